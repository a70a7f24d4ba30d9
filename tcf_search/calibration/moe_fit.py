"""The MoE stage of the calibration: fitted after the dense terms, on the MoE rows alone.

One physical parameter of the hopper family, on the H100 MoE rows (:func:`moe_rows`) of the
non-held-out (model, num_gpus) groups: ``all_to_all_bw_ratio``, the EP all-to-all's bandwidth
over the ring collectives' on the same links (relative, so that a cluster's or fabric's network
fraction carries over to its all-to-all). Megatron-Core's alltoall dispatcher sends every top-k
copy of a token to its expert's rank (token_dispatcher.py MoEAlltoAllTokenDispatcher through
torch.distributed.all_to_all_single: one ncclSend and ncclRecv per peer in a group, no
deduplication), the bytes costmodel/parallel/expert.py prices. Grok-1's EP 8 at expert TP 4
spans four nodes as Qwen3-235B's EP 32 does, so both measure mostly the network's all-to-all;
the one ratio fits NeMo's DGX Cloud rows (fabric unnamed: the family's fitted network fraction)
and Megatron-Bridge's DGX-H100 rows (InfiniBand) alike: left-out fits of each model x GPU group
give 0.779-0.799.

Every other family takes hopper's: the blackwell MoE rows (Megatron-Bridge's B200, NeMo's
GB200 Grok-1) are not fitted and test the transfer.

Left out of the fit and reported apart: the rows of a release its maintainers call a regression
(:data:`BRIDGE_REGRESSIONS`).

Tried and left out, as the rows cannot identify them:

* a half-size of the routed experts' GEMMs of their own (the smallest dimension at which
  Transformer Engine's GroupedLinear, one GEMM per local expert, reaches half its headroom):
  fitted with the ratio it came to 376, but left-out fits gave 16 (its bound) without GPT-OSS
  H100, 2,060 without Grok-1, 253 without Qwen3-30B: it only followed GPT-OSS's residual, whose
  term is elsewhere (docs/cost-model.md). Before, a share of the dense GEMM fraction went to its
  bound of 1 on Grok-1, whose experts (32,768 wide) are as large as dense GEMMs.
* the flex (DeepEP / HybridEP) fractions: one H100 row runs flex across nodes (Qwen3-30B
  26.04.01), which cannot tell them from its other terms; they stay DeepEP's published figures
  (costmodel/hardware.py).
* ``moe_load_imbalance``: every MoE row ran balanced by construction (Grok-1: capacity factor
  1.0 with padding, ``moe_pad_to_capacity`` in its release's switches; Megatron-Bridge:
  ``moe_router_force_load_balancing``), so it is 1 there.

Idempotent: it starts from fixed priors whatever calibration.yaml holds, and rewrites only its
own keys and the ``MOE_MARK`` part of each family's source. Run alone on the current calibration
with ``python -m tcf_search.calibration.fit --moe-only [--write]``; both print each model x GPU
group's error with that group left out of the fit (:func:`leave_group_out`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from costmodel.specs import Efficiency
from hardware_catalog.frameworks import release_key
from tcf_search.calibration.accuracy import regime
from tcf_search.calibration.dataset import Group, predict_groups
from tcf_search.calibration.least_squares import EFF_BOUNDS, fit_efficiency

MOE_PARAMS = ("all_to_all_bw_ratio",)
MOE_BOUNDS = {p: EFF_BOUNDS[p] for p in MOE_PARAMS}
MOE_PRIOR = {"all_to_all_bw_ratio": 1.0}  # NCCL's ring figures as they are
MOE_MARK = "; MoE terms"
MOE_SOURCES = ("dgxc-benchmarking", "megatron-bridge")

# Megatron-Bridge releases (release, system, model) its maintainers call a regression; their
# rows are kept out of the fit and reported apart (benchmarks/published_runs.py tells the
# story). #1998 (open, 2026-01-20): "2X slower performance in QWEN3 30B on H100 and B200 with the
# dropless schedule ... the perf in 25.11 is 2X slower than 25.09". #1705 (Qwen3-235B B200
# MXFP8), fixed by PR #1760 (2025-12-17): "MXFP8 step time improved from 20.1s to 16.9s ...
# Disable moe_a2a_overlap due to CPU overhead ... Disable VP for mxfp8": the 25.11 table's row
# (PP 8 VP 2, A2A overlap) steps in 20.05 s, the regressed recipe's 20.1.
BRIDGE_REGRESSIONS = {
    ("25.11", "DGX-H100", "qwen3-30b-a3b"): "Megatron-Bridge #1998",
    ("25.11", "DGX-B200", "qwen3-30b-a3b"): "Megatron-Bridge #1998",
    ("25.11", "DGX-B200", "qwen3-235b-a22b"): "Megatron-Bridge #1705",
}


def regression_rows(frame: pd.DataFrame) -> pd.Series:
    """Megatron-Bridge rows of a release in :data:`BRIDGE_REGRESSIONS`."""
    keys = {" ".join(k) for k in BRIDGE_REGRESSIONS}
    rk = [release_key(str(d), str(m)) for d, m in zip(frame["source_detail"].fillna(""),
                                                       frame["model_name"].fillna(""),
                                                       strict=True)]
    return frame["source"].eq("megatron-bridge") & pd.Series(rk, index=frame.index).isin(keys)


def moe_rows(frame: pd.DataFrame) -> pd.Series:
    """The MoE rows this stage fits and reports: measured tokens/s of NVIDIA's DGX Cloud tables
    (Grok-1) and Megatron-Bridge's performance tables (DeepSeek-V3, Qwen3, GPT-OSS), each run
    with its release's switches (frameworks.yaml ``release_switches``), less the regressions.

    ``mcore-moe`` (Mixtral 8x7B dropless) is left out: MFU only, no tokens/s to take a residual
    of, and dropless routing is not the balanced run that ``moe_load_imbalance`` 1 prices."""
    return (frame["moe_experts"].notna() & frame["status"].eq("ok")
            & frame["source"].isin(MOE_SOURCES) & frame["tokens_per_sec_per_gpu"].gt(0)
            & ~regression_rows(frame))


def moe_group(frame: pd.DataFrame) -> pd.Series:
    """The hold-out unit of the MoE rows: model x GPU (a model's releases and scales together)."""
    model = frame["model_name"].astype(str).str.replace(r"\s*\(.*?\)", "", regex=True)
    return model + " | " + frame["gpu"].astype(str)


def with_moe_source(eff: Efficiency, text: str) -> Efficiency:
    return replace(eff, source=eff.source.split(MOE_MARK)[0] + MOE_MARK + " " + text)


def _fit_hopper(frame: pd.DataFrame, groups: list[Group], rows: pd.Series,
                hopper: Efficiency) -> dict[str, float]:
    rows = rows & regime(frame).str.startswith("hopper/")
    start = replace(hopper, **MOE_PRIOR)  # type: ignore[arg-type]
    eff, _ = fit_efficiency(frame, groups, rows, "hopper", start, MOE_PARAMS)
    return {p: float(getattr(eff, p)) for p in MOE_PARAMS}


def _with_terms(effs: dict[str, Efficiency], fitted: dict[str, float]) -> dict[str, Efficiency]:
    return {f: replace(e, **fitted) for f, e in effs.items()}  # type: ignore[arg-type]


def fit_moe(frame: pd.DataFrame, groups: list[Group], train: pd.Series,
            effs: dict[str, Efficiency]) -> dict[str, Efficiency]:
    """Every family's efficiency with hopper's MoE terms fitted on the hopper MoE rows of
    ``train``."""
    rows = moe_rows(frame) & train
    fitted = _fit_hopper(frame, groups, rows, effs["hopper"])
    n = int((rows & regime(frame).str.startswith("hopper/")).sum())
    print(f"MoE terms (hopper, on {n} rows):", {p: round(v, 4) for p, v in fitted.items()},
          "bounds", MOE_BOUNDS)
    for p, v in fitted.items():
        lo, hi = MOE_BOUNDS[p]
        if not lo * 1.01 < v < hi * 0.99:
            print(f"  {p} at its bound: a term the model lacks carries the error")
    text = (f"({', '.join(MOE_PARAMS)}) fitted by python -m tcf_search.calibration.fit on {n} "
            "H100 MoE rows of non-held-out groups (dgxc-benchmarking Grok-1, Megatron-Bridge "
            "DeepSeek-V3/Qwen3/GPT-OSS less acknowledged regressions)")
    out = {}
    for family, eff in _with_terms(effs, fitted).items():
        own = text if family == "hopper" else "from the hopper fit, " + text
        out[family] = with_moe_source(eff, own)
    return out


def leave_group_out(frame: pd.DataFrame, groups: list[Group], train: pd.Series,
                    effs: dict[str, Efficiency]) -> pd.DataFrame:
    """Each MoE row's predicted / measured with its model x GPU group out of the fit: hopper's
    groups refitted without it, every other family's (never fitted) under the full fit. The
    regression rows are predicted too, under the full fit, and flagged."""
    measured = frame["tokens_per_sec_per_gpu"].to_numpy()
    fitted_rows = moe_rows(frame) & train
    hop = regime(frame).str.startswith("hopper/")
    full = _fit_hopper(frame, groups, fitted_rows, effs["hopper"])
    shown = (moe_rows(frame) | (regression_rows(frame) & frame["tokens_per_sec_per_gpu"].gt(0)))
    group = moe_group(frame)
    ratio = np.full(len(frame), np.nan)
    base = predict_groups(groups, len(frame), _with_terms(effs, full))["tokens_per_s_per_gpu"]
    ratio[shown.to_numpy()] = base[shown.to_numpy()] / measured[shown.to_numpy()]
    for g in sorted(set(group[fitted_rows & hop])):
        out = (group == g).to_numpy()
        terms = _fit_hopper(frame, groups, fitted_rows & (group != g), effs["hopper"])
        pred = predict_groups(groups, len(frame), _with_terms(effs, terms))
        sel = out & shown.to_numpy()
        ratio[sel] = pred["tokens_per_s_per_gpu"][sel] / measured[sel]
    idx = np.flatnonzero(shown.to_numpy())
    return pd.DataFrame({"case_id": frame["case_id"].to_numpy()[idx],
                         "group": group.to_numpy()[idx], "ratio": ratio[idx],
                         "regression": regression_rows(frame).to_numpy()[idx]})


def report_moe(frame: pd.DataFrame, groups: list[Group], held: pd.Series,
               effs: dict[str, Efficiency]) -> dict[str, float]:
    """Per MoE row: published, predicted and error, marked by whether it was fitted; the mean
    absolute error on the rows not fitted (held-out hopper groups, every blackwell row); and
    each model x GPU group's median error with the group left out of the fit."""
    pred = predict_groups(groups, len(frame), effs)["tokens_per_s_per_gpu"]
    measured = frame["tokens_per_sec_per_gpu"].to_numpy()
    fam = regime(frame)
    regress = regression_rows(frame).to_numpy()
    rows = np.flatnonzero((moe_rows(frame) | regression_rows(frame)).to_numpy())
    unfitted: list[float] = []
    fitted: list[float] = []
    for i in rows:
        err = pred[i] / measured[i] - 1
        test = bool(held.iloc[i]) or not fam.iloc[i].startswith("hopper/")
        if regress[i]:
            label = "regression, not fitted"
        else:
            (unfitted if test else fitted).append(abs(err))
            label = "not fitted" if test else "fitted"
        print(f"  {frame['case_id'].iloc[i]:<42}{measured[i]:>9.0f}{pred[i]:>9.0f}"
              f"{err:>+7.1%}  {label}")
    out = {"moe_fitted_mape": float(np.mean(fitted)) if fitted else float("nan"),
           "moe_unfitted_mape": float(np.mean(unfitted)) if unfitted else float("nan"),
           "moe_unfitted_rows": float(len(unfitted))}
    print("MoE rows:", {k: round(v, 4) for k, v in out.items()})
    logo = leave_group_out(frame, groups, ~held, effs)
    logo["ape"] = (logo["ratio"] - 1).abs()
    print("MoE groups left out of the fit (model | GPU: rows, median APE, predicted/measured):")
    for g, part in logo[~logo["regression"]].groupby("group"):
        print(f"  {g:<36}{len(part):>3}  {part['ape'].median():6.1%}  "
              + " ".join(f"{r:.2f}" for r in part["ratio"]))
    for _, r in logo[logo["regression"]].iterrows():
        print(f"  {r['group']:<36}  1  {r['ape']:6.1%}  {r['ratio']:.2f} {r['case_id']} "
              "(acknowledged regression, apart)")
    kept = logo[~logo["regression"]]
    out["moe_group_median_ape"] = float(kept.groupby("group")["ape"].median().median())
    out["moe_row_median_ape"] = float(kept["ape"].median())
    print("MoE left-out figures:", {k: round(v, 4) for k, v in out.items()
                                    if k.startswith("moe_group") or k.startswith("moe_row")})
    return out
