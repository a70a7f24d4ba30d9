"""How a model's layers are written beyond their sizes: norm, position embedding, biases.

The cost model's figures do not depend on these beyond rounding; ``ModelSpec`` carries them so
that an export trains the model that was searched (Megatron's ``--normalization``,
``--position-embedding-type``, ``--rotary-base``, ``--add-qkv-bias``; torchtitan's and
nanotron's Llama parts).
"""

from __future__ import annotations

from typing import Literal

Norm = Literal["rmsnorm", "layernorm"]
PositionEmbedding = Literal["rope", "learned"]
Bias = Literal["none", "qkv", "all"]  # linear-layer biases: none, QKV only (Qwen2), every one

CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("rmsnorm", "layernorm"),
    "position_embedding": ("rope", "learned"),
    "bias": ("none", "qkv", "all"),
}


def style_errors(owner: str, **values: str) -> list[str]:
    """One message per value that is not one of its ``CHOICES``."""
    return [f"{owner}.{name} must be one of {', '.join(CHOICES[name])}, but got {value!r}"
            for name, value in values.items() if value not in CHOICES[name]]
