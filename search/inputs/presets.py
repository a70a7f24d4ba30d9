"""Model presets: public architectures by name, as :class:`costmodel.ModelSpec`.

Numbers are the published model configurations (Hugging Face ``config.json`` of each release, the
GPT-3 paper, Table 2.1). Where the cost model's vocabulary cannot say something exactly, the
preset approximates it and says so in :data:`APPROXIMATIONS`.
"""

from __future__ import annotations

from costmodel.layer_style import (
    DEEPSEEK_V3_ROPE_SCALING,
    DEEPSEEK_V3_ROUTER,
    KIMI_K2_ROUTER,
    LLAMA31_ROPE_SCALING,
    MoeRouter,
)
from costmodel.mla import MlaSpec
from costmodel.specs import ModelSpec

# DeepSeek-V3's multi-head latent attention (config.json: q_lora_rank, kv_lora_rank, ...)
DEEPSEEK_V3_MLA = MlaSpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                          qk_rope_head_dim=64, v_head_dim=128)

PRESETS: dict[str, ModelSpec] = {
    # Llama 3 (Meta, 2024): GQA with 8 KV heads, SwiGLU, 128,256-token vocabulary, untied;
    # RMSNorm, RoPE with rope_theta 500000, no biases (config.json of each release).
    "llama3-8b": ModelSpec(name="llama3-8b", layers=32, hidden=4096, ffn_hidden=14336,
                           heads=32, kv_heads=8, vocab=128256, rope_base=500000.0),
    "llama3-70b": ModelSpec(name="llama3-70b", layers=80, hidden=8192, ffn_hidden=28672,
                            heads=64, kv_heads=8, vocab=128256, rope_base=500000.0),
    # Llama 3.1: Llama 3's shapes (405B its own) with RoPE scaled for 128k tokens (config.json
    # rope_scaling: rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
    # original_max_position_embeddings 8192; the same in the 8B, 70B and 405B releases)
    "llama3.1-8b": ModelSpec(name="llama3.1-8b", layers=32, hidden=4096, ffn_hidden=14336,
                             heads=32, kv_heads=8, vocab=128256, rope_base=500000.0,
                             rope_scaling=LLAMA31_ROPE_SCALING),
    "llama3.1-70b": ModelSpec(name="llama3.1-70b", layers=80, hidden=8192, ffn_hidden=28672,
                              heads=64, kv_heads=8, vocab=128256, rope_base=500000.0,
                              rope_scaling=LLAMA31_ROPE_SCALING),
    "llama3.1-405b": ModelSpec(name="llama3.1-405b", layers=126, hidden=16384,
                               ffn_hidden=53248, heads=128, kv_heads=8, vocab=128256,
                               rope_base=500000.0, rope_scaling=LLAMA31_ROPE_SCALING),
    # GPT-3 175B (Brown et al., 2020, Table 2.1): MHA, GELU 4h MLP, tied embeddings; the
    # vocabulary is padded to 51,200 as Megatron-LM does (a multiple of 128 * TP). GPT-2's
    # architecture (paper, section 2.1): learned positions, LayerNorm, biases on every linear.
    "gpt3-175b": ModelSpec(name="gpt3-175b", layers=96, hidden=12288, ffn_hidden=49152,
                           heads=96, kv_heads=96, vocab=51200, ffn_type="gelu",
                           tied_embeddings=True, norm="layernorm", position_embedding="learned",
                           bias="all"),
    # Mixtral 8x7B (Mistral AI, 2024): 8 experts, top-2, every layer MoE; rope_theta 1e6.
    "mixtral-8x7b": ModelSpec(name="mixtral-8x7b", layers=32, hidden=4096, ffn_hidden=14336,
                              heads=32, kv_heads=8, vocab=32000, moe_experts=8, moe_topk=2,
                              moe_ffn_hidden=14336, rope_base=1.0e6),
    # DeepSeek-V3 (DeepSeek-AI, 2024): 61 layers, the first 3 dense (18,432 wide), then 256
    # routed experts of width 2,048, top-8 in 4 of 8 groups with sigmoid scores and a balancing
    # bias (DEEPSEEK_V3_ROUTER), plus 1 shared expert; rope_theta 10000 with YaRN
    # scaling (config.json rope_scaling: factor 40, original_max_position_embeddings 4096,
    # beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1); multi-head latent attention
    # (DEEPSEEK_V3_MLA); one multi-token prediction module (sec. 2.2, D = 1; config.json
    # num_nextn_predict_layers 1; Megatron-Bridge's recipe mtp_num_layers=1,
    # src/megatron/bridge/recipes/deepseek/deepseek_v3.py).
    "deepseek-v3": ModelSpec(name="deepseek-v3", layers=61, hidden=7168, ffn_hidden=18432,
                             heads=128, kv_heads=128, head_dim=128, vocab=129280,
                             moe_experts=256, moe_topk=8, moe_ffn_hidden=2048,
                             moe_shared_experts=1, moe_dense_layers=3, mla=DEEPSEEK_V3_MLA,
                             rope_scaling=DEEPSEEK_V3_ROPE_SCALING,
                             moe_router=DEEPSEEK_V3_ROUTER, mtp_layers=1),
    # Kimi K2 (Moonshot AI, 2025, config.json): DeepSeek-V3's shape with 64 heads, 384
    # experts, one dense layer and an ungrouped router (KIMI_K2_ROUTER); 1.04T total, 32B
    # active published
    "kimi-k2": ModelSpec(name="kimi-k2", layers=61, hidden=7168, ffn_hidden=18432, heads=64,
                         kv_heads=64, head_dim=128, vocab=163840, moe_experts=384, moe_topk=8,
                         moe_ffn_hidden=2048, moe_shared_experts=1, moe_dense_layers=1,
                         mla=DEEPSEEK_V3_MLA, moe_router=KIMI_K2_ROUTER),
    # Qwen3 MoE (Qwen team, 2025): GQA with 4 KV heads of 128 dims, 128 experts, top-8, no
    # shared expert, every layer MoE; rope_theta 1e6, no QKV bias (attention_bias: false);
    # QK-norm on every layer (transformers' Qwen3MoeAttention: q_norm, k_norm over head_dim).
    "qwen3-30b-a3b": ModelSpec(name="qwen3-30b-a3b", layers=48, hidden=2048, ffn_hidden=6144,
                               heads=32, kv_heads=4, head_dim=128, vocab=151936,
                               moe_experts=128, moe_topk=8, moe_ffn_hidden=768,
                               rope_base=1.0e6, qk_norm=True),
    "qwen3-235b-a22b": ModelSpec(name="qwen3-235b-a22b", layers=94, hidden=4096,
                                 ffn_hidden=12288, heads=64, kv_heads=4, head_dim=128,
                                 vocab=151936, moe_experts=128, moe_topk=8,
                                 moe_ffn_hidden=1536, rope_base=1.0e6, qk_norm=True),
    # gpt-oss (OpenAI, 2025; config.json of openai/gpt-oss-120b and -20b): 36 / 24 layers of
    # width 2,880, 64 query heads of 64 dims and 8 KV heads, every layer MoE with 128 / 32
    # experts of width 2,880 (intermediate_size), top-4 (num_experts_per_tok), softmax over the
    # top-k; layer_types alternate sliding_attention (sliding_window 128) and full_attention,
    # starting windowed (window_skip_freq 2, as Megatron-Bridge's GPT-OSS bridge sets
    # window_attn_skip_freq = 2); learnable attention sinks per head; biases on the attention
    # and expert linears (attention_bias: true); vocab 201,088, untied; rope_theta 150000.
    # Published: 116.8B / 20.9B total, 5.1B / 3.6B active (model card; the input embedding,
    # a lookup, not counted active). The experts' gated activation clamped to +-7 (swiglu_limit).
    "gpt-oss-120b": ModelSpec(name="gpt-oss-120b", layers=36, hidden=2880, ffn_hidden=2880,
                              heads=64, kv_heads=8, head_dim=64, vocab=201088,
                              moe_experts=128, moe_topk=4, moe_ffn_hidden=2880,
                              sliding_window=128, window_skip_freq=2, attention_sinks=True,
                              bias="all", rope_base=150000.0, swiglu_limit=7.0),
    "gpt-oss-20b": ModelSpec(name="gpt-oss-20b", layers=24, hidden=2880, ffn_hidden=2880,
                             heads=64, kv_heads=8, head_dim=64, vocab=201088,
                             moe_experts=32, moe_topk=4, moe_ffn_hidden=2880,
                             sliding_window=128, window_skip_freq=2, attention_sinks=True,
                             bias="all", rope_base=150000.0, swiglu_limit=7.0),
    # Llama 4 Maverick (Meta, 2025; config.json text_config of
    # meta-llama/Llama-4-Maverick-17B-128E): 48 layers of width 5,120, 40 heads of 128 dims, 8
    # KV heads; interleave_moe_layer_step 2 (layers 1, 3, ... MoE: 128 experts of width 8,192
    # (intermediate_size), top-1 with sigmoid scores, and one shared expert of the same width;
    # the other layers dense of width 16,384, intermediate_size_mlp); attention_chunk_size
    # 8192 on 3 of every 4 layers, the 4th full attention without RoPE (no_rope_layers);
    # vocab 202,048, untied; rope_theta 500000. Published: 400B total, 17B active.
    "llama4-maverick": ModelSpec(name="llama4-maverick", layers=48, hidden=5120,
                                 ffn_hidden=16384, heads=40, kv_heads=8, head_dim=128,
                                 vocab=202048, moe_experts=128, moe_topk=1,
                                 moe_ffn_hidden=8192, moe_shared_experts=1, moe_layer_freq=2,
                                 moe_router=MoeRouter(score="sigmoid"), attention_chunk=8192,
                                 window_skip_freq=4, rope_base=500000.0),
    # A few-million-parameter Llama for real runs on CPU (tiny-cpu study): 4 layers of width
    # 256, 8 heads of 32 dims, 4 KV heads, so TP=2/4 and PP=2/4 all divide it. ~5.0M params.
    "tiny": ModelSpec(name="tiny", layers=4, hidden=256, ffn_hidden=768, heads=8, kv_heads=4,
                      vocab=4096),
}

