"""Inputs of the cost model: the model, the cluster, the plan and the training setup.

All are frozen, slotted, keyword-only dataclasses in SI units (bytes, FLOP/s, seconds). They hold
no behaviour beyond validation and a few derived sizes, so that the formulas in the sibling modules
read like the papers they cite.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from costmodel.errors import SpecError, require_positive
from costmodel.framework import FrameworkProfile
from costmodel.hardware import ClusterSpec, Efficiency, GpuSpec, MeasuredLinks
from costmodel.layer_style import (
    Bias,
    MoeRouter,
    Norm,
    PositionEmbedding,
    RopeScaling,
    style_errors,
)
from costmodel.memory_model import MemoryModel
from costmodel.mla import MlaSpec
from costmodel.plan_fields import (
    PLAN_FIELDS,
    SCHEDULE_CODES,
    SCHEDULE_NAMES,
    MoeDispatcher,
    MoeOverlap,
    PipelineSchedule,
    Recompute,
    check_fields,
    fields_doc,
)
from costmodel.recompute_modules import plan_modules
from costmodel.rule_table import OWN, holds_for, schedule_code

FfnType = Literal["swiglu", "gelu"]
Precision = Literal["bf16", "fp16", "fp8"]

PRECISION_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp8": 2}

__all__ = ["ClusterSpec", "Efficiency", "FrameworkProfile", "GpuSpec", "MeasuredLinks",
           "MemoryModel", "ModelSpec", "PipelineSchedule", "Plan", "Recompute", "SpecError",
           "Training"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. MoE when ``moe_experts > 0``.

    ``ffn_hidden`` is the dense MLP width; ``moe_ffn_hidden`` the per-expert width (defaults to
    ``ffn_hidden``). ``moe_dense_layers`` leading layers stay dense (DeepSeek-V3 keeps 3); after
    them every ``moe_layer_freq``-th layer is MoE (Llama 4 Maverick: every 2nd).

    Attention per layer: a layer is windowed when ``sliding_window`` (each query sees the last w
    tokens; gpt-oss, Mistral) or ``attention_chunk`` (each query sees its own chunk of c tokens
    only; Llama 4) is set, except every ``window_skip_freq``-th layer, which attends to the whole
    sequence (Megatron-Core's ``window_attn_skip_freq``; 0: every layer windowed).
    """

    name: str = "model"
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0  # 0 means hidden // heads
    ffn_type: FfnType = "swiglu"
    tied_embeddings: bool = False
    moe_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden: int = 0
    moe_shared_experts: int = 0
    moe_dense_layers: int = 0
    moe_router: MoeRouter | None = None  # beyond top-k softmax (its groups: the flex dispatch)
    mla: MlaSpec | None = None  # multi-head latent attention (costmodel.attention)
    sliding_window: int = 0  # tokens each query attends to at most (0: the whole sequence)
    attention_chunk: int = 0  # chunked attention: a query sees its own chunk only (Llama 4)
    window_skip_freq: int = 0  # every Nth layer full attention (0: every layer windowed)
    attention_sinks: bool = False  # a learnable softmax offset per head (gpt-oss's sinks)
    qk_norm: bool = False  # RMSNorm over each head's query and key (Qwen3, OLMo 2)
    moe_layer_freq: int = 1  # after the dense layers, layer i is MoE iff (i + 1) % freq == 0
    norm: Norm = "rmsnorm"  # norm .. bias: see costmodel/layer_style.py
    position_embedding: PositionEmbedding = "rope"
    rope_base: float = 10000.0  # RoPE theta; unused with learned positions
    rope_scaling: RopeScaling | None = None  # long-context RoPE scaling (no cost; the exports)
    bias: Bias = "none"  # linear-layer biases: none, QKV only (Qwen2.x), every one (GPT-3)
    mtp_layers: int = 0  # multi-token prediction depths (Megatron --mtp-num-layers; costmodel.mtp)
    # the gated activation's inputs clamped to +-limit (gpt-oss's swiglu_limit; Megatron-Core's
    # activation_func_clamp_value), priced on the routed experts (costmodel.moe; a dense MLP's
    # clamp is not: gpt-oss has none); 0: unclamped
    swiglu_limit: float = 0.0

    def __post_init__(self) -> None:
        require_positive("model", layers=self.layers, hidden=self.hidden,
                         ffn_hidden=self.ffn_hidden, heads=self.heads, kv_heads=self.kv_heads,
                         vocab=self.vocab, rope_base=self.rope_base)
        if errors := style_errors("model", norm=self.norm, bias=self.bias,
                                  position_embedding=self.position_embedding):
            raise SpecError(errors[0])
        if self.heads % self.kv_heads:
            raise SpecError(f"model.heads % model.kv_heads == 0 must hold, but got "
                            f"heads={self.heads}, kv_heads={self.kv_heads}")
        if self.ffn_type not in ("swiglu", "gelu"):
            raise SpecError(f"model.ffn_type must be 'swiglu' or 'gelu', but got {self.ffn_type!r}")
        if self.head_dim < 0 or self.d_head < 1:  # else attention sizes are 0: NaN times
            raise SpecError(f"model.head_dim, or hidden // heads when it is 0, must be >= 1, but "
                            f"got head_dim={self.head_dim}, hidden={self.hidden}, "
                            f"heads={self.heads}")
        for name in ("moe_experts", "moe_topk", "moe_shared_experts", "moe_ffn_hidden",
                     "sliding_window", "attention_chunk", "window_skip_freq", "mtp_layers"):
            if getattr(self, name) < 0:
                raise SpecError(f"model.{name} must be >= 0, but got {getattr(self, name)}")
        if self.moe_experts and not 0 < self.moe_topk <= self.moe_experts:
            raise SpecError(f"model.moe_topk must be in 1..moe_experts={self.moe_experts}, "
                            f"but got moe_topk={self.moe_topk}")
        if self.moe_router is not None and (not self.moe_experts
                                            or self.moe_experts % self.moe_router.groups):
            raise SpecError(f"model.moe_router needs experts that its {self.moe_router.groups} "
                            f"groups divide, but got moe_experts={self.moe_experts}")
        if self.swiglu_limit < 0 or (self.swiglu_limit and self.ffn_type != "swiglu"):
            raise SpecError(f"model.swiglu_limit clamps a gated activation: >= 0, and 0 unless "
                            f"ffn_type is 'swiglu', but got swiglu_limit={self.swiglu_limit}, "
                            f"ffn_type={self.ffn_type!r}")
        if self.rope_scaling is not None and self.position_embedding != "rope":
            raise SpecError("model.rope_scaling needs position_embedding rope")
        if not 0 <= (n := self.moe_dense_layers) <= self.layers:
            raise SpecError(f"model.moe_dense_layers must be in 0..layers, but got {n}")
        if not 1 <= self.moe_layer_freq <= self.layers:
            raise SpecError(f"model.moe_layer_freq must be in 1..layers={self.layers}, but got "
                            f"{self.moe_layer_freq}")
        if self.sliding_window and self.attention_chunk:
            raise SpecError(f"model.sliding_window and model.attention_chunk exclude each other "
                            f"(a layer is windowed or chunked), but got sliding_window="
                            f"{self.sliding_window}, attention_chunk={self.attention_chunk}")
        if self.window_skip_freq and (self.window_skip_freq < 2 or not self.window):
            raise SpecError(f"model.window_skip_freq must be 0 or >= 2 beside a sliding_window "
                            f"or attention_chunk (every Nth layer full attention), but got "
                            f"window_skip_freq={self.window_skip_freq}, sliding_window="
                            f"{self.sliding_window}, attention_chunk={self.attention_chunk}")
        if self.qk_norm and self.mla is not None:
            raise SpecError("model.qk_norm normalises grouped-query heads; latent attention "
                            "(mla) normalises its latents already")

    @property
    def is_moe(self) -> bool:
        return self.moe_experts > 0

    @property
    def qkv_bias(self) -> bool:
        """Biases on the Q, K and V projections (the only ones the cost model counts)."""
        return self.bias != "none"

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def expert_ffn_hidden(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def moe_pattern(self) -> tuple[bool, ...]:
        """Whether each layer is MoE: none of a dense model, none of the leading dense layers,
        then every ``moe_layer_freq``-th (Hugging Face Llama 4's ``moe_layers``:
        range(step - 1, layers, step))."""
        return _moe_pattern(self.is_moe, self.moe_dense_layers, self.moe_layer_freq,
                            self.layers)

    @property
    def moe_layers(self) -> int:
        return sum(self.moe_pattern)

    @property
    def window(self) -> int:
        """The window of a windowed layer: ``sliding_window`` or ``attention_chunk`` (0: none)."""
        return self.sliding_window or self.attention_chunk

    @property
    def window_pattern(self) -> tuple[bool, ...]:
        """Whether each layer is windowed (Megatron-Core's is_layer_window_attention,
        megatron/core/transformer/utils.py at d98e8a6: 1-based layer number % freq != 0)."""
        return _window_pattern(bool(self.window), self.window_skip_freq, self.layers)

    @property
    def windowed_layers(self) -> int:
        return sum(self.window_pattern)


# the per-layer patterns, cached: the cost model asks for them on every batch of plans
@functools.lru_cache(maxsize=256)
def _moe_pattern(moe: bool, dense_first: int, freq: int, layers: int) -> tuple[bool, ...]:
    return tuple(moe and i >= dense_first and (i + 1) % freq == 0 for i in range(layers))


@functools.lru_cache(maxsize=256)
def _window_pattern(windowed: bool, skip_freq: int, layers: int) -> tuple[bool, ...]:
    return tuple(windowed and (not skip_freq or (i + 1) % skip_freq != 0)
                 for i in range(layers))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One distributed-training layout. ``tp*pp*cp*dp`` is the world size; EP is carved out of
    ``dp*cp`` for the expert layers (Megatron's convention). Each field is a row of
    :data:`costmodel.plan_fields.PLAN_FIELDS` (its meaning, its key in every format, its own
    check); the fields below are the rows' names, types and defaults, in the rows' order.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    zero_stage: int = 0
    micro_batch: int = 1
    recompute: Recompute = "none"
    recompute_layers: int = 0
    sequence_parallel: bool = False
    pp_schedule: PipelineSchedule = "1f1b"
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    expert_tp: int = 0
    recompute_modules: tuple[str, ...] = ()
    cpu_offload_layers: int = 0
    moe_dispatcher: MoeDispatcher = ""
    moe_a2a_overlap: MoeOverlap = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", plan_modules(self.recompute_modules))
        check_fields(self)  # each field alone, by its row: degrees, choices, counts
        # cross-field rules that read nothing but the plan, from the one table (the rest:
        # check_plan)
        check_own(self)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def schedule(self) -> PipelineSchedule:
        """The schedule run: interleaved iff vpp > 1 (``costmodel.rule_table.schedule_code``)."""
        code = int(schedule_code(SCHEDULE_CODES[self.pp_schedule], self.vpp))
        return SCHEDULE_NAMES[code]


Plan.__doc__ = f"{Plan.__doc__}\n    {fields_doc()}"  # help(Plan) shows each field's meaning


def plan_columns(plan: Plan | Mapping[str, object]) -> dict[str, int]:
    """One plan (or its fields, before a ``Plan`` is built) as plain ints, encoded like the
    search's layout columns (numpy broadcasts them as 1-element columns)."""
    out: dict[str, int] = {}
    for f in PLAN_FIELDS:  # a mapping: a field absent holds its default
        v = plan.get(f.name, f.default) if isinstance(plan, Mapping) else getattr(plan, f.name)
        # a mapping's module set may come as its mask already
        out[f.name] = int(v) if f.type is tuple and isinstance(v, numbers.Integral) else f.code(v)
    return out


_NO_FACTS: Any = None  # an own rule reads no fact


def check_own(plan: Plan) -> None:
    """The rules that read the plan alone (``Plan.__post_init__``); facts are not read."""
    cols = plan_columns(plan)
    for r in OWN:
        if not holds_for(r, cols, _NO_FACTS):
            raise SpecError(f"plan.{r.message(cols, _NO_FACTS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """The workload of one optimizer step, and the framework that runs it.

    ``global_batch`` is in sequences. Everything the framework decides (overlaps, buckets,
    kernels, ZeRO semantics, recompute, MoE dispatch, its memory model) is its
    :class:`~costmodel.framework.FrameworkProfile`, read as ``training.framework.<group>.<switch>``
    and built from ``hardware_catalog/frameworks.yaml`` only.
    """

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: Precision = "bf16"
    """The GEMMs' precision (bf16, fp16, or fp8 with bf16 elsewhere)."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Adam keeps two states a parameter, SGD (momentum not counted) none."""
    framework: FrameworkProfile
    """What the framework does (``hardware_catalog.frameworks.framework_profile``)."""

    def __post_init__(self) -> None:
        require_positive("training", seq_len=self.seq_len, global_batch=self.global_batch)
        if self.precision not in PRECISION_CODES:
            raise SpecError(f"training.precision must be one of {sorted(PRECISION_CODES)}, "
                            f"but got {self.precision!r}")
        if not isinstance(self.framework, FrameworkProfile):
            raise SpecError("training.framework must be a FrameworkProfile "
                            "(hardware_catalog.frameworks.framework_profile), but got "
                            f"{type(self.framework).__name__}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def with_switches(self, **changes: Any) -> Training:
        """This training with some framework switches (by their flat names, as
        :meth:`FrameworkProfile.with_switches` takes them) or its memory model changed."""
        return replace(self, framework=self.framework.with_switches(**changes))

    def to_dict(self) -> dict[str, Any]:
        """The workload and every framework switch by its flat name, with the memory model's
        fields: the plan file's ``training`` section (:meth:`from_dict` reads it back)."""
        return {"seq_len": self.seq_len, "global_batch": self.global_batch,
                "precision": self.precision, "optimizer": self.optimizer,
                **self.framework.switches(),
                "memory_model": asdict(self.framework.memory_model)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Training:
        """What :meth:`to_dict` wrote: the workload's fields, and every switch flat."""
        workload = {k: raw[k] for k in WORKLOAD_FIELDS if k in raw}
        return cls(**workload, framework=FrameworkProfile.from_switches(
            {k: v for k, v in raw.items() if k not in WORKLOAD_FIELDS}))


# Training's own fields (the rest of a plan file's training section is the framework's)
WORKLOAD_FIELDS: tuple[str, ...] = ("seq_len", "global_batch", "precision", "optimizer")
