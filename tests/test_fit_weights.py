"""The fit's weighing of sources and its choice of llm-foundry rows for a SKU family, on a small
frame made here (no measured data needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tcf_search.calibration.fit import foundry_node_rows
from tcf_search.calibration.least_squares import source_weights


def _frame() -> pd.DataFrame:
    rows = ([("playbook", "h100-sxm-80gb", 8, "ok")] * 6
            + [("llm-foundry", "h100-sxm-80gb", 8, "ok"), ("llm-foundry", "h100-sxm-80gb", 8, "ok"),
               ("llm-foundry", "h100-sxm-80gb", 64, "ok"),  # across nodes: a fabric to assume
               ("llm-foundry", "h100-sxm-80gb", 8, "oom"),
               ("llm-foundry", "a100-sxm-80gb", 8, "ok")])
    return pd.DataFrame(rows, columns=["source", "gpu", "num_gpus", "status"]).assign(
        gpus_per_node=8, precision="bf16", moe_experts=np.nan)


def test_each_source_weighs_as_much_as_another() -> None:
    frame = _frame()
    idx = np.arange(len(frame))
    w = source_weights(frame, idx)
    totals = pd.Series(w ** 2).groupby(frame["source"].to_numpy()).sum()
    assert np.allclose(totals.to_numpy(), totals.iloc[0])
    assert w[0] < w[-1]  # a Playbook row counts for less than one of the smaller source's
    # one source alone: every row as before (the weights are all one)
    assert np.allclose(source_weights(frame, idx[:6]), 1.0)


def test_foundry_rows_are_the_families_ok_runs_within_a_node() -> None:
    frame = _frame()
    assert foundry_node_rows(frame, "hopper").to_numpy().nonzero()[0].tolist() == [6, 7]
    assert foundry_node_rows(frame, "ampere").to_numpy().nonzero()[0].tolist() == [10]
