"""Exports train the searched model: latent attention (DeepSeek-V3), RoPE scaling (Llama 3.1) and,
for DeepSpeed and Accelerate, the architecture written beside their configs, each read back by
the launcher's own config code; a format that cannot express a model refuses it with a rule.

Over every preset: each format accepts a plain plan of the model and reads it back, or refuses
it naming the rule (never silently another model).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from megatron_lm import megatron_lm_reads, megatron_lm_reads_many, source
from test_export_roundtrip import (
    exported,
    launcher_flags,
    nemo_model_config,
    nemo_overrides,
    titan_config,
    transformer_config_kwargs,
)

from costmodel import Plan, SpecError, Training, check_plan, rules
from costmodel.layer_style import LLAMA31_ROPE_SCALING
from hardware_catalog.catalog import get_gpu
from search.hf_config import model_from_hf_config
from search.placement import Subproblem, solve_many
from search.planfile import PlanFile, dump_plan_file, parse_plan_file
from search.presets import PRESETS, get_preset
from search.prune import solve_placement
from search.specs import cluster_spec, training_spec
from tcf_search.export import ExportOptions, ExportRefused, render
from tcf_search.export.hf_model import family
from tcf_search.export.options import TARGETS
from tcf_search.export.view import facts_of

GPU = "h100-sxm-80gb"


def plan_file(model: str, plan: Plan, gpus: int, batch: int, seq: int = 4096,
              framework: str = "megatron") -> PlanFile:
    training = training_spec(framework=framework, precision="bf16", seq_len=seq,
                             global_batch=batch)
    return PlanFile(study=f"{model}-check", model=get_preset(model), gpu=GPU, num_gpus=gpus,
                    gpus_per_node=8, training=training, plan=plan)


def deepseek() -> PlanFile:
    """DeepSeek-V3 on 2,048 GPUs: TP 8 with sequence parallelism, EP 64 over the data ranks."""
    plan = Plan(tp=8, pp=1, dp=256, ep=64, zero_stage=1, sequence_parallel=True,
                recompute="full")
    return plan_file("deepseek-v3", plan, 2048, 15360)


def llama31(pp: int = 4) -> PlanFile:
    plan = Plan(tp=8, pp=pp, dp=64 // pp, zero_stage=1, sequence_parallel=True,
                recompute="selective")
    return plan_file("llama3.1-70b", plan, 512, 512, seq=8192)


def megatron_mla_config(files: dict[str, str]) -> tuple[Any, dict[str, str | bool]]:
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
    kw = transformer_config_kwargs(flags, torch)
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


# --- RoPE scaling --------------------------------------------------------------------------------

def llama3_inv_freq(dim: int, theta: float) -> np.ndarray:
    """Llama 3.1's scaled inverse frequencies from its config.json (factor 8, low_freq_factor
    1, high_freq_factor 4, original_max_position_embeddings 8192), restated here."""
    s = LLAMA31_ROPE_SCALING
    freqs = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * math.pi / freqs
    low, high = (s.original_max_position_embeddings / s.low_freq_factor,
                 s.original_max_position_embeddings / s.high_freq_factor)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    mid = (1 - smooth) * freqs / s.factor + smooth * freqs
    return np.where(wavelen > low, freqs / s.factor, np.where(wavelen < high, freqs, mid))


def test_llama31_megatron_reads_back_rope_scaling() -> None:
    pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    rope = pytest.importorskip("megatron.core.models.common.embeddings.rotary_pos_embedding",
                               reason="megatron-core not installed (extra: export-check)")
    flags = launcher_flags(render("megatron", llama31())["megatron.sh"], "pretrain_gpt.py")
    assert flags["--use-rope-scaling"] is True and float(str(flags["--rope-scaling-factor"])) == 8
    # the frequencies Megatron-Core computes from those flags are Llama 3.1's
    emb = rope.RotaryEmbedding(kv_channels=128, rotary_percent=1.0, rotary_base=500000,
                               rope_scaling=True, rope_scaling_factor=8.0,
                               use_cpu_initialization=True)
    np.testing.assert_allclose(emb.inv_freq.double().numpy(), llama3_inv_freq(128, 500000.0),
                               rtol=1e-5)
    plain = render("megatron", dataclasses.replace(llama31(), model=get_preset("llama3-70b")))
    assert "--use-rope-scaling" not in plain["megatron.sh"]


def test_llama31_megatron_lm_parses_and_validates() -> None:
    pf = llama31()
    got = megatron_lm_reads(render("megatron", pf)["megatron.sh"], pf.num_gpus,
                            ["use_rope_scaling", "rope_scaling_factor", "num_layers"])
    assert (got["use_rope_scaling"], got["rope_scaling_factor"], got["num_layers"]) == (
        True, 8.0, 80)


def test_llama31_torchtitan_reads_back_rope_scaling(tmp_path: Path) -> None:
    cfg = titan_config(render("torchtitan", llama31()), tmp_path)
    r = cfg.model_spec.model.layers[0].attention.rope
    assert (r.scaling, r.scaling_factor, r.low_freq_factor, r.high_freq_factor,
            r.original_max_position_embeddings, r.theta) == ("llama", 8.0, 1.0, 4.0, 8192,
                                                             500000.0)
    plain = dataclasses.replace(llama31(), model=get_preset("llama3-70b"))
    assert titan_config(render("torchtitan", plain), tmp_path
                        ).model_spec.model.layers[0].attention.rope.scaling == "none"


def test_torchtitan_0_2_trains_llama31_scaling_only() -> None:
    v02 = ExportOptions(target_version="0.2")
    assert 'flavor = "70B"' in render("torchtitan", llama31(), v02)["torchtitan.toml"]
    with pytest.raises(ExportRefused, match="always scale RoPE as Llama 3.1"):
        render("torchtitan", dataclasses.replace(llama31(), model=get_preset("llama3-70b")), v02)


def test_llama31_nemo_sets_the_providers_rope_scaling() -> None:
    o = nemo_overrides(files := render("nemo", llama31()))
    assert "--recipe llama31_70b_pretrain_config" in files["nemo.sh"]
    assert (o["model.rope_scaling"], o["model.rope_scaling_factor"]) == ("true", "8.0")
    plain = nemo_overrides(render("nemo", dataclasses.replace(
        llama31(), model=get_preset("llama3-70b"))))
    assert plain["model.rope_scaling"] == "false"


def test_nanotron_refuses_rope_scaling_it_would_not_apply() -> None:
    with pytest.raises(ExportRefused, match="never reads it"):
        render("nanotron", llama31(pp=1))


def test_hf_configs_carry_rope_scaling() -> None:
    llama = model_from_hf_config({
        "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
        "rope_theta": 500000.0, "rope_scaling": {
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}})
    assert llama.rope_scaling == LLAMA31_ROPE_SCALING
    assert get_preset("llama3.1-405b").rope_scaling == LLAMA31_ROPE_SCALING
    assert get_preset("llama3-70b").rope_scaling is None
    v3 = model_from_hf_config({
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "intermediate_size": 18432, "vocab_size": 129280, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
        "routed_scaling_factor": 2.5, "rope_scaling": {
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})
    preset = get_preset("deepseek-v3")
    assert (v3.mla, v3.rope_scaling, v3.moe_router) == (
        preset.mla, preset.rope_scaling, preset.moe_router)


def test_plan_files_keep_latent_attention_and_rope_scaling() -> None:
    pf = deepseek()
    back = parse_plan_file(dump_plan_file(pf))
    assert back.model == pf.model and back.model.mla == pf.model.mla


# --- DeepSpeed and Accelerate: the model beside the config ---------------------------------------

def hf_config(files: dict[str, str], folder: Path) -> Any:
    transformers = pytest.importorskip("transformers",
                                       reason="transformers not installed (extra: export-check)")
    (folder / "config.json").write_text(files["config.json"])
    return transformers.AutoConfig.from_pretrained(str(folder))


@pytest.mark.parametrize("fmt", ["deepspeed", "accelerate"])
def test_deepseek_v3_config_json_reads_back_mla(fmt: str, tmp_path: Path) -> None:
    pf = deepseek()
    # DeepSpeed runs MoE models at ZeRO-1/2 only (the moe_zero rule); Accelerate's FSDP at 3
    zero = 2 if fmt == "deepspeed" else 3
    # transformers' DeepseekV3ForCausalLM builds no MTP module (DeepSpeed's profile refuses one)
    pf = dataclasses.replace(pf, plan=Plan(tp=1, pp=1, dp=2048, zero_stage=zero),
                             model=dataclasses.replace(pf.model, mtp_layers=0),
                             training=dataclasses.replace(pf.training, global_batch=16384))
    files = render(fmt, pf)
    cfg = hf_config(files, tmp_path)
    assert cfg.model_type == "deepseek_v3"
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
            cfg.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts,
            cfg.moe_intermediate_size, cfg.first_k_dense_replace) == (256, 8, 1, 2048, 3)
    assert (cfg.rope_parameters["rope_type"], cfg.rope_parameters["factor"]) == ("yarn", 40.0)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (8, 4, 2.5)
    script = next(t for n, t in files.items() if n.endswith(".sh"))
    assert '--model_config "$(dirname "$0")"' in script and "config.json" in script


def test_llama_config_json_reads_back_70b_and_rope_scaling(tmp_path: Path) -> None:
    pf = dataclasses.replace(llama31(), plan=Plan(tp=1, pp=1, dp=512, zero_stage=3))
    cfg = hf_config(render("accelerate", pf), tmp_path)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.vocab_size) == ("llama", 80, 8192, 64, 8, 128256)
    p = cfg.rope_parameters
    assert (p["rope_type"], p["factor"], p["low_freq_factor"], p["high_freq_factor"],
            p["original_max_position_embeddings"], p["rope_theta"]) == (
        "llama3", 8.0, 1.0, 4.0, 8192, 500000.0)


# --- every preset through every format -----------------------------------------------------------

def simple(model: str) -> PlanFile:
    """A plan every launcher could run but for the model: data parallel over 8 GPUs, ZeRO-1."""
    return plan_file(model, Plan(tp=1, pp=1, dp=8, zero_stage=1), 8, 64, seq=2048)


def read_back(fmt: str, files: dict[str, str], pf: PlanFile, folder: Path) -> None:
    """The model as the launcher's own config code reads it: layers, width, heads, vocab."""
    m = pf.model
    if fmt in ("deepspeed", "accelerate"):
        cfg = hf_config(files, folder)
        layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
        assert (layers, cfg.vocab_size) == (m.layers, m.vocab)
        assert hf_model_class_builds(cfg)
    elif fmt == "megatron":
        flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
        assert (flags["--num-layers"], flags["--vocab-size"]) == (str(m.layers), str(m.vocab))
        assert ("--multi-latent-attention" in flags) == (m.mla is not None)
        assert ("--use-rope-scaling" in flags) == (
            m.rope_scaling is not None and m.rope_scaling.kind == "llama3")
    elif fmt == "nemo":
        cfg = nemo_model_config(files)
        assert (cfg.num_layers, cfg.hidden_size) == (m.layers, m.hidden)
    elif fmt == "torchtitan":
        model = titan_config(files, folder).model_spec.model
        rope = model.layers[0].attention.rope
        assert (len(model.layers), rope.scaling) == (
            m.layers, "llama" if m.rope_scaling else "none")
    else:
        assert f"num_hidden_layers: {m.layers}" in files["nanotron.yaml"]


