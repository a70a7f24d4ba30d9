"""Accuracy of the cost model against measured runs, in the figures issue #2 asks for."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from costmodel.params import active_params
from hardware_catalog import CatalogError, get_gpu
from search.inputs import regime_of

GIB = 2**30
# The tool recommends only plans predicted to leave this fraction of usable memory free: runs
# predicted above 90% of usable memory ran 22% slower (median) in the Playbook sweep, where the
# caching allocator starts freeing and retrying (see the closing note of issue #2).
PICK_HEADROOM = 0.10


def _ape(pred: pd.Series, measured: pd.Series) -> pd.Series:
    return (pred - measured).abs() / measured


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def throughput_rows(frame: pd.DataFrame) -> pd.Series:
    """Playbook ok rows whose pipeline timing is trusted (pp == 1 or after HF's PP fix)."""
    pb = frame["source"].eq("playbook") & frame["status"].eq("ok")
    fixed = frame["after_pp_fix"].astype(str).str.lower().eq("true")
    return pb & (frame["pp"].eq(1) | fixed)


def regime(frame: pd.DataFrame) -> pd.Series:
    """Each row's regime for the accuracy split and the uncertainty: SKU family, precision and
    dense or MoE (``hopper/fp8/dense``)."""
    moe = frame["moe_experts"].fillna(0).astype(float) > 0
    return pd.Series([regime_of(_family(str(g)), str(p), bool(m)) for g, p, m in zip(
        frame["gpu"], frame["precision"].fillna("bf16"), moe, strict=True)], index=frame.index)


def _family(gpu: str) -> str:
    try:
        return get_gpu(gpu).family
    except CatalogError:
        return "unknown"


def dgxc_figures(f: pd.DataFrame, tok: pd.Series) -> dict[str, Any]:
    """Tokens/s errors on NVIDIA's DGX Cloud tables, in all and by regime."""
    rows = f["source"].eq("dgxc-benchmarking") & f["status"].eq("ok") & tok.notna()
    out: dict[str, Any] = {"dgxc_rows": int(rows.sum())}
    if not rows.any():
        return out
    ape = _ape(tok[rows], f.loc[rows, "tokens_per_sec_per_gpu"])
    out["dgxc_median_ape"] = float(ape.median())
    out["dgxc_mape"] = float(ape.mean())
    for name, e in ape.groupby(regime(f[rows])):
        out[f"dgxc_{name}_median_ape"] = float(e.median())
        out[f"dgxc_{name}_rows"] = int(e.size)
    return out


def multinode_figures(f: pd.DataFrame, tok: pd.Series) -> dict[str, Any]:
    """Tokens/s errors of every source on its runs over more than one node (issue #34's bar:
    the network terms are what these rows test); the Playbook's as in :func:`throughput_rows`."""
    rows = (f["status"].eq("ok") & tok.notna() & f["tokens_per_sec_per_gpu"].notna()
            & (f["num_gpus"] > f["gpus_per_node"].fillna(8)))
    rows &= ~f["source"].eq("playbook") | throughput_rows(f)
    out: dict[str, Any] = {}
    for src, idx in f[rows].groupby("source").groups.items():
        e = _ape(tok[idx], f.loc[idx, "tokens_per_sec_per_gpu"])
        out[f"multinode/{src}_median_ape"] = float(e.median())
        out[f"multinode/{src}_rows"] = int(e.size)
    return out


def report(frame: pd.DataFrame, pred: dict[str, np.ndarray],
           mask: pd.Series | None = None) -> dict[str, Any]:
    """Figures on the rows of ``mask`` (default all). ``pred`` holds estimate_batch columns
    aligned with ``frame`` (NaN where a row could not be modelled)."""
    sel = pd.Series(True, index=frame.index) if mask is None else mask
    f = frame[sel]
    tok = pd.Series(pred["tokens_per_s_per_gpu"], index=frame.index)[sel]
    # measured peaks are rank 0's, the first pipeline stage's; OOM is any stage's
    rank0 = pred.get("first_stage_mem_bytes", pred["peak_mem_bytes"])
    mem = pd.Series(rank0, index=frame.index)[sel] / GIB
    fits = pd.Series(pred["fits"], index=frame.index)[sel]
    mem_frac = pd.Series(pred["peak_mem_bytes"] / pred["usable_bytes"], index=frame.index)[sel]
    out: dict[str, Any] = {}

    pb = f["source"].eq("playbook") & f["status"].isin(["ok", "oom"]) & mem.notna()
    ok = f["status"].eq("ok")
    fits_b = fits.astype(float) > 0.5
    out["oom_rows"] = int(pb.sum())
    out["oom_accuracy"] = float((fits_b[pb] == ok[pb]).mean())
    out["false_fits"] = float((fits_b[pb] & ~ok[pb]).mean())
    out["false_ooms"] = float((~fits_b[pb] & ok[pb]).mean())
    memrows = pb & ok & f["peak_mem_gib"].notna()
    ape_mem = _ape(mem[memrows], f.loc[memrows, "peak_mem_gib"])
    out["mem_rows"] = int(memrows.sum())
    out["mem_mape"] = float(ape_mem.mean())
    out["mem_median_ape"] = float(ape_mem.median())

    thr = throughput_rows(f) & tok.notna()
    ape = _ape(tok[thr], f.loc[thr, "tokens_per_sec_per_gpu"])
    out["tput_rows"] = int(thr.sum())
    out["tput_median_ape"] = float(ape.median())
    out["tput_mape"] = float(ape.mean())
    rhos, picks = [], []
    for _, g in f[thr].groupby(["model_name", "num_gpus"]):
        if len(g) < 3:
            continue
        measured = g["tokens_per_sec_per_gpu"].to_numpy()
        predicted = tok[g.index].to_numpy()
        rhos.append(_spearman(measured, predicted))
        roomy = (mem_frac[g.index] <= 1 - PICK_HEADROOM).to_numpy()
        ranked = np.where(roomy, predicted, -np.inf) if roomy.any() else predicted
        picks.append(measured[int(np.argmax(ranked))] / measured.max())
    out["groups"] = len(rhos)
    out["spearman_median"] = float(np.nanmedian(rhos)) if rhos else float("nan")
    out["spearman_mean"] = float(np.nanmean(rhos)) if rhos else float("nan")
    out["pick_vs_best_mean"] = float(np.mean(picks)) if picks else float("nan")
    out["pick_vs_best_min"] = float(np.min(picks)) if picks else float("nan")

    out.update(dgxc_figures(f, tok))
    out.update(multinode_figures(f, tok))
    for src in ("megatron-sc21", "llm-foundry"):
        rows = f["source"].eq(src) & f["status"].eq("ok") & tok.notna()
        if rows.any():
            e = _ape(tok[rows], f.loc[rows, "tokens_per_sec_per_gpu"])
            out[f"{src}_rows"] = int(rows.sum())
            out[f"{src}_mape"] = float(e.mean())
            # every one of these runs ran: the share predicted to fit is an OOM check on
            # frameworks the memory fit never saw
            out[f"{src}_predicted_fit"] = float((fits_b[rows]).mean())
    return out


# what ``tcf-search predict`` writes (GiB, a boolean's text) as the columns the figures read
PREDICT_COLUMNS = {"tokens_per_s_per_gpu": ("pred_tokens_per_sec_per_gpu", 1.0),
                   "peak_mem_bytes": ("pred_peak_mem_gib", GIB),
                   "first_stage_mem_bytes": ("pred_first_stage_mem_gib", GIB),
                   "usable_bytes": ("pred_usable_mem_gib", GIB)}


def predicted_columns(predicted: pd.DataFrame) -> dict[str, np.ndarray]:
    """The figures' inputs from what ``tcf-search predict`` wrote, row for row (issue #36 item
    1: the benchmark measures the path users run, knob and stage-split choices included); a
    row predict refused holds NaN, as the calibration path's unmodelled rows do."""
    out = {key: pd.to_numeric(predicted[col], errors="coerce").to_numpy(float) * scale
           for key, (col, scale) in PREDICT_COLUMNS.items()}
    fits = predicted["pred_fits"].astype(str).str.lower().isin(["true", "1"]).to_numpy(float)
    out["fits"] = np.where(np.isnan(out["tokens_per_s_per_gpu"]), np.nan, fits)
    return out


P_OOM_BINS = (0.0, 0.1, 0.3, 0.7, 0.9, 1.0)


def predict_calibration(frame: pd.DataFrame, predicted: pd.DataFrame,
                        held: pd.Series) -> dict[str, Any]:
    """What ``tcf-search predict`` wrote, checked against what ran (issue #41): the share of the
    held-out rows that ran whose tokens/s fall in ``[pred_tokens_per_sec_lo,
    pred_tokens_per_sec_hi]``, and P(OOM) in bins against the share of runs in each bin that ran
    out of memory (every row that ran or ran out: status ok or oom)."""
    def num(col: str) -> pd.Series:  # rows predict could not handle hold no number
        return pd.to_numeric(predicted[col], errors="coerce")

    lo, hi = num("pred_tokens_per_sec_lo"), num("pred_tokens_per_sec_hi")
    tok = frame["tokens_per_sec_per_gpu"]
    ran = frame["status"].eq("ok") & tok.notna() & lo.notna() & held
    inside = (tok >= lo) & (tok <= hi)
    out: dict[str, Any] = {"interval_rows": int(ran.sum()),
                           "interval_within": float(inside[ran].mean()) if ran.any() else
                           float("nan")}
    p = num("pred_p_oom")
    judged = frame["status"].isin(["ok", "oom"]) & p.notna()
    bins = []
    for a, b in zip(P_OOM_BINS[:-1], P_OOM_BINS[1:], strict=True):
        in_bin = judged & (p >= a) & ((p < b) if b < 1.0 else (p <= b))
        bins.append({"bin": f"{a:.0%}-{b:.0%}", "rows": int(in_bin.sum()),
                     "predicted": float(p[in_bin].mean()) if in_bin.any() else float("nan"),
                     "measured_oom": (float(frame.loc[in_bin, "status"].eq("oom").mean())
                                      if in_bin.any() else float("nan"))})
    out["p_oom_bins"] = bins
    out["launched_fit"] = launched_fit(frame, predicted)
    return out


def launched_fit(frame: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per source, of its runs that ran (status ok): how many ``tcf-search predict`` priced,
    how many it predicted to fit and how many it refused (``pred_error``). Every one ran, so
    a miss is a false out-of-memory (the Playbook's share is its ``false_ooms``)."""
    ok = frame["status"].eq("ok")
    runs = pd.DataFrame({
        "source": frame["source"],
        "fit": predicted["pred_fits"].astype(str).str.lower().isin(["true", "1"]),
        "refused": predicted["pred_error"].fillna("").astype(str).str.len() > 0})[ok]
    runs["priced"] = ~runs["refused"]
    counts = runs.groupby("source")[["priced", "fit", "refused"]].sum()
    return {str(src): {k: int(v) for k, v in row.items()} for src, row in counts.iterrows()}


# what each regime axis reads off a row (issue #36 item 5: is the model biased by regime?)
SIZE_EDGES = (0.0, 3e9, 15e9, 80e9, float("inf"))
SIZE_LABELS = ("<3B", "3-15B", "15-80B", ">80B")
SCALE_EDGES = (0, 8, 64, 512, 10**9)
SCALE_LABELS = ("1 node", "9-64", "65-512", ">512")
BIAS_MIN_ROWS = 5


def active_params_of(groups: Iterable[Any], index: pd.Index) -> pd.Series:
    """Each row's parameters one token multiplies (``costmodel.params.active_params`` of its
    group's model; ``calibration.dataset.load_groups``'s groups), NaN for a row no group holds:
    the size axis of :func:`bias_by_regime`."""
    out = pd.Series(np.nan, index=index)
    for g in groups:
        out.iloc[g.index] = float(active_params(g.model))
    return out


def regime_axes(f: pd.DataFrame, params: pd.Series) -> dict[str, pd.Series]:
    """Each row's place on every axis the bias table splits by."""
    compiled = f["compile"].astype(str).str.lower()
    return {
        "source": f["source"].astype(str),
        "stack": f["framework"].fillna("unstated").astype(str),
        "precision": f["precision"].fillna("bf16").astype(str),
        "size": pd.cut(params, SIZE_EDGES, labels=SIZE_LABELS).astype(str),
        "scale": pd.cut(pd.to_numeric(f["num_gpus"], errors="coerce"), SCALE_EDGES,
                        labels=SCALE_LABELS).astype(str),
        "kind": pd.Series(np.where(pd.to_numeric(f["moe_experts"], errors="coerce")
                                   .fillna(0) > 0, "moe", "dense"), index=f.index),
        "mode": compiled.map({"true": "compiled", "false": "eager"}).fillna("unstated"),
        "recompute": f.get("recompute", pd.Series(index=f.index, dtype=object))
        .fillna("unstated").astype(str),
        "family": f["gpu"].map(lambda g: _family(str(g))),
    }


def bias_by_regime(f: pd.DataFrame, tok: pd.Series, rows: pd.Series,
                   params: pd.Series) -> dict[str, Any]:
    """The signed error of tokens/s on ``rows`` (runs that ran) per regime of each axis: the
    median of log(predicted / measured), + where the model is too fast, with the rows behind
    it; regimes of fewer than ``BIAS_MIN_ROWS`` rows are left out. ``params``: each row's
    parameters a token multiplies (:func:`active_params_of`), its size."""
    measured = pd.to_numeric(f["tokens_per_sec_per_gpu"], errors="coerce")
    ok = rows & f["status"].eq("ok") & tok.notna() & measured.gt(0)
    log_ratio = np.log(tok[ok] / measured[ok])
    out: dict[str, Any] = {}
    for axis, key in regime_axes(f[ok], params[ok]).items():
        by = log_ratio.groupby(key).agg(["median", "size"])
        out[axis] = {str(k): {"median_log_ratio": float(v["median"]), "rows": int(v["size"])}
                     for k, v in by.iterrows() if v["size"] >= BIAS_MIN_ROWS}
    return out


# The Playbook's rows name their Slurm job (case_id "playbook-<job id>"); jobs submitted together
# (job id // 1000) ran on the cluster of that day. A layout the sweep ran in two batches, once at
# ZeRO-0 and once at ZeRO-1 (which move the same gradient bytes; the model prices them within a
# few percent at these sizes), measures how far the sweep reproduces itself, which no cost model
# can be closer to than: a model-free check on the data the figures above are judged on.
TWIN_COLUMNS = ("model_name", "num_gpus", "tp", "pp", "dp", "cp", "micro_batch", "global_batch",
                "seq_len", "after_pp_fix")
MIN_TWINS = 5  # a batch's twins reported from this many


def batch_twins(frame: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per Playbook job batch with at least ``MIN_TWINS`` twins in other batches (the same layout,
    ``TWIN_COLUMNS``): its runs' tokens/s over their twins', median and range."""
    ok = frame["source"].eq("playbook") & frame["status"].eq("ok")
    f = frame[ok & frame["tokens_per_sec_per_gpu"].notna()]
    f = f.assign(batch=f["case_id"].str.extract(r"playbook-(\d+)")[0].astype(float) // 1000)
    f = f[f["batch"].notna()]
    cols = list(TWIN_COLUMNS)
    keyed = f.assign(**{c: f[c].astype(str) for c in cols})
    out: dict[int, dict[str, float]] = {}
    for batch, own in keyed.groupby("batch"):
        pairs = own.merge(keyed[keyed["batch"] != batch], on=cols, suffixes=("", "_twin"))
        if pairs["case_id"].nunique() < MIN_TWINS:
            continue
        ratio = pairs["tokens_per_sec_per_gpu"] / pairs["tokens_per_sec_per_gpu_twin"]
        out[int(batch)] = {"runs": int(pairs["case_id"].nunique()),
                           "median": round(float(ratio.median()), 3),
                           "min": round(float(ratio.min()), 3),
                           "max": round(float(ratio.max()), 3)}
    return out
