"""The fp8 copies of the weights a stack keeps (``costmodel.memory.fp8_weight_bytes``): Transformer
Engine's cached cast of a bf16 weight, its transpose on a GPU whose fp8 GEMMs take only the TN
layout (``GpuSpec.fp8_weight_copy_bytes``), whole under Megatron-FSDP, and none where each GEMM
casts its weight afresh (llm-foundry's plain te.Linear calls), which pays the cast in time."""

from __future__ import annotations

from typing import Any

import pytest
from costmodel_helpers import assert_terms_match_estimate, training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from hardware_catalog import get_gpu

MODEL = ModelSpec(layers=8, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000)
H100 = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=8)
TRAIN: dict[str, Any] = {"seq_len": 4096, "global_batch": 8}


def _weights(framework: str, plan: Plan, cluster: ClusterSpec = H100, **switches: object) -> float:
    tr = training_for(framework, precision="fp8", **TRAIN, **switches)
    return estimate(MODEL, cluster, plan, tr).memory.stages[0].weights_bytes


def _bf16_weights(framework: str, plan: Plan) -> float:
    est = estimate(MODEL, H100, plan, training_for(framework, **TRAIN))
    return est.memory.stages[0].weights_bytes


def test_megatron_fsdp_keeps_the_cached_cast_whole() -> None:
    """Under ZeRO-3 the bf16 weights are sharded eight ways but Transformer Engine's cached fp8
    copy (data and transpose on H100: two bytes) is of the gathered weight: it does not shrink."""
    sharded = Plan(dp=8, zero_stage=3)
    bf16 = _bf16_weights("megatron", sharded)  # 2 bytes / 8 a parameter
    assert _weights("megatron", sharded) == pytest.approx(bf16 + 2 * 8 * bf16 / 2)
    # fp8 weights are the copy itself: an fp8 shard, the transposes built after each gather
    assert _weights("megatron", sharded, fp8_param_gather=True) == pytest.approx(bf16 / 2)
    tr = training_for("megatron", precision="fp8", **TRAIN)
    assert_terms_match_estimate(MODEL, H100, sharded, tr)


def test_a_stack_that_casts_each_gemm_keeps_no_copy_and_pays_the_cast() -> None:
    plan = Plan(dp=8, zero_stage=1)
    assert _weights("llm-foundry", plan) == pytest.approx(_bf16_weights("llm-foundry", plan))
    assert _weights("megatron", plan) == pytest.approx(2 * _bf16_weights("megatron", plan))
    cached = training_for("llm-foundry", precision="fp8", fp8_weight_cache=True, **TRAIN)
    fresh = training_for("llm-foundry", precision="fp8", **TRAIN)
    assert estimate(MODEL, H100, plan, fresh).step_time_s > estimate(MODEL, H100, plan,
                                                                     cached).step_time_s


def test_blackwell_keeps_no_transpose() -> None:
    """B200's fp8 GEMMs take any layout (SM 10.0): the cached copy is the fp8 data alone."""
    b200 = ClusterSpec(gpu=get_gpu("b200-180gb"), num_gpus=8)
    plan = Plan(dp=8, zero_stage=1)
    assert _weights("megatron", plan, b200) == pytest.approx(
        1.5 * estimate(MODEL, b200, plan, training_for("megatron", **TRAIN)
                       ).memory.stages[0].weights_bytes)
