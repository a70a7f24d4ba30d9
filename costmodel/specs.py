"""Inputs of the cost model: the model, the cluster, the plan and the training setup.

All are frozen, slotted, keyword-only dataclasses in SI units (bytes, FLOP/s, seconds). They hold
no behaviour beyond validation and a few derived sizes, so that the formulas in the sibling modules
read like the papers they cite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from costmodel.attention import MlaSpec
from costmodel.errors import SpecError, require_positive
from costmodel.graphs import graph_scope
from costmodel.hardware import ClusterSpec, Efficiency, GpuSpec
from costmodel.layer_style import (
    Bias,
    MoeRouter,
    Norm,
    PositionEmbedding,
    RopeScaling,
    style_errors,
)
from costmodel.memory_model import MemoryModel
from costmodel.plan_fields import (
    PP_SCHEDULES,
    RECOMPUTE_MODES,
    PipelineSchedule,
    Recompute,
    check_fields,
    fields_doc,
)
from costmodel.recompute_modules import MEGATRON_DEFAULT, module_set, plan_modules

FfnType = Literal["swiglu", "gelu"]
Precision = Literal["bf16", "fp16", "fp8"]

RECOMPUTE_CODES: dict[str, int] = {name: i for i, name in enumerate(RECOMPUTE_MODES)}
PRECISION_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp8": 2}
SCHEDULE_CODES: dict[str, int] = {name: i for i, name in enumerate(PP_SCHEDULES)}
SCHEDULE_NAMES: dict[int, PipelineSchedule] = dict(enumerate(PP_SCHEDULES))

__all__ = ["ClusterSpec", "Efficiency", "GpuSpec", "MemoryModel", "ModelSpec", "PipelineSchedule",
           "Plan", "Recompute", "SpecError", "Training"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. MoE when ``moe_experts > 0``.

    ``ffn_hidden`` is the dense MLP width; ``moe_ffn_hidden`` the per-expert width (defaults to
    ``ffn_hidden``). ``moe_dense_layers`` leading layers stay dense (DeepSeek-V3 keeps 3).
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
    moe_router: MoeRouter | None = None  # beyond top-k softmax (no cost; the exports)
    mla: MlaSpec | None = None  # multi-head latent attention (costmodel.attention)
    sliding_window: int = 0  # tokens each query attends to at most (0: the whole sequence)
    norm: Norm = "rmsnorm"  # norm .. bias: see costmodel/layer_style.py
    position_embedding: PositionEmbedding = "rope"
    rope_base: float = 10000.0  # RoPE theta; unused with learned positions
    rope_scaling: RopeScaling | None = None  # long-context RoPE scaling (no cost; the exports)
    bias: Bias = "none"  # linear-layer biases: none, QKV only (Qwen2.x), every one (GPT-3)
    mtp_layers: int = 0  # multi-token prediction depths (Megatron --mtp-num-layers; costmodel.mtp)

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
                     "sliding_window", "mtp_layers"):
            if getattr(self, name) < 0:
                raise SpecError(f"model.{name} must be >= 0, but got {getattr(self, name)}")
        if self.moe_experts and not 0 < self.moe_topk <= self.moe_experts:
            raise SpecError(f"model.moe_topk must be in 1..moe_experts={self.moe_experts}, "
                            f"but got moe_topk={self.moe_topk}")
        if self.moe_router is not None and (not self.moe_experts
                                            or self.moe_experts % self.moe_router.groups):
            raise SpecError(f"model.moe_router needs experts that its {self.moe_router.groups} "
                            f"groups divide, but got moe_experts={self.moe_experts}")
        if self.rope_scaling is not None and self.position_embedding != "rope":
            raise SpecError("model.rope_scaling needs position_embedding rope")
        if not 0 <= (n := self.moe_dense_layers) <= self.layers:
            raise SpecError(f"model.moe_dense_layers must be in 0..layers, but got {n}")

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
    def moe_layers(self) -> int:
        return self.layers - self.moe_dense_layers if self.is_moe else 0


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", plan_modules(self.recompute_modules))
        check_fields(self)  # each field alone, by its row: degrees, choices, counts
        # cross-field rules that read nothing but the plan, from the one table (the rest:
        # check_plan)
        from costmodel.rules import check_own

        check_own(self)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def schedule(self) -> PipelineSchedule:
        """The schedule run: interleaved iff vpp > 1 (``costmodel.rules.schedule_code``)."""
        from costmodel.rules import schedule_code

        code = int(schedule_code(SCHEDULE_CODES[self.pp_schedule], self.vpp))
        return SCHEDULE_NAMES[code]


Plan.__doc__ = f"{Plan.__doc__}\n    {fields_doc()}"  # help(Plan) shows each field's meaning


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """What one optimizer step processes and how the framework behaves.

    ``global_batch`` is in sequences. The overlap flags are real framework switches
    (Megatron ``--overlap-grad-reduce``/``--overlap-param-gather``/``--tp-comm-overlap``,
    FSDP prefetching); frameworks differ in their defaults.
    """

    seq_len: int
    global_batch: int
    precision: Precision = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    grad_dtype_bytes: int = 4  # fp32 gradient accumulation buffer (Megatron main_grad, nanotron)
    # bytes a parameter of gradient accumulation (optimizer.py): a pass of the framework's own
    # every micro-batch (``_pp``: in a pipeline at ZeRO-0; -1: the same), or autograd's in-place
    # .grad add on all but the first where whole gradients are kept (``inplace``)
    grad_accum_pass_bytes: float = 0.0
    grad_accum_pass_bytes_pp: float = -1.0
    grad_accum_inplace_bytes: float = 0.0
    master_weights: bool = True  # fp32 master copy next to the low-precision weights
    # Bytes of an optimizer state element (Adam's m, v; SGD's momentum): fp32 beside fp32 masters;
    # torch.optim's zeros_like keeps the parameter's dtype (bf16 in NeMo AutoModel's MoE models)
    optimizer_state_bytes: int = 4
    # Bytes of a gradient element as reduced (0: grad_dtype_bytes): FSDP2's reduce_dtype=float32
    # (sync off, accumulated whole in fp32: _fsdp_param.py to_accumulated_grad_if_needed)
    grad_reduce_bytes: int = 0
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    flash_attention: bool = True
    # The fused-attention kernel: "flash2", FlashAttention-2 and its peers (nanotron, llm-foundry,
    # PyTorch SDPA); "flash3", FlashAttention-3 or cuDNN's under Transformer Engine (Hopper on)
    attention_kernel: Literal["flash2", "flash3"] = "flash2"
    # the loss over the logits: "fused", or nanotron's "eager_fp32" ops (compute.LOSS_FP32_BYTES)
    loss_kernel: Literal["fused", "eager_fp32"] = "fused"
    # whether ZeRO-1/2's gradient reduction runs during backward (Megatron) or after (nanotron)
    overlap_grad_reduce_sharded: bool = True
    # ZeRO-1/2: gradients by a full all-reduce (twice a reduce-scatter's bytes); both DP
    # collectives as one call on the whole buffer, not dp_bucket_bytes buckets; eager host ops per
    # DP rank per layer to gather the parameters. nanotron's ZeRO-1: all three (frameworks.yaml)
    sharded_grad_all_reduce: bool = False
    sharded_dp_one_call: bool = False
    sharded_gather_host_ops: float = 0.0
    separate_grad_comm_buffer: bool = False  # nanotron copies grads into a reduce buffer
    # ZeRO-2 under gradient accumulation pays one of two costs, never neither: "micro_batch"
    # reduce-scatters into the owner's shard every micro-batch (DeepSpeed ZeRO-2's hooks, zero/
    # stage_1_and_2.py; Megatron-FSDP's optim_grads; FSDP2 with sync on, torchtitan); "step" keeps
    # whole gradients, reduce-scatters once (FSDP2 with set_requires_gradient_sync(False) to the
    # last micro-batch, torch.distributed.pipelining's schedules). ``_pp``: under PP.
    zero2_grad_sync: Literal["micro_batch", "step"] = "micro_batch"
    # CP's K/V exchange (parallel/context.py): cp - 1 ring steps (Megatron-Core's p2p), or one
    # all-gather (torchtitan's default)
    cp_comm: Literal["ring", "all_gather"] = "ring"
    zero2_grad_sync_pp: Literal["micro_batch", "step"] = "micro_batch"
    # ZeRO-3 alike: "micro_batch" as torchtitan's train_step, "step" as NeMo AutoModel's
    # get_sync_ctx (set_requires_gradient_sync; whole gradients held in the reduce dtype)
    zero3_grad_sync: Literal["micro_batch", "step"] = "micro_batch"
    # A partial full-recompute count is per model chunk (Megatron-LM's --recompute-num-layers):
    # with vpp chunks a multiple of vpp. Validity (costmodel.rules ``recompute_chunks``)
    recompute_per_chunk: bool = False
    # The interleaved schedule's micro-batches in groups of pp (Megatron-Core's default
    # microbatch_group_size_per_vp_stage). Validity (rules microbatch_groups)
    microbatch_groups: bool = False
    # MoE layers train with tp > 1 only under SP (Megatron-Core's MoELayer.forward): rule moe_tp_sp
    moe_tp_sequence_parallel: bool = False
    # The launcher takes an explicit per-virtual-stage layout (Megatron-Core's
    # --pipeline-model-parallel-layout, torchtitan's per-stage lists): any split of a stage into
    # vpp chunks runs; off, only what the first/last-stage flags build. Validity (vpp_layers)
    uneven_chunks: bool = False
    dp_bucket_bytes: float = 25 * 2**20  # gradient bucket (torch DDP's default 25 MiB)
    # Extra seconds per TP ring step when a pipeline engine interleaves p2p with TP collectives on
    # one stream across the network (nanotron's eager PP engine; 0 for separate streams).
    pp_tp_step_overhead_s: float = 0.0
    # Megatron-LM's scatter/gather of pipeline activations (Narayanan et al., SC21, sec. 4.1):
    # each TP rank sends 1/tp of a stage boundary's activation over its NIC, the next stage
    # all-gathers it over NVLink. Only without sequence parallel, which shards them anyway.
    pp_scatter_gather: bool = False
    # Interleaved 1F1B sends a chunk's activation while the next computes (Megatron-LM's
    # overlap_p2p_comm, default with a virtual pipeline); without interleaving all wait for it
    overlap_p2p_comm: bool = False
    # What SP keeps for the QKV and MLP-in projections' backward: Megatron the sharded norm output,
    # all-gathered again (Korthikanti et al., 2022, 4.2.2); DTensor's ColwiseParallel the gathered
    sp_saves_gathered_input: bool = False
    # activations offloaded to host memory per layer (Megatron-Core's --cpu-offloading-num-layers,
    # Transformer Engine's offload context): rule ``cpu_offload``; costmodel/offload.py
    cpu_offloading: bool = False
    # TP on DTensors (torchtitan, the harness): each TP op pays dtensor_op_overhead_s more
    dtensor_tp: bool = False
    # Bytes of an activation element, exchanged, stored for backward and streamed by elementwise
    # kernels: 2 under bf16/fp16 autocast (fp8 GEMMs too); 4 without (CPU validation runs, fp32)
    activation_dtype_bytes: float = 2.0
    # fp8 keeps the GEMM inputs' casts for backward (TE's Linear); torchao's keeps bf16 ones
    fp8_saves_cast_inputs: bool = True
    # fp8 weights only (Megatron-LM --fp8-param-gather): 1 byte a weight, not bf16 plus a cast,
    # all-gathered in fp8 by the distributed optimizer (fp32 masters stay)
    fp8_param_gather: bool = False
    # fp8 weight casts cached after a step's first micro-batch (Megatron-Core's TE layers pass
    # is_first_microbatch, megatron/core/extensions/transformer_engine.py); not in torchao's
    fp8_weight_cache: bool = True
    # Norms, RoPE and the activation function as fused kernels (nanotron's, Transformer Engine's,
    # torch.compile); False: eager composites, several HBM passes each (costmodel.compute.EAGER_*)
    fused_elementwise: bool = True
    # Pipeline stages placed by compute cost, the LM head counted (nanotron, where a plan gives
    # no split; costmodel.mapping.cost_balanced_split); False: an even split
    pp_cost_balance: bool = False
    # What recompute="selective" recomputes: "activation" (the MLP's activation, attention's
    # scores without flash attention: Korthikanti et al.), "every_other_mm" (torchtitan's
    # per-op policy: every elementwise op and every second GEMM; the rest and attention saved)
    # or "modules": Megatron-Core's recompute_modules (costmodel/recompute_modules.py)
    selective_recompute: Literal["activation", "every_other_mm", "modules"] = "activation"
    recompute_modules: tuple[str, ...] = MEGATRON_DEFAULT
    # CPU time to issue one kernel or collective (eager PyTorch; ~10-20 us for lean stacks)
    host_overhead_s: float = 15e-6
    # CUDA graphs (costmodel/graphs.py; Megatron-Core --cuda-graph-impl/--cuda-graph-scope):
    # the scope names what a layer's graphs capture, () the whole layer; "none": eager
    cuda_graph_impl: Literal["none", "local", "transformer_engine"] = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    # --moe-router-fusion: the router's top-k and load-balancing loss as TE's fused kernels
    moe_router_fusion: bool = False
    # MoE token dispatch (costmodel/moe.py, costmodel/parallel/expert.py), Megatron-Core's
    # --moe-token-dispatcher-type: "alltoall" (permute, all-to-all over EP, all-gather over
    # expert TP), "allgather" (every token all-gathered over TP x EP, reduce-scattered back) or
    # "flex" (DeepEP / HybridEP: one copy of a token per destination rank and per remote node)
    moe_dispatcher: Literal["alltoall", "allgather", "flex"] = "alltoall"
    # --moe-permute-fusion: the permute/unpermute as single fused kernels (one read, top-k writes)
    moe_permute_fusion: bool = False
    # --overlap-moe-expert-parallel-comm (Megatron-Bridge moe_a2a_overlap): the EP all-to-all of
    # one micro-batch overlaps another's compute; off by default, nothing hides it
    moe_a2a_overlap: bool = False
    # --moe-shared-expert-overlap (alltoall dispatcher): the shared experts' MLP runs on a side
    # stream during the dispatch and combine all-to-alls (megatron/core/transformer/moe/README.md)
    moe_shared_expert_overlap: bool = False
    # the busiest EP rank's routed tokens over the mean (>= 1): 1 under force-balanced routing
    # (--moe-router-force-load-balancing) or capacity padding (--moe-pad-expert-input-to-capacity)
    moe_load_imbalance: float = 1.0
    # --moe-pad-expert-input-to-capacity (with --moe-expert-capacity-factor): every expert's
    # input padded to its capacity, so the token counts are known on the host and the alltoall
    # and HybridEP dispatchers skip their device-to-host sync (costmodel/moe.py host_syncs)
    moe_pad_to_capacity: bool = False
    # ZeRO-3 keeps no low-precision shard of the weights: the fp32 master shard is the parameter,
    # cast to bf16 only while a unit is gathered (FSDP2's fully_shard with a MixedPrecisionPolicy,
    # torch/distributed/fsdp/_fully_shard/_fsdp_param.py; FSDP1's flat parameter alike). Off: a
    # bf16 shard beside the fp32 main shard (DeepSpeed stage 3, Megatron-FSDP's two buffers).
    zero3_master_is_param: bool = False
    # What the framework runs at all, cited in its profile (validity: costmodel.rules
    # ``framework_*``): its ZeRO stages (``_pp``: under PP), its recompute modes, whether full
    # recompute may cover part of a stage (--recompute-num-layers), its pipeline schedules
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    zero_stages_pp: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    partial_recompute: bool = True
    pp_schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
    # ... with MoE layers (DeepSpeed refuses stage 3: runtime/engine.py _configure_zero_optimizer)
    moe_max_zero_stage: int = 3
    # Tensor parallelism on a model with MoE layers (NeMo AutoModel's MoE parallelizer asserts
    # tp == 1: nemo_automodel/components/moe/parallelizer.py, parallelize_model)
    moe_tensor_parallel: bool = True
    # The framework builds MTP modules (Megatron-Core's --mtp-num-layers): rule ``mtp``
    multi_token_prediction: bool = True
    memory_model: MemoryModel = field(default_factory=MemoryModel)

    def __post_init__(self) -> None:
        require_positive("training", seq_len=self.seq_len, global_batch=self.global_batch,
                         dp_bucket_bytes=self.dp_bucket_bytes)  # 0 bytes: infinite buckets
        if self.activation_dtype_bytes not in (2.0, 4.0):
            raise SpecError("training.activation_dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), "
                            f"but got {self.activation_dtype_bytes!r}")
        object.__setattr__(self, "recompute_modules", module_set(self.recompute_modules))
        for name, choices in (("selective_recompute", ("activation", "every_other_mm", "modules")),
                              ("optimizer_state_bytes", (2, 4)), ("grad_reduce_bytes", (0, 2, 4)),
                              ("zero3_grad_sync", ("micro_batch", "step")),
                              ("loss_kernel", ("fused", "eager_fp32")),
                              ("attention_kernel", ("flash2", "flash3")),
                              ("moe_dispatcher", ("alltoall", "allgather", "flex")),
                              ("precision", tuple(PRECISION_CODES))):
            if (value := getattr(self, name)) not in choices:
                raise SpecError(f"training.{name} must be one of {sorted(choices)}, "
                                f"but got {value!r}")
        if not self.moe_load_imbalance >= 1.0:
            raise SpecError("training.moe_load_imbalance must be >= 1 (busiest rank / mean), "
                            f"but got {self.moe_load_imbalance!r}")
        object.__setattr__(self, "cuda_graph_scope",
                           graph_scope(self.cuda_graph_impl, self.cuda_graph_scope))
        for name, known in (("zero_stages", (0, 1, 2, 3)), ("zero_stages_pp", (0, 1, 2, 3)),
                            ("recompute_modes", tuple(RECOMPUTE_CODES)),
                            ("pp_schedules", tuple(SCHEDULE_CODES))):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name) or not set(getattr(self, name)) <= set(known):
                raise SpecError(f"training.{name} must be a non-empty subset of {list(known)}, "
                                f"but got {list(getattr(self, name))!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def grad_reduce_dtype_bytes(self) -> int:
        """Bytes of a gradient element on the wire (and in an unsharded accumulation)."""
        return self.grad_reduce_bytes or self.grad_dtype_bytes
