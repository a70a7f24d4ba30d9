"""Attention shapes: multi-head latent attention, QKV bias and sliding windows, as worked
examples with the arithmetic in comments."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from costmodel.attention import causal_keys, qkv_params
from costmodel.mla import MlaSpec
from costmodel.params import (
    active_params,
    attention_params,
    embedding_params,
    model_flops_per_token,
    total_params,
)
from costmodel.specs import ModelSpec
from search.inputs.hf_config import load_hf_config
from search.inputs.presets import PRESETS


def test_deepseek_v3_parameters_match_the_published_counts() -> None:
    m = PRESETS["deepseek-v3"]
    # attention per layer: q 7168*1536 + 1536 + 1536*128*192 = 48,760,320
    #   kv 7168*(512+64) + 512*(1 + 128*(128+128)) = 4,128,768 + 16,777,728 = 20,906,496
    #   out 128*128*7168 = 117,440,512; total 187,107,328
    assert attention_params(m) == 187_107_328
    # 61 * 187.1M attention + 3 dense MLPs 3*7168*18432 + 58 MoE layers of 257 experts
    # 3*7168*2048 and a 7168*256 router + 2 * 129280*7168 embeddings: 671.03B, the published
    # 671B (the 14B multi-token-prediction module left out, as the paper's 671B does)
    assert total_params(m) == pytest.approx(671e9, rel=0.001)
    # active: attention, dense layers, 9 of 257 experts a MoE layer and both embeddings:
    # 37.55B; without the input embedding (a lookup, no FLOPs) 36.63B; published 37B
    assert active_params(m) == pytest.approx(37.55e9, rel=0.001)
    assert active_params(m) - embedding_params(m) == pytest.approx(37e9, rel=0.011)


def test_mla_attention_flops_use_the_query_key_and_value_widths() -> None:
    m = PRESETS["deepseek-v3"]
    mha = dataclasses.replace(m, mla=None)  # 128 heads of 128: d_qk = d_v = 128
    s = 4096
    # scores and values: 6 * L * a * (d_qk + d_v) * s, (192 + 128) vs (128 + 128), over the 61
    # layers and the MTP module's one (Megatron's formula counts it)
    # the GEMM term does not depend on s: the difference of two lengths is attention alone
    att = model_flops_per_token(m, s) - model_flops_per_token(m, 1)
    att_mha = model_flops_per_token(mha, s) - model_flops_per_token(mha, 1)
    assert m.mtp_layers == 1
    assert att == pytest.approx(6 * (61 + 1) * 128 * (192 + 128) * (s - 1))
    assert att / att_mha == pytest.approx(320 / 256)


def test_qkv_bias_adds_one_bias_per_output() -> None:
    m = ModelSpec(layers=2, hidden=1024, ffn_hidden=4096, heads=8, kv_heads=2, vocab=1000)
    # 1024 * (8*128 + 2*2*128) weights; with bias + (8*128 + 2*2*128) = 1536 more
    assert qkv_params(dataclasses.replace(m, bias="qkv")) - qkv_params(m) == 1536


def test_sliding_window_caps_the_keys() -> None:
    m = ModelSpec(layers=2, hidden=1024, ffn_hidden=4096, heads=8, kv_heads=2, vocab=1000)
    assert causal_keys(m, 8192) == 4096  # causal: half of 8192
    w = dataclasses.replace(m, sliding_window=4096)
    # query i sees min(i + 1, 4096) keys: 4096 - 4096^2 / (2 * 8192) = 3072 on average
    assert causal_keys(w, 8192) == 3072
    assert causal_keys(w, 2048) == 1024  # the window is longer than the sequence
    # model FLOPs count 4096 keys, not 8192, in the attention term
    att = model_flops_per_token(m, 8192) - model_flops_per_token(m, 1)
    att_w = model_flops_per_token(w, 8192) - model_flops_per_token(w, 1)
    assert att_w / att == pytest.approx((4096 - 1) / (8192 - 1))


def _write(tmp_path: Path, cfg: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


BASE = {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 4096, "vocab_size": 1000}


def test_hf_fields_are_read_or_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    qwen = load_hf_config(_write(tmp_path, {**BASE, "model_type": "qwen2",
                                            "sliding_window": 4096,
                                            "use_sliding_window": False}))
    assert qwen.qkv_bias and qwen.sliding_window == 0
    mistral = load_hf_config(_write(tmp_path, {**BASE, "sliding_window": 4096}))
    assert mistral.sliding_window == 4096 and not mistral.qkv_bias
    # gpt-oss's alternation is every 2nd layer full (tests/test_model_features.py); a pattern
    # no every-Nth rule gives is named and priced as full attention
    with caplog.at_level(logging.WARNING, logger="tcf_search"):
        odd = load_hf_config(_write(tmp_path, {
            **BASE, "sliding_window": 128, "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention", "full_attention",
                            "sliding_attention"]}))
    assert odd.sliding_window == 0 and odd.windowed_layers == 0 and odd.qkv_bias
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "windowed on 2 of 4 layers in no every-Nth pattern" in lines[0]
    assert "output projection" in lines[0]


def test_mla_from_the_architecture_section() -> None:
    from search.inputs.specs import build_specs
    from search.inputs.study import parse_study
    study = parse_study("""
model:
  architecture:
    layers: 4
    hidden: 1024
    ffn_hidden: 4096
    heads: 8
    vocab: 1000
    mla: {q_lora_rank: 256, kv_lora_rank: 128, qk_nope_head_dim: 64, qk_rope_head_dim: 32,
          v_head_dim: 64}
training: {seq_len: 1024, global_batch: 8}
cluster: {gpu: h100-sxm-80gb, gpus: 8}
""")
    m = build_specs(study).model
    assert m.mla == MlaSpec(q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
                            qk_rope_head_dim=32, v_head_dim=64)
    # q: (1024 + 1 + 8*96) * 256 = 459,008; kv: 1024*(128+32) + 128*(1 + 8*(64+64)) = 295,040
    assert qkv_params(m) == 459_008 + 295_040
    assert (m.kv_heads, m.head_dim) == (8, 64)
