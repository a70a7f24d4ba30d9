"""Model features of current MoE models (issue #35, item 5): QK-norm, attention that differs by
layer (a sliding window or Llama 4's chunks on all but every Nth layer, gpt-oss's sinks) and the
MoE/dense layer pattern, each round-tripped: Hugging Face config -> ModelSpec, preset -> the
Megatron, NeMo and Hugging Face exports -> the same model, the CSV's optional columns, explain;
and priced: a half-windowed model's attention lies between the windowed and the full one's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from costmodel_helpers import training_for
from export_helpers import megatron_kwargs, nemo_model_config, nemo_overrides
from export_plans import plan_file

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from costmodel.attention import causal_keys
from costmodel.compute import layer_times
from costmodel.params import active_params, embedding_params, model_flops_per_token, total_params
from costmodel.plans import as_plan_arrays
from costmodel.specs import plan_columns
from hardware_catalog import get_gpu
from search.inputs.hf_config import model_from_hf_config
from search.inputs.measured import case_from_row
from search.inputs.presets import get_preset
from search.inputs.study import parse_study
from tcf_search.explain.analysis import model_features
from tcf_search.export import ExportRefused, render

# --- Hugging Face configs, as released (the keys that shape the model) ---------------------------

# openai/gpt-oss-120b config.json (gpt-oss-20b: 24 layers, 32 experts)
GPT_OSS_120B: dict[str, Any] = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
    "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 201088, "num_local_experts": 128, "num_experts_per_tok": 4,
    "experts_per_token": 4, "sliding_window": 128, "attention_bias": True, "hidden_act": "silu",
    "rope_theta": 150000, "tie_word_embeddings": False, "swiglu_limit": 7.0,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False}}
GPT_OSS_20B = {**GPT_OSS_120B, "num_hidden_layers": 24, "num_local_experts": 32,
               "layer_types": ["sliding_attention", "full_attention"] * 12}
# meta-llama/Llama-4-Maverick-17B-128E config.json: the language model in text_config, NoPE
# (and full-attention) layers from Llama4TextConfig's default interval of 4
MAVERICK: dict[str, Any] = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 128,
    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8192,
    "rope_theta": 500000.0, "rope_scaling": None, "use_qk_norm": False,
    "tie_word_embeddings": False, "hidden_act": "silu"}}
# Qwen/Qwen3-30B-A3B config.json
QWEN3_30B: dict[str, Any] = {
             "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "rope_theta": 1000000.0, "sliding_window": None, "use_sliding_window": False,
             "attention_bias": False, "tie_word_embeddings": False, "hidden_act": "silu"}

# what no cost reads and a preset may leave out (the presets' APPROXIMATIONS: gpt-oss's YaRN)
COSTLESS = ("name", "rope_scaling")


def _same_model(got: ModelSpec, want: ModelSpec) -> None:
    diff = {f.name: (getattr(got, f.name), getattr(want, f.name))
            for f in dataclasses.fields(want) if f.name not in COSTLESS
            and getattr(got, f.name) != getattr(want, f.name)}
    assert not diff, diff


@pytest.mark.parametrize(("cfg", "preset"), [(GPT_OSS_120B, "gpt-oss-120b"),
                                             (GPT_OSS_20B, "gpt-oss-20b"),
                                             (MAVERICK, "llama4-maverick"),
                                             (QWEN3_30B, "qwen3-30b-a3b")])
def test_hf_configs_read_as_the_presets(cfg: dict[str, Any], preset: str) -> None:
    got = model_from_hf_config(cfg)
    _same_model(got, get_preset(preset))
    assert total_params(got) == total_params(get_preset(preset))


def test_hf_layer_patterns_become_fields() -> None:
    oss = model_from_hf_config(GPT_OSS_120B)
    # layer i windowed iff (i + 1) % 2 != 0: layers 0, 2, ..., 34 (layer_types' even entries)
    assert oss.window_pattern == tuple(k == "sliding_attention"
                                       for k in GPT_OSS_120B["layer_types"])
    assert (oss.sliding_window, oss.window_skip_freq, oss.attention_sinks) == (128, 2, True)
    assert oss.bias == "all" and not oss.qk_norm
    mav = model_from_hf_config(MAVERICK)
    # Llama4TextConfig: moe_layers = range(step - 1, layers, step) = 1, 3, ..., 47; chunked
    # attention where RoPE is used, (i + 1) % 4 != 0
    assert mav.moe_pattern == tuple(i in range(1, 48, 2) for i in range(48))
    assert mav.window_pattern == tuple((i + 1) % 4 != 0 for i in range(48))
    assert (mav.attention_chunk, mav.sliding_window, mav.moe_shared_experts) == (8192, 0, 1)
    assert (mav.ffn_hidden, mav.expert_ffn_hidden) == (16384, 8192)
    # explicit indices (Llama4TextConfig.moe_layers) win over the step
    listed = {**MAVERICK["text_config"], "moe_layers": list(range(3, 48))}
    assert model_from_hf_config(listed).moe_pattern == tuple(i >= 3 for i in range(48))
    assert model_from_hf_config(QWEN3_30B).qk_norm
    # DeepSeek's first_k_dense_replace: leading dense layers
    ds = model_from_hf_config({**QWEN3_30B, "model_type": "deepseek_v3",
                               "first_k_dense_replace": 3})
    assert ds.moe_pattern == tuple(i >= 3 for i in range(48)) and ds.moe_layers == 45


def test_presets_match_the_published_parameter_counts() -> None:
    # (total, active) published: gpt-oss model card (active without the input embedding, a
    # lookup); Meta's Llama 4 release (400B, 17B, both embeddings counted)
    published = {"gpt-oss-120b": (116.8e9, 5.1e9), "gpt-oss-20b": (20.9e9, 3.6e9),
                 "llama4-maverick": (400e9, 17e9)}
    for name, (total, active) in published.items():
        m = get_preset(name)
        counted = active_params(m) - (embedding_params(m) if name.startswith("gpt-oss") else 0)
        assert total_params(m) == pytest.approx(total, rel=0.02), name
        assert counted == pytest.approx(active, rel=0.02), name
    # gpt-oss-120b by hand: 36 layers x (attention 2880*(64*64) * 2 + 2880*(2*8*64) * 2 =
    # 26.54M, 128 experts 3*2880^2 and a 2880*128 router = 3.185G) + 2 * 201088*2880 = 116.8G
    assert total_params(get_preset("gpt-oss-120b")) == pytest.approx(116.83e9, rel=1e-3)


# --- pricing -------------------------------------------------------------------------------------

def _base() -> ModelSpec:
    return ModelSpec(layers=4, hidden=2048, ffn_hidden=8192, heads=16, kv_heads=4, vocab=32000)


def test_chunked_and_half_windowed_keys_by_hand() -> None:
    m = _base()
    # chunks of 2048 in 8192 tokens: query j of a chunk sees j + 1 keys, 2048 / 2 on average
    chunked = dataclasses.replace(m, attention_chunk=2048)
    assert causal_keys(chunked, 8192) == 1024
    # 3 of 4 layers chunked: 3/4 * 1024 + 1/4 * 4096 = 1792
    assert causal_keys(dataclasses.replace(chunked, window_skip_freq=4), 8192) == 1792
    # sliding window 4096 on layers 0 and 2: (3072 + 4096) / 2
    half = dataclasses.replace(m, sliding_window=4096, window_skip_freq=2)
    assert half.windowed_layers == 2 and causal_keys(half, 8192) == (3072 + 4096) / 2


def test_half_windowed_attention_lies_between_windowed_and_full() -> None:
    full = _base()
    windowed = dataclasses.replace(full, sliding_window=1024)
    half = dataclasses.replace(windowed, window_skip_freq=2)
    seq = 8192
    flops = [model_flops_per_token(m, seq) for m in (windowed, half, full)]
    assert flops[0] < flops[1] < flops[2]
    assert flops[1] == pytest.approx((flops[0] + flops[2]) / 2)  # half the layers of each kind
    cluster = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=8)
    tr = training_for(seq_len=seq, global_batch=64)
    p = as_plan_arrays(plan_columns(Plan(tp=1, dp=8)))
    attn = [float(layer_times(m, cluster, tr, p).attention_fwd_s[0])
            for m in (windowed, half, full)]
    assert attn[0] < attn[1] < attn[2]
    assert attn[1] == pytest.approx((attn[0] + attn[2]) / 2)
    steps = [estimate(m, cluster, Plan(tp=1, dp=8), tr).step_time_s
             for m in (windowed, half, full)]
    assert steps[0] < steps[1] < steps[2]


def test_qk_norm_costs_time_memory_and_weights() -> None:
    m = get_preset("qwen3-30b-a3b")
    plain = dataclasses.replace(m, qk_norm=False)
    # q_norm and k_norm: one weight of 128 each per layer, 48 layers
    assert total_params(m) - total_params(plain) == 48 * 2 * 128
    cluster = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=8)
    tr = training_for("megatron", seq_len=4096, global_batch=64)
    plan = Plan(tp=1, dp=8, ep=8, zero_stage=1)
    with_norm, without = estimate(m, cluster, plan, tr), estimate(plain, cluster, plan, tr)
    assert with_norm.compute.time_s > without.compute.time_s
    acts = [max(s.activations_bytes for s in e.memory.stages) for e in (with_norm, without)]
    # the norms' saved input, q and k: 2 bytes x 4096 tokens x (32 + 4) heads x 128 a layer
    assert acts[0] > acts[1]


def test_moe_pattern_counts_layers_and_prices_them() -> None:
    m = get_preset("llama4-maverick")
    assert m.moe_layers == 24 and m.moe_pattern[:4] == (False, True, False, True)
    every = dataclasses.replace(m, moe_layer_freq=1)
    assert every.moe_layers == 48 and total_params(every) > total_params(m)


def test_bad_patterns_name_the_field() -> None:
    with pytest.raises(ValueError, match="window_skip_freq"):
        dataclasses.replace(_base(), window_skip_freq=2)  # no window to skip
    with pytest.raises(ValueError, match="exclude each other"):
        dataclasses.replace(_base(), sliding_window=128, attention_chunk=8192)
    with pytest.raises(ValueError, match="moe_layer_freq"):
        dataclasses.replace(_base(), moe_layer_freq=0)
    from search.inputs.specs import build_specs
    from search.inputs.study import StudyError
    study = parse_study("""
