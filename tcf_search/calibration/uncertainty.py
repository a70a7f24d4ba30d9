"""The cost model's error, as data: quantiles of its held-out residuals per regime.

``python -m tcf_search.calibration.fit --write`` writes ``hardware_catalog/uncertainty.yaml``:
for tokens/s, the quantiles of log(measured / predicted) on the rows of held-out sweep groups,
per regime (SKU family / precision / dense or MoE / scale) and for each coarser regime a
sparse one falls back to; for memory, the quantiles of log(measured / predicted) peak memory
(Playbook ``max_memory_reserved``, the only measured peaks). ``search.uncertainty`` reads it.

The coverage written next to them is honest: the held-out groups are split in two by a stable
hash, the quantiles of one half bound the other half's rows, and the other way round.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from search.uncertainty import LEVELS, MIN_ROWS, regime_keys, scale_of
from tcf_search.calibration.accuracy import regime, throughput_rows

GIB = 2**30


def tput_rows(frame: pd.DataFrame, pred: dict[str, np.ndarray]) -> pd.Series:
    """Rows whose tokens/s the cost model is judged on: the Playbook's trusted ones and every
    other source's ok rows."""
    other = ~frame["source"].eq("playbook") & frame["status"].eq("ok")
    ok = pd.Series(np.isfinite(pred["tokens_per_s_per_gpu"]), index=frame.index)
    return (throughput_rows(frame) | other) & ok & frame["tokens_per_sec_per_gpu"].notna()


def _keys(frame: pd.DataFrame) -> pd.Series:
    scale = frame["num_gpus"].map(scale_of)
    return regime(frame) + "/" + scale


def _quantiles(values: np.ndarray) -> list[float]:
    return [round(float(q), 5) for q in np.quantile(values, LEVELS)]


def throughput_table(frame: pd.DataFrame, pred: dict[str, np.ndarray],
                     rows: pd.Series) -> dict[str, dict[str, Any]]:
    """Quantiles of log(measured / predicted tokens/s) per regime key and every coarser key."""
    sel = rows & tput_rows(frame, pred)
    r = np.log(frame.loc[sel, "tokens_per_sec_per_gpu"].to_numpy()
               / pred["tokens_per_s_per_gpu"][sel.to_numpy()])
    keys = _keys(frame[sel]).to_numpy()
    buckets: dict[str, list[float]] = {}
    for key, value in zip(keys, r, strict=True):
        for k in regime_keys(*str(key).split("/")):
            buckets.setdefault(k, []).append(float(value))
    return {k: {"n": len(v), "q": _quantiles(np.asarray(v))}
            for k, v in sorted(buckets.items()) if len(v) >= MIN_ROWS}


def memory_table(frame: pd.DataFrame, pred: dict[str, np.ndarray],
                 rows: pd.Series) -> dict[str, Any]:
    sel = (rows & frame["source"].eq("playbook") & frame["status"].eq("ok")
           & frame["peak_mem_gib"].notna()
           & pd.Series(np.isfinite(pred["first_stage_mem_bytes"]), index=frame.index))
    r = np.log(frame.loc[sel, "peak_mem_gib"].to_numpy() * GIB
               / pred["first_stage_mem_bytes"][sel.to_numpy()])
    return {"n": int(r.size), "q": _quantiles(r),
            "rows": "Playbook ok runs (nanotron, H100) of held-out groups: max_memory_reserved "
                    "on rank 0; every other regime borrows them, unvalidated"}


def _half(frame: pd.DataFrame) -> pd.Series:
    keys = frame["model_name"].astype(str) + "|" + frame["num_gpus"].astype(str)
    return keys.map(lambda k: zlib.crc32(("half|" + k).encode()) % 2 == 0).astype(bool)


def coverage(frame: pd.DataFrame, pred: dict[str, np.ndarray], held: pd.Series,
             lo: float = 0.1, hi: float = 0.9) -> dict[str, Any]:
    """Share of held-out rows inside the [lo, hi] interval built from the *other* half of the
    held-out groups (two-fold by sweep group), in all and per family/precision/MoE."""
    from search.uncertainty import Uncertainty

    half = _half(frame)
    inside = pd.Series(np.nan, index=frame.index)
    for a in (True, False):
        table = throughput_table(frame, pred, held & (half == a))
        unc = Uncertainty(throughput=table, memory={})
        test = held & (half != a) & tput_rows(frame, pred)
        for i in np.flatnonzero(test.to_numpy()):
            row = frame.iloc[i]
            key = str(_keys(frame.iloc[[i]]).iloc[0])
            q, _ = unc.quantiles(*key.split("/"))
            ratio = row["tokens_per_sec_per_gpu"] / pred["tokens_per_s_per_gpu"][i]
            lo_r, hi_r = np.exp(np.interp([lo, hi], LEVELS, q))
            inside.iloc[i] = float(lo_r <= ratio <= hi_r)
    got = inside.dropna()
    by = got.groupby(regime(frame.loc[got.index]))
    return {"interval": [lo, hi], "rows": int(got.size), "within": round(float(got.mean()), 4),
            "by_regime": {k: {"rows": int(v.size), "within": round(float(v.mean()), 4)}
                          for k, v in by}}


def write_uncertainty(path: Path, frame: pd.DataFrame, pred: dict[str, np.ndarray],
                      held: pd.Series) -> dict[str, Any]:
    doc = {"levels": [round(x, 2) for x in LEVELS],
           "throughput": throughput_table(frame, pred, held),
           "memory": memory_table(frame, pred, held),
           "coverage": coverage(frame, pred, held)}
    path.write_text("# Written by `python -m tcf_search.calibration.fit --write`; do not edit "
                    "by hand.\n# Quantiles of log(measured / predicted) on held-out rows; read "
                    "by search/uncertainty.py.\n" + yaml.safe_dump(doc, sort_keys=False, width=100,
                                                                   default_flow_style=None))
    print("wrote", path)
    return doc
