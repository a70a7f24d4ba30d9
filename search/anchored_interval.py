"""The 80% interval of a prediction anchored on measured runs of its own cluster.

A study anchored on measured steps (``cluster.calibration`` with a ``measured:`` block, written
by ``tcf-search calibrate --measured``) is judged on what anchoring did on the shared rows, not
on the family's residuals: ``benchmarks/bench_anchor.py --write`` anchors on one run of each
(source, model, GPU, GPU count) group of ``measured_runs.csv``, predicts the group's other runs
through ``tcf-search predict``'s code, and writes the quantiles of log(measured / anchored
predicted tokens/s) here (``hardware_catalog/anchored.yaml``), each group weighing alike, each
residual divided by the sd kriging leaves it (``search.inputs.layout_transfer.krige``): a
plan's interval is those quantiles times its own sd, narrow near an anchor run's layout and as
wide as the residuals of a group's far layouts away from it. The interval narrows to them only
for a study the check covered: the model and GPU count of one of its anchor runs
(``search.inputs.links.anchor_matches``); any other study keeps its regime's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodel.specs import ClusterSpec, ModelSpec, Training
from hardware_catalog import CATALOG_DIR
from search.inputs.anchor_tails import Tail, tails_from
from search.inputs.layout_transfer import FEATURES, Transfer, krige, layout_of
from search.inputs.links import (
    ClusterCalibration,
    anchor_matches,
    load_calibration,
    model_key,
)
from search.inputs.sections import LEVELS

ANCHORED_FILE = CATALOG_DIR / "anchored.yaml"


@dataclass(frozen=True, slots=True)
class AnchoredSpread:
    q: tuple[float, ...]  # quantiles of log(measured / anchored predicted) / its sd at LEVELS
    n: int  # held-out predictions
    groups: int  # groups anchored
    basis: str  # how it was obtained
    # the pull of a measured run's fit toward the family's: the spread of the family's log
    # residuals within a group over that of the groups' offsets (tcf_search.calibration.anchor)
    prior_weight: float = 0.0
    # how a run's residual carries to other layouts (search.inputs.layout_transfer), fitted on
    # the shared rows: pooled, and each regime's own where it has groups enough
    transfer: Transfer | None = None
    transfers: dict[str, Transfer] = field(default_factory=dict)
    sd: float = 1.0  # the plan's sd left by kriging (1: a residual's own)
    # each regime's bulk and tail of the family's residuals: how much of an anchor run's
    # residual is its cluster's (search.inputs.anchor_tails), fitted on the shared rows
    tails: dict[str, Tail] = field(default_factory=dict)

    def interval(self, tokens: float, lo: float, hi: float) -> tuple[float, float]:
        a, b = np.exp(self.sd * np.interp([lo, hi], LEVELS, self.q))
        return float(tokens * a), float(tokens * b)

    def at(self, sd: float) -> AnchoredSpread:
        return replace(self, sd=float(sd))

    @property
    def label(self) -> str:
        return (f"anchored: {self.groups} groups' leave-one-in residuals, x{self.sd:.2f} "
                f"of a residual's sd at this layout")


@lru_cache(maxsize=1)
def load_anchored_spread() -> AnchoredSpread | None:
    """The stored spread (None where no benchmark has written it)."""
    if not ANCHORED_FILE.exists():
        return None
    doc = yaml.safe_load(ANCHORED_FILE.read_text()) or {}
    q = doc.get("q")
    if not q or list(doc.get("levels", [])) != list(LEVELS):
        return None
    t = doc.get("transfer")
    transfer = _stored_transfer(t) if isinstance(t, dict) else None
    by_regime = doc.get("transfers") or {}
    weight = transfer.prior_weight if transfer is not None else float(
        (doc.get("pull") or {}).get("prior_weight", 0.0))
    return AnchoredSpread(q=tuple(float(v) for v in q), n=int(doc.get("n", 0)),
                          groups=int(doc.get("groups", 0)), basis=str(doc.get("basis", "")),
                          prior_weight=weight, transfer=transfer,
                          transfers={str(k): _stored_transfer(v) for k, v in by_regime.items()
                                     if isinstance(v, dict)},
                          tails=tails_from(doc.get("tails")))


def _stored_transfer(t: dict[str, Any]) -> Transfer:
    return Transfer(far=float(t["far"]), near=float(t["near"]), decay=float(t["decay"]),
                    basis=str(t.get("basis", "")))


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


def calibration_at(path: str) -> ClusterCalibration:
    """The calibration file at ``path``, read once."""
    return _calibration(path)


@dataclass(frozen=True, slots=True)
class AnchorLocal:
    """A study's anchor runs of its own model and GPU count, and what they move each plan by."""

    transfer: Transfer
    layouts: np.ndarray  # (k, len(FEATURES))
    residuals: np.ndarray  # log(measured / anchored by the cluster-wide scales)
    seq_len: int
    global_batch: int

    def shift(self, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per plan of ``cols`` (plan arrays): its log tokens/s shift and the sd left."""
        return krige(self.transfer, self.layouts, self.residuals,
                     layout_of(cols, self.seq_len, self.global_batch))

    def apply(self, out: dict[str, np.ndarray], cols: dict[str, np.ndarray]
              ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``out`` (``estimate_batch``'s) with its throughput moved by the anchors (the step
        time's parts stay the cost model's), and each plan's sd left."""
        shift, sd = self.shift(cols)
        f = np.exp(shift)
        moved = {k: np.asarray(out[k]) * f for k in RATES}
        return {**out, **moved, "step_time_s": np.asarray(out["step_time_s"]) / f}, sd


RATES = ("tokens_per_s_per_gpu", "mfu", "mfu_causal", "hfu", "mfu_precision_peak",
         "model_tflops_per_gpu")


def local_of(cal: ClusterCalibration | None, model: ModelSpec, cluster: ClusterSpec,
             training: Training) -> AnchorLocal | None:
    """The anchor runs of ``cal`` a study of ``model`` on ``cluster`` is near (its model
    shape, GPU and GPU count), with their layouts and residuals; None where it has none or the
    file recorded no transfer (older files: the scales alone move it)."""
    if cal is None or cal.measured is None or cal.measured.transfer is None:
        return None
    key = model_key(model)
    runs = [r for r in cal.measured.runs
            if r.get("model") == key and r.get("gpu") == cluster.gpu.id
            and int(r.get("num_gpus", 0)) == cluster.num_gpus and isinstance(r.get("layout"), dict)]
    if not runs:
        return None
    lay = np.array([[float(r["layout"].get(f, 0.0)) for f in FEATURES] for r in runs])
    # what the run says of its cluster (the measured figure where the file predates tails)
    res = np.log([float(r.get("cluster_tokens_per_s", r["measured_tokens_per_s"]))
                  / float(r["anchored_tokens_per_s"]) for r in runs])
    return AnchorLocal(transfer=cal.measured.transfer, layouts=lay, residuals=res,
                       seq_len=training.seq_len, global_batch=training.global_batch)


def local_for(calibration: str, model: ModelSpec, cluster: ClusterSpec,
              training: Training) -> AnchorLocal | None:
    """:func:`local_of` for a study's calibration file (a path; "" none)."""
    return local_of(_calibration(calibration), model, cluster, training) if calibration \
        else None


def anchor_batch(cal: ClusterCalibration | None, model: ModelSpec, cluster: ClusterSpec,
                 training: Training, cols: dict[str, np.ndarray],
                 out: dict[str, np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], AnchoredSpread | None, np.ndarray]:
    """``estimate_batch``'s ``out`` for the plans ``cols`` moved by ``cal``'s anchor runs near
    them, the anchored spread where the study is what the runs checked (None: its regime's),
    and each plan's sd left (1 where no run is near)."""
    spread = load_anchored_spread() if anchor_matches(cal, model, cluster) else None
    local = local_of(cal, model, cluster, training)
    if local is None:
        return out, spread, np.ones(len(np.atleast_1d(cols["tp"])))
    moved, sd = local.apply(out, cols)
    return moved, spread, sd
