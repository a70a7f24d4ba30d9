"""The layout transfer of a measured run's residual (``search.inputs.layout_transfer.Transfer``),
fitted on the family's log residuals of groups of runs of one (source, model, GPU, cluster);
and each regime's bulk and tail of those residuals (:func:`fit_tails`,
``search.inputs.anchor_tails``): how much of one run's error is its cluster's.

Every ordered pair (a, b) of runs of a group is one observation of how much of run a's residual
run b shares: ``r_b = rho(d_ab) * r_a + noise``, with ``rho(d) = far + (near - far) *
exp(-d / decay)`` (the regression of one run's residual on another's, which is their
correlation where the two share one spread: simple kriging's weight for one anchor). Three
parameters, fitted by least squares over all pairs at once:

- each group's residuals are divided by their own robust scale, so a source whose model errs
  by 30% and one that errs by 3% speak in one unit: the correlation's shape is fitted, not any
  source's spread. The scale is that of the differences between the group's runs (median
  |r_a - r_b| / (0.6745 sqrt 2)), in which the group's common offset cancels: a scale of the
  residuals themselves would shrink exactly the groups whose runs share most, and bias the
  correlation low;
- each group weighs alike, whatever its number of pairs;
- the loss is soft-L1 (Huber-like, unit scale): the residuals are heavy-tailed (a run that hit
  a pathology the cost model does not price errs by 60%), and one such run must not set what
  every other run transfers.

:func:`fit_regime_transfers` fits the same three numbers on each regime's groups alone (SKU
family/precision/dense or MoE, ``search.inputs.regime_of``) where the regime has
``MIN_REGIME_GROUPS`` groups of two runs or more: a regime whose runs err by one offset (a fixed
recipe's) carries a run's error further than one whose runs each hit a pathology of their own,
and the pooled fit, weighing every group alike, is the latter's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from search.inputs import (
    MAX_TAIL_WEIGHT,
    MIN_REGIME_GROUPS,
    MIN_TAIL_TO_BULK,
    Tail,
    Transfer,
    distance,
)

LOSS = "soft_l1"
MAD_TO_SD = 0.6745


def _pairs(residuals: np.ndarray, groups: np.ndarray,
           layouts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per ordered pair of runs of a group: r_a, r_b (in the group's robust scale), d_ab and
    the pair's weight (1 / the group's pairs)."""
    parts: list[tuple[np.ndarray, ...]] = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 2:
            continue
        r = residuals[idx]
        a, b = np.nonzero(~np.eye(len(idx), dtype=bool))
        scale = max(float(np.median(np.abs(r[a] - r[b]))) / (MAD_TO_SD * math.sqrt(2.0)), 1e-4)
        d = distance(layouts[idx], layouts[idx])[a, b]
        parts.append((r[a] / scale, r[b] / scale, d, np.full(len(a), 1.0 / len(a))))
    return tuple(np.concatenate(c) for c in zip(*parts, strict=True))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _params(p: np.ndarray) -> tuple[float, float, float]:
    far = _sigmoid(float(p[0]))
    return far, far + (1.0 - far) * _sigmoid(float(p[1])), math.exp(float(p[2]))


def fit_transfer(residuals: np.ndarray, groups: np.ndarray, layouts: np.ndarray,
                 basis: str = "") -> tuple[Transfer, dict[str, Any]]:
    """The transfer fitted on the runs' ``residuals`` (log measured / the family's predicted),
    grouped by ``groups``, at ``layouts`` (``search.inputs.layout_transfer.layout_of``); and
    what it was fitted on."""
    ra, rb, d, w = _pairs(np.asarray(residuals, dtype=float), np.asarray(groups),
                          np.asarray(layouts, dtype=float))
    sw = np.sqrt(w / w.mean())

    def misfit(p: np.ndarray) -> np.ndarray:
        far, near, decay = _params(p)
        return sw * (rb - (far + (near - far) * np.exp(-d / decay)) * ra)

    sol = least_squares(misfit, np.array([-2.0, 0.0, 0.0]), loss=LOSS, f_scale=1.0)
    far, near, decay = _params(sol.x)
    t = Transfer(far=min(far, near), near=min(near, 0.999), decay=decay, basis=basis)
    groups_used = len({g for g in np.unique(groups) if np.sum(groups == g) >= 2})
    return t, {"pairs": int(len(d)), "groups": groups_used, "loss": LOSS,
               "median_pair_distance": round(float(np.median(d)), 3)}