def hf_model_class_builds(cfg: Any) -> bool:
    """The config names a causal-LM class transformers has for its model type."""
    auto = pytest.importorskip("transformers.models.auto.modeling_auto")
    return cfg.model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_every_preset_is_trained_or_refused_by_each_format(model: str, tmp_path: Path) -> None:
    pf = simple(model)
    for fmt in TARGETS:
        try:
            files = render(fmt, pf)
        except ExportRefused as e:
            assert e.reasons and all(e.reasons), (model, fmt)
            continue
        read_back(fmt, files, pf, tmp_path)
    assert family(pf.model) is not None  # every preset has a Hugging Face family


def test_deepspeed_and_accelerate_write_a_loadable_model_for_every_plan(
        tmp_path: Path) -> None:
    from export_plans import golden_plans
    plans = golden_plans()
    for fmt in ("deepspeed", "accelerate"):
        for _name, pf, files in exported(plans, fmt):
            assert json.loads(files["config.json"])["model_type"] == family(pf.model)
            read_back(fmt, files, pf, tmp_path)


# --- the recompute rule (costmodel.rules recompute_chunks) ---------------------------------------

def chunked(recompute_layers: int, vpp: int = 2) -> Plan:
    return Plan(tp=8, pp=4, dp=16, vpp=vpp, zero_stage=1, sequence_parallel=True,
                recompute="full", recompute_layers=recompute_layers)


