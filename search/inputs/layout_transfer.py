"""What one measured run says about another layout of its own model on its own cluster.

A run's log residual under the SKU family's fit (log measured / predicted tokens/s) is part
cluster, part layout: two runs of one (model, GPU, cluster) group that differ in their parallel
degrees, micro-batch, recompute or sequence err alike only as far as their layouts are alike.
The measured runs' transfer to a plan is then a function of its layout distance to them:

- :func:`layout_of` / :func:`distance`: a layout's coordinates and the distance between two,
  ``sum |log2 ratio|`` over the degrees and the workload's sequence and batch, plus 1 for each
  categorical axis that differs (ZeRO stage, recompute, sequence parallel): one doubling, or one
  switch, is one unit, and no axis weighs more than another.
- :class:`Transfer`: the correlation of two runs' residuals of one group as a function of their
  distance ``d``: ``far + (near - far) * exp(-d / decay)``; ``near`` (< 1: what a run shares
  with another of the same layout, its own noise left out), ``far`` (what any two layouts of
  the group share: the cluster's part) and ``decay`` (the distance it takes to lose 1/e of the
  rest). Fitted on the shared rows by :mod:`tcf_search.calibration.transfer_fit`, stored in
  ``hardware_catalog/anchored.yaml`` with how it was obtained (``benchmarks/bench_anchor.py``):
  pooled over the shared rows, and per regime (SKU family/precision/dense or MoE) where a regime
  has groups enough of its own (:func:`transfer_for`): how far a run's error carries is a
  property of the stack and the model's error there (a fixed recipe whose error is one offset
  carries far; a sweep whose runs hit pathologies of their own carries little).
- :func:`krige`: the plan's expected residual given the anchor runs' (simple kriging with that
  correlation) and the spread left about it. The cluster's part is what ``calibrate
  --measured``'s scales carry (their pull toward the family's fit is ``far``'s); the rest, the
  runs' residuals after the scales, moves a plan by the within-group part of the correlation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# log2 coordinates: the plan's degrees, then the workload's
LOG_AXES = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "seq_len", "global_batch")
# a mismatch is one unit
SWITCH_AXES = ("zero_stage", "recompute", "sequence_parallel")
FEATURES = (*LOG_AXES, *SWITCH_AXES)


def layout_of(cols: Mapping[str, Any], seq_len: int, global_batch: int) -> np.ndarray:
    """The coordinates (n, len(FEATURES)) of the plans in ``cols`` (plan arrays:
    ``costmodel.plans_to_arrays``) under a workload of ``seq_len`` and ``global_batch``."""
    n = len(np.atleast_1d(cols["tp"]))
    work = {"seq_len": seq_len, "global_batch": global_batch}
    out = np.empty((n, len(FEATURES)))
    for i, name in enumerate(FEATURES):
        v = np.broadcast_to(np.asarray(work[name] if name in work else cols[name],
                                       dtype=float), (n,))
        out[:, i] = np.log2(np.maximum(v, 1.0)) if name in LOG_AXES else v
    return out


def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The (len(a), len(b)) layout distances (module docstring)."""
    k = len(LOG_AXES)
    diff = np.abs(a[:, None, :] - b[None, :, :])
    return diff[..., :k].sum(-1) + (diff[..., k:] > 0).sum(-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """The correlation of two runs' residuals of one group against their layout distance."""

    far: float
    near: float
    decay: float
    basis: str = ""

    def __post_init__(self) -> None:
        assert 0.0 <= self.far <= self.near < 1.0 and self.decay > 0, self

    def correlation(self, d: np.ndarray) -> np.ndarray:
        return self.far + (self.near - self.far) * np.exp(-np.asarray(d, dtype=float)
                                                          / self.decay)

    @property
    def prior_weight(self) -> float:
        """The pull on a cluster-wide scale one run gives: it moves ``far`` of the way, as a
        least-squares prior of weight ``sqrt((1 - far) / far)`` on the log-scale does."""
        return math.sqrt((1.0 - self.far) / max(self.far, 1e-6))

    def to_dict(self) -> dict[str, Any]:
        return {"far": round(self.far, 4), "near": round(self.near, 4),
                "decay": round(self.decay, 4), "basis": self.basis}


def transfer_for(pooled: Transfer | None, by_regime: Mapping[str, Transfer],
                 regimes: Iterable[str]) -> Transfer | None:
    """The transfer for anchor runs of ``regimes``: their regime's own where they share one that
    has its own fit, else the pooled one."""
    names = set(regimes)
    return by_regime.get(names.pop(), pooled) if len(names) == 1 else pooled


def krige(t: Transfer, anchors: np.ndarray, residuals: np.ndarray,
          plans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For plans at layouts ``plans``, given anchor runs at ``anchors`` whose log residuals
    after the cluster-wide scales are ``residuals``: the log shift each plan takes from them,
    and the sd of its residual left (in units of a residual's sd: 1 - what the anchors explain,
    so 0 only where a plan is perfectly known)."""
    if len(anchors) == 0:
        return np.zeros(len(plans)), np.ones(len(plans))
    big = t.correlation(distance(anchors, anchors))
    np.fill_diagonal(big, 1.0)
    small = t.correlation(distance(plans, anchors))  # (n, k)
    within_big = (big - t.far) / (1.0 - t.far)
    within_small = (small - t.far) / (1.0 - t.far)
    shift = within_small @ np.linalg.solve(within_big, np.asarray(residuals, dtype=float))
    explained = np.einsum("nk,kn->n", small, np.linalg.solve(big, small.T))
    return shift, np.sqrt(np.clip(1.0 - explained, 1e-6, 1.0))
