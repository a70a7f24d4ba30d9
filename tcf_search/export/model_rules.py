"""The launchers' rules on the model's architecture: RoPE scaling and latent attention as
Megatron-LM takes them, and the attention features (QK-norm, windows, chunks, sinks) a launcher
builds or refuses. Read by the tables in ``rules``."""

from __future__ import annotations

from costmodel.specs import ModelSpec

from .rule_base import AnyRule, Rule


def _yarn_fixed(m: ModelSpec) -> bool:
    """YaRN's correction range at MLATransformerConfig's defaults (4096, beta 32 and 1), which
    Megatron-LM 0.16 has no flags for."""
    s = m.rope_scaling
    return s is None or (s.original_max_position_embeddings, s.beta_fast, s.beta_slow) == (
        4096, 32.0, 1.0)


def _llama3_fixed(m: ModelSpec) -> bool:
    s = m.rope_scaling
    return s is None or (s.low_freq_factor, s.high_freq_factor,
                         s.original_max_position_embeddings) == (1.0, 4.0, 8192)


def plain_llama_attention(m: ModelSpec) -> bool:
    """Llama 3's attention: full causal on every layer, no QK-norm, no sinks."""
    return not (m.qk_norm or m.window or m.attention_sinks)


def scaling(m: ModelSpec) -> str:
    return m.rope_scaling.kind if m.rope_scaling else "none"


# RoPE scaling and latent attention as Megatron-LM 0.16 takes them (megatron.rope_scaling_args)
MEGATRON_ROPE: tuple[AnyRule, ...] = (
    Rule(lambda f: scaling(f.model) != "llama3" or (f.model.mla is None
                                                     and _llama3_fixed(f.model)),
         "--use-rope-scaling applies Llama 3.1's scaling with low_freq_factor 1, "
         "high_freq_factor 4 and 8192 original positions (only the factor is a flag), to "
         "non-MLA attention, but the model has {model.rope_scaling}",
         "megatron/core/models/common/embeddings/rotary_pos_embedding.py _apply_scaling"),
    Rule(lambda f: scaling(f.model) != "yarn" or (f.model.mla is not None
                                                   and _yarn_fixed(f.model)),
         "YaRN is MLA's rope_type, with original_max_position_embeddings 4096, beta_fast 32 "
         "and beta_slow 1 (no flags; --position-embedding-type has no yarn in 0.16), but the "
         "model has mla={model.mla}, rope_scaling={model.rope_scaling}",
         "megatron/core/transformer/transformer_config.py MLATransformerConfig"),
)


# The attention features as Megatron-Core builds them (megatron.attention_args)
MEGATRON_ATTENTION: tuple[AnyRule, ...] = (
    Rule(lambda f: not f.model.attention_sinks or f.cp == 1,
         "Transformer Engine's attention with learnable sinks (softmax_type learnable) runs "
         "context parallelism as all-to-all only (cp_comm_type a2a), which this export does not "
         "write and the cost model does not price (it prices the p2p ring), but got cp={cp}",
         "Megatron-Bridge src/megatron/bridge/recipes/gpt_oss/gpt_oss.py (v0.5.1): cp_comm_type "
         "a2a for learnable softmax"),
    Rule(lambda f: not f.model.attention_chunk,
         "Megatron-Core has no chunked attention (a query seeing only its own chunk, Llama 4's "
         "attention_chunk_size), only sliding windows (window_size, window_attn_skip_freq), but "
         "the model has attention_chunk={model.attention_chunk}",
         "megatron/core/transformer/transformer_config.py (core_v0.16.1; d98e8a6)"),
)


def llama_attention(launcher: str, source: str, elsewhere: str = "") -> Rule:
    """A launcher whose model is Llama 3's refuses QK-norm, windows, chunks and sinks."""
    return Rule(lambda f: plain_llama_attention(f.model),
                f"{launcher} attention is causal over the whole sequence on every layer, without "
                f"QK-norm or sinks{elsewhere}, but the model has qk_norm={{model.qk_norm}}, "
                "sliding_window={model.sliding_window}, attention_chunk="
                "{model.attention_chunk}, attention_sinks={model.attention_sinks}", source)
