"""The framework's parallelism switches: data parallelism and ZeRO, tensor and sequence
parallelism, the pipeline, and the MoE layers' expert parallelism (groups of
:class:`~costmodel.framework.FrameworkProfile`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodel.errors import SpecError, require_positive
from costmodel.framework.checks import PP_SCHEDULES, ZERO_STAGES, as_subset, check_choices
from costmodel.placement import parse_rank_order

GradSync = Literal["micro_batch", "step"]


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
    fsdp_pp_keeps_gathered: bool
    """A run launched fully sharded (FSDP, ZeRO-3) under a pipeline keeps its parameters
    gathered from forward to backward, the default policy's (torchtitan's FSDP2): what it ran
    is ZeRO-1's memory and traffic (read where a measured row states ZeRO-3 with pp > 1)."""

    def __post_init__(self) -> None:
        require_positive("training", dp_bucket_bytes=self.dp_bucket_bytes)  # 0: no buckets
        check_choices(zero2_grad_sync=(self.zero2_grad_sync, ("micro_batch", "step")),
                       zero2_grad_sync_pp=(self.zero2_grad_sync_pp, ("micro_batch", "step")),
                       zero3_grad_sync=(self.zero3_grad_sync, ("micro_batch", "step")))
        as_subset(self, "zero_stages", ZERO_STAGES)
        as_subset(self, "zero_stages_pp", ZERO_STAGES)


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
    fp8_sp_gather: bool
    """Under fp8, the forward's sequence-parallel all-gathers move the quantised input (1 byte
    an element): Transformer Engine's LayerNormLinear quantises in the norm kernel and gathers
    the fp8 tensor; torchao's Float8ColwiseParallel / PrepareFloat8ModuleInput cast before the
    all-gather. Off: gathered at the activations' dtype."""


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
    rank_order: str
    """How the framework lays its parallel dimensions over the global ranks, fastest-varying
    first (Megatron-Core's ``order``, ``"tp-cp-ep-dp-pp"``): which groups share an NVLink domain
    and which pipeline hops leave it (``costmodel.placement``)."""

    def __post_init__(self) -> None:
        as_subset(self, "pp_schedules", PP_SCHEDULES)
        parse_rank_order(self.rank_order, "training.rank_order")



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
    rank and, through the RDMA stage, per destination node)."""
    moe_router_fusion: bool
    """``--moe-router-fusion``: the router's top-k and load-balancing loss as Transformer
    Engine's fused kernels."""
    moe_permute_fusion: bool
    """``--moe-permute-fusion``: the permute/unpermute as single fused kernels (one read, top-k
    writes)."""
    moe_a2a_overlap: bool
    """``--overlap-moe-expert-parallel-comm`` (Megatron-Bridge ``moe_a2a_overlap``): the EP
    all-to-all of one micro-batch overlaps another's compute; off, nothing hides it."""
    moe_flex_sms: int
    """The SMs the flex dispatcher's fused kernels hold while they run (Megatron-Core's
    ``--moe-deepep-num-sms``, default 20 for DeepEP, its default backend; HybridEP's
    ``--moe-hybridep-num-sms``): under ``moe_a2a_overlap`` the compute beside them runs on the
    rest (``costmodel.parallel.expert.lapped``)."""
    moe_shared_expert_overlap: bool
    """``--moe-shared-expert-overlap`` (alltoall dispatcher): the shared experts' MLP runs on a
    side stream during the dispatch and combine all-to-alls
    (``megatron/core/transformer/moe/README.md``)."""
    moe_dispatchers: tuple[str, ...]
    """The dispatchers a plan may run besides the training's (plan field ``moe_dispatcher``;
    rule ``moe_dispatch``): those the framework's launcher takes as a switch."""
    moe_a2a_overlaps: tuple[bool, ...]
    """The all-to-all overlap settings a plan may run besides the training's (plan field
    ``moe_a2a_overlap``)."""
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
        check_choices(moe_dispatcher=(self.moe_dispatcher, ("alltoall", "allgather", "flex")))
        for name, known in (("moe_dispatchers", ("alltoall", "allgather", "flex")),
                            ("moe_a2a_overlaps", (False, True))):
            value = tuple(getattr(self, name))
            object.__setattr__(self, name, value)
            if not set(value) <= set(known):
                raise SpecError(f"training.{name} must be a subset of {list(known)}, but got "
                                f"{list(value)!r}")
        if self.moe_flex_sms < 1:
            raise SpecError("training.moe_flex_sms must be >= 1 (the SMs DeepEP's kernels hold), "
                            f"but got {self.moe_flex_sms!r}")
        if not self.moe_load_imbalance >= 1.0:
            raise SpecError("training.moe_load_imbalance must be >= 1 (busiest rank / mean), "
                            f"but got {self.moe_load_imbalance!r}")