GPT_OSS_APPROXIMATION = (
    "RoPE unscaled here: the release scales it by YaRN (factor 32 over 4,096 positions, an "
    "attention factor of 1.35), which Megatron-LM 0.16's flags give only beside latent "
    "attention and which Megatron-Core then runs unfused (Transformer Engine's fused RoPE takes "
    "no attention factor: rope_utils.py apply_rotary_pos_emb), about ten more passes over the "
    "queries and keys each way, not priced here. The experts' activation is priced as "
    "Megatron-Core runs gpt-oss's (a SwiGLU clamped at swiglu_limit 7.0, its clamps eager), but "
    "exported to Megatron-LM as plain SwiGLU: its 0.16 flags have no clamp or linear offset "
    "(TransformerConfig activation_func_clamp_value, glu_linear_offset); Megatron-Bridge's "
    "GPT-OSS recipe builds both.")


APPROXIMATIONS: dict[str, str] = {
    "deepseek-v3": "The multi-token-prediction module (14B, one layer) runs on the last "
                   "pipeline stage but is not in the 671B total (the paper's count).",
    "kimi-k2": "The multi-token-prediction module is left out. RoPE as written here (base "
               "10000, no scaling): the releases' config.json files differ in rope_theta and "
               "YaRN factor, so none is carried.",
    "gpt-oss-120b": GPT_OSS_APPROXIMATION,
    "gpt-oss-20b": GPT_OSS_APPROXIMATION,
    "llama4-maverick": "The full-attention layers skip RoPE (no_rope_layers), priced and "
                       "exported as RoPE on every layer (an elementwise pass: no other cost). "
                       "Megatron-LM has no chunked attention: its export is refused.",
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name``; a ``KeyError`` lists the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        valid = ", ".join(preset_names())
        raise KeyError(f"unknown model preset {name!r}; valid: {valid}") from None