def fit_regime_transfers(residuals: np.ndarray, groups: np.ndarray, layouts: np.ndarray,
                         regimes: np.ndarray) -> dict[str, Transfer]:
    """Each regime's own transfer (module docstring), for regimes of at least
    ``MIN_REGIME_GROUPS`` groups of two runs or more; the others use the pooled one."""
    r, g, reg = (np.asarray(residuals, dtype=float), np.asarray(groups),
                 np.asarray(regimes).astype(str))
    lay = np.asarray(layouts, dtype=float)
    out: dict[str, Transfer] = {}
    for name in np.unique(reg):
        keep = (reg == name) & np.isfinite(r)
        _, counts = np.unique(g[keep], return_counts=True)
        if np.sum(counts >= 2) < MIN_REGIME_GROUPS:
            continue
        t, how = fit_transfer(r[keep], g[keep], lay[keep])
        out[str(name)] = replace(t, basis=f"{name}: {how['pairs']} pairs of {how['groups']} "
                                          f"groups")
    return out


EM_STEPS = 200


def fit_tails(residuals: np.ndarray, groups: np.ndarray,
              regimes: np.ndarray) -> dict[str, Tail]:
    """Each regime's two-normal mixture of the runs' log residuals (search.inputs.anchor_tails),
    by expectation-maximisation with every group weighing alike (each run 1 / its group's
    runs); regimes of fewer than ``MIN_REGIME_GROUPS`` groups get none, and so does one whose
    mixture finds no minority tail of another scale than its bulk (``MAX_TAIL_WEIGHT``,
    ``MIN_TAIL_TO_BULK``)."""
    r, g, reg = (np.asarray(residuals, dtype=float), np.asarray(groups),
                 np.asarray(regimes).astype(str))
    out: dict[str, Tail] = {}
    for name in np.unique(reg):
        keep = (reg == name) & np.isfinite(r)
        names, inverse, counts = np.unique(g[keep], return_inverse=True, return_counts=True)
        if len(names) < MIN_REGIME_GROUPS:
            continue
        x, w = r[keep], 1.0 / counts[inverse]
        tail = _mixture(x, w, groups=len(names))
        if (tail.tail_weight <= MAX_TAIL_WEIGHT
                and tail.tail_sd >= MIN_TAIL_TO_BULK * tail.bulk_sd):
            out[str(name)] = tail
    return out


def _mixture(x: np.ndarray, w: np.ndarray, groups: int) -> Tail:
    """Two zero-mean normals by EM from a narrow bulk and a broad tail (weights ``w``)."""
    spread = math.sqrt(float(np.sum(w * x * x) / np.sum(w)))
    bulk, tail, p = max(spread / 4.0, 1e-3), max(spread * 2.0, 2e-3), 0.2
    for _ in range(EM_STEPS):
        a = (1.0 - p) * np.exp(-0.5 * (x / bulk) ** 2) / bulk
        b = p * np.exp(-0.5 * (x / tail) ** 2) / tail
        t = w * b / np.maximum(a + b, 1e-300)
        u = w - t
        p = float(t.sum() / w.sum())
        bulk = max(math.sqrt(float((u * x * x).sum() / max(u.sum(), 1e-12))), 1e-3)
        tail = max(math.sqrt(float((t * x * x).sum() / max(t.sum(), 1e-12))), bulk)
    return Tail(bulk_sd=bulk, tail_sd=tail, tail_weight=min(p, 0.999), groups=groups)
