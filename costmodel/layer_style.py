"""How a model's layers are written beyond their sizes: norm, position embedding, biases.

The cost model's figures do not depend on these beyond rounding; ``ModelSpec`` carries them so
that an export trains the model that was searched (Megatron's ``--normalization``,
``--position-embedding-type``, ``--rotary-base``, ``--add-qkv-bias``; torchtitan's and
nanotron's Llama parts), and RoPE's long-context scaling (:class:`RopeScaling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodel.errors import SpecError

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


RopeScalingKind = Literal["llama3", "yarn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """How a long-context model rescales its RoPE frequencies (Hugging Face ``rope_scaling``).

    ``llama3``: Llama 3.1's band-wise scaling (``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings``; the Llama-3.1 config.json
    files: 8, 1, 4, 8192). ``yarn``: YaRN (Peng et al., 2023) as DeepSeek-V3 uses it
    (``factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale``,
    ``mscale_all_dim``; DeepSeek-V3's config.json: 40, 4096, 32, 1, 1, 1). It is priced at no
    cost: the frequencies are computed once (a YaRN attention factor other than 1, which
    Megatron-Core applies with an unfused RoPE, is not priced: the presets' approximations say
    where); an export must still train with them.
    """

    kind: RopeScalingKind
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float = 1.0  # yarn
    mscale_all_dim: float = 0.0  # yarn

    def __post_init__(self) -> None:
        if self.kind not in ("llama3", "yarn"):
            raise SpecError(f"model.rope_scaling.kind must be llama3 or yarn, but got "
                            f"{self.kind!r}")
        if not self.factor > 0 or self.original_max_position_embeddings < 1:
            raise SpecError(f"model.rope_scaling: factor > 0 and "
                            f"original_max_position_embeddings >= 1 must hold, but got "
                            f"factor={self.factor}, original_max_position_embeddings="
                            f"{self.original_max_position_embeddings}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise SpecError(f"model.rope_scaling: high_freq_factor > low_freq_factor > 0 must "
                            f"hold, but got {self.high_freq_factor}, {self.low_freq_factor}")


# The published scalings the presets carry
LLAMA31_ROPE_SCALING = RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0,
                                   high_freq_factor=4.0, original_max_position_embeddings=8192)
DEEPSEEK_V3_ROPE_SCALING = RopeScaling(kind="yarn", factor=40.0,
                                       original_max_position_embeddings=4096, beta_fast=32.0,
                                       beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouter:
    """How a token picks its experts beyond top-k (Hugging Face ``scoring_func``, ``n_group``,
    ``topk_group``, ``routed_scaling_factor``, ``topk_method``). The cost reads the groups
    alone: the flex dispatch sends a token once per destination rank and node, and
    group-limited routing (DeepSeek-V3's, at most ``group_topk`` groups a token) reaches fewer
    (``costmodel.parallel.expert.units_hit``); NCCL's all-to-all moves every routed copy
    wherever it goes. An export must still train it. None on a ``ModelSpec``: softmax over the
    top-k (Mixtral, Qwen MoE)."""

    score: Literal["softmax", "sigmoid"] = "softmax"
    groups: int = 1  # experts split into groups; a token takes experts of its group_topk best
    group_topk: int = 1
    scaling: float = 1.0  # the routed experts' weighted output is multiplied by this
    expert_bias: bool = False  # auxiliary-loss-free balancing: a bias on selection per expert

    def __post_init__(self) -> None:
        if self.score not in ("softmax", "sigmoid"):
            raise SpecError(f"model.moe_router.score must be softmax or sigmoid, but got "
                            f"{self.score!r}")
        if not 1 <= self.group_topk <= self.groups or not self.scaling > 0:
            raise SpecError(f"model.moe_router: 1 <= group_topk <= groups and scaling > 0 must "
                            f"hold, but got groups={self.groups}, group_topk={self.group_topk}, "
                            f"scaling={self.scaling}")
        if self.expert_bias and self.score != "sigmoid":
            raise SpecError("model.moe_router.expert_bias needs score sigmoid")


# DeepSeek-V3's router (config.json: scoring_func sigmoid, topk_method noaux_tc, n_group 8,
# topk_group 4, routed_scaling_factor 2.5); Kimi K2's (n_group 1, topk_group 1, 2.827)
DEEPSEEK_V3_ROUTER = MoeRouter(score="sigmoid", groups=8, group_topk=4, scaling=2.5,
                               expert_bias=True)
KIMI_K2_ROUTER = MoeRouter(score="sigmoid", scaling=2.827, expert_bias=True)
