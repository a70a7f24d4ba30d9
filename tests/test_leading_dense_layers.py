"""A MoE model's leading dense layers (DeepSeek-V3's first 3) are the first stage's: that stage
holds their dense MLPs, sharded by the distributed optimizer over data parallel, in place of
routed experts, which a pattern layer holds sharded over their expert-DP replicas only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from costmodel.activation_memory import _layer_bytes, activation_bytes_per_layer
from costmodel.mapping import StageLayers
from costmodel.memory import coefficients, leading_dense_on, stage_memory
from costmodel.params import attention_params, dense_mlp_params, expert_params, norm_params
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.rules import Switches
from hardware_catalog import get_gpu
from search.inputs.planspec import parse_plan
from search.inputs.presets import get_preset
from search.inputs.specs import build_specs, training_spec
from search.inputs.study import load_study

# 12 layers: 2 dense (MLP 4096 wide), then 10 MoE (16 experts of 512, top-2, 1 shared)
MOE = ModelSpec(name="moe", layers=12, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=16,
                vocab=32000, moe_experts=16, moe_topk=2, moe_ffn_hidden=512,
                moe_shared_experts=1, moe_dense_layers=2)
TRAINING = training_for(seq_len=2048, global_batch=64)
CLUSTER = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=16, gpus_per_node=8)


def three_layer_stage(stage: str):  # noqa: ANN201
    """A stage's bytes of MOE on pp 4 (three layers a stage), tp 1, dp 4, ep 4, ZeRO-1."""
    p = as_plan_arrays(plans_to_arrays([Plan(tp=1, pp=4, dp=4, ep=4, zero_stage=1)]))
    co = coefficients(MOE, CLUSTER, TRAINING, p)
    layers = StageLayers(first=np.array([3.0]), middle=np.array([3.0]), last=np.array([3.0]))
    return stage_memory(MOE, TRAINING, p, co, layers, np.array([8.0]), stage)


def test_the_first_stage_holds_the_dense_layers_mlps_and_one_moe_layers_experts() -> None:
    # pp 4 of 12 layers: the first stage holds layers 0-2, dense, dense, MoE
    first = three_layer_stage("first")
    h, E = MOE.hidden, MOE.moe_experts
    attn_norm = attention_params(MOE) + norm_params(MOE)
    shared_router = expert_params(MOE) + h * E
    routed_local = E / 4 * expert_params(MOE)  # ep 4: 4 experts a rank
    embed = MOE.vocab * h
    by_hand = (3 * attn_norm + 2 * dense_mlp_params(MOE) + shared_router + routed_local + embed)
    assert float(first.params[0]) == pytest.approx(by_hand)
    assert leading_dense_on(MOE, "middle", np.array([3.0]))[0] == 0


def test_the_leading_dense_layers_leave_the_other_stages_all_moe() -> None:
    mid = three_layer_stage("middle")
    moe_layer = (attention_params(MOE) + norm_params(MOE) + expert_params(MOE)
                 + MOE.hidden * MOE.moe_experts + MOE.moe_experts / 4 * expert_params(MOE))
    assert float(mid.params[0]) == pytest.approx(3 * moe_layer)


def test_megatron_bridges_deepseek_v3_b200_recipe_fits() -> None:
    """The study's baseline is Megatron-Bridge's 26.04.01 DGX-B200 recipe, which ran (3,328
    tokens/s per GPU published): its first stage holds the 3 dense layers and 5 MoE ones, and
    priced so it fits (181.0 GiB of 176.8 when every layer was priced as 58/61 of a MoE one)."""
    study = load_study("studies/deepseek-v3-b200x256.yaml")
    specs = build_specs(study)
    assert study.baseline is not None
    plan = parse_plan(study.baseline, specs, Switches())
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    assert e.memory.fits


def test_an_interleaved_moe_model_stores_half_a_moe_layer_and_half_a_dense_one() -> None:
    """Llama 4 Maverick's MoE layers every other layer (moe_layer_freq 2): a layer's
    activations average its MoE and dense layers', as its parameters do
    (costmodel.activation_memory.activation_bytes_per_layer), not all MoE."""
    model = get_preset("llama4-maverick")
    assert model.moe_layers * 2 == model.layers
    tr = training_spec(framework="megatron", precision="bf16", seq_len=8192, global_batch=64)
    p = as_plan_arrays(plans_to_arrays([Plan(tp=8, pp=1, dp=1, ep=8, sequence_parallel=True,
                                             recompute="selective")]))
    dense = dataclasses.replace(model, moe_experts=0, moe_topk=0, moe_shared_experts=0,
                                moe_ffn_hidden=0, moe_router=None, moe_layer_freq=1)
    mixed, moe, plain = (activation_bytes_per_layer(model, tr, p), _layer_bytes(model, tr, p),
                         _layer_bytes(dense, tr, p))
    for got, a, b in zip(mixed, moe, plain, strict=True):
        assert float(got[0]) == pytest.approx(0.5 * float(a[0]) + 0.5 * float(b[0]), rel=1e-12)
    assert float(moe[0][0]) > float(mixed[0][0]) > float(plain[0][0])