@pytest.mark.parametrize("framework", ["generic", "megatron", "nemo", "megatron-sc21"])
def test_megatron_profiles_carry_the_recompute_switch(framework: str) -> None:
    t = training_spec(framework=framework, precision="bf16", seq_len=8192, global_batch=512)
    assert t.recompute_per_chunk and not Training(seq_len=1, global_batch=1).recompute_per_chunk


def test_partial_recompute_under_interleaving_is_per_chunk() -> None:
    m = get_preset("llama3-70b")
    cluster = cluster_spec(get_gpu(GPU), 512, 8, "")
    megatron = training_spec(framework="megatron", precision="bf16", seq_len=8192,
                             global_batch=512)
    with pytest.raises(SpecError, match="recompute_chunks: .*recompute_layers=3, vpp=2"):
        check_plan(m, cluster, chunked(3), megatron)
    for ok in (chunked(4), chunked(0), chunked(20), chunked(3, vpp=1)):
        check_plan(m, cluster, ok, megatron)  # per chunk 2; all; the whole stage; no chunks
    check_plan(m, cluster, chunked(3), Training(seq_len=8192, global_batch=512))  # switch off


def test_the_export_refuses_with_the_same_rule() -> None:
    pf = plan_file("llama3-70b", chunked(3), 512, 512, seq=8192)
    f = facts_of(pf, ExportOptions(), "megatron")
    assert f.rule_facts.switches.recompute_per_chunk
    with pytest.raises(ExportRefused, match="recompute_chunks: "):
        render("megatron", pf)
    flags = launcher_flags(render("megatron", dataclasses.replace(
        pf, plan=chunked(4)))["megatron.sh"], "pretrain_gpt.py")
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == ("block", "2")
    assert rules.BY_NAME["recompute_chunks"].facts == ("recompute_per_chunk", "layers")


