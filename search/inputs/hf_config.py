"""Read a Hugging Face ``config.json`` into a :class:`costmodel.ModelSpec`.

Covers the decoder families the presets come from: Llama/Mistral, Mixtral, Qwen2/Qwen3 (dense and
MoE), DeepSeek-V2/V3 and Kimi K2 (multi-head latent attention: ``kv_lora_rank`` and friends,
transformers' ``DeepseekV3Config``), GPT-2-style configs. QKV biases (Qwen2's
``Qwen2Attention`` always has them; ``attention_bias`` elsewhere) and a sliding window
(``sliding_window``, off where ``use_sliding_window`` is false), per-layer attention
(``layer_types``; Llama 4's ``attention_chunk_size`` and ``no_rope_layers``), QK-norm (Qwen3,
OLMo 2), gpt-oss's attention sinks and the MoE layers' pattern (``first_k_dense_replace``,
``interleave_moe_layer_step``, ``decoder_sparse_step``) are read; Llama 4's language model from
its ``text_config``. A key that changes the cost and is not modelled is named in one warning line
(logger ``tcf_search``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from costmodel.errors import TcfError
from costmodel.layer_style import MoeRouter, RopeScaling
from costmodel.mla import MlaSpec
from costmodel.specs import ModelSpec, SpecError
from search.inputs.files import MIB, InputError, read_input


class HfConfigError(TcfError):
    """A config.json cannot be read as a decoder-only transformer; the message names the key."""


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise HfConfigError(f"config.json {key}: must be an integer (got {value!r})")
            return value
    if default is None:
        raise HfConfigError(f"config.json {keys[0]}: required key is missing")
    return default


def _number(cfg: dict[str, Any], key: str) -> float:
    """A non-negative number the config may leave out (0.0 then)."""
    value = cfg.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise HfConfigError(f"config.json {key}: must be a number >= 0 (got {value!r})")
    return float(value)


def _ffn_type(cfg: dict[str, Any]) -> str:
    # Llama, Mistral, Qwen and DeepSeek use gated (SwiGLU) MLPs whatever the activation's name;
    # GPT-2-style configs (n_embd, activation_function) use a plain GELU MLP.
    if "n_embd" in cfg:
        return "gelu"
    act = str(cfg.get("hidden_act", "silu")).lower()
    return "swiglu" if act in ("silu", "swish", "swiglu") else "gelu"


def _layer_style(cfg: dict[str, Any]) -> dict[str, Any]:
    """Norm, positions and biases: GPT-2-style configs (``n_embd``) use LayerNorm, learned
    positions and biases everywhere; Llama-style ones RMSNorm and RoPE at ``rope_theta``, with
    QKV biases where ``attention_bias`` is set or the model is Qwen2 (its modeling code always
    adds them)."""
    if "n_embd" in cfg:
        return {"norm": "layernorm", "position_embedding": "learned", "bias": "all"}
    qkv = bool(cfg.get("attention_bias")) or cfg.get("model_type") in QKV_BIAS_TYPES
    # gpt-oss: attention_bias on q, k, v and o, and its experts and router always biased
    every = qkv and cfg.get("model_type") in ALL_BIAS_TYPES
    return {"rope_base": float(cfg.get("rope_theta", 10000.0)),
            "bias": "all" if every else "qkv" if qkv else "none"}


def _rope_scaling(cfg: dict[str, Any]) -> tuple[RopeScaling | None, list[str]]:
    """``rope_scaling`` of a Llama 3.1 (rope_type llama3) or DeepSeek-V3 (type yarn) config;
    any other kind is reported as not modelled."""
    raw = cfg.get("rope_scaling")
    if not isinstance(raw, dict):
        return None, []
    kind = raw.get("rope_type", raw.get("type"))
    keys = {"llama3": ("low_freq_factor", "high_freq_factor"),
            "yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")}
    if kind not in keys:
        return None, [f"rope_scaling of type {kind!r}"]
    try:
        fields = {k: float(raw[k]) for k in keys[str(kind)] if raw.get(k) is not None}
        return RopeScaling(kind=kind, factor=float(raw["factor"]),
                           original_max_position_embeddings=int(
                               raw["original_max_position_embeddings"]), **fields), []
    except (KeyError, TypeError, ValueError, TcfError) as exc:
        raise HfConfigError(f"config.json rope_scaling: {exc}") from None


def _moe_fields(cfg: dict[str, Any], layers: int, ffn: int) -> dict[str, Any]:
    experts = _int(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts == 0:
        return {}
    topk = _int(cfg, "num_experts_per_tok", "experts_per_token", default=2)
    # Llama 4: intermediate_size is the experts' width, intermediate_size_mlp the dense layers'
    llama4 = "intermediate_size_mlp" in cfg
    widths = ("moe_intermediate_size", "intermediate_size") if llama4 else (
        "moe_intermediate_size",)
    expert_ffn = _int(cfg, *widths, default=ffn)
    shared = _int(cfg, "n_shared_experts", default=1 if llama4 else 0)  # Llama4TextMoe's
    if shared == 0 and cfg.get("shared_expert_intermediate_size"):
        # Qwen2-MoE: one shared expert of its own width, counted in routed-expert widths.
        shared = max(1, round(_int(cfg, "shared_expert_intermediate_size") / expert_ffn))
    dense_layers = _int(cfg, "first_k_dense_replace", default=0)
    mlp_only = cfg.get("mlp_only_layers") or []
    if isinstance(mlp_only, list) and mlp_only:
        dense_layers = max(dense_layers, len(mlp_only))
    # every Nth layer MoE, layer i iff (i + 1) % N == 0: Llama 4's interleave_moe_layer_step
    # (transformers' Llama4TextConfig moe_layers), Qwen MoE's decoder_sparse_step
    freq = _int(cfg, "interleave_moe_layer_step", "decoder_sparse_step", default=1) or 1
    listed = cfg.get("moe_layers")  # Llama 4's explicit indices win over the step
    if isinstance(listed, list) and all(isinstance(i, int) for i in listed):
        dense_layers, freq = _moe_pattern(set(listed), layers, (dense_layers, freq))
    fields = {"moe_experts": experts, "moe_topk": topk, "moe_ffn_hidden": expert_ffn,
              "moe_shared_experts": shared, "moe_dense_layers": min(dense_layers, layers),
              "moe_layer_freq": min(freq, layers), "moe_router": _router(cfg)}
    if llama4:  # Llama4Router: a sigmoid over the top-k logits
        fields["moe_router"] = MoeRouter(score="sigmoid")
    return fields


def _moe_pattern(listed: set[int], layers: int, given: tuple[int, int]) -> tuple[int, int]:
    """The leading dense layers and the step of ModelSpec's MoE pattern that give exactly the
    listed MoE layers; ``given`` where none does, which is named as not modelled."""
    for k in range(min(listed, default=layers) + 1):  # no dense layer after the first MoE one
        for n in range(1, layers + 1):
            if {i for i in range(k, layers) if (i + 1) % n == 0} == listed:
                return k, n
    LOG.warning("config.json: not modelled: moe_layers %s (no leading-dense-then-every-Nth "
                "pattern; modelled as %d dense layers, then every %d)", sorted(listed), *given)
    return given


def _router(cfg: dict[str, Any]) -> MoeRouter | None:
    """DeepSeek-style routing (scoring_func, n_group, topk_group, routed_scaling_factor,
    topk_method noaux_tc: the balancing bias); None for plain top-k softmax."""
    if cfg.get("scoring_func", "softmax") == "softmax" and _int(cfg, "n_group", default=1) <= 1:
        return None
    try:
        return MoeRouter(score=str(cfg.get("scoring_func", "softmax")),  # type: ignore[arg-type]
                         groups=_int(cfg, "n_group", default=1) or 1,
                         group_topk=_int(cfg, "topk_group", default=1) or 1,
                         scaling=float(cfg.get("routed_scaling_factor") or 1.0),
                         expert_bias=cfg.get("topk_method") == "noaux_tc")
    except (TypeError, ValueError, TcfError) as exc:
        raise HfConfigError(f"config.json router: {exc}") from None


LOG = logging.getLogger("tcf_search")
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")  # transformers' Qwen2Attention: q, k, v with bias
# model types whose attention always normalises q and k (transformers' Qwen3Attention,
# Qwen3MoeAttention: q_norm, k_norm over head_dim; Olmo2Attention: over all heads, the same
# elements)
QK_NORM_TYPES = ("qwen3", "qwen3_moe", "olmo2")
SINK_TYPES = ("gpt_oss",)  # transformers' GptOssAttention: a learnable sink per head
ALL_BIAS_TYPES = ("gpt_oss",)  # GptOssAttention (o_proj too) and GptOssExperts' biases
LLAMA4_TYPES = ("llama4", "llama4_text")


def _mla(cfg: dict[str, Any]) -> MlaSpec | None:
    if "kv_lora_rank" not in cfg:
        return None
    return MlaSpec(q_lora_rank=_int(cfg, "q_lora_rank", default=0),
                   kv_lora_rank=_int(cfg, "kv_lora_rank"),
                   qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
                   qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
                   v_head_dim=_int(cfg, "v_head_dim"))


def _skip_freq(windowed: list[bool]) -> int | None:
    """Megatron-Core's window_attn_skip_freq for a per-layer pattern (every Nth layer full, the
    rest windowed): 0 for all windowed, None where no N gives the pattern."""
    layers = len(windowed)
    for n in [0, *range(2, layers + 1)]:
        if windowed == [not n or (i + 1) % n != 0 for i in range(layers)]:
            return n
    return None


def _attention_pattern(cfg: dict[str, Any], layers: int) -> tuple[dict[str, Any], list[str]]:
    """Which layers are windowed and by what (ModelSpec's sliding_window / attention_chunk /
    window_skip_freq): ``layer_types`` (sliding_attention, chunked_attention, full_attention;
    gpt-oss, recent Llama 4 configs), else Llama 4's ``no_rope_layers`` (a RoPE layer is a
    chunked one: transformers' Llama4TextAttention), else ``sliding_window`` on every layer
    (off where ``use_sliding_window`` is false); and what of it is not modelled."""
    w = _int(cfg, "sliding_window", default=0) if not isinstance(
        cfg.get("sliding_window"), bool) else 0
    if cfg.get("use_sliding_window") is False:
        w = 0
    chunk = _int(cfg, "attention_chunk_size", default=0)
    kinds = cfg.get("layer_types")
    rope = cfg.get("no_rope_layers")
    if cfg.get("model_type") in LLAMA4_TYPES and not (isinstance(rope, list) and rope):
        # Llama4TextConfig's default: a NoPE (and full-attention) layer every
        # no_rope_layer_interval layers (transformers' configuration_llama4.py)
        every = _int(cfg, "no_rope_layer_interval", default=4) or 4
        rope = [int((i + 1) % every != 0) for i in range(layers)]
    notes = []
    if isinstance(rope, list) and len(rope) == layers and not all(rope):
        notes.append(f"no_rope_layers: RoPE skipped on {rope.count(0)} of {layers} layers "
                     f"(priced with RoPE on every layer)")
    if not (isinstance(kinds, list) and len(kinds) == layers):
        kinds = None
        if chunk > 0 and isinstance(rope, list) and len(rope) == layers:
            kinds = ["chunked_attention" if r else "full_attention" for r in rope]
    if kinds is None:
        if chunk > 0:
            return {"attention_chunk": chunk}, notes
        return ({"sliding_window": w} if w > 0 else {}), notes
    windowed = [k in ("sliding_attention", "chunked_attention") for k in kinds]
    fields: dict[str, Any] = {}
    if any(k == "sliding_attention" for k in kinds) and w > 0:
        fields["sliding_window"] = w
    if any(k == "chunked_attention" for k in kinds) and chunk > 0:
        fields["attention_chunk"] = chunk
    freq = _skip_freq(windowed)
    if not any(windowed):
        return {}, notes
    if len(fields) != 1 or freq is None:
        notes.append(f"layer_types {sorted(set(kinds))} windowed on {sum(windowed)} of "
                     f"{layers} layers in no every-Nth pattern (sliding_window={w}, "
                     f"attention_chunk_size={chunk}; every layer modelled with full attention)")
        return {}, notes
    return fields | {"window_skip_freq": freq}, notes


def _not_modelled(cfg: dict[str, Any]) -> list[str]:
    out = []
    if cfg.get("use_qk_norm"):  # Llama 4's weightless L2 norm (Megatron-Core's qk_l2_norm)
        out.append("use_qk_norm=true (Llama 4's L2 norm of q and k)")
    if cfg.get("mlp_bias"):
        out.append("mlp_bias=true")
    if (cfg.get("attention_bias") and "o_proj_bias" not in cfg
            and cfg.get("model_type") not in ALL_BIAS_TYPES):
        out.append("attention_bias=true on the output projection (q, k, v biases modelled)")
    return out


def model_from_hf_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """The ModelSpec of one parsed ``config.json`` mapping."""
    if isinstance(cfg.get("text_config"), dict):  # Llama 4: the language model is nested
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    layers = _int(cfg, "num_hidden_layers", "n_layer")
    hidden = _int(cfg, "hidden_size", "n_embd")
    heads = _int(cfg, "num_attention_heads", "n_head")
    ffn = _int(cfg, "intermediate_size_mlp", "intermediate_size", "n_inner", default=4 * hidden)
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=0)
    if heads <= 0:
        raise HfConfigError(f"config.json num_attention_heads: must be positive (got {heads})")
    try:
        mla = _mla(cfg)
    except TcfError as exc:
        raise HfConfigError(f"config.json: {exc}") from None
    if mla is not None:  # MLA: every head has its own (up-projected) key and value
        kv_heads, head_dim = heads, mla.v_head_dim
    attention, skipped = _attention_pattern(cfg, layers)
    rope_scaling, unscaled = _rope_scaling(cfg)
    skipped += unscaled + _not_modelled(cfg)
    if skipped:
        LOG.warning("config.json: not modelled: %s", "; ".join(skipped))
    fields: dict[str, Any] = {
        "name": name, "layers": layers, "hidden": hidden, "ffn_hidden": ffn, "heads": heads,
        "kv_heads": kv_heads, "head_dim": head_dim,
        "vocab": _int(cfg, "vocab_size"), "ffn_type": _ffn_type(cfg),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", "n_embd" in cfg)),
        "mla": mla, **attention,
        "qk_norm": cfg.get("model_type") in QK_NORM_TYPES,
        "attention_sinks": cfg.get("model_type") in SINK_TYPES,
        # DeepSeek-V3's multi-token prediction modules (costmodel.mtp)
        "mtp_layers": _int(cfg, "num_nextn_predict_layers", default=0),
        # gpt-oss's clamped gated activation (costmodel.moe.GLU_CLAMP_ELEMS_PER_F)
        "swiglu_limit": _number(cfg, "swiglu_limit"),
        **_layer_style(cfg),
        "rope_scaling": rope_scaling if "n_embd" not in cfg else None,
    }
    fields.update(_moe_fields(cfg, layers, ffn))
    try:
        return ModelSpec(**fields)
    except SpecError as exc:
        raise HfConfigError(f"config.json: {exc}") from None


MAX_CONFIG_BYTES = 16 * MIB


def load_hf_config(path: str | Path) -> ModelSpec:
    """A config.json: a regular file of at most 16 MiB (never a FIFO or a device)."""
    p = Path(path)
    try:
        cfg = json.loads(read_input(p, "config.json", MAX_CONFIG_BYTES).decode("utf-8"))
    except InputError as exc:
        raise HfConfigError(str(exc)) from None
    except RecursionError:
        raise HfConfigError(f"{p} is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # also an integer of over 4,300 digits
        raise HfConfigError(f"{p} is not valid JSON: {str(exc).splitlines()[0][:120]}"
                            ) from None
    if not isinstance(cfg, dict):
        raise HfConfigError(f"{p} must hold a JSON object")
    name = str(cfg.get("_name_or_path") or cfg.get("model_type") or p.parent.name or "model")
    return model_from_hf_config(cfg, name=name)
