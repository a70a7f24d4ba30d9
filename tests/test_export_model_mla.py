"""Exports train DeepSeek-V3's latent attention (MLA) and its router: Megatron-Core's
MLATransformerConfig and Megatron-LM's own argument code read the flags back, NeMo keeps its
DeepSeek recipe with the searched sizes, and a format that cannot express latent attention
refuses it with a rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from export_helpers import (
    exported,
    flag_values,
    megatron_kwargs,
    nemo_model_config,
    nemo_overrides,
)
from export_plans import deepseek
from megatron_lm import megatron_lm_reads, megatron_lm_reads_many, source

from tcf_search.export import ExportOptions, ExportRefused, render


def megatron_mla_config(files: dict[str, str], **extra: Any
                        ) -> tuple[Any, dict[str, str | bool]]:
    tc, flags, kw = megatron_kwargs(files)
    kw |= extra
    kw |= {"q_lora_rank": int(str(flags["--q-lora-rank"])),
           "kv_lora_rank": int(str(flags["--kv-lora-rank"])),
           "qk_head_dim": int(str(flags["--qk-head-dim"])),
           "qk_pos_emb_head_dim": int(str(flags["--qk-pos-emb-head-dim"])),
           "v_head_dim": int(str(flags["--v-head-dim"])),
           "qk_layernorm": bool(flags.get("--qk-layernorm")),
           "rope_type": flags["--rope-type"],
           "rotary_scaling_factor": float(str(flags["--rotary-scaling-factor"])),
           "mscale": float(str(flags["--mscale"])),
           "mscale_all_dim": float(str(flags["--mscale-all-dim"])),
           "moe_shared_expert_intermediate_size": int(str(
               flags["--moe-shared-expert-intermediate-size"])),
           "moe_router_score_function": flags["--moe-router-score-function"],
           "moe_router_num_groups": int(str(flags["--moe-router-num-groups"])),
           "moe_router_group_topk": int(str(flags["--moe-router-group-topk"])),
           "moe_router_topk_scaling_factor": float(str(
               flags["--moe-router-topk-scaling-factor"])),
           "moe_router_enable_expert_bias": bool(flags.get("--moe-router-enable-expert-bias")),
           "num_query_groups": None}
    return tc.MLATransformerConfig(**kw), flags


# --- latent attention ----------------------------------------------------------------------------

def test_deepseek_v3_recompute_modules_read_back() -> None:
    """The paper's own selective recompute (RMSNorm and MLA up-projections, as the shipped study
    names them) exported as --recompute-modules, which MLATransformerConfig accepts only beside
    latent attention (and moe_act only beside --moe-grouped-gemm)."""
    pf = deepseek()
    training = pf.training.with_switches(recompute_modules=("layernorm", "mla_up_proj"))
    pf = dataclasses.replace(pf, training=training,
                             plan=dataclasses.replace(pf.plan, recompute="selective"))
    files = render("megatron", pf)
    modules = flag_values(files["megatron.sh"], "pretrain_gpt.py", "--recompute-modules")
    cfg, flags = megatron_mla_config(files, recompute_modules=modules,
                                     moe_grouped_gemm=True)
    assert flags["--recompute-granularity"] == "selective" and "--moe-grouped-gemm" in flags
    assert cfg.recompute_granularity == "selective"
    assert list(cfg.recompute_modules) == ["layernorm", "mla_up_proj"]


def test_a_plans_own_modules_are_exported_and_read_back() -> None:
    """A plan naming its own set (the search's recompute_modules axis) under a training that
    keeps Megatron-Core's default: Megatron-LM's --recompute-modules and NeMo's
    model.recompute_modules carry the plan's, which MLATransformerConfig accepts."""
    pf = deepseek()
    assert pf.training.framework.activations.recompute_modules == ("core_attn",)
    pf = dataclasses.replace(pf, plan=dataclasses.replace(
        pf.plan, recompute="selective", recompute_modules=("layernorm", "mla_up_proj")))
    files = render("megatron", pf)
    modules = flag_values(files["megatron.sh"], "pretrain_gpt.py", "--recompute-modules")
    assert modules == ["layernorm", "mla_up_proj"]
    cfg, _ = megatron_mla_config(files, recompute_modules=modules, moe_grouped_gemm=True)
    assert (cfg.recompute_granularity, list(cfg.recompute_modules)) == (
        "selective", ["layernorm", "mla_up_proj"])
    nemo = nemo_model_config(render("nemo", pf))
    assert list(nemo.recompute_modules) == ["layernorm", "mla_up_proj"]


def test_deepseek_v3_megatron_reads_back_mla() -> None:
    pf = deepseek()
    cfg, flags = megatron_mla_config(render("megatron", pf))
    a, s = pf.model.mla, pf.model.rope_scaling
    assert a is not None and s is not None
    assert cfg.multi_latent_attention and cfg.qk_layernorm  # DeepSeek's normed latents
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim,
            cfg.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (cfg.rope_type, cfg.rotary_scaling_factor, cfg.mscale, cfg.mscale_all_dim) == (
        "yarn", 40.0, 1.0, 1.0)
    # the correction range is MLATransformerConfig's default, which the rules checked
    assert (cfg.original_max_position_embeddings, cfg.beta_fast, cfg.beta_slow) == (
        s.original_max_position_embeddings, s.beta_fast, s.beta_slow)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size,
            cfg.moe_shared_expert_intermediate_size) == (256, 8, 2048, 2048)
    assert flags["--moe-layer-freq"] == "([0]*3+[1]*58)"
    # DeepSeek-V3's router: sigmoid scores, top-8 within 4 of 8 groups, x2.5, balancing bias
    assert (cfg.moe_router_score_function, cfg.moe_router_num_groups, cfg.moe_router_group_topk,
            cfg.moe_router_topk_scaling_factor, cfg.moe_router_enable_expert_bias) == (
        "sigmoid", 8, 4, 2.5, True)
    assert "--group-query-attention" not in flags  # validate_args: exclusive with MLA
    assert (cfg.tensor_model_parallel_size, cfg.expert_model_parallel_size) == (8, 64)
    assert flags["--mtp-num-layers"] == "1" and cfg.mtp_num_layers == 1  # the MTP module


