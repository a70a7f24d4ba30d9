"""What a training framework does, as one typed profile: :class:`FrameworkProfile`.

A profile is a few frozen groups by concern (numerics, data parallelism, tensor and pipeline
parallelism, attention, kernels, activations, MoE) plus the calibrated :class:`MemoryModel`.
Their fields carry no defaults: every value comes from ``hardware_catalog/frameworks.yaml``
(its ``generic`` profile names every switch once, each framework overrides some), a study's
allowed overrides or a measured row's release switches, through
``hardware_catalog.frameworks.framework_profile``. The cost model only reads them.

A switch's name is unique across the groups and is the key that frameworks.yaml, a study, a
plan file and a measured row's release use for it: :meth:`FrameworkProfile.from_switches`
routes flat ``name: value`` pairs to their groups and :meth:`FrameworkProfile.switches` gives
them back flat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from costmodel.errors import SpecError, require_positive
from costmodel.graphs import graph_scope
from costmodel.memory_model import MemoryModel
from costmodel.recompute_modules import module_set

__all__ = ["Activations", "Attention", "DataParallel", "FrameworkProfile", "Kernels", "Moe",
           "Numerics", "Pipeline", "TensorParallel"]

GradSync = Literal["micro_batch", "step"]

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")
PP_SCHEDULES = ("1f1b", "interleaved", "gpipe")


def _check_choices(**values_and_choices: tuple[object, tuple[object, ...]]) -> None:
    for name, (value, choices) in values_and_choices.items():
        if value not in choices:
            raise SpecError(f"training.{name} must be one of {sorted(map(str, choices))}, "
                            f"but got {value!r}")


def _subset(owner: object, name: str, known: tuple[object, ...]) -> None:
    """``owner.name`` as a tuple (a YAML list arrives as a list), a non-empty subset of
    ``known``."""
    value = tuple(getattr(owner, name))
    object.__setattr__(owner, name, value)
    if not value or not set(value) <= set(known):
        raise SpecError(f"training.{name} must be a non-empty subset of {list(known)}, "
                        f"but got {list(value)!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Numerics:
    """The bytes of what a step holds and moves: weights, gradients, optimizer states and
    activations, and what fp8 training keeps."""

    master_weights: bool
    """An fp32 master copy of the weights next to the low-precision ones."""
    grad_dtype_bytes: int
    """Bytes of a gradient element as accumulated: 4 for an fp32 accumulation buffer (Megatron's
    ``main_grad``, nanotron's fp32 accumulator), 2 for bf16/fp16 gradients."""
    grad_reduce_bytes: int
    """Bytes of a gradient element as reduced (0: ``grad_dtype_bytes``). FSDP2's
    ``reduce_dtype=float32`` reduces in 4 (with sync off the gradients are accumulated whole in
    fp32: ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``)."""
    optimizer_state_bytes: int
    """Bytes of an optimizer state element (Adam's m and v, SGD's momentum): 4 in fp32 beside
    fp32 masters; torch.optim's ``zeros_like`` keeps the parameter's dtype (2: bf16 in NeMo
    AutoModel's MoE models)."""
    activation_dtype_bytes: float
    """Bytes of an activation element, exchanged, stored for backward and streamed by
    elementwise kernels: 2 under bf16/fp16 autocast (fp8 GEMMs too); 4 without it (CPU
    validation runs in fp32)."""
    fp8_param_gather: bool
    """fp8 weights only (Megatron-LM ``--fp8-param-gather``): 1 byte a weight, not bf16 plus a
    cast, all-gathered in fp8 by the distributed optimizer (the fp32 masters stay)."""
    fp8_saves_cast_inputs: bool
    """fp8 keeps the GEMM inputs' fp8 casts for backward (Transformer Engine's Linear); torchao's
    float8 keeps the bf16 inputs and casts again in backward."""
    fp8_weight_cache: bool
    """fp8 weight casts cached after a step's first micro-batch (Megatron-Core's TE layers pass
    ``is_first_microbatch``, ``megatron/core/extensions/transformer_engine.py``); torchao's
    Float8Linear casts its weight at every forward."""

    def __post_init__(self) -> None:
        if self.activation_dtype_bytes not in (2.0, 4.0):
            raise SpecError("training.activation_dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), "
                            f"but got {self.activation_dtype_bytes!r}")
        _check_choices(optimizer_state_bytes=(self.optimizer_state_bytes, (2, 4)),
                       grad_reduce_bytes=(self.grad_reduce_bytes, (0, 2, 4)))

    @property
    def grad_reduce_dtype_bytes(self) -> int:
        """Bytes of a gradient element on the wire (and in an unsharded accumulation)."""
        return self.grad_reduce_bytes or self.grad_dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallel:
    """Data parallelism and ZeRO: which stages run, how gradients accumulate and are reduced,
    how parameters are gathered, and what overlaps."""

    zero_stages: tuple[int, ...]
    """The ZeRO stages the framework runs at all (validity: ``costmodel.rules``
    ``framework_zero``)."""
    zero_stages_pp: tuple[int, ...]
    """``zero_stages`` under pipeline parallelism (DeepSpeed's pipeline engine asserts stage <
    2)."""
    overlap_grad_reduce: bool
    """ZeRO-0's gradient all-reduce runs during backward (Megatron ``--overlap-grad-reduce``,
    DDP's bucketed hooks) rather than after it."""
    overlap_grad_reduce_sharded: bool
    """ZeRO-1/2's gradient reduction runs during backward (Megatron) rather than after it
    (nanotron, DeepSpeed's ``overlap_comm`` off)."""
    overlap_param_gather: bool
    """The sharded parameters' all-gather overlaps the forward (Megatron
    ``--overlap-param-gather``, FSDP prefetching) rather than following the optimizer step."""
    dp_bucket_bytes: float
    """Bytes of a gradient bucket (torch DDP's default 25 MiB; Megatron's 40M parameters in
    fp32)."""
    sharded_grad_all_reduce: bool
    """ZeRO-1/2 reduce gradients by a full all-reduce (twice a reduce-scatter's bytes).
    nanotron's ZeRO-1 does (frameworks.yaml)."""
    sharded_dp_one_call: bool
    """ZeRO-1/2 run both DP collectives as one call on the whole buffer, not in
    ``dp_bucket_bytes`` buckets (nanotron's ZeRO-1)."""
    sharded_gather_host_ops: float
    """Eager host operations per DP rank per layer to gather the ZeRO-1/2 parameters (nanotron's
    ``all_gather_coalesced``)."""
    separate_grad_comm_buffer: bool
    """Gradients are copied into a reduce buffer of their own before the reduction
    (nanotron)."""
    grad_accum_pass_bytes: float
    """Bytes a parameter of the framework's own gradient-accumulation pass, run every
    micro-batch (``costmodel/optimizer.py``; nanotron's ``fp32_grad.add_(bf16 grad)``); 0: none."""
    grad_accum_pass_bytes_pp: float
    """``grad_accum_pass_bytes`` in a pipeline at ZeRO-0 (DeepSpeed's BF16_Optimizer); -1: the
    same as without a pipeline."""
    grad_accum_inplace_bytes: float
    """Bytes a parameter of autograd's in-place ``.grad`` add on every micro-batch but the
    first, where whole gradients are kept and the framework has no pass of its own."""
    zero2_grad_sync: GradSync
    """What ZeRO-2 pays under gradient accumulation, one of two costs, never neither:
    "micro_batch" reduce-scatters into the owner's shard every micro-batch (DeepSpeed ZeRO-2's
    hooks, ``zero/stage_1_and_2.py``; Megatron-FSDP's ``optim_grads``; FSDP2 with sync on,
    torchtitan); "step" keeps whole gradients and reduce-scatters once (FSDP2 with
    ``set_requires_gradient_sync(False)`` to the last micro-batch,
    ``torch.distributed.pipelining``'s schedules)."""
    zero2_grad_sync_pp: GradSync
    """``zero2_grad_sync`` under pipeline parallelism."""
    zero3_grad_sync: GradSync
    """ZeRO-3 alike: "micro_batch" as torchtitan's ``train_step``, "step" as NeMo AutoModel's
    ``get_sync_ctx`` (``set_requires_gradient_sync``; whole gradients held in the reduce
    dtype)."""
    zero3_master_is_param: bool
    """ZeRO-3 keeps no low-precision shard of the weights: the fp32 master shard is the
    parameter, cast to bf16 only while a unit is gathered (FSDP2's ``fully_shard`` with a
    MixedPrecisionPolicy, ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``; FSDP1's flat
    parameter alike). Off: a bf16 shard beside the fp32 main shard (DeepSpeed stage 3,
    Megatron-FSDP's two buffers)."""

    def __post_init__(self) -> None:
        require_positive("training", dp_bucket_bytes=self.dp_bucket_bytes)  # 0: no buckets
        _check_choices(zero2_grad_sync=(self.zero2_grad_sync, ("micro_batch", "step")),
                       zero2_grad_sync_pp=(self.zero2_grad_sync_pp, ("micro_batch", "step")),
                       zero3_grad_sync=(self.zero3_grad_sync, ("micro_batch", "step")))
        _subset(self, "zero_stages", ZERO_STAGES)
        _subset(self, "zero_stages_pp", ZERO_STAGES)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallel:
    """Tensor and sequence parallelism."""

    tp_comm_overlap: bool
    """TP's all-gathers and reduce-scatters overlap the GEMMs (Megatron ``--tp-comm-overlap``,
    Transformer Engine's userbuffers)."""
    sp_saves_gathered_input: bool
    """What SP keeps for the QKV and MLP-in projections' backward: Megatron the sharded norm
    output, all-gathered again (Korthikanti et al., 2022, 4.2.2); DTensor's ColwiseParallel the
    gathered one."""
    dtensor_tp: bool
    """TP on DTensors (torchtitan, the validation harness): each TP op pays
    ``dtensor_op_overhead_s`` more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """Pipeline parallelism: the schedules, how stages are placed and split, and how
    activations travel between them."""

    pp_schedules: tuple[str, ...]
    """The pipeline schedules the framework runs (validity: ``costmodel.rules``
    ``framework_schedule``)."""
    microbatch_groups: bool
    """The interleaved schedule runs micro-batches in groups of pp (Megatron-Core's default
    ``microbatch_group_size_per_vp_stage``). Validity: rule ``microbatch_groups``."""
    uneven_chunks: bool
    """The launcher takes an explicit per-virtual-stage layout (Megatron-Core's
    ``--pipeline-model-parallel-layout``, torchtitan's per-stage lists): any split of a stage
    into vpp chunks runs; off, only what the first/last-stage flags build. Validity: rule
    ``vpp_layers``."""
    pp_cost_balance: bool
    """Pipeline stages placed by compute cost, the LM head counted (nanotron, where a plan gives
    no split; ``costmodel.mapping.cost_balanced_split``); off: an even split."""
    overlap_p2p_comm: bool
    """Interleaved 1F1B sends a chunk's activation while the next computes (Megatron-LM's
    ``overlap_p2p_comm``, default with a virtual pipeline); without interleaving all wait for
    it."""
    pp_scatter_gather: bool
    """Megatron-LM's scatter/gather of pipeline activations (Narayanan et al., SC21, sec. 4.1):
    each TP rank sends 1/tp of a stage boundary's activation over its NIC, the next stage
    all-gathers it over NVLink. Only without sequence parallelism, which shards them anyway."""
    pp_tp_step_overhead_s: float
    """Extra seconds per TP ring step when a pipeline engine interleaves p2p with TP collectives
    on one stream across the network (nanotron's eager PP engine; 0 for separate streams)."""

    def __post_init__(self) -> None:
        _subset(self, "pp_schedules", PP_SCHEDULES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention:
    """The attention kernel and context parallelism's exchange."""

    flash_attention: bool
    """A fused attention kernel, which stores no score matrix; off: eager attention
    (Korthikanti et al.'s 5as/h score terms)."""
    attention_kernel: Literal["flash2", "flash3"]
    """The fused-attention kernel: "flash2", FlashAttention-2 and its peers (nanotron,
    llm-foundry, PyTorch SDPA); "flash3", FlashAttention-3 or cuDNN's under Transformer Engine
    (Hopper on)."""
    cp_comm: Literal["ring", "all_gather"]
    """CP's K/V exchange (``costmodel/parallel/context.py``): cp - 1 ring steps (Megatron-Core's
    p2p), or one all-gather (torchtitan's default)."""

    def __post_init__(self) -> None:
        _check_choices(attention_kernel=(self.attention_kernel, ("flash2", "flash3")),
                       cp_comm=(self.cp_comm, ("ring", "all_gather")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernels:
    """How the rest of a layer's work runs and is launched: the loss, the elementwise
    kernels, the host's issue cost and CUDA graphs."""

    loss_kernel: Literal["fused", "eager_fp32"]
    """The loss over the logits: "fused", or nanotron's "eager_fp32" ops
    (``costmodel.compute.LOSS_FP32_BYTES``)."""
    fused_elementwise: bool
    """Norms, RoPE and the activation function as fused kernels (nanotron's, Transformer
    Engine's, torch.compile); off: eager composites, several HBM passes each
    (``costmodel.compute.EAGER_*``)."""
    host_overhead_s: float
    """CPU seconds to issue one kernel or collective (eager PyTorch; ~10-20 us for lean
    stacks)."""
    cuda_graph_impl: Literal["none", "local", "transformer_engine"]
    """CUDA graphs (``costmodel/graphs.py``; Megatron-Core ``--cuda-graph-impl``): "none" runs
    eagerly."""
    cuda_graph_scope: tuple[str, ...]
    """What a layer's graphs capture (Megatron-Core ``--cuda-graph-scope``); (): the whole
    layer."""

    def __post_init__(self) -> None:
        _check_choices(loss_kernel=(self.loss_kernel, ("fused", "eager_fp32")))
        object.__setattr__(self, "cuda_graph_scope",
                           graph_scope(self.cuda_graph_impl, self.cuda_graph_scope))


@dataclass(frozen=True, slots=True, kw_only=True)
class Activations:
    """What the framework does to free stored activations: recompute them, or offload them to
    host memory."""

    recompute_modes: tuple[str, ...]
    """The recompute modes the framework runs (validity: ``costmodel.rules``
    ``framework_recompute``)."""
    partial_recompute: bool
    """Full recompute may cover part of a stage (Megatron-LM's ``--recompute-num-layers``)."""
    recompute_per_chunk: bool
    """A partial full-recompute count is per model chunk (Megatron-LM's
    ``--recompute-num-layers``): with vpp chunks a multiple of vpp. Validity: rule
    ``recompute_chunks``."""
    selective_recompute: Literal["activation", "every_other_mm", "modules"]
    """What ``recompute="selective"`` recomputes: "activation" (the MLP's activation, attention's
    scores without flash attention: Korthikanti et al.), "every_other_mm" (torchtitan's per-op
    policy: every elementwise op and every second GEMM; the rest and attention saved) or
    "modules": Megatron-Core's ``recompute_modules`` (``costmodel/recompute_modules.py``)."""
    recompute_modules: tuple[str, ...]
    """Megatron-Core's selective modules (``--recompute-modules``), where
    ``selective_recompute`` is "modules"; a plan may name its own."""
    cpu_offloading: bool
    """Activations offloaded to host memory per layer (Megatron-Core's
    ``--cpu-offloading-num-layers``, Transformer Engine's offload context): rule
    ``cpu_offload``; ``costmodel/offload.py``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", module_set(self.recompute_modules))
        _check_choices(selective_recompute=(self.selective_recompute,
                                            ("activation", "every_other_mm", "modules")))
        _subset(self, "recompute_modes", RECOMPUTE_MODES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Moe:
    """Mixture-of-experts layers: what the framework runs beside them, how tokens are
    dispatched, what is fused and what overlaps."""

    moe_tensor_parallel: bool
    """Tensor parallelism on a model with MoE layers (NeMo AutoModel's MoE parallelizer asserts
    tp == 1: ``nemo_automodel/components/moe/parallelizer.py``, ``parallelize_model``)."""
    moe_tp_sequence_parallel: bool
    """MoE layers train with tp > 1 only under SP (Megatron-Core's ``MoELayer.forward``): rule
    ``moe_tp_sp``."""
    moe_max_zero_stage: int
    """The highest ZeRO stage the framework runs with MoE layers (DeepSpeed refuses stage 3:
    ``runtime/engine.py`` ``_configure_zero_optimizer``)."""
    moe_dispatcher: Literal["alltoall", "allgather", "flex"]
    """MoE token dispatch (``costmodel/moe.py``, ``costmodel/parallel/expert.py``),
    Megatron-Core's ``--moe-token-dispatcher-type``: "alltoall" (permute, all-to-all over EP,
    all-gather over expert TP), "allgather" (every token all-gathered over TP x EP,
    reduce-scattered back) or "flex" (DeepEP / HybridEP: one copy of a token per destination
    rank and per remote node)."""
    moe_router_fusion: bool
    """``--moe-router-fusion``: the router's top-k and load-balancing loss as Transformer
    Engine's fused kernels."""
    moe_permute_fusion: bool
    """``--moe-permute-fusion``: the permute/unpermute as single fused kernels (one read, top-k
    writes)."""
    moe_a2a_overlap: bool
    """``--overlap-moe-expert-parallel-comm`` (Megatron-Bridge ``moe_a2a_overlap``): the EP
    all-to-all of one micro-batch overlaps another's compute; off, nothing hides it."""
    moe_shared_expert_overlap: bool
    """``--moe-shared-expert-overlap`` (alltoall dispatcher): the shared experts' MLP runs on a
    side stream during the dispatch and combine all-to-alls
    (``megatron/core/transformer/moe/README.md``)."""
    moe_load_imbalance: float
    """The busiest EP rank's routed tokens over the mean (>= 1): 1 under force-balanced routing
    (``--moe-router-force-load-balancing``) or capacity padding
    (``--moe-pad-expert-input-to-capacity``)."""
    moe_pad_to_capacity: bool
    """``--moe-pad-expert-input-to-capacity`` (with ``--moe-expert-capacity-factor``): every
    expert's input padded to its capacity, so the token counts are known on the host and the
    alltoall and HybridEP dispatchers skip their device-to-host sync (``costmodel/moe.py``
    ``host_syncs``)."""

    def __post_init__(self) -> None:
        _check_choices(moe_dispatcher=(self.moe_dispatcher, ("alltoall", "allgather", "flex")))
        if not self.moe_load_imbalance >= 1.0:
            raise SpecError("training.moe_load_imbalance must be >= 1 (busiest rank / mean), "
                            f"but got {self.moe_load_imbalance!r}")


# the groups of a profile, by attribute name
GROUPS: dict[str, type] = {"numerics": Numerics, "dp": DataParallel, "tp": TensorParallel,
                           "pp": Pipeline, "attention": Attention, "kernels": Kernels,
                           "activations": Activations, "moe": Moe}


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkProfile:
    """How a training framework behaves: its switches, by concern, and its memory model.

    Built from ``hardware_catalog/frameworks.yaml`` (``framework_profile`` there), never from
    defaults written here. A switch is read as ``training.framework.<group>.<switch>``.
    """

    numerics: Numerics
    """Bytes of weights, gradients, optimizer states and activations; fp8's casts."""
    dp: DataParallel
    """Data parallelism and ZeRO."""
    tp: TensorParallel
    """Tensor and sequence parallelism."""
    pp: Pipeline
    """Pipeline parallelism."""
    attention: Attention
    """The attention kernel and CP's exchange."""
    kernels: Kernels
    """The loss, elementwise kernels, host issue cost and CUDA graphs."""
    activations: Activations
    """Recompute and activation offloading."""
    moe: Moe
    """Mixture-of-experts layers."""
    multi_token_prediction: bool
    """The framework builds multi-token prediction modules (Megatron-Core's
    ``--mtp-num-layers``; ``megatron/core/transformer/multi_token_prediction.py``): rule
    ``mtp``."""
    memory_model: MemoryModel
    """The calibrated memory model: the PyTorch allocator's numbers with the framework's own
    activation and logits footprint (``costmodel/memory_model.py``)."""

    @classmethod
    def from_switches(cls, switches: Mapping[str, Any]) -> FrameworkProfile:
        """A profile from flat ``switch: value`` pairs, every switch given (and a
        ``memory_model``, a :class:`MemoryModel` or its fields): the names are those of
        :func:`switch_names`."""
        unknown = sorted(set(switches) - set(SWITCH_GROUP) - {"memory_model"})
        if unknown:
            raise SpecError(f"training.{unknown[0]}: not a framework switch (valid: "
                            f"{', '.join(sorted(SWITCH_GROUP))})")
        missing = [name for name in (*SWITCH_GROUP, "memory_model") if name not in switches]
        if missing:
            raise SpecError(f"a framework profile needs every switch, but got none for "
                            f"{', '.join(missing)}")
        mm = switches["memory_model"]
        groups = {group: kind(**{f.name: switches[f.name] for f in fields(kind)})
                  for group, kind in GROUPS.items()}
        return cls(**groups,  # type: ignore[arg-type]
                   multi_token_prediction=switches["multi_token_prediction"],
                   memory_model=mm if isinstance(mm, MemoryModel) else MemoryModel(**mm))

    def switches(self) -> dict[str, Any]:
        """Every switch by its flat name, in group order (not the memory model)."""
        out: dict[str, Any] = {}
        for group in GROUPS:
            part = getattr(self, group)
            out.update({f.name: getattr(part, f.name) for f in fields(part)})
        out["multi_token_prediction"] = self.multi_token_prediction
        return out

    def switch(self, name: str) -> Any:
        """One switch by its flat name."""
        group = SWITCH_GROUP[name]
        return getattr(getattr(self, group) if group else self, name)

    def with_switches(self, **changes: Any) -> FrameworkProfile:
        """This profile with some switches (by flat name) or its memory model changed."""
        unknown = sorted(set(changes) - set(SWITCH_GROUP) - {"memory_model"})
        if unknown:
            raise SpecError(f"training.{unknown[0]}: not a framework switch (valid: "
                            f"{', '.join(sorted(SWITCH_GROUP))})")
        top = {k: v for k, v in changes.items() if not SWITCH_GROUP.get(k)}
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if SWITCH_GROUP.get(name):
                by_group.setdefault(SWITCH_GROUP[name], {})[name] = value
        parts = {g: replace(getattr(self, g), **kw) for g, kw in by_group.items()}
        return replace(self, **parts, **top)


# each switch's group ("" for the profile's own fields)
SWITCH_GROUP: dict[str, str] = {
    **{f.name: group for group, kind in GROUPS.items() for f in fields(kind)},
    "multi_token_prediction": ""}


def switch_names() -> tuple[str, ...]:
    """Every switch's flat name (frameworks.yaml's keys, beside ``memory_model``)."""
    return tuple(SWITCH_GROUP)


assert len(SWITCH_GROUP) == sum(len(fields(kind)) for kind in GROUPS.values()) + 1, \
    "a switch name is unique across the groups"