model:
  architecture: {layers: 4, hidden: 1024, ffn_hidden: 4096, heads: 8, vocab: 1000,
                 window_skip_freq: 1, sliding_window: 128}
training: {seq_len: 1024, global_batch: 8}
cluster: {gpu: h100-sxm-80gb, gpus: 8}
""")
    with pytest.raises(StudyError, match="model.architecture: model.window_skip_freq"):
        build_specs(study)


# --- exports: the launcher's own config reads the same model back --------------------------------

# Megatron-LM's moe_freq_type / _eval_pattern (megatron/training/arguments.py, core_v0.16.1):
# only digits, brackets, "+", "*" and "," are evaluated
def _eval_pattern(text: str) -> list[int]:
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text), text
    return list(eval(text))


def _megatron_model(files: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """The exported megatron.sh's flags in Megatron-Core's TransformerConfig, with the model
    features' fields parsed as Megatron-LM's argument types do (tuple_type, moe_freq_type)."""
    tc, flags, kw = megatron_kwargs(files)
    if "--window-size" in flags:
        kw["window_size"] = tuple(int(x) for x in str(flags["--window-size"]).split(","))
    if "--window-attn-skip-freq" in flags:
        kw["window_attn_skip_freq"] = int(str(flags["--window-attn-skip-freq"]))
    if "--moe-layer-freq" in flags:
        kw["moe_layer_freq"] = _eval_pattern(str(flags["--moe-layer-freq"]))
    kw["qk_layernorm"] = bool(flags.get("--qk-layernorm"))
    kw["softmax_type"] = flags.get("--softmax-type", "vanilla")
    kw["moe_router_score_function"] = flags.get("--moe-router-score-function", "softmax")
    kw["moe_shared_expert_intermediate_size"] = (
        int(str(flags["--moe-shared-expert-intermediate-size"]))
        if "--moe-shared-expert-intermediate-size" in flags else None)
    return tc.TransformerConfig(**kw), flags


def _as_megatron_builds(cfg: Any) -> dict[str, Any]:
    """What the TransformerConfig builds, layer by layer (megatron/core/transformer/utils.py
    is_layer_window_attention; moe_layer_freq as the list or an int's every-Nth)."""
    from megatron.core.transformer.utils import is_layer_window_attention
    n = cfg.num_layers
    freq = cfg.moe_layer_freq
    moe = (freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(n)])
    return {"windowed": tuple(is_layer_window_attention(cfg.window_size,
                                                        cfg.window_attn_skip_freq, i + 1)
                              for i in range(n)),
            "window": cfg.window_size[0] + 1 if cfg.window_size else 0,
            "moe": tuple(bool(x) for x in moe) if cfg.num_moe_experts else (False,) * n,
            "qk_norm": cfg.qk_layernorm, "sinks": cfg.softmax_type == "learnable"}


