"""The MoE stage of the calibration: fitted after the dense terms, on the MoE rows alone.

One physical parameter of the hopper family, on the dgxc-benchmarking Grok-1 H100 rows of the
non-held-out (model, num_gpus) groups: ``all_to_all_bw_ratio``, the EP all-to-all's bandwidth
over the ring collectives' on the same links (the exchange is 25-35% of those rows' step;
relative, so that a cluster's or fabric's network fraction carries over to its all-to-all).
Every other family takes hopper's (no other family has MoE rows to fit; the GB200 Grok-1 rows
test the transfer).

Tried and left out: a grouped-GEMM share of the dense GEMM fraction went to its bound of 1 on
these rows. Grok-1's experts (width 32,768, thousands of tokens each) are as large as dense
GEMMs, so the rows cannot see a grouped-GEMM penalty; the per-expert roofline
(costmodel/moe.py) is the model's only term for fine-grained experts.

Not fitted: ``moe_load_imbalance``. Every MoE row of the measured file ran balanced by
construction (Grok-1: capacity factor 1.0 with padding to capacity, so each expert computes
exactly the mean; the rows' notes say so, and their releases' switches run it:
``moe_pad_to_capacity`` in frameworks.yaml ``release_switches``, with NeMo 2's expert TP), so
the rows cannot see it: it is 1 there, as it is under the force-balanced routing of
Megatron-Bridge's benchmarks.

Idempotent: it starts from fixed priors whatever calibration.yaml holds, and rewrites only its
own keys and the ``MOE_MARK`` part of each family's source. Run alone on the current calibration
with ``python -m tcf_search.calibration.fit --moe-only [--write]``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from costmodel.specs import Efficiency
from tcf_search.calibration.accuracy import regime
from tcf_search.calibration.dataset import Group, predict_groups
from tcf_search.calibration.least_squares import EFF_BOUNDS, fit_efficiency

MOE_PARAMS = ("all_to_all_bw_ratio",)
MOE_BOUNDS = {p: EFF_BOUNDS[p] for p in MOE_PARAMS}
MOE_PRIOR = {"all_to_all_bw_ratio": 1.0}
MOE_MARK = "; MoE terms"


def moe_rows(frame: pd.DataFrame) -> pd.Series:
    """The dgxc-benchmarking Grok-1 rows that are measurements: the rows this stage fits and
    reports.

    The other MoE rows of the measured file are left out, as this stage cannot price them:
    ``megatron-bridge`` (DeepSeek-V3, Qwen3, GPT-OSS: fine-grained experts, whose step their
    releases' dispatcher and fusion switches set, frameworks.yaml ``release_switches``; terms
    they run are not priced (HybridEP's and DeepEP's SM budget), and 25.11's Qwen3-30B is a
    known regression, Megatron-Bridge #1998, 1.9-2.8x over at the prior, so they would steer
    the all-to-all ratio, not measure it) and ``mcore-moe`` (Mixtral 8x7B dropless: MFU only,
    no tokens/s to take a residual of, and dropless routing is not the balanced run that
    ``moe_load_imbalance`` 1 prices)."""
    return (frame["moe_experts"].notna() & frame["status"].eq("ok")
            & frame["source"].eq("dgxc-benchmarking"))


def with_moe_source(eff: Efficiency, text: str) -> Efficiency:
    return replace(eff, source=eff.source.split(MOE_MARK)[0] + MOE_MARK + " " + text)


def fit_moe(frame: pd.DataFrame, groups: list[Group], train: pd.Series,
            effs: dict[str, Efficiency]) -> dict[str, Efficiency]:
    """Every family's efficiency with hopper's MoE terms fitted on the hopper MoE rows of
    ``train``."""
    rows = moe_rows(frame) & train & regime(frame).str.startswith("hopper/")
    start = replace(effs["hopper"], **MOE_PRIOR)  # type: ignore[arg-type]
    hopper, _ = fit_efficiency(frame, groups, rows, "hopper", start, MOE_PARAMS)
    fitted = {p: float(getattr(hopper, p)) for p in MOE_PARAMS}
    print("MoE terms (hopper, on", int(rows.sum()), "Grok-1 rows):",
          {p: round(v, 4) for p, v in fitted.items()}, "bounds", MOE_BOUNDS)
    text = (f"({', '.join(MOE_PARAMS)}) fitted by python -m tcf_search.calibration.fit on "
            f"{int(rows.sum())} dgxc-benchmarking Grok-1 H100 rows of non-held-out groups")
    out = {}
    for family, eff in effs.items():
        own = text if family == "hopper" else "from the hopper fit, " + text
        out[family] = with_moe_source(replace(eff, **fitted), own)  # type: ignore[arg-type]
    return out


def report_moe(frame: pd.DataFrame, groups: list[Group], held: pd.Series,
               effs: dict[str, Efficiency]) -> dict[str, float]:
    """Per MoE row: published, predicted and error, marked by whether it was fitted; the mean
    absolute error on the rows not fitted (held-out hopper groups, every blackwell row)."""
    pred = predict_groups(groups, len(frame), effs)["tokens_per_s_per_gpu"]
    measured = frame["tokens_per_sec_per_gpu"].to_numpy()
    fam = regime(frame)
    rows = np.flatnonzero(moe_rows(frame).to_numpy())
    unfitted: list[float] = []
    fitted: list[float] = []
    for i in rows:
        err = pred[i] / measured[i] - 1
        test = bool(held.iloc[i]) or not fam.iloc[i].startswith("hopper/")
        (unfitted if test else fitted).append(abs(err))
        print(f"  {frame['case_id'].iloc[i]:<42}{measured[i]:>9.0f}{pred[i]:>9.0f}"
              f"{err:>+7.1%}  {'not fitted' if test else 'fitted'}")
    out = {"moe_fitted_mape": float(np.mean(fitted)) if fitted else float("nan"),
           "moe_unfitted_mape": float(np.mean(unfitted)) if unfitted else float("nan"),
           "moe_unfitted_rows": float(len(unfitted))}
    print("MoE rows:", {k: round(v, 4) for k, v in out.items()})
    return out
