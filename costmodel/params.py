"""Parameter counts and per-token FLOPs of a decoder-only transformer.

Symbols: h hidden, f FFN width, a query heads, g key/value heads, d head dim, V vocabulary, s
sequence. Parameter counts follow the architecture directly (Llama: RMSNorm without bias; GPT/MPT
biases are ignored, < 0.1%). FLOPs are multiply-adds x 2, as in Narayanan et al. (SC21, eq. 3)
and Kaplan et al. (2020).
"""

from __future__ import annotations

from costmodel.attention import causal_keys, out_params, qk_dim, qkv_params, score_keys, v_dim
from costmodel.specs import ModelSpec


def attention_params(m: ModelSpec) -> int:
    """Q, K, V and output projections: h*(a*d) + 2*h*(g*d) + (a*d)*h for grouped-query
    attention; MLA's low-rank factors (costmodel.attention.qkv_params)."""
    return qkv_params(m) + out_params(m)


def mlp_matrices(m: ModelSpec) -> int:
    """Weight matrices of one MLP: SwiGLU has gate, up and down; GELU has up and down."""
    return 3 if m.ffn_type == "swiglu" else 2


def dense_mlp_params(m: ModelSpec) -> int:
    return mlp_matrices(m) * m.hidden * m.ffn_hidden


def expert_params(m: ModelSpec) -> int:
    """One routed expert's MLP."""
    return mlp_matrices(m) * m.hidden * m.expert_ffn_hidden


def moe_mlp_params(m: ModelSpec) -> int:
    """All routed and shared experts plus the router of one MoE layer."""
    shared = m.moe_shared_experts * expert_params(m)
    return m.moe_experts * expert_params(m) + shared + m.hidden * m.moe_experts


def norm_params(m: ModelSpec) -> int:
    """A layer's vectors beside its matrices: the two norms' weights, QK-norm's two of one
    head's width (Qwen3's q_norm and k_norm, RMSNorm(head_dim)) and one learnable sink per head
    (gpt-oss's ``sinks``)."""
    qk = 2 * qk_dim(m) if m.qk_norm else 0
    return 2 * m.hidden + qk + (m.heads if m.attention_sinks else 0)


def embedding_params(m: ModelSpec) -> int:
    return m.vocab * m.hidden


def total_params(m: ModelSpec) -> int:
    layers_dense = m.layers - m.moe_layers
    body = (m.layers * (attention_params(m) + norm_params(m))
            + layers_dense * dense_mlp_params(m) + m.moe_layers * moe_mlp_params(m))
    heads = 1 if m.tied_embeddings else 2
    return body + heads * embedding_params(m) + m.hidden


def active_params(m: ModelSpec) -> int:
    """Parameters touched by one token (routed experts counted top-k times)."""
    if not m.is_moe:
        return total_params(m)
    per_moe_layer_active = ((m.moe_topk + m.moe_shared_experts) * expert_params(m)
                            + m.hidden * m.moe_experts)
    return total_params(m) - m.moe_layers * (moe_mlp_params(m) - per_moe_layer_active)


def model_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False) -> float:
    """Training FLOPs per token, the PaLM/Megatron convention: 6·N_active (embedding lookup
    excluded, LM head included) + 6·L·a·(d_qk + d_v)·s for attention scores and values
    (12·L·(a·d)·s when d_qk = d_v = d), no causal halving; s is the window under sliding-window
    attention. ``causal``: the attention a causal mask leaves to compute instead (each query's
    keys, :func:`costmodel.attention.causal_keys`: about s/2), the figure long-context reports
    quote."""
    n_matmul = active_params(m) - m.hidden - (0 if m.tied_embeddings else embedding_params(m))
    n_matmul -= m.layers * norm_params(m)
    keys = causal_keys(m, seq_len) if causal else score_keys(m, seq_len)
    mtp_layer = 6.0 * last_layer_matmul_params(m) + 6.0 * m.heads * (qk_dim(m) + v_dim(m)) * keys
    return (6.0 * n_matmul + 6.0 * m.layers * m.heads * (qk_dim(m) + v_dim(m)) * keys
            + mtp_flops(m, mtp_layer))


def last_layer_matmul_params(m: ModelSpec) -> int:
    """Weights one token multiplies in the last layer (a MoE layer's top-k and shared experts
    and its router, as ``active_params`` counts them)."""
    if m.moe_pattern[-1]:
        mlp = (m.moe_topk + m.moe_shared_experts) * expert_params(m) + m.hidden * m.moe_experts
    else:
        mlp = dense_mlp_params(m)
    return attention_params(m) + mlp


def mtp_flops(m: ModelSpec, layer_flops: float) -> float:
    """Training FLOPs per token of the multi-token prediction depths (costmodel.mtp), Megatron's
    convention (megatron/training/training.py ``num_floating_point_operations``; Megatron-Bridge's
    src/megatron/bridge/training/utils/flop_utils.py alike): per depth one more layer of the last
    layer's kind (``layer_flops``), 6 (3h + 2h^2) for its norms and eh_proj, and 6 h V for the
    logits again."""
    h, V = float(m.hidden), float(m.vocab)
    return m.mtp_layers * (layer_flops + 6.0 * (3.0 * h + 2.0 * h * h) + 6.0 * h * V)