def _wants(m: ModelSpec) -> dict[str, Any]:
    return {"windowed": m.window_pattern, "window": m.sliding_window,
            "moe": m.moe_pattern, "qk_norm": m.qk_norm, "sinks": m.attention_sinks}


def _simple(model: ModelSpec | str, fw: str = "megatron") -> Any:
    name = model if isinstance(model, str) else "llama3-8b"
    pf = plan_file(name, Plan(tp=1, pp=1, dp=8, zero_stage=1), 8, 64, seq=4096, framework=fw)
    return pf if isinstance(model, str) else dataclasses.replace(pf, model=model)


# Maverick's shape without chunks (which Megatron-Core lacks): its interleaved MoE layers, and a
# window pattern; DeepSeek-style leading dense layers on Qwen3's QK-norm
INTERLEAVED = dataclasses.replace(get_preset("llama4-maverick"), name="maverick-windowed",
                                  attention_chunk=0, sliding_window=4096)
LEADING_DENSE = dataclasses.replace(get_preset("qwen3-30b-a3b"), name="qwen3-dense-first",
                                    moe_dense_layers=2, moe_layer_freq=3)


@pytest.mark.parametrize("model", ["gpt-oss-120b", "gpt-oss-20b", "qwen3-30b-a3b",
                                   "qwen3-235b-a22b", INTERLEAVED, LEADING_DENSE])
