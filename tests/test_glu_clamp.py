"""gpt-oss's clamped SwiGLU (``ModelSpec.swiglu_limit``) as Megatron-Core runs it: the eager
clamps and cat in HBM passes, the host's extra wait, the ``moe_act`` recompute running them again;
and the field's ways in (Hugging Face config, study, CSV cell, a release's switches) and out
(the Hugging Face export)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, Plan, SpecError, estimate
from costmodel.compute import layer_times
from costmodel.kernels import kernels_of
from costmodel.moe import D2H_SYNC_S, GLU_CLAMP_ELEMS_PER_F, GLU_CLAMP_OPS
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec
from search.inputs.hf_config import HfConfigError, model_from_hf_config
from search.inputs.presets import get_preset

CLAMPED = get_preset("gpt-oss-20b")
PLAIN = replace(CLAMPED, swiglu_limit=0.0)


def _times(h100: GpuSpec, **plan: object) -> tuple[Any, Any, Any, Any]:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64, framework="megatron")
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8, zero_stage=1, **plan)]))  # type: ignore[arg-type]
    kn = kernels_of(cluster, tr, p)
    return (layer_times(CLAMPED, cluster, tr, p), layer_times(PLAIN, cluster, tr, p), kn, tr)


def test_the_clamps_cost_their_passes_and_one_more_wait(h100: GpuSpec) -> None:
    """Forward: 8 elements per expert-width element of each top-k copy in HBM, and the
    offset's blocking copy (a round trip and the next kernel's issue); backward: the MoE layer's
    twice-the-forward elementwise rule; a dense layer is untouched."""
    clamped, plain, kn, tr = _times(h100)
    per_copy_s = float(kn.tokens[0]) * kn.act / float(kn.hbm)
    passes = CLAMPED.moe_topk * GLU_CLAMP_ELEMS_PER_F * CLAMPED.expert_ffn_hidden * per_copy_s
    wait = D2H_SYNC_S + tr.framework.kernels.host_overhead_s
    assert float(clamped.fwd_moe_s[0] - plain.fwd_moe_s[0]) == pytest.approx(passes + wait)
    assert float(clamped.bwd_moe_s[0] - plain.bwd_moe_s[0]) == pytest.approx(2 * passes)
    assert float(clamped.fwd_dense_s[0]) == float(plain.fwd_dense_s[0])


def test_a_moe_act_recompute_runs_the_clamps_again(h100: GpuSpec) -> None:
    clamped, plain, kn, _ = _times(h100, recompute="selective", recompute_modules=("moe_act",))
    per_copy_s = float(kn.tokens[0]) * kn.act / float(kn.hbm)
    passes = CLAMPED.moe_topk * GLU_CLAMP_ELEMS_PER_F * CLAMPED.expert_ffn_hidden * per_copy_s
    launches = GLU_CLAMP_OPS * h100.efficiency.kernel_overhead_s
    gap = float(clamped.selective_extra_moe_s[0] - plain.selective_extra_moe_s[0])
    assert gap == pytest.approx(passes + launches)
    assert float(clamped.selective_host_moe_s[0]) > float(plain.selective_host_moe_s[0])


def test_a_clamped_plan_is_slower_end_to_end(h100: GpuSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64, framework="megatron")
    plan = Plan(dp=8, ep=8, zero_stage=1)
    slow, fast = estimate(CLAMPED, cluster, plan, tr), estimate(PLAIN, cluster, plan, tr)
    assert slow.step_time_s > fast.step_time_s
    assert slow.compute.model_flops == fast.compute.model_flops  # the clamps add no FLOPs


GPT_OSS_CFG = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
               "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "vocab_size": 201088, "num_local_experts": 32,
               "num_experts_per_tok": 4, "hidden_act": "silu", "attention_bias": True,
               "sliding_window": 128, "rope_theta": 150000, "tie_word_embeddings": False,
               "layer_types": ["sliding_attention", "full_attention"] * 12}


def test_the_hf_config_gives_the_limit() -> None:
    assert model_from_hf_config({**GPT_OSS_CFG, "swiglu_limit": 7.0}).swiglu_limit == 7.0
    assert model_from_hf_config(GPT_OSS_CFG).swiglu_limit == 0.0
    for bad in (-1.0, "7", True):
        with pytest.raises(HfConfigError, match="swiglu_limit: must be a number >= 0"):
            model_from_hf_config({**GPT_OSS_CFG, "swiglu_limit": bad})


def test_the_limit_needs_a_gated_activation() -> None:
    with pytest.raises(SpecError, match="swiglu_limit clamps a gated activation"):
        replace(PLAIN, ffn_type="gelu", swiglu_limit=7.0)
    with pytest.raises(SpecError, match="swiglu_limit"):
        replace(PLAIN, swiglu_limit=-1.0)


def test_a_study_architecture_takes_the_limit() -> None:
    from search.inputs.specs import build_model
    from search.inputs.study import StudyError, parse_study
    text = """
model:
  architecture:
    layers: 4
    hidden: 1024
    ffn_hidden: 1024
    heads: 8
    vocab: 1000
    swiglu_limit: {limit}
    moe: {{experts: 8, topk: 2, ffn_hidden: 512}}
training: {{seq_len: 1024, global_batch: 8}}
cluster: {{gpu: h100-sxm-80gb, gpus: 8}}
"""
    assert build_model(parse_study(text.format(limit=7))).swiglu_limit == 7.0
    with pytest.raises(StudyError, match="swiglu_limit"):
        build_model(parse_study(text.format(limit=-2)))


def test_a_bridge_gpt_oss_row_runs_its_release_clamp() -> None:
    """Megatron-Bridge's GPT-OSS bridge builds activation_func_clamp_value 7.0 (the release's
    model switches); a row's own cell wins."""
    from search.inputs.measured import case_from_row
    row = {"case_id": "x", "source": "megatron-bridge",
           "source_detail": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md "
                            "@067f987d section 26.04.01 DGX-H100",
           "model_name": "GPT OSS 120B", "layers": "36", "hidden": "2880", "ffn_hidden": "2880",
           "heads": "64", "kv_heads": "8", "vocab": "201088", "seq_len": "4096",
           "moe_experts": "128", "moe_topk": "4", "moe_ffn_hidden": "2880",
           "gpu": "h100-sxm-80gb", "gpus_per_node": "8", "num_gpus": "64", "tp": "1", "pp": "4",
           "dp": "16", "ep": "8", "micro_batch": "1", "global_batch": "1280",
           "precision": "bf16", "framework": "nemo"}
    assert case_from_row(row).model.swiglu_limit == 7.0
    assert case_from_row({**row, "swiglu_limit": "5"}).model.swiglu_limit == 5.0


def test_the_hf_export_writes_the_limit_and_no_other_family_claims_it() -> None:
    from tcf_search.export.hf_model import config, family
    assert family(CLAMPED) == "gpt_oss"
    assert config(CLAMPED, 4096)["swiglu_limit"] == 7.0
    assert family(PLAIN) is None  # transformers' gpt_oss always clamps
    llama = get_preset("llama3-8b")
    assert family(llama) == "llama" and family(replace(llama, swiglu_limit=7.0)) is None
