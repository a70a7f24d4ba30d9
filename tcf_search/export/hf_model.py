"""The searched model as a Hugging Face ``config.json``, for the formats that configure the user's
own training script and have no model section (DeepSpeed, Accelerate).

Their configs hold parallelism, batch and precision only; the model is whatever the script
builds. So the export writes the architecture beside them in the format such scripts read
(``AutoConfig.from_pretrained(folder)`` then ``AutoModelForCausalLM.from_config``), and the
launch script passes its folder as ``--model_config``. The family is the Hugging Face model
class that builds exactly this architecture (transformers' ``models/<family>/configuration_*``);
a model none of them builds is refused (``rules.HF_MODEL``). Keys are the ones the release
config.json files use (``rope_theta``, ``rope_scaling``), which transformers 4 and 5 both read.
"""

from __future__ import annotations

from typing import Any

from costmodel.layer_style import MoeRouter
from costmodel.specs import ModelSpec

from .literals import json_text

FILENAME = "config.json"


def _plain_attention(m: ModelSpec) -> bool:
    """Attention the older families build: no QK-norm, no sinks, no chunks, the same on every
    layer; and every layer MoE after the leading dense ones."""
    return not (m.qk_norm or m.attention_sinks or m.attention_chunk or m.window_skip_freq
                or m.moe_layer_freq > 1)


def _patterned_family(m: ModelSpec) -> str | None:
    """The families of per-layer patterns (transformers 5's configuration files):
    gpt_oss (``layer_types`` of sliding and full attention, a sink per head, biases on every
    linear, every layer MoE by top-k softmax, the experts' SwiGLU clamped at ``swiglu_limit``),
    llama4_text (``layer_types`` of chunked and full attention, ``moe_layers`` by index, one
    shared expert, sigmoid router), qwen3 and qwen3_moe (QK-norm; ``mlp_only_layers`` and
    ``decoder_sparse_step`` for the dense layers)."""
    router = m.moe_router
    if m.attention_sinks:
        ok = (m.is_moe and m.bias == "all" and not m.qk_norm and not m.attention_chunk
              and not (m.moe_shared_experts or m.moe_dense_layers or m.moe_layer_freq > 1)
              and router is None and m.rope_scaling is None and m.swiglu_limit > 0)
        return "gpt_oss" if ok else None
    if m.attention_chunk or (m.is_moe and m.moe_router == MoeRouter(score="sigmoid")):
        ok = (m.is_moe and m.bias == "none" and not m.qk_norm and not m.sliding_window
              and m.moe_shared_experts == 1 and router == MoeRouter(score="sigmoid"))
        return "llama4_text" if ok else None
    if m.qk_norm and not (m.sliding_window or m.window_skip_freq):
        if not m.is_moe:
            return "qwen3" if m.bias == "none" and m.moe_layer_freq == 1 else None
        ok = m.bias == "none" and not m.moe_shared_experts and router is None
        return "qwen3_moe" if ok else None
    return None


def family(m: ModelSpec) -> str | None:
    """The Hugging Face model family that builds ``m``, or None."""
    llama_parts = (m.norm == "rmsnorm" and m.position_embedding == "rope"
                   and m.ffn_type == "swiglu")
    router = m.moe_router
    if m.swiglu_limit and not m.attention_sinks:  # only gpt_oss clamps its activation
        return None
    if not _plain_attention(m) or router == MoeRouter(score="sigmoid"):
        if not llama_parts or m.mla is not None or (m.rope_scaling
                                                     and m.rope_scaling.kind == "yarn"):
            return None
        return _patterned_family(m)
    if m.mla is not None:  # transformers' DeepseekV3 routes with sigmoid scores
        ok = (llama_parts and m.bias == "none" and m.is_moe and not m.sliding_window
              and router is not None and router.score == "sigmoid")
        return "deepseek_v3" if ok else None
    if m.norm == "layernorm" and m.position_embedding == "learned":
        gpt2 = (m.ffn_type == "gelu" and m.bias == "all" and m.tied_embeddings
                and m.kv_heads == m.heads and m.d_head * m.heads == m.hidden and not m.is_moe)
        return "gpt2" if gpt2 and not m.sliding_window else None
    if not llama_parts or m.bias == "all" or m.rope_scaling and m.rope_scaling.kind == "yarn":
        return None
    if m.is_moe:  # Mixtral: every layer routed by top-k softmax, no shared expert
        plain = not (m.moe_shared_experts or m.moe_dense_layers or m.bias != "none"
                     or router not in (None, MoeRouter()))
        return "mixtral" if plain else None
    if m.sliding_window:
        return "mistral" if m.bias == "none" else None
    if m.bias == "qkv":  # Qwen2Config has no head_dim: hidden / heads
        return "qwen2" if m.d_head * m.heads == m.hidden else None
    return "llama"


