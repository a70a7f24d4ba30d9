"""Multi-token prediction (costmodel/mtp.py, Megatron-Core's MTP block): it costs time and
memory on the stage that holds the LM head alone, and a model without it is priced as before."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from costmodel_helpers import assert_terms_match_estimate, training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, estimate
from costmodel.mapping import STAGES
from costmodel.mtp import mtp_params
from costmodel.params import model_flops_per_token
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.step import evaluate
from hardware_catalog import get_gpu
from search.inputs.presets import PRESETS

# a small DeepSeek-like MoE model: 2 dense layers, then MoE layers with a shared expert
MOE = ModelSpec(name="moe", layers=12, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=16,
                vocab=32000, moe_experts=16, moe_topk=2, moe_ffn_hidden=512,
                moe_shared_experts=1, moe_dense_layers=2)
DENSE = ModelSpec(name="dense", layers=12, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=8,
                  vocab=32000)
# every schedule, GPipe too (no framework that builds MTP modules runs it), for the terms' sake
TRAINING = training_for(seq_len=2048, global_batch=64,
                        pp_schedules=("1f1b", "gpipe", "interleaved"))
CLUSTER = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=16, gpus_per_node=8)
PLANS = [
    Plan(tp=2, pp=4, dp=2, ep=2, sequence_parallel=True, zero_stage=1),
    Plan(tp=1, pp=4, dp=4, ep=4, vpp=3, zero_stage=1, recompute="selective"),
    Plan(tp=2, pp=2, dp=4, ep=4, sequence_parallel=True, recompute="full",
         first_stage_layers=7, last_stage_layers=5),
    Plan(tp=1, pp=4, dp=4, ep=2, pp_schedule="gpipe", first_stage_layers=4,
         last_stage_layers=1),
]


def _step(model: ModelSpec, plan: Plan):  # type: ignore[no-untyped-def]
    return evaluate(model, CLUSTER, TRAINING, as_plan_arrays(plans_to_arrays([plan])))


@pytest.mark.parametrize("base", [MOE, DENSE], ids=["moe", "dense"])
@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_mtp_adds_memory_on_the_last_stage_only(base: ModelSpec, plan: Plan) -> None:
    without, with_mtp = _step(base, plan), _step(dataclasses.replace(base, mtp_layers=1), plan)
    for stage in ("first", "middle"):
        for part in ("weights", "grads", "optimizer", "activations", "buffers", "overhead"):
            assert getattr(with_mtp.stages[stage], part) == getattr(without.stages[stage], part)
    for part in ("weights", "grads", "optimizer", "activations", "buffers"):
        assert getattr(with_mtp.stages["last"], part) > getattr(without.stages["last"], part)


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_mtp_adds_time_and_model_flops(plan: Plan) -> None:
    without, with_mtp = _step(MOE, plan), _step(dataclasses.replace(MOE, mtp_layers=2), plan)
    assert with_mtp.step_time_s > without.step_time_s
    assert with_mtp.model_flops > without.model_flops
    assert with_mtp.hardware_flops > without.hardware_flops


def test_mtp_paces_the_pipeline_only_where_the_last_stage_is_slowest() -> None:
    """Megatron-Bridge's DeepSeek-V3 layouts give the MTP stage fewer decoder layers: with one
    layer there (4 on the others), the slowest stage's compute is a middle stage's and MTP
    only lengthens the bubble; with nothing pinned (4 layers on the first stage, 3 on the last)
    it lengthens every micro-batch."""
    model = PRESETS["deepseek-v3"]
    without = dataclasses.replace(model, mtp_layers=0)
    cluster = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=1024, gpus_per_node=8)
    training = training_for(seq_len=4096, global_batch=1024)
    short = Plan(tp=2, pp=16, dp=32, ep=64, sequence_parallel=True, zero_stage=1,
                 recompute="full", first_stage_layers=4, last_stage_layers=1)
    even = dataclasses.replace(short, first_stage_layers=0, last_stage_layers=0)
    a, b = (estimate(m, cluster, short, training) for m in (without, model))
    assert b.compute.time_s == pytest.approx(a.compute.time_s, rel=1e-9)
    assert b.step_time_s > a.step_time_s
    c, d = (estimate(m, cluster, even, training) for m in (without, model))
    assert d.compute.time_s > 1.05 * c.compute.time_s


def test_mtp_parameters_on_the_last_stage_by_hand() -> None:
    """DeepSeek-V3, tp 1, ep 64, pp > 1: the MTP layer's dense part (MLA 187.1M, norms 14.3K,
    shared expert 3 x 7168 x 2048 = 44.0M, router 7168 x 256 = 1.8M), eh_proj 2 x 7168^2 =
    102.8M, three norms, and the embedding copy 129,280 x 7168 = 926.7M; its routed experts
    256 / 64 x 44.0M = 176.2M."""
    m = PRESETS["deepseek-v3"]
    from costmodel.params import attention_params

    h = m.hidden
    layer = attention_params(m) + 2 * h + 3 * h * 2048 + h * 256
    p = as_plan_arrays(plans_to_arrays([Plan(tp=1, pp=16, dp=64, ep=64, zero_stage=1)]))
    dense, experts = mtp_params(m, p)
    assert dense[0] == layer + 2 * h * h + 3 * h + 129280 * h
    assert experts[0] == 4 * 3 * h * 2048
    one = as_plan_arrays(plans_to_arrays([Plan(tp=1, pp=1, dp=1024, ep=64, zero_stage=1)]))
    assert mtp_params(m, one)[0][0] == layer + 2 * h * h + 3 * h  # the stage has the embedding


def test_model_flops_follow_megatrons_formula() -> None:
    """megatron/training/training.py num_floating_point_operations: per MTP depth one more layer
    of the last layer's kind, 6 (3h + 2h^2) and 6 h V again."""
    h, V = MOE.hidden, MOE.vocab
    one_more = dataclasses.replace(MOE, layers=MOE.layers + 1)  # one more MoE layer
    layer = model_flops_per_token(one_more, 2048) - model_flops_per_token(MOE, 2048)
    got = model_flops_per_token(dataclasses.replace(MOE, mtp_layers=1), 2048)
    assert got - model_flops_per_token(MOE, 2048) == pytest.approx(
        layer + 6 * (3 * h + 2 * h * h) + 6 * h * V, rel=1e-12)


