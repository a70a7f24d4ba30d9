"""Checks more than one cost-model test module makes."""

from __future__ import annotations

import pytest

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.terms import MemoryTerms, memory_terms


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
