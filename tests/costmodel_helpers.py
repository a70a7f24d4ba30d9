"""Checks more than one cost-model test module makes, and the training setups they run.

A test builds its :class:`Training` the way a study does (``search.inputs.specs.training_spec``:
a named profile of ``hardware_catalog/frameworks.yaml`` at a precision, then the study's
overrides), as torchtitan's ``config_registry.py`` names its configurations: :func:`training_for`
with the framework's name, overriding a switch only where the test is about that switch.
"""

from __future__ import annotations

from typing import Any

import pytest

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.framework import FrameworkProfile
from costmodel.terms import MemoryTerms, memory_terms
from hardware_catalog.frameworks import framework_profile
from search.inputs.specs import training_spec


def training_for(framework: str = "generic", *, seq_len: int, global_batch: int,
                 precision: str = "bf16", optimizer: str = "adam", compile: bool = False,
                 **switches: Any) -> Training:
    """The training a study of ``framework`` at ``precision`` builds, with ``switches`` (flat
    switch names, or ``memory_model``) as its overrides."""
    return training_spec(framework=framework, precision=precision, seq_len=seq_len,
                         global_batch=global_batch, optimizer=optimizer, compile=compile,
                         switches=switches)


def profile_for(framework: str = "generic", precision: str = "bf16",
                **switches: Any) -> FrameworkProfile:
    """The profile a study of ``framework`` at ``precision`` runs, with ``switches``."""
    return framework_profile(framework, precision, switches)


def assert_terms_match_estimate(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                                tr: Training) -> MemoryTerms:
    """The CP-SAT stage's linear memory terms (costmodel.terms) give every stage's bytes of the
    estimate, at an even split with the plan's recomputed layers; returns the terms."""
    est = estimate(model, cluster, plan, tr)
    terms = memory_terms(model, cluster, plan, tr)
    n = model.layers // plan.pp
    recomputed = (plan.recompute_layers or n) if plan.recompute == "full" else 0
    for st in est.memory.stages:
        assert terms.stage_bytes(st.stage, n, recomputed) == pytest.approx(st.total_bytes,
                                                                            rel=1e-9)
    return terms
