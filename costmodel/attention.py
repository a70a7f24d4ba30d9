"""The attention block's shapes: grouped-query attention, or multi-head latent attention (MLA,
DeepSeek-AI, "DeepSeek-V2", 2024, sec. 2.1; DeepSeek-V3, Kimi K2).

MLA projects the hidden state down to a latent ``c_q`` (``q_lora_rank``, absent when 0) and a
latent ``c_kv`` (``kv_lora_rank``) plus one shared rotary key of ``qk_rope_head_dim``; up
projections give every head a query and key of ``qk_nope_head_dim + qk_rope_head_dim`` and a
value of ``v_head_dim``. Training materialises the up-projected keys and values (Megatron-Core's
``MLASelfAttention``, megatron/core/transformer/multi_latent_attention.py, runs the ordinary
core attention on them), so attention FLOPs, its activations and the context-parallel exchange
are those of ``heads`` heads of those widths; the weights are the low-rank factors.
"""

from __future__ import annotations

from costmodel.specs import ModelSpec


def qk_dim(m: ModelSpec) -> int:
    """Width of one head's query and key."""
    return m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim if m.mla else m.d_head


def v_dim(m: ModelSpec) -> int:
    """Width of one head's value (and of its attention output)."""
    return m.mla.v_head_dim if m.mla else m.d_head


def kv_dims(m: ModelSpec) -> int:
    """Key plus value width of one KV head as attention reads them (MLA: up-projected)."""
    return qk_dim(m) + v_dim(m)


def qkv_params(m: ModelSpec) -> int:
    """Weights before the output projection. GQA: h*(a*d) + 2*h*(g*d), plus a*d + 2*g*d biases
    with ``qkv_bias`` (Qwen2). MLA: h*q_lora + q_lora*a*(nope+rope) (or h*a*(nope+rope)
    without a query latent), h*(kv_lora + rope) + kv_lora*a*(nope + v), and the two latents'
    RMSNorm weights."""
    h, a = m.hidden, m.heads
    if m.mla is None:
        width = a * m.d_head + 2 * m.kv_heads * m.d_head
        return h * width + (width if m.qkv_bias else 0)
    x = m.mla
    qk = x.qk_nope_head_dim + x.qk_rope_head_dim
    q = h * a * qk if not x.q_lora_rank else (h + 1 + a * qk) * x.q_lora_rank
    kv = h * (x.kv_lora_rank + x.qk_rope_head_dim) + x.kv_lora_rank * (
        1 + a * (x.qk_nope_head_dim + x.v_head_dim))
    return q + kv


def out_params(m: ModelSpec) -> int:
    return m.heads * v_dim(m) * m.hidden


def qkv_act_elems(m: ModelSpec) -> int:
    """Per token, the elements the QKV path keeps for backward after its input: q, k, v as
    attention reads them, and under MLA the two latents and the shared rotary key."""
    a, g = m.heads, m.kv_heads
    kept = a * qk_dim(m) + g * kv_dims(m)
    if m.mla:
        kept += m.mla.q_lora_rank + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
    return kept


def rope_elems(m: ModelSpec) -> int:
    """Per token, the elements RoPE rotates: every query and key head (MLA: the rotary part of
    each query head and the one shared rotary key); none under learned positions."""
    if m.position_embedding != "rope":
        return 0
    if m.mla:
        return (m.heads + 1) * m.mla.qk_rope_head_dim
    return (m.heads + m.kv_heads) * m.d_head


def _windowed_fraction(m: ModelSpec) -> float:
    return m.windowed_layers / m.layers


def causal_keys(m: ModelSpec, seq_len: int) -> float:
    """Keys a query attends to on average under a causal mask, averaged over the layers (each
    kind of layer at its own count; attention time and FLOPs are linear in it): s/2 on a full
    layer; under a sliding window of w < s tokens (Mistral 7B, gpt-oss's windowed layers) query
    i sees min(i + 1, w) keys, w - w^2 / (2s) on average; under chunked attention (Llama 4's
    attention_chunk_size c) query i sees the i mod c + 1 keys of its own chunk, (q c^2 + r^2) /
    (2s) on average for s = q c + r."""
    s, full = float(seq_len), seq_len / 2.0
    if not m.windowed_layers:
        return full
    if m.sliding_window:
        w = float(m.sliding_window)
        windowed = full if w >= s else w - w * w / (2.0 * s)
    else:
        q, r = divmod(seq_len, m.attention_chunk)
        windowed = (q * float(m.attention_chunk) ** 2 + float(r) ** 2) / (2.0 * s)
    f = _windowed_fraction(m)
    return f * windowed + (1.0 - f) * full


def score_keys(m: ModelSpec, seq_len: int) -> float:
    """Keys per query in the model-FLOPs convention (no causal halving), averaged over the
    layers: s on a full layer, min(s, window) on a windowed or chunked one."""
    if not m.windowed_layers:
        return float(seq_len)
    f = _windowed_fraction(m)
    return f * float(min(seq_len, m.window)) + (1.0 - f) * float(seq_len)