def test_deepseek_v3_megatron_lm_parses_and_validates() -> None:
    pf = deepseek()
    got = megatron_lm_reads(render("megatron", pf)["megatron.sh"], pf.num_gpus, [
        "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
        "rope_type", "rotary_scaling_factor", "moe_layer_freq", "num_moe_experts",
        "qk_layernorm", "moe_router_num_groups", "moe_router_group_topk",
        "moe_router_score_function", "moe_router_enable_expert_bias", "mtp_num_layers"])
    assert got["config_class"] == "MLATransformerConfig"
    assert got["mtp_num_layers"] == 1
    assert (got["q_lora_rank"], got["kv_lora_rank"], got["qk_head_dim"],
            got["qk_pos_emb_head_dim"], got["v_head_dim"]) == (1536, 512, 128, 64, 128)
    assert (got["rope_type"], got["rotary_scaling_factor"]) == ("yarn", 40.0)
    assert got["moe_layer_freq"] == [0] * 3 + [1] * 58 and got["qk_layernorm"]
    assert (got["moe_router_num_groups"], got["moe_router_group_topk"],
            got["moe_router_score_function"], got["moe_router_enable_expert_bias"]) == (
        8, 4, "sigmoid", True)


def test_megatron_lm_accepts_every_export(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Megatron-LM's own parse_args, validate_args and config over every shipped study's top
    plans and the golden plans (with MEGATRON_LM_SRC; the search runs only then)."""
    source()
    from export_plans import golden_plans, study_top_plans
    plans = {**golden_plans(), **study_top_plans(tmp_path_factory.mktemp("studies"))}
    runs = [(name, pf, files["megatron.sh"]) for name, pf, files in exported(plans, "megatron")]
    got = megatron_lm_reads_many([(text, pf.num_gpus) for _, pf, text in runs], [
        "num_layers", "hidden_size", "num_attention_heads", "tensor_model_parallel_size",
        "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"])
    for (name, pf, _), cfg in zip(runs, got, strict=True):
        assert "error" not in cfg, (name, cfg.get("error"))
        m, p = pf.model, pf.plan
        assert (cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (
            m.layers, m.hidden, m.heads), name
        assert (cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"],
                cfg["virtual_pipeline_model_parallel_size"] or 1) == (p.tp, p.pp, p.vpp), name


def test_deepseek_v3_nemo_uses_its_recipe_with_the_searched_sizes() -> None:
    files = render("nemo", deepseek())
    cfg, o = nemo_model_config(files), nemo_overrides(files)
    assert "--recipe deepseek_v3_pretrain_config" in files["nemo.sh"]
    assert type(cfg).__name__ == "MLATransformerConfig"
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.v_head_dim) == (
        1536, 512, 128, 128)
    assert (cfg.rope_type, cfg.rotary_scaling_factor, cfg.mscale_all_dim) == ("yarn", 40.0, 1.0)
    # the searched model's MTP depth (the preset's, which is the recipe's default), not the
    # recipe's own pipeline layout
    assert o["model.mtp_num_layers"] == "1" and cfg.mtp_num_layers == 1
    assert o["model.pipeline_model_parallel_layout"] == "null"
    assert (cfg.moe_router_score_function, cfg.moe_router_num_groups,
            cfg.moe_router_group_topk, cfg.moe_router_enable_expert_bias) == (
        "sigmoid", 8, 4, True)


@pytest.mark.parametrize("fmt", ["torchtitan", "nanotron"])
def test_formats_without_latent_attention_refuse_it(fmt: str) -> None:
    with pytest.raises(ExportRefused, match="latent attention"):
        render(fmt, deepseek())


def test_an_mla_model_on_a_non_deepseek_recipe_is_refused() -> None:
    with pytest.raises(ExportRefused, match="MLATransformerConfig"):
        render("nemo", deepseek(), ExportOptions(nemo_recipe="llama3_70b_pretrain_config"))