def test_no_mtp_costs_nothing() -> None:
    p = as_plan_arrays(plans_to_arrays(PLANS))
    dense, experts = mtp_params(MOE, p)
    assert not dense.any() and not experts.any()
    r = _step(MOE, PLANS[0])
    assert np.isfinite(r.step_time_s).all() and set(r.stages) == set(STAGES)


def test_negative_depths_are_refused() -> None:
    with pytest.raises(SpecError, match="model.mtp_layers must be >= 0"):
        dataclasses.replace(MOE, mtp_layers=-1)


@pytest.mark.parametrize("pp,recompute,r,schedule", [
    (1, "none", 0, "1f1b"), (4, "none", 0, "1f1b"), (4, "full", 0, "1f1b"),
    (4, "full", 2, "1f1b"), (2, "selective", 0, "1f1b"), (4, "none", 0, "gpipe")])
def test_the_placements_memory_terms_hold_the_mtp_depths(pp: int, recompute: str, r: int,
                                                         schedule: str) -> None:
    """The CP-SAT stage's linear terms (costmodel.terms) reproduce every stage's bytes with MTP
    on the head's stage."""
    model = dataclasses.replace(MOE, mtp_layers=2)
    plan = Plan(tp=2, pp=pp, dp=16 // (2 * pp), ep=2, recompute=recompute,  # type: ignore[arg-type]
                recompute_layers=r, sequence_parallel=True, zero_stage=1,
                pp_schedule=schedule)  # type: ignore[arg-type]
    assert_terms_match_estimate(model, CLUSTER, plan, TRAINING)
