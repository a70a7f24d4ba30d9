"""The cost model's error, as data: quantiles of its held-out residuals per regime.

``python -m tcf_search.calibration.fit --write`` (or ``python -m tcf_search.calibration.
uncertainty``, on the calibration as written, without fitting) writes
``hardware_catalog/uncertainty.yaml``: for tokens/s, bounds on log(measured / predicted) from the
rows of held-out sweep groups, per regime (framework stack, SKU family / precision / dense or
MoE / scale) and for each coarser regime a sparse one falls back to; for memory, the quantiles of
log(measured / predicted) peak memory (Playbook ``max_memory_reserved``, the only measured
peaks).
Beside them, ``ranking``: how often the model orders two runs of one group right, by their
predicted gap (``tcf_search.calibration.ranking``). ``search.uncertainty`` reads it all.

The unit of the data is the sweep group, (model, GPU count): its rows share a model, a cluster and
the model's error on them, and a plan asked about later belongs to a group the fit has not seen.
So the tokens/s bounds are hierarchical split-conformal ones (Lee, Barber & Willett,
"Distribution-free inference with hierarchical data", arXiv:2306.06342), smoothed: each of a
regime's K groups weighs 1 (a row 1/N of its group's N rows) and holds its own slot of width
1 / (K + 1) centred on its rank's level k / (K + 1), its rows spread evenly over the slot; the
value at level p is interpolated between the rows about it. With one row a group the k-th smallest
of n residuals sits at level k / (n + 1), the chance that a row of a new group exchangeable with
them falls under it; between two such rows the interpolation gives the level in between, as the
smoothed conformal predictor's tie-breaking does (Vovk, Gammerman & Shafer, "Algorithmic Learning
in a Random World", 2005, sec. 2.4), where the order statistic itself (the next rank up) holds a
new row at p + up to 1 / (K + 1): an 80% interval of ten groups held 90-98%, not 80%. Levels past
p > K / (K + 1) (or p < 1 / (K + 1)) have no bound (infinite): those are answered by a coarser
regime (family, then all), not by a few rows.

The coverage written next to them is honest and is the shipped tables' own: each held-out group
is judged by the bounds of the other held-out groups (leave one group out), as a study of a new
model meets the tables of all of them; it is given per row and per group (each group weighing
alike, what the bounds are built to hold), by regime and by framework stack. (A two-fold split
would judge a regime by half its groups: a regime of 10-17 groups, Ampere's, then has too few a
half for the 80% bounds and is judged by every family's pooled residuals, an interval it never
gets from the tables.)
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from search import INTERVAL, MOE_KEY, key_regime, regime_keys, residual_stack, scale_of
from search.inputs import LEVELS
from tcf_search.calibration.accuracy import regime, throughput_rows
from tcf_search.calibration.dataset import group_of, weigh_alike
from tcf_search.calibration.ranking import ranking_table

GIB = 2**30
TOL = 1e-9  # weights are sums of 1/N: compare them with room for rounding


def tput_rows(frame: pd.DataFrame, pred: dict[str, np.ndarray]) -> pd.Series:
    """Rows whose tokens/s the cost model is judged on: the Playbook's trusted ones and every
    other source's ok rows."""
    other = ~frame["source"].eq("playbook") & frame["status"].eq("ok")
    ok = pd.Series(np.isfinite(pred["tokens_per_s_per_gpu"]), index=frame.index)
    return (throughput_rows(frame) | other) & ok & frame["tokens_per_sec_per_gpu"].notna()


def _stacks(frame: pd.DataFrame) -> pd.Series:
    """Each row's framework stack ("" where the frame names no framework)."""
    if "framework" not in frame:
        return pd.Series("", index=frame.index, dtype=object)
    return frame["framework"].fillna("").astype(str).map(residual_stack)


def _keys(frame: pd.DataFrame) -> pd.Series:
    """Each row's finest regime key: its framework's stack, family/precision/kind/scale."""
    scale = frame["num_gpus"].map(scale_of)
    stack = _stacks(frame)
    return (stack + ":").where(stack.ne(""), "") + regime(frame) + "/" + scale


