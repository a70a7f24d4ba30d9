"""The study file: every shipped study loads, bad input fails with one line naming the field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from costmodel.params import total_params
from search.inputs.hf_config import HfConfigError, load_hf_config
from search.inputs.presets import PRESETS
from search.inputs.specs import build_specs
from search.inputs.study import StudyError, load_study, parse_study

STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))

GOOD = """
model: {preset: llama3-8b}
training: {seq_len: 8192, global_batch: 256}
cluster: {gpu: h100-sxm-80gb, gpus: 8}
"""


def test_every_shipped_study_loads_and_builds_specs() -> None:
    names = {p.name for p in STUDIES}
    # other tools call these two by name
    assert {"llama3-70b-h100x1024.yaml", "tiny-cpu.yaml"} <= names
    for path in STUDIES:
        study = load_study(path)
        specs = build_specs(study)
        assert specs.cluster.num_gpus > 0, path
        assert study.name == path.stem, "a study is named like its file"


def test_defaults_and_axis_normalisation() -> None:
    study = parse_study(GOOD + "search_space: {tp: [8, 2, 2], recompute: full}\n", name="s")
    assert study.name == "s"
    assert study.search_space.tp == (2, 8)  # sorted, deduplicated
    assert study.search_space.recompute == ("full",)
    assert study.search_space.pp == "auto"
    assert study.search.trials == 300 and study.objective.metric == "tokens_per_s"


def test_global_batch_in_tokens_becomes_sequences() -> None:
    text = GOOD.replace("global_batch: 256", "global_batch_tokens: 2097152")
    assert build_specs(parse_study(text)).training.global_batch == 256


def test_megatron_fp8_recipe_switches_reach_the_training() -> None:
    text = GOOD.replace("global_batch: 256", "global_batch: 256, precision: fp8, "
                        "framework: megatron, fp8_param_gather: true, grad_reduce_in_bf16: true")
    tr = build_specs(parse_study(text)).training
    assert tr.framework.numerics.fp8_param_gather and tr.framework.numerics.grad_dtype_bytes == 2
    default = build_specs(parse_study(GOOD)).training.framework.numerics
    assert not default.fp8_param_gather and default.grad_dtype_bytes == 4


def test_compile_fuses_an_eager_profile() -> None:
    titan = GOOD.replace("global_batch: 256", "global_batch: 256, framework: torchtitan")
    def fused(text: str) -> bool:
        return build_specs(parse_study(text)).training.framework.kernels.fused_elementwise

    assert not fused(titan)
    assert fused(titan.replace("framework: torchtitan", "framework: torchtitan, compile: true"))
    assert fused(GOOD)  # Megatron-like: fused


def test_nodes_times_gpus_per_node() -> None:
    text = GOOD.replace("gpus: 8", "nodes: 4, gpus_per_node: 8")
    assert build_specs(parse_study(text)).cluster.num_gpus == 32


def test_cluster_overrides_reach_the_gpu() -> None:
    text = GOOD.replace("gpus: 8}", "gpus: 8, overrides: {hbm_bytes: 4.0e+10}}")
    assert build_specs(parse_study(text)).cluster.gpu.hbm_bytes == 4.0e10


@pytest.mark.parametrize("edit, expected", [
    (("gpus: 8", "gpus: 8, gpux: 1"),
     "cluster.gpux: unknown key (valid: calibration, fabric, gpu, gpu_spec"),
    (("seq_len: 8192", "seq_len: -4"), "training.seq_len: Input should be greater than 0 (got -4)"),
    (("seq_len: 8192", "seq_len: '8192'"), "training.seq_len: Input should be a valid integer"),
    (("seq_len: 8192", "seq_len: true"), "training.seq_len: Input should be a valid integer"),
    (("preset: llama3-8b", "preset: llama9"), "model.preset: must be one of"),
    (("global_batch: 256", "global_batch: 256, global_batch_tokens: 8192"),
     "training: give exactly one of global_batch"),
    (("gpus: 8", "gpus: 12"), "cluster: gpus % gpus_per_node == 0 must hold"),
    (("global_batch: 256", "global_batch: 256, fp8_param_gather: true"),
     "training: fp8_param_gather needs precision: fp8 (got precision 'bf16')"),
])
def test_bad_fields_are_named(edit: tuple[str, str], expected: str) -> None:
    with pytest.raises(StudyError) as err:
        parse_study(GOOD.replace(*edit))
    assert str(err.value).startswith(expected), str(err.value)
    assert "\n" not in str(err.value)


def test_a_risk_level_outside_the_tabled_quantiles_is_refused() -> None:
    """The held-out residuals are tabled at 5%...95%: a rarer level would be clamped, so the
    ranking would claim a confidence it does not have."""
    assert parse_study(GOOD + "objective: {risk: 0.05}\n").objective.risk == 0.05
    for level, rule in (("0.01", "greater than or equal to 0.05"),
                        ("0.99", "less than or equal to 0.95")):
        with pytest.raises(StudyError) as err:
            parse_study(GOOD + f"objective: {{risk: {level}}}\n")
        assert str(err.value).startswith(f"objective.risk: Input should be {rule}"), str(err.value)


@pytest.mark.parametrize("axis, value, expected", [
    ("tp", "[1, a]", "search_space.tp: values must be a positive integer, or auto (got 'a')"),
    ("tp", "0", "search_space.tp: values must be a positive integer"),
    ("tp", "[]", "search_space.tp: must be auto, a value or a non-empty list"),
    ("zero_stage", "4", "search_space.zero_stage: values must be one of [0, 1, 2, 3]"),
    ("recompute", "[none, most]", "search_space.recompute: values must be one of"),
    ("sequence_parallel", "1", "search_space.sequence_parallel: values must be one of"),
])
def test_bad_axes_are_named(axis: str, value: str, expected: str) -> None:
    with pytest.raises(StudyError, match="^" + expected.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        parse_study(GOOD + f"search_space: {{{axis}: {value}}}\n")


@pytest.mark.parametrize("text, expected", [
    ("", "study: must be a YAML mapping (got an empty file)"),
    ("- 1\n- 2\n", "study: must be a YAML mapping (got list)"),
    ("!!python/object/apply:os.system ['echo hi']", "study: not valid YAML"),
    ("model: {preset: [", "study: not valid YAML"),
])
def test_malformed_documents(text: str, expected: str) -> None:
    with pytest.raises(StudyError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        parse_study(text)


def test_binary_junk_and_missing_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(StudyError, match="not UTF-8"):
        load_study(junk)
    with pytest.raises(StudyError, match="cannot read"):
        load_study(tmp_path / "absent.yaml")


def test_unknown_sku_lists_valid_ids() -> None:
    with pytest.raises(StudyError, match=r"^cluster\.gpu: .*h100-sxm-80gb"):
        build_specs(parse_study(GOOD.replace("h100-sxm-80gb", "h999")))


def test_objective_needs_its_inputs() -> None:
    with pytest.raises(StudyError, match="time_to_train needs training.token_budget"):
        parse_study(GOOD + "objective: {metric: time_to_train}\n")
    with pytest.raises(StudyError, match="cost needs cluster.price_per_gpu_hour"):
        parse_study(GOOD.replace("256}", "256, token_budget: 1.0e+9}")
                    + "objective: {metric: cost}\n")


def test_export_and_validation_sections_are_kept() -> None:
    study = parse_study(GOOD + "export: {formats: [megatron], rank: 2}\n"
                               "validation: {top: 2, device: cpu}\n")
    assert study.export is not None and study.export.formats == ["megatron"]
    assert study.export.rank == 2
    assert study.validation is not None and study.validation.top == 2


def test_explicit_architecture_with_moe() -> None:
    text = GOOD.replace("{preset: llama3-8b}", """
  architecture: {layers: 4, hidden: 256, ffn_hidden: 512, heads: 8, vocab: 1000,
                 moe: {experts: 4, topk: 2}}""")
    model = build_specs(parse_study(text)).model
    assert model.kv_heads == 8 and model.moe_experts == 4 and model.expert_ffn_hidden == 512


def test_presets_have_their_published_sizes() -> None:
    # total parameters, billions: the releases' own figures (DeepSeek-V3 over-counts its
    # MLA attention, see presets.APPROXIMATIONS)
    expected = {"llama3-8b": 8.03, "llama3-70b": 70.6, "llama3.1-405b": 405.9,
                "gpt3-175b": 174.6, "mixtral-8x7b": 46.7, "qwen3-30b-a3b": 30.5,
                "qwen3-235b-a22b": 235.1}
    for name, billions in expected.items():
        assert total_params(PRESETS[name]) / 1e9 == pytest.approx(billions, rel=0.01), name
    assert 671 < total_params(PRESETS["deepseek-v3"]) / 1e9 < 700
    assert total_params(PRESETS["tiny"]) < 10e6


def _config(tmp_path: Path, cfg: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_hf_config_llama_mixtral_qwen_deepseek(tmp_path: Path) -> None:
    llama = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 500000.0}
    parsed = load_hf_config(_config(tmp_path, llama))
    assert dataclasses.replace(parsed, name="llama3-8b") == PRESETS["llama3-8b"]
    mixtral = {**llama, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    m = load_hf_config(_config(tmp_path, mixtral))
    assert (m.moe_experts, m.moe_topk, m.expert_ffn_hidden) == (8, 2, 14336)
    qwen = {**llama, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768}
    q = load_hf_config(_config(tmp_path, qwen))
    assert (q.moe_experts, q.expert_ffn_hidden, q.head_dim) == (128, 768, 128)
    qwen2 = load_hf_config(_config(tmp_path, {**llama, "model_type": "qwen2"}))
    assert (qwen2.bias, qwen2.norm, qwen2.position_embedding) == ("qkv", "rmsnorm", "rope")
    gpt2 = load_hf_config(_config(tmp_path, {"n_layer": 12, "n_embd": 768, "n_head": 12,
                                             "vocab_size": 50257}))
    assert (gpt2.bias, gpt2.norm, gpt2.position_embedding) == ("all", "layernorm", "learned")
    deepseek = {**llama, "num_attention_heads": 128, "num_key_value_heads": 128,
                "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                "n_shared_experts": 1, "first_k_dense_replace": 3, "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048, "num_nextn_predict_layers": 1}
    d = load_hf_config(_config(tmp_path, deepseek))
    assert (d.kv_heads, d.head_dim, d.moe_dense_layers, d.moe_shared_experts) == (128, 128, 3, 1)
    assert d.mtp_layers == PRESETS["deepseek-v3"].mtp_layers == 1  # its MTP module
    assert d.mla is not None and (d.mla.q_lora_rank, d.mla.qk_rope_head_dim) == (1536, 64)


def test_hf_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(HfConfigError, match="hidden_size: required key is missing"):
        load_hf_config(_config(tmp_path, {"num_hidden_layers": 2}))
    with pytest.raises(HfConfigError, match="vocab_size: must be an integer"):
        load_hf_config(_config(tmp_path, {"num_hidden_layers": 2, "hidden_size": 8,
                                          "num_attention_heads": 2, "vocab_size": "many"}))


def test_hf_config_path_is_relative_to_the_study(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    _config(tmp_path / "m", {"num_hidden_layers": 2, "hidden_size": 64,
                             "num_attention_heads": 4, "vocab_size": 100})
    study = tmp_path / "s.yaml"
    study.write_text(GOOD.replace("{preset: llama3-8b}", "{hf_config: m/config.json}"))
    assert build_specs(load_study(study)).model.layers == 2



@pytest.mark.parametrize("written", ["4e6", "4.0e+6", "4000000.0", "4_000_000"])
def test_global_batch_tokens_in_scientific_notation(written: str) -> None:
    """Issue #38: ``4e6`` tokens (read by YAML 1.1 as text, ``4.0e+6`` as a float) is a whole
    number of tokens: 4,000,000 = 1,000 sequences of 4,000."""
    text = GOOD.replace("seq_len: 8192", "seq_len: 4000").replace(
        "global_batch: 256", f"global_batch_tokens: {written}")
    assert build_specs(parse_study(text)).training.global_batch == 1000


@pytest.mark.parametrize("written, expected", [
    ("4096.5", "training.global_batch_tokens: must be a whole number (got 4096.5)"),
    ("4.5e6", "training: global_batch_tokens % seq_len == 0 must hold (got 4500000 and 8192; "
              "nearest whole batches: 4,497,408, 4,505,600)"),
    ("4e-3", "training.global_batch_tokens: must be a whole number"),
])
def test_global_batch_tokens_not_whole_is_refused(written: str, expected: str) -> None:
    with pytest.raises(StudyError) as err:
        parse_study(GOOD.replace("global_batch: 256", f"global_batch_tokens: {written}"))
    assert str(err.value).startswith(expected), str(err.value)
    assert "\n" not in str(err.value)
