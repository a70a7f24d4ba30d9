"""The framework stack in the uncertainty's regimes: a plan is judged by the held-out residuals of
runs of its own stack (Megatron-Core's profiles are one) where they bound it, then by every
stack's; plan files carry the framework so that explain of a ranked plan gives the run's
interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from search.inputs.planfile import PlanFile, dump_plan_file, parse_plan_file
from search.inputs.specs import plan_file_specs
from search.uncertainty import Uncertainty, interval, regime_keys, residual_stack
from tcf_search.calibration.uncertainty import coverage, throughput_table


@pytest.mark.parametrize("framework,stack", [
    ("generic", "megatron-core"), ("megatron", "megatron-core"), ("megatron-lm", "megatron-core"),
    ("nemo", "megatron-core"), ("megatron-sc21", "megatron-core"), ("nanotron", "nanotron"),
    ("torchtitan", "torchtitan"), ("", "")])
def test_megatron_cores_profiles_are_one_stack(framework: str, stack: str) -> None:
    assert residual_stack(framework) == stack


def test_the_stacks_own_regimes_come_first_then_every_stacks() -> None:
    assert regime_keys("hopper", "bf16", "dense", "small", "nanotron") == [
        "nanotron:hopper/bf16/dense/small", "nanotron:hopper/bf16/dense", "nanotron:hopper/bf16",
        "nanotron:hopper", "hopper/bf16/dense/small", "hopper/bf16/dense", "hopper/bf16",
        "hopper", "all"]
    assert regime_keys("hopper", "bf16", "dense", "small")[0] == "hopper/bf16/dense/small"


def _frame(n_groups: int, framework: str, spread: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame([
        {"model_name": f"{framework}{g}", "num_gpus": 8, "gpu": "h100-sxm-80gb",
         "precision": "bf16", "moe_experts": 0, "source": "x", "status": "ok", "pp": 1,
         "after_pp_fix": False, "framework": framework,
         "tokens_per_sec_per_gpu": 1000.0 * math.exp(rng.normal(0, spread))}
        for g in range(n_groups) for _ in range(2)])


def test_a_tuned_stack_keeps_its_narrow_bounds_beside_a_noisy_one() -> None:
    """Ten groups of Megatron-Core runs within a few percent and twenty of nanotron runs off by
    tens of percent: the Megatron-Core regime's 80% bounds are the narrow ones, the pooled
    regime's the wide ones, and a plan of each stack gets its own."""
    frame = pd.concat([_frame(10, "nemo", 0.03, 1), _frame(20, "nanotron", 0.5, 2)],
                      ignore_index=True)
    pred = {"tokens_per_s_per_gpu": np.full(len(frame), 1000.0)}
    table = throughput_table(frame, pred, pd.Series(True, index=frame.index))
    unc = Uncertainty(throughput=table, memory={})
    tuned = interval(1.0, ("hopper", "bf16", "dense", "small", "megatron-core"), unc=unc)
    noisy = interval(1.0, ("hopper", "bf16", "dense", "small", "nanotron"), unc=unc)
    pooled = interval(1.0, ("hopper", "bf16", "dense", "small", "torchtitan"), unc=unc)
    assert tuned[2] == "megatron-core:hopper/bf16/dense/small"
    assert noisy[2] == "nanotron:hopper/bf16/dense/small"
    assert pooled[2] == "hopper/bf16/dense/small"  # no torchtitan runs: every stack's
    assert tuned[1] - tuned[0] < 0.2 < noisy[1] - noisy[0]
    # each stack's held-out groups judged by the others' bounds, one left out at a time
    cov = coverage(frame, pred, pd.Series(True, index=frame.index))
    assert set(cov["by_stack"]) == {"megatron-core", "nanotron"}
    assert cov["by_stack"]["megatron-core"]["groups"] == 10
    assert cov["by_stack"]["nanotron"]["own_stack_bounds"] == 1.0


def test_a_plan_file_carries_the_framework() -> None:
    from export_plans import golden_plans

    pf = next(iter(golden_plans().values()))
    back = parse_plan_file(dump_plan_file(pf))
    assert back.framework == pf.framework
    named = parse_plan_file(dump_plan_file(PlanFile(**{
        **{f: getattr(pf, f) for f in PlanFile.__dataclass_fields__}, "framework": "nemo"})))
    assert named.framework == "nemo" and plan_file_specs(named).framework == "nemo"
    # files written before the field read as no framework: every stack's residuals
    text = dump_plan_file(named)
    assert "\nframework: nemo\n" in text
    assert parse_plan_file(text.replace("\nframework: nemo\n", "\n")).framework == ""


def test_a_moe_plan_meets_the_moe_groups_residuals_before_dense_pools() -> None:
    """The MoE regime (``MOE_KEY``) answers a MoE plan before any regime that pools it with dense
    models; its bounds are the MoE groups' left out of the MoE fit, regressions apart, each group
    weighing alike, and none where the groups are too few."""
    from search.uncertainty import MOE_KEY
    from tcf_search.calibration.uncertainty import moe_table

    keys = regime_keys("hopper", "bf16", "moe", "large", "megatron-core")
    assert keys.index(MOE_KEY) < keys.index("megatron-core:hopper/bf16")
    assert keys[:keys.index(MOE_KEY)] == [
        "megatron-core:hopper/bf16/moe/large", "megatron-core:hopper/bf16/moe",
        "hopper/bf16/moe/large", "hopper/bf16/moe"]
    assert MOE_KEY not in regime_keys("hopper", "bf16", "dense", "large", "megatron-core")
    # ten groups the model prices 1.0-1.9x too fast (predicted / measured), one regression
    ratios = [1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.7, 1.9]
    logo = pd.DataFrame({"group": [f"g{i}" for i in range(10)] + ["bad"],
                         "ratio": ratios + [5.0], "regression": [False] * 10 + [True]})
    table = moe_table(logo)
    assert table is not None and (table["n"], table["groups"]) == (10, 10)
    unc = Uncertainty(throughput={MOE_KEY: table, "all": {"q": [0.0] * 19}}, memory={})
    lo, hi, key = interval(1000.0, ("hopper", "bf16", "moe", "large", "megatron-core"), unc=unc)
    assert key == MOE_KEY
    assert 1000.0 / 1.9 <= lo < 1000.0 / 1.5 and 1000.0 / 1.1 < hi <= 1000.0  # 5.0 left out
    assert moe_table(logo.iloc[:5]) is None  # five groups cannot bound an 80% interval