def _at_level(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """The value at level p >= 0.5 of a row of a new group (module docstring): each group's
    weight spread over its slot, interpolated; +inf past K / (K + 1), K the total weight."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    k = float(w.sum())
    if p > k / (k + 1.0) + TOL:
        return float("inf")
    at = (np.cumsum(w) - w / 2 + 0.5) / (k + 1.0)
    return float(np.interp(p, at, v))


def conformal_bounds(values: np.ndarray, groups: np.ndarray,
                     levels: tuple[float, ...] = LEVELS) -> list[float]:
    """Bounds at ``levels`` on a row of a new group, from residuals ``values`` of the groups
    ``groups`` (module docstring): an upper one where p > 0.5, and where p <= 0.5 the mirror
    lower one, under which a share p of new rows fall."""
    w = weigh_alike(groups)
    return [round(_at_level(values, w, p), 5) if p > 0.5
            else round(-_at_level(-values, w, 1.0 - p), 5) for p in levels]


def pooled_quantiles(values: np.ndarray, groups: np.ndarray) -> list[float]:
    """Quantiles at LEVELS of the rows with every group weighing alike (each row at the middle of
    its weight): an estimate of a new group's distribution, for P(OOM), not a bound."""
    order = np.argsort(values, kind="stable")
    w = weigh_alike(groups)[order]
    at = (np.cumsum(w) - w / 2) / w.sum()
    return [round(float(q), 5) for q in np.interp(LEVELS, at, values[order])]


def throughput_table(frame: pd.DataFrame, pred: dict[str, np.ndarray],
                     rows: pd.Series) -> dict[str, dict[str, Any]]:
    """Bounds on log(measured / predicted tokens/s) per regime key and every coarser key, for
    the keys whose groups bound the shown interval."""
    sel = rows & tput_rows(frame, pred)
    r = np.log(frame.loc[sel, "tokens_per_sec_per_gpu"].to_numpy()
               / pred["tokens_per_s_per_gpu"][sel.to_numpy()])
    keys = _keys(frame[sel]).to_numpy()
    groups = group_of(frame[sel]).to_numpy()
    buckets: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        # the MoE regime's bounds are the MoE groups left out of the MoE fit (moe_table), not
        # the held-out rows' (Grok-1's alone)
        for k in regime_keys(*key_regime(str(key))):
            if k != MOE_KEY:
                buckets.setdefault(k, []).append(i)
    table = {}
    for k, idx in sorted(buckets.items()):
        q = conformal_bounds(r[idx], groups[idx])
        if np.all(np.isfinite(np.interp(INTERVAL, LEVELS, q))):
            table[k] = {"n": len(idx), "groups": int(np.unique(groups[idx]).size), "q": q}
    return table


def memory_table(frame: pd.DataFrame, pred: dict[str, np.ndarray],
                 rows: pd.Series) -> dict[str, Any]:
    sel = (rows & frame["source"].eq("playbook") & frame["status"].eq("ok")
           & frame["peak_mem_gib"].notna()
           & pd.Series(np.isfinite(pred["first_stage_mem_bytes"]), index=frame.index))
    r = np.log(frame.loc[sel, "peak_mem_gib"].to_numpy() * GIB
               / pred["first_stage_mem_bytes"][sel.to_numpy()])
    groups = group_of(frame[sel]).to_numpy()
    return {"n": int(r.size), "groups": int(np.unique(groups).size),
            "q": pooled_quantiles(r, groups),
            "rows": "Playbook ok runs (nanotron, H100) of held-out groups: max_memory_reserved "
                    "on rank 0; every other regime borrows them, unvalidated"}


def half_of(frame: pd.DataFrame) -> pd.Series:
    """The two halves of the held-out groups the ranking check judges each other by (stable
    hash)."""
    return group_of(frame).map(lambda k: zlib.crc32(("half|" + k).encode()) % 2 == 0).astype(bool)


def _shares(inside: pd.Series, groups: pd.Series) -> dict[str, Any]:
    by_group = inside.groupby(groups).mean()
    return {"rows": int(inside.size), "groups": int(by_group.size),
            "within": round(float(inside.mean()), 4),
            "within_groups": round(float(by_group.mean()), 4)}


def _judge(unc: Any, key: str, frame: pd.DataFrame, pred: dict[str, np.ndarray], i: int,
           lo: float, hi: float) -> tuple[float, str]:
    """Whether row ``i``'s measured tokens/s lies in the [lo, hi] interval ``unc`` gives its
    regime ``key`` (1.0 or 0.0), and the regime key that answered."""
    q, used = unc.quantiles(*key_regime(key), at=(lo, hi))
    ratio = frame["tokens_per_sec_per_gpu"].iloc[i] / pred["tokens_per_s_per_gpu"][i]
    lo_r, hi_r = np.exp(np.interp([lo, hi], LEVELS, q))
    return float(lo_r <= ratio <= hi_r), used


def coverage(frame: pd.DataFrame, pred: dict[str, np.ndarray], held: pd.Series,
             lo: float = INTERVAL[0], hi: float = INTERVAL[1]) -> dict[str, Any]:
    """Leave one group out: share of each held-out group's rows inside the [lo, hi] interval
    built from the *other* held-out groups, in all, per family/precision/MoE and per framework
    stack (``search.uncertainty.residual_stack``): per row (``within``) and per group, each
    weighing alike (``within_groups``, what the bounds are built to hold); ``borrowed`` is the
    share of rows a coarser regime than their own finest bounded, ``own_stack_bounds`` a stack's
    share bounded by its own residuals."""
    from search import Uncertainty

    test = held & tput_rows(frame, pred)
    groups = group_of(frame)
    keys = _keys(frame)
    inside = pd.Series(np.nan, index=frame.index)
    used = pd.Series("", index=frame.index, dtype=object)
    for g in groups[test].unique():
        mine = groups.eq(g)
        # (no MoE regime: judged by its others, a MoE group of moe_table's nine has too few,
        # eight, for the 80% bounds, so its rows fall back as they would without it)
        unc = Uncertainty(throughput=throughput_table(frame, pred, held & ~mine), memory={})
        for i in np.flatnonzero((test & mine).to_numpy()):
            inside.iloc[i], used.iloc[i] = _judge(unc, str(keys.iloc[i]), frame, pred, int(i),
                                                  lo, hi)
    got = inside.dropna()
    gi = groups[got.index]
    stack = _stacks(frame.loc[got.index])
    own = pd.Series([u.startswith(f"{st}:") and bool(st)
                     for u, st in zip(used[got.index], stack, strict=True)], index=got.index)
    return {"interval": [lo, hi], **_shares(got, gi),
            "borrowed": round(float((used[got.index] != keys[got.index]).mean()), 4),
            "by_regime": {k: _shares(v, gi[v.index])
                          for k, v in got.groupby(regime(frame.loc[got.index]))},
            "by_stack": {k: {**_shares(v, gi[v.index]),
                             "own_stack_bounds": round(float(own[v.index].mean()), 4)}
                         for k, v in got.groupby(stack)}}


def moe_table(logo: pd.DataFrame) -> dict[str, Any] | None:
    """Bounds on log(measured / predicted) tokens/s of a MoE plan (``search.MOE_KEY``), from the
    MoE stage's leave-one-group-out ratios (``moe_fit.leave_group_out``: each model x GPU group
    predicted with it out of the MoE fit, the families never fitted under the full one), the
    releases their maintainers call regressions left out; each group weighs alike. The held-out
    split holds Grok-1's MoE rows alone, so it cannot say how far the model is off on the
    fine-grained MoE models; these groups can. None where the groups are too few to bound the
    80% interval."""
    part = logo[~logo["regression"].astype(bool)]
    r = -np.log(part["ratio"].to_numpy(float))
    groups = part["group"].to_numpy()
    q = conformal_bounds(r, groups)
    if not np.all(np.isfinite(np.interp(INTERVAL, LEVELS, q))):
        return None
    return {"n": int(r.size), "groups": int(np.unique(groups).size), "q": q,
            "rows": "MoE rows of dgxc-benchmarking and Megatron-Bridge (Grok-1, DeepSeek-V3, "
                    "Qwen3, GPT-OSS; regressions out), each model x GPU group predicted with it "
                    "left out of the MoE fit"}


def write_uncertainty(path: Path, frame: pd.DataFrame, pred: dict[str, np.ndarray],
                      held: pd.Series, moe: dict[str, Any] | None = None) -> dict[str, Any]:
    """uncertainty.yaml from the held-out groups' residuals, with ``moe`` (:func:`moe_table`)
    as the MoE regime's bounds in place of the held-out MoE rows'."""
    throughput = throughput_table(frame, pred, held)
    if moe is not None:
        throughput[MOE_KEY] = moe
    doc = {"levels": [round(x, 2) for x in LEVELS],
           "throughput": throughput,
           "memory": memory_table(frame, pred, held),
           "ranking": ranking_table(frame, pred["tokens_per_s_per_gpu"],
                                    held & tput_rows(frame, pred)),
           "coverage": coverage(frame, pred, held)}
    path.write_text("# Written by `python -m tcf_search.calibration.fit --write` or\n# `python -m "
                    "tcf_search.calibration.uncertainty`; do not edit by hand.\n# Bounds on "
                    "log(measured / predicted) from held-out groups (the method:\n# "
                    "tcf_search/calibration/uncertainty.py); read by search/uncertainty.py.\n"
                    + yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None))
    print("wrote", path)
    return doc


def main() -> int:
    """Write uncertainty.yaml from the calibration as written (no fit: the residuals are the
    shipped model's on the held-out groups, as the fit's are once it has written)."""
    from hardware_catalog import CATALOG_DIR, load_calibration
    from tcf_search.calibration.dataset import (
        find_measured_csv,
        load_groups,
        predict_groups,
        split_mask,
    )
    from tcf_search.calibration.moe_fit import leave_group_out

    csv = find_measured_csv()
    if csv is None:
        print("measured_runs.csv not found at ../shared/data/")
        return 1
    frame = pd.read_csv(csv)
    groups, _ = load_groups(frame)
    held = split_mask(frame)
    logo = leave_group_out(frame, groups, ~held, load_calibration(CATALOG_DIR))
    write_uncertainty(CATALOG_DIR / "uncertainty.yaml", frame,
                      predict_groups(groups, len(frame)), held, moe_table(logo))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
