"""The 80% interval of a prediction anchored on measured runs of its own cluster.

A study anchored on measured steps (``cluster.calibration`` with a ``measured:`` block, written
by ``tcf-search calibrate --measured``) is judged on what anchoring did on the shared rows, not
on the family's residuals: ``benchmarks/bench_anchor.py --write`` anchors on one run of each
(source, model, GPU, GPU count) group of ``measured_runs.csv``, predicts the group's other runs
through ``tcf-search predict``'s code, and writes the quantiles of log(measured / anchored
predicted tokens/s) here (``hardware_catalog/anchored.yaml``), each group weighing alike. The
interval narrows to them only for a study the check covered: the model and GPU count of one of
its anchor runs (``search.inputs.links.anchor_matches``); any other study keeps its regime's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from costmodel.specs import ClusterSpec, ModelSpec
from hardware_catalog import CATALOG_DIR
from search.inputs.links import ClusterCalibration, anchor_matches, load_calibration
from search.inputs.sections import LEVELS

ANCHORED_FILE = CATALOG_DIR / "anchored.yaml"


@dataclass(frozen=True, slots=True)
class AnchoredSpread:
    q: tuple[float, ...]  # quantiles of log(measured / anchored predicted) at LEVELS
    n: int  # held-out predictions
    groups: int  # groups anchored
    basis: str  # how it was obtained
    # the pull of a measured run's fit toward the family's: the spread of the family's log
    # residuals within a group over that of the groups' offsets (tcf_search.calibration.anchor)
    prior_weight: float = 0.0

    def interval(self, tokens: float, lo: float, hi: float) -> tuple[float, float]:
        a, b = np.exp(np.interp([lo, hi], LEVELS, self.q))
        return float(tokens * a), float(tokens * b)

    @property
    def label(self) -> str:
        return f"anchored: {self.groups} groups' leave-one-in residuals"


@lru_cache(maxsize=1)
def load_anchored_spread() -> AnchoredSpread | None:
    """The stored spread (None where no benchmark has written it)."""
    if not ANCHORED_FILE.exists():
        return None
    doc = yaml.safe_load(ANCHORED_FILE.read_text()) or {}
    q = doc.get("q")
    if not q or list(doc.get("levels", [])) != list(LEVELS):
        return None
    return AnchoredSpread(q=tuple(float(v) for v in q), n=int(doc.get("n", 0)),
                          groups=int(doc.get("groups", 0)), basis=str(doc.get("basis", "")),
                          prior_weight=float((doc.get("pull") or {}).get("prior_weight", 0.0)))


def spread_for(calibration: str, model: ModelSpec, cluster: ClusterSpec) -> AnchoredSpread | None:
    """The anchored spread for a study of ``model`` on ``cluster`` anchored on the calibration
    file ``calibration`` (a path; "" none), or None where it keeps its regime's interval."""
    if not calibration:
        return None
    cal = _calibration(calibration)
    return load_anchored_spread() if anchor_matches(cal, model, cluster) else None


@lru_cache(maxsize=16)
def _calibration(path: str) -> ClusterCalibration:
    return load_calibration(Path(path))
