"""The search: which plan trains fastest, memory first.

User text becomes cost-model inputs once (``search.inputs``: a study, a plan file, a measured
row, a preset or a Hugging Face config, resolved by ``inputs.specs``) → ``space`` (valid
layouts) → ``prune`` and ``placement`` (what fits, and CP-SAT's layer placement) →
``evaluate`` and ``optimize`` (Optuna, on the ``storage``) → ``output``; ``pipeline.run_study``
composes them.

The names the commands use are this package's face (``__all__``), each read from its module on
first use, so that a command that never searches does not import Optuna and OR-Tools; the
user-input readers have their own face, ``search.inputs``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.anchored_interval import (
        AnchoredSpread,
        AnchorLocal,
        anchor_batch,
        load_anchored_spread,
        local_for,
        spread_for,
    )
    from search.baseline import baseline_doc, baseline_of, step_breakdown
    from search.output import (
        MFU_FLAG,
        interval_text,
        prior_legend,
        ranking_line,
        render,
        run_file,
    )
    from search.pipeline import RunOptions, run_study
    from search.placement import candidates
    from search.priors import plan_rests_on
    from search.rdb import in_memory, sqlite_file
    from search.rescore import cost_model_version
    from search.space import build_space
    from search.uncertainty import (
        INTERVAL,
        MOE_KEY,
        Uncertainty,
        calibration_status,
        gap_bin,
        key_regime,
        p_best_faster,
        plan_regime,
        regime_keys,
        residual_stack,
        scale_of,
        uncertainty_metrics,
    )

_HOME = {
    "anchored_interval": ("AnchoredSpread", "AnchorLocal", "anchor_batch",
                          "load_anchored_spread", "local_for", "spread_for"),
    "baseline": ("baseline_doc", "baseline_of", "step_breakdown"),
    "output": ("MFU_FLAG", "interval_text", "prior_legend", "ranking_line", "render", "run_file"),
    "pipeline": ("RunOptions", "run_study"),
    "placement": ("candidates",),
    "rdb": ("in_memory", "sqlite_file"),
    "rescore": ("cost_model_version",),
    "space": ("build_space",),
    "priors": ("plan_rests_on",),
    "uncertainty": ("INTERVAL", "MOE_KEY", "Uncertainty", "calibration_status", "gap_bin",
                    "key_regime", "p_best_faster", "plan_regime", "regime_keys",
                    "residual_stack", "scale_of", "uncertainty_metrics"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = [
    "AnchorLocal", "AnchoredSpread", "INTERVAL", "MFU_FLAG", "MOE_KEY", "RunOptions",
    "Uncertainty",
    "anchor_batch",
    "local_for",
    "baseline_doc", "baseline_of",
    "build_space", "calibration_status", "candidates", "cost_model_version", "gap_bin", "in_memory",
    "interval_text", "key_regime", "load_anchored_spread", "p_best_faster", "plan_regime",
    "plan_rests_on", "prior_legend", "ranking_line", "regime_keys", "render", "residual_stack",
    "run_file", "run_study", "scale_of", "sqlite_file", "spread_for", "step_breakdown",
    "uncertainty_metrics",
]  # the names of _HOME (tests/test_layers.py holds the two equal)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'search' has no attribute {name!r}")
    # read from its module each time, not cached here: a name patched there (a test's
    # monkeypatch) is what every later import of the face gets
    return getattr(importlib.import_module(f"search.{module}"), name)
