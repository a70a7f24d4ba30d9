"""Exports train Llama 3.1's RoPE scaling: Megatron-Core computes Llama 3.1's frequencies from
the exported flags, Megatron-LM, torchtitan and NeMo read the scaling back, torchtitan 0.2 and
nanotron refuse what they would not apply, and Hugging Face configs and plan files keep it (and
latent attention).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from export_helpers import launcher_flags, nemo_overrides, titan_config
from export_plans import deepseek, llama31
from megatron_lm import megatron_lm_reads

from costmodel.layer_style import LLAMA31_ROPE_SCALING
from search.inputs.hf_config import model_from_hf_config
from search.inputs.planfile import dump_plan_file, parse_plan_file
from search.inputs.presets import get_preset
from tcf_search.export import ExportOptions, ExportRefused, render


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