def test_megatron_export_builds_the_same_layers(model: ModelSpec | str) -> None:
    pf = _simple(model)
    cfg, flags = _megatron_model(render("megatron", pf))
    assert _as_megatron_builds(cfg) == _wants(pf.model)
    if pf.model.moe_layers < pf.model.layers:
        assert isinstance(cfg.moe_layer_freq, list)


def test_megatron_keeps_its_leading_dense_pattern() -> None:
    files = render("megatron", _simple(dataclasses.replace(
        get_preset("qwen3-30b-a3b"), moe_dense_layers=3)))
    assert "--moe-layer-freq '([0]*3+[1]*45)'" in files["megatron.sh"]


def test_megatron_lm_parses_the_features_back() -> None:
    """Megatron-LM's own parse_args, validate_args and core_transformer_config_from_args
    (skipped without a Megatron-LM checkout, MEGATRON_LM_SRC)."""
    from megatron_lm import megatron_lm_reads
    pf = _simple("gpt-oss-20b")
    got = megatron_lm_reads(render("megatron", pf)["megatron.sh"], 8,
                            ["window_size", "window_attn_skip_freq", "softmax_type",
                             "qk_layernorm", "moe_layer_freq"])
    assert (list(got["window_size"]), got["window_attn_skip_freq"], got["softmax_type"]) == (
        [127, 0], 2, "learnable")
    qwen = _simple(LEADING_DENSE)
    got = megatron_lm_reads(render("megatron", qwen)["megatron.sh"], 8,
                            ["qk_layernorm", "moe_layer_freq"])
    assert got["qk_layernorm"] and got["moe_layer_freq"] == [int(x) for x in
                                                             LEADING_DENSE.moe_pattern]


