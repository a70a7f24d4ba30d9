"""How well the cost model orders two plans, as data: of two runs of one sweep group (same model,
same cluster) whose predicted tokens/s differ by a factor g, how often the one predicted faster
measured faster, by bins of |log g|, from the held-out groups (``uncertainty.yaml``'s
``ranking``, read by ``search.uncertainty.p_best_faster``).

A plan's interval says how far its own prediction may be off; two plans of one study share most
of their error (the same model, cluster and software), so whether #1 really beats #2 is a
question about the ratio, which these pairs answer. Each group weighs alike in a bin (a group's
pairs vote as one: its share of them ordered right), and the shares are made non-decreasing in
the gap by pooling adjacent bins that are not (isotonic regression, each bin weighing by its
groups). An estimate on runs the fit did not see, not a bound."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from search import gap_bin
from tcf_search.calibration.dataset import group_of

# bin edges on |log(predicted tokens/s of one run / the other's)|
GAP_EDGES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def pooled_non_decreasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Pool adjacent violators: the weighted least-squares non-decreasing fit of ``values``."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, n2), (v1, w1, n1) = blocks.pop(), blocks.pop()
            w = w1 + w2
            blocks.append([(v1 * w1 + v2 * w2) / w if w else (v1 + v2) / 2, w, n1 + n2])
    return [b[0] for b in blocks for _ in range(int(b[2]))]


def ordered_pairs(frame: pd.DataFrame, predicted: np.ndarray,
                  rows: pd.Series) -> pd.DataFrame:
    """Every pair of ``rows`` in one sweep group: |predicted log gap|, whether the faster
    predicted measured faster (a measured tie counts half), the group."""
    sel = rows.to_numpy() & np.isfinite(predicted)
    lp = np.log(predicted[sel])
    lm = np.log(frame["tokens_per_sec_per_gpu"].to_numpy()[sel])
    key = group_of(frame[sel]).to_numpy()
    parts = []
    for g in np.unique(key):
        at = np.flatnonzero(key == g)
        i, j = np.triu_indices(at.size, 1)
        dp, dm = lp[at[i]] - lp[at[j]], lm[at[i]] - lm[at[j]]
        right = np.where(dm == 0, 0.5, (np.sign(dp) == np.sign(dm)).astype(float))
        parts.append(pd.DataFrame({"gap": np.abs(dp), "right": right, "group": g}))
    return (pd.concat(parts, ignore_index=True) if parts
            else pd.DataFrame({"gap": [], "right": [], "group": []}))


def gap_bins(pairs: pd.DataFrame) -> np.ndarray:
    """The GAP_EDGES bin of each pair's gap."""
    return gap_bin(pairs["gap"].to_numpy(), GAP_EDGES)


def ranking_table(frame: pd.DataFrame, predicted: np.ndarray, rows: pd.Series) -> dict[str, Any]:
    pairs = ordered_pairs(frame, predicted, rows)
    bins = gap_bins(pairs)
    shares: list[float] = []
    groups: list[int] = []
    counts: list[int] = []
    for b in range(len(GAP_EDGES)):
        inside = pairs[bins == b]
        by_group = inside.groupby("group")["right"].mean()
        shares.append(float(by_group.mean()) if by_group.size else 0.5)
        groups.append(int(by_group.size))
        counts.append(int(len(inside)))
    return {"gap_edges": list(GAP_EDGES),
            "p_right": [round(p, 4) for p in pooled_non_decreasing(shares, groups)],
            "pairs": counts, "groups": groups,
            "rows": "pairs of runs within one held-out sweep group; |log predicted gap| binned "
                    "from each edge to the next (the last to infinity)"}


def two_fold_check(frame: pd.DataFrame, predicted: np.ndarray, rows: pd.Series,
                   half: pd.Series) -> list[dict[str, float]]:
    """The table of one half of the groups judged on the other half's pairs, both ways: per gap
    bin the mean probability it gives and the share ordered right (each group alike), pooled
    over the two folds by pairs."""
    out: list[list[tuple[float, float, int]]] = [[] for _ in GAP_EDGES]
    for a in (True, False):
        table = ranking_table(frame, predicted, rows & (half == a))
        pairs = ordered_pairs(frame, predicted, rows & (half != a))
        bins = gap_bins(pairs)
        for b in range(len(GAP_EDGES)):
            inside = pairs[bins == b]
            if len(inside):
                right = float(inside.groupby("group")["right"].mean().mean())
                out[b].append((table["p_right"][b], right, len(inside)))
    rows_out = []
    for b, folds in enumerate(out):
        n = sum(f[2] for f in folds)
        if n:
            rows_out.append({"bin": b, "pairs": n,
                             "p": sum(f[0] * f[2] for f in folds) / n,
                             "right": sum(f[1] * f[2] for f in folds) / n})
    return rows_out