def test_the_placement_recomputes_multiples_of_the_chunks() -> None:
    """7 layers a stage need 3 recomputed to fit: per chunk (vpp 2) that is 4, never 3."""
    need = tuple(tuple(max(0, n - 4) for n in range(15)) for _ in range(2))
    base = Subproblem(layers=14, pp=2, full=True, shift=False, partial=True, head_units=0,
                      need=need, vpp=2)
    assert solve_placement(base).recomputed == 3  # type: ignore[union-attr]
    chunks = dataclasses.replace(base, recompute_step=2)
    placed = solve_placement(chunks)
    assert placed is not None and placed.recomputed == 4
    arrays = {s: np.asarray([need[i]]) for i, s in enumerate(("first", "last"))}
    rows, ok = solve_many(arrays, 2, np.asarray([True]), False, True, 14, 0, 2, step=2)
    assert ok[0] and rows[0][3] == 4


def test_interleaved_micro_batches_come_in_groups_of_pp() -> None:
    """Megatron-Core's interleaved schedule (groups of pp micro-batches) under the Megatron
    profiles; torch.distributed.pipelining's (torchtitan) needs no such count."""
    m, cluster = get_preset("llama3-70b"), cluster_spec(get_gpu(GPU), 512, 8, "")
    plan = Plan(tp=8, pp=4, dp=16, vpp=2, zero_stage=1, sequence_parallel=True, micro_batch=2)
    for framework, refused in (("megatron", True), ("nemo", True), ("torchtitan", False)):
        t = training_spec(framework=framework, precision="bf16", seq_len=8192, global_batch=96)
        assert (96 // (2 * 16)) % 4 == 3
        if refused:
            with pytest.raises(SpecError, match="microbatch_groups: .*pp=4, micro_batch=2"):
                check_plan(m, cluster, plan, t)
        else:
            check_plan(m, cluster, plan, t)
    pf = plan_file("llama3-70b", plan, 512, 96, seq=8192)
    with pytest.raises(ExportRefused, match="microbatch_groups: "):
        render("megatron", pf)
    assert not facts_of(pf, ExportOptions(), "torchtitan").rule_facts.switches.microbatch_groups