@pytest.mark.parametrize("model", ["gpt-oss-20b", "qwen3-30b-a3b", LEADING_DENSE])
def test_nemo_export_builds_the_same_layers(model: ModelSpec | str) -> None:
    pf = _simple(model, "nemo")
    if not isinstance(model, str):  # a recipe of its family (nemo.RECIPES)
        from tcf_search.export import ExportOptions
        files = render("nemo", pf, ExportOptions(nemo_recipe="qwen3_30b_a3b_pretrain_config"))
    else:
        files = render("nemo", pf)
    cfg = nemo_model_config(files)
    m = pf.model
    assert (cfg.qk_layernorm, cfg.softmax_type == "learnable") == (m.qk_norm, m.attention_sinks)
    if m.sliding_window:
        assert (list(cfg.window_size), cfg.window_attn_skip_freq) == (
            [m.sliding_window - 1, 0], m.window_skip_freq)
    freq = nemo_overrides(files).get("model.moe_layer_freq")
    if m.moe_layers < m.layers:
        assert freq is not None and _eval_pattern(freq) == [int(x) for x in m.moe_pattern]
    else:
        assert freq is None


def test_launchers_without_the_feature_refuse_it_by_name() -> None:
    with pytest.raises(ExportRefused, match="no chunked attention"):
        render("megatron", _simple("llama4-maverick"))
    with pytest.raises(ExportRefused, match="no chunked attention"):
        render("nemo", _simple("llama4-maverick", "nemo"))
    qk = dataclasses.replace(get_preset("llama3-8b"), qk_norm=True)
    windowed = dataclasses.replace(get_preset("llama3-8b"), sliding_window=4096)
    for model in (qk, windowed):
        with pytest.raises(ExportRefused, match="without QK-norm or sinks"):
            render("torchtitan", _simple(model, "torchtitan"))
        with pytest.raises(ExportRefused, match="without QK-norm or sinks"):
            render("nanotron", _simple(model, "nanotron"))
    sinks = dataclasses.replace(_simple("gpt-oss-20b"), plan=Plan(tp=1, cp=2, dp=4, zero_stage=1))
    with pytest.raises(ExportRefused, match="cp_comm_type a2a"):
        render("megatron", sinks)
    # Megatron writes what torchtitan refuses
    assert "--qk-layernorm" in render("megatron", _simple(qk))["megatron.sh"]


@pytest.mark.parametrize("model", ["gpt-oss-20b", "llama4-maverick", "qwen3-30b-a3b",
                                   LEADING_DENSE])