def _patterned(kind: str, m: ModelSpec) -> dict[str, Any]:
    """The keys of the per-layer families (``_patterned_family``)."""
    windowed = m.window_pattern
    if kind == "gpt_oss":
        return {"intermediate_size": m.expert_ffn_hidden, "num_local_experts": m.moe_experts,
                "num_experts_per_tok": m.moe_topk, "attention_bias": True,
                "swiglu_limit": m.swiglu_limit, "sliding_window": m.sliding_window or None,
                "layer_types": ["sliding_attention" if w else "full_attention"
                                for w in windowed]}
    if kind == "llama4_text":  # RoPE on every layer, as priced (no NoPE layers)
        return {"intermediate_size": m.expert_ffn_hidden, "intermediate_size_mlp": m.ffn_hidden,
                "num_local_experts": m.moe_experts, "num_experts_per_tok": m.moe_topk,
                "moe_layers": [i for i, moe in enumerate(m.moe_pattern) if moe],
                "interleave_moe_layer_step": m.moe_layer_freq,
                "attention_chunk_size": m.attention_chunk or None, "use_qk_norm": False,
                "no_rope_layers": [1] * m.layers,
                "layer_types": ["chunked_attention" if w else "full_attention"
                                for w in windowed]}
    if kind == "qwen3_moe":
        return {"moe_intermediate_size": m.expert_ffn_hidden, "num_experts": m.moe_experts,
                "num_experts_per_tok": m.moe_topk, "norm_topk_prob": True,
                "decoder_sparse_step": m.moe_layer_freq,
                "mlp_only_layers": list(range(m.moe_dense_layers))}
    return {}


def _rope(m: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": m.rope_base}
    s = m.rope_scaling
    if s is None:
        return out
    if s.kind == "llama3":
        out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor,
                               "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings":
                                   s.original_max_position_embeddings}
    else:
        out["rope_scaling"] = {"type": "yarn", "factor": s.factor,
                               "original_max_position_embeddings":
                                   s.original_max_position_embeddings,
                               "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                               "mscale": s.mscale, "mscale_all_dim": s.mscale_all_dim}
    return out


def config(m: ModelSpec, seq_len: int) -> dict[str, Any]:
    """The config.json mapping; ``family(m)`` must not be None."""
    kind = family(m)
    assert kind is not None
    if kind == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "n_layer": m.layers, "n_embd": m.hidden, "n_head": m.heads,
                "n_inner": m.ffn_hidden, "n_positions": seq_len, "vocab_size": m.vocab,
                "tie_word_embeddings": True,
                # no dropout, as searched: GPT2Config's defaults are 0.1 each (the other
                # families' configs default their attention_dropout to 0.0 and have no other)
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    scaled = m.rope_scaling
    positions = max(seq_len, int(scaled.factor * scaled.original_max_position_embeddings)
                    if scaled else 0)
    out: dict[str, Any] = {
        "model_type": kind, "num_hidden_layers": m.layers, "hidden_size": m.hidden,
        "intermediate_size": m.ffn_hidden, "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads, "head_dim": m.d_head, "vocab_size": m.vocab,
        "hidden_act": "silu", "max_position_embeddings": positions,
        "tie_word_embeddings": m.tied_embeddings, **_rope(m)}
    if kind == "mixtral":
        out |= {"intermediate_size": m.expert_ffn_hidden, "num_local_experts": m.moe_experts,
                "num_experts_per_tok": m.moe_topk}
    if kind == "mistral":
        out["sliding_window"] = m.sliding_window
    out |= _patterned(kind, m)
    if kind == "deepseek_v3" and m.mla is not None:
        a = m.mla
        out |= {"q_lora_rank": a.q_lora_rank or None, "kv_lora_rank": a.kv_lora_rank,
                "qk_nope_head_dim": a.qk_nope_head_dim, "qk_rope_head_dim": a.qk_rope_head_dim,
                "v_head_dim": a.v_head_dim, "head_dim": a.qk_rope_head_dim,
                "n_routed_experts": m.moe_experts, "num_experts_per_tok": m.moe_topk,
                "n_shared_experts": m.moe_shared_experts,
                "moe_intermediate_size": m.expert_ffn_hidden,
                "first_k_dense_replace": m.moe_dense_layers}
        if m.moe_router is not None:
            r = m.moe_router
            out |= {"scoring_func": r.score, "n_group": r.groups, "topk_group": r.group_topk,
                    "routed_scaling_factor": r.scaling, "norm_topk_prob": True,
                    "topk_method": "noaux_tc" if r.expert_bias else "greedy"}
    out["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                             "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
                             "deepseek_v3": "DeepseekV3ForCausalLM",
                             "gpt_oss": "GptOssForCausalLM", "llama4_text": "Llama4ForCausalLM",
                             "qwen3": "Qwen3ForCausalLM",
                             "qwen3_moe": "Qwen3MoeForCausalLM"}[kind]]
    return out


def render(m: ModelSpec, seq_len: int) -> str:
    return json_text(config(m, seq_len))


HEADER = ("# The model is the searched one: {family} architecture in config.json beside this "
          "file (no weights,\n# no download); the training script builds it from "
          "--model_config (AutoConfig.from_pretrained).\n")
