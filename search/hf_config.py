"""Read a Hugging Face ``config.json`` into a :class:`costmodel.ModelSpec`.

Covers the decoder families the presets come from: Llama/Mistral, Mixtral, Qwen2/Qwen3 (dense and
MoE), DeepSeek-V2/V3 and GPT-2-style configs. DeepSeek's multi-head latent attention is
approximated as MHA with ``v_head_dim``-sized heads, as in the ``deepseek-v3`` preset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from costmodel.errors import TcfError
from costmodel.specs import ModelSpec, SpecError


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
    qkv = bool(cfg.get("attention_bias")) or cfg.get("model_type") in ("qwen2", "qwen2_moe")
    return {"rope_base": float(cfg.get("rope_theta", 10000.0)), "bias": "qkv" if qkv else "none"}


def _moe_fields(cfg: dict[str, Any], layers: int, ffn: int) -> dict[str, int]:
    experts = _int(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts == 0:
        return {}
    topk = _int(cfg, "num_experts_per_tok", default=2)
    expert_ffn = _int(cfg, "moe_intermediate_size", default=ffn)
    shared = _int(cfg, "n_shared_experts", default=0)
    if shared == 0 and cfg.get("shared_expert_intermediate_size"):
        # Qwen2-MoE: one shared expert of its own width, counted in routed-expert widths.
        shared = max(1, round(_int(cfg, "shared_expert_intermediate_size") / expert_ffn))
    dense_layers = _int(cfg, "first_k_dense_replace", default=0)
    mlp_only = cfg.get("mlp_only_layers") or []
    if isinstance(mlp_only, list) and mlp_only:
        dense_layers = max(dense_layers, len(mlp_only))
    return {"moe_experts": experts, "moe_topk": topk, "moe_ffn_hidden": expert_ffn,
            "moe_shared_experts": shared, "moe_dense_layers": min(dense_layers, layers)}


def model_from_hf_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """The ModelSpec of one parsed ``config.json`` mapping."""
    layers = _int(cfg, "num_hidden_layers", "n_layer")
    hidden = _int(cfg, "hidden_size", "n_embd")
    heads = _int(cfg, "num_attention_heads", "n_head")
    ffn = _int(cfg, "intermediate_size", "n_inner", default=4 * hidden)
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=0)
    if "kv_lora_rank" in cfg:  # DeepSeek MLA, approximated as MHA (see module docstring)
        kv_heads = heads
        head_dim = _int(cfg, "v_head_dim", default=hidden // heads)
    fields: dict[str, Any] = {
        "name": name, "layers": layers, "hidden": hidden, "ffn_hidden": ffn, "heads": heads,
        "kv_heads": kv_heads, "head_dim": head_dim,
        "vocab": _int(cfg, "vocab_size"), "ffn_type": _ffn_type(cfg),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", "n_embd" in cfg)),
        **_layer_style(cfg),
    }
    fields.update(_moe_fields(cfg, layers, ffn))
    try:
        return ModelSpec(**fields)
    except SpecError as exc:
        raise HfConfigError(f"config.json: {exc}") from None


def load_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HfConfigError(f"cannot read {p}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HfConfigError(f"{p} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise HfConfigError(f"{p} must hold a JSON object")
    name = str(cfg.get("_name_or_path") or cfg.get("model_type") or p.parent.name or "model")
    return model_from_hf_config(cfg, name=name)