def test_hf_export_reads_back_as_the_same_model(model: ModelSpec | str,
                                                tmp_path: Path) -> None:
    """The config.json beside a DeepSpeed/Accelerate config: this tool's reader gives the
    searched model back, and transformers builds the same layer kinds from it."""
    pf = _simple(model, "accelerate")
    pf = dataclasses.replace(pf, plan=Plan(tp=1, pp=1, dp=8, zero_stage=3))
    text = render("accelerate", pf)["config.json"]
    _same_model(model_from_hf_config(json.loads(text)), pf.model)
    transformers = pytest.importorskip("transformers",
                                       reason="transformers not installed (extra: export-check)")
    (tmp_path / "config.json").write_text(text)
    cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    m = pf.model
    if cfg.model_type == "gpt_oss":
        assert [k == "sliding_attention" for k in cfg.layer_types] == list(m.window_pattern)
    if cfg.model_type == "llama4_text":
        assert [k == "chunked_attention" for k in cfg.layer_types] == list(m.window_pattern)
        assert [i in cfg.moe_layers for i in range(m.layers)] == list(m.moe_pattern)
    if cfg.model_type == "qwen3_moe":
        moe = [i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
               for i in range(m.layers)]
        assert moe == list(m.moe_pattern)


# --- the CSV's optional columns and explain ------------------------------------------------------

def _row(**cells: object) -> dict[str, str]:
    row = {"case_id": "x", "model_name": "gpt-oss-20b", "layers": 24, "hidden": 2880,
           "ffn_hidden": 2880, "heads": 64, "kv_heads": 8, "vocab": 201088, "seq_len": 4096,
           "moe_experts": 32, "moe_topk": 4, "moe_ffn_hidden": 2880, "gpu": "h100-sxm-80gb",
           "gpus_per_node": 8, "num_gpus": 8, "tp": 1, "pp": 1, "dp": 8, "ep": 8,
           "global_batch": 64, "framework": "megatron", "bias": "all", **cells}
    return {k: str(v) for k, v in row.items()}


def test_csv_optional_columns_describe_the_model() -> None:
    case = case_from_row(_row(head_dim=64, sliding_window=128, window_skip_freq=2,
                              attention_sinks="true", swiglu_limit=7))
    _same_model(case.model, dataclasses.replace(get_preset("gpt-oss-20b"), rope_base=10000.0))
    plain = case_from_row(_row())
    assert (plain.model.window_pattern, plain.model.qk_norm, plain.model.d_head) == (
        (False,) * 24, False, 2880 // 64)
    ds = case_from_row(_row(dense_layers=3, moe_layer_freq=2, qk_norm="true",
                            attention_chunk=8192, window_skip_freq=4))
    assert ds.model.moe_pattern == tuple(i >= 3 and (i + 1) % 2 == 0 for i in range(24))
    assert ds.model.qk_norm and ds.model.windowed_layers == 18
    with pytest.raises(ValueError, match="qk_norm: must be true or false"):
        case_from_row(_row(qk_norm="maybe"))
    for bad in ("-1", "tight"):
        with pytest.raises(ValueError, match="swiglu_limit: must be a number >= 0"):
            case_from_row(_row(swiglu_limit=bad))


def test_explain_names_the_layer_patterns(tmp_path: Path) -> None:
    assert model_features(get_preset("gpt-oss-120b")) == (
        "sliding window 128 on 18 of 36 layers, 1 in 2 full; attention sinks; "
        "SwiGLU clamped at 7")
    assert model_features(get_preset("llama4-maverick")) == (
        "chunked attention 8192 on 36 of 48 layers, 1 in 4 full; MoE on 24 of 48 layers, 1 in 2")
    assert model_features(get_preset("qwen3-30b-a3b")) == "QK-norm"
    assert model_features(get_preset("deepseek-v3")) == "MoE on 58 of 61 layers, first 3 dense"
    assert model_features(get_preset("llama3-8b")) == ""
    from test_explain_cli import run
    study = tmp_path / "oss.yaml"
    study.write_text("name: oss\nmodel: {preset: gpt-oss-20b}\n"
                     "training: {seq_len: 4096, global_batch: 64, framework: megatron}\n"
                     "cluster: {gpu: h100-sxm-80gb, gpus: 8}\n")
    code, out, err = run(str(study), "--plan", "tp=1,pp=1,dp=8,ep=8,mbs=1,zero=1")
    assert code == 0, err
    assert "sliding window 128 on 12 of 24 layers" in " ".join(out.split())
