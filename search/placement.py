"""The placement problem of one layout, its objective, and a vectorised exact solver for bulk use.

Given a layout (pp stages, recompute mode) and, per stage, ``need[n]``: the fewest fully
recomputed layers with which the stage fits holding n layers (``> n`` when it cannot), choose

* ``n_first``, ``n_middle``, ``n_last`` with ``n_first + (pp-2)*n_middle + n_last = layers``
  (Megatron's uneven first/last pipeline stages; all equal when ``shift`` is off), which with
  ``vpp`` > 1 chunks must be a split Megatron builds with its own flags
  (``costmodel.mapping.launchable_chunks``: each count divisible by vpp, or the ends one short
  of a middle divisible by vpp, the embedding and the loss counted as layers). Where the
  framework takes a per-rank layout (``any_chunks``) the middle ranks may hold shares a layer
  apart, the extra layers on the earliest (``costmodel.mapping.ranks_of``): ``n_middle`` is the
  most loaded middle rank's, ``(pp-2)*(n_middle-1) < layers - n_first - n_last <
  (pp-2)*n_middle``, and the ends hold at most ``n_middle`` (80 layers on pp 32:
  3 + 15 x 3 + 15 x 2 + 2), and
* ``r``, the layers per stage fully recomputed (Megatron's ``--recompute-num-layers``; each stage
  recomputes ``min(r, n_stage)``), at least 1 under 'full' recompute and 0 otherwise, and,
  where the framework counts it per model chunk (``recompute_step`` = vpp, the table's
  ``recompute_chunks`` rule), a multiple of vpp or at least the largest stage's layers (all),

minimising, in this order: the slowest stage's work ``4*(3*n + min(r, n)) + head`` (forward 1,
backward 2, recompute 1 per layer, in quarter-layer units; the LM head on the last stage), then
``r``, then ``|n_first - n_middle| + |n_last - n_middle|``, then preferring more layers on the
first, then the middle stage, then fewer on the last. The order makes the optimum unique.

``search.prune.solve_placement`` states this model in CP-SAT; :func:`solve_many` enumerates it
with numpy for thousands of layouts at once. Tests check they agree on every subproblem.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from costmodel.mapping import launchable_chunks

STAGE_NAMES = ("first", "middle", "last")


def stages_of(pp: int) -> tuple[str, ...]:
    """Stages that differ: one with pp=1; first and last with pp=2 (a 'middle' stage of a
    2-stage pipeline holds no more than the first)."""
    return ("first",) if pp == 1 else ("first", "last") if pp == 2 else STAGE_NAMES


@dataclass(frozen=True, slots=True)
class Subproblem:
    layers: int
    pp: int
    full: bool  # recompute 'full': r >= 1
    shift: bool  # uneven first/last stages allowed (the study allows it)
    partial: bool  # fewer than all layers may be recomputed
    head_units: int
    need: tuple[tuple[int, ...], ...]  # per stage of stages_of(pp), for n = 0..layers
    vpp: int = 1  # model chunks per rank: the split must be one Megatron builds (launchable)
    recompute_step: int = 1  # r is a multiple of this, or all layers (rules.recompute_chunks)
    any_chunks: bool = False  # the framework takes an explicit layout: any split (uneven_chunks)


@dataclass(frozen=True, slots=True)
class Placement:
    n_first: int
    n_middle: int
    n_last: int
    recomputed: int

    def plan_fields(self, layers: int, pp: int, full: bool, vpp: int = 1) -> dict[str, int]:
        """The ``Plan`` fields: 0 means an even split / all layers recomputed."""
        f = plan_fields(layers, np.asarray(pp), np.asarray(full), np.asarray([
            [self.n_first, self.n_middle, self.n_last, self.recomputed]]), np.asarray(vpp))
        return {k: int(v[0]) for k, v in f.items()}


def plan_fields(layers: int, pp: np.ndarray, full: np.ndarray, rows: np.ndarray,
                vpp: np.ndarray | int = 1) -> dict[str, np.ndarray]:
    """Placements ``(n_first, n_middle, n_last, r)`` as ``Plan`` columns, where 0 means an even
    split (first/last stage layers; only where vpp chunks split it evenly too, else the counts
    are written out) and all layers (recompute_layers)."""
    nf, nm, nl, r = rows.T
    even = ((layers % (pp * np.asarray(vpp)) == 0) & (nf == layers // pp)
            & (nl == layers // pp))
    uneven = (pp > 1) & ~even
    most = np.maximum(np.maximum(nf, np.where(pp > 2, nm, 0)), np.where(pp > 1, nl, 0))
    return {"first_stage_layers": np.where(uneven, nf, 0),
            "last_stage_layers": np.where(uneven, nl, 0),
            "recompute_layers": np.where(full & (r < most), r, 0)}


def objective_weights(layers: int) -> tuple[int, int, int, int, int]:
    """Multipliers that fold the lexicographic objective into one integer:
    ``((((longest*R + r)*S + spread)*F + (L - n_first))*M + (L - n_middle))*N + n_last``."""
    L = layers
    return L + 1, 2 * L + 1, L + 1, L + 1, L + 1


def objective_key(layers: int, longest: np.ndarray | int, r: np.ndarray | int,
                  spread: np.ndarray | int, n_first: np.ndarray | int,
                  n_middle: np.ndarray | int, n_last: np.ndarray | int) -> np.ndarray | int:
    R, S, F, M, N = objective_weights(layers)
    return (((((longest * R + r) * S + spread) * F + (layers - n_first)) * M
             + (layers - n_middle)) * N + n_last)


@cache
def candidates(layers: int, pp: int, shift: bool, vpp: int = 1,
               any_chunks: bool = False) -> np.ndarray:
    """All placements (n_first, n_middle, n_last) of ``layers`` on ``pp`` stages, as rows; with
    vpp > 1 chunks only those Megatron builds with its first/last flags
    (:func:`costmodel.mapping.launchable_chunks`), unless ``any_chunks`` (the framework takes an
    explicit per-stage layout, ``training.framework.pp.uneven_chunks``)."""
    rows = _splits(layers, pp, shift, any_chunks)
    rows.flags.writeable = False  # cached: shared by every caller
    if vpp <= 1 or len(rows) == 0 or any_chunks:
        return rows
    # as pinned counts: an even-looking split is launchable when the counts are (47 + 47 on
    # pp 2, vpp 3: the embedding and loss counted), though 94 % (2 * 3) != 0
    ok = launchable_chunks(layers, pp, vpp, rows[:, 0], rows[:, 2])
    out = rows[ok]
    out.flags.writeable = False
    return out


def _splits(layers: int, pp: int, shift: bool, near_even: bool = False) -> np.ndarray:
    L = layers
    if pp == 1:
        return np.array([[L, L, L]])
    if not shift:
        return np.array([[L // pp] * 3]) if L % pp == 0 else np.zeros((0, 3), dtype=int)
    if pp == 2:
        nf = np.arange(1, L)
        return np.stack([nf, nf, L - nf], axis=1)
    nm = np.arange(1, (L - 2) // (pp - 2) + 1)
    rest = L - (pp - 2) * nm
    rows = [np.stack([np.arange(1, r), np.full(r - 1, m), r - np.arange(1, r)], axis=1)
            for m, r in zip(nm, rest, strict=True) if r >= 2]
    if near_even:
        # the middle ranks a layer apart (n_middle the most loaded's), the ends no larger than
        # it: what a per-rank layout adds is balance (80 layers on pp 32); ends above the
        # middle ranks keep to the equal splits, to keep the candidates few
        nf, nl = (a.ravel() for a in np.meshgrid(np.arange(1, L), np.arange(1, L),
                                                   indexing="ij"))
        mid = L - nf - nl
        most = -(-mid // (pp - 2))
        keep = (mid > pp - 2) & (mid % (pp - 2) != 0) & (nf <= most) & (nl <= most)
        rows.append(np.stack([nf[keep], most[keep], nl[keep]], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 3), dtype=int)


def recompute_step(vpp: int, per_chunk: bool) -> int:
    """What the layers recomputed per stage come in multiples of (``rules.recompute_chunks``)."""
    return max(1, vpp) if per_chunk else 1


def solve_many(need: dict[str, np.ndarray], pp: int, full: np.ndarray, shift: bool,
               partial: bool, layers: int, head_units: int, vpp: int = 1,
               max_cells: int = 2_000_000, step: int = 1, any_chunks: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """Optimal placements of many layouts sharing ``pp``, ``shift`` and ``vpp``.

    ``need[stage]`` is (layouts x layers+1). Returns ``(rows, ok)``: rows of
    ``(n_first, n_middle, n_last, r)`` and whether any placement fits.
    """
    L = layers
    cand = candidates(L, pp, shift, vpp, any_chunks)
    k = next(iter(need.values())).shape[0]
    out = np.zeros((k, 4), dtype=np.int64)
    ok = np.zeros(k, dtype=bool)
    if len(cand) == 0 or k == 0:
        return out, ok
    stages = stages_of(pp)
    col = {"first": 0, "middle": 1, "last": 2}
    chunk = max(1, max_cells // len(cand))
    for lo in range(0, k, chunk):
        sl = slice(lo, min(k, lo + chunk))
        n = {s: cand[:, col[s]][None, :] for s in stages}
        req = {s: need[s][sl][:, cand[:, col[s]]] for s in stages}
        fits = np.logical_and.reduce([req[s] <= n[s] for s in stages])
        f = full[sl][:, None]
        r_needed = np.maximum(np.max(np.stack([req[s] for s in stages]), axis=0), 1)
        # the fewest valid: a multiple of step, or the largest stage's layers (all of them)
        most = np.max(np.stack([n[s] for s in stages]), axis=0)
        r_needed = np.minimum(-(-r_needed // step) * step, np.maximum(most, r_needed))
        r = np.broadcast_to(np.where(f, r_needed if partial else L, 0), fits.shape)
        longest = np.max(np.stack([
            4 * (3 * n[s] + np.minimum(r, n[s])) + (head_units if s == stages[-1] else 0)
            for s in stages]), axis=0)
        spread = (np.abs(cand[:, 0] - cand[:, 1]) + np.abs(cand[:, 2] - cand[:, 1])
                  if pp > 2 and shift else np.zeros(len(cand), dtype=np.int64))[None, :]
        key = objective_key(L, longest, r, spread, cand[:, 0][None, :], cand[:, 1][None, :],
                            cand[:, 2][None, :])
        key = np.where(fits, key, np.iinfo(np.int64).max)
        best = np.argmin(key, axis=1)
        rows = np.arange(best.shape[0])
        ok[sl] = fits[rows, best]
        out[sl, :3] = cand[best]
        out[sl, 3] = r[rows, best]
    return out, ok
