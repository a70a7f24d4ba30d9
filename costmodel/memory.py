"""Memory per GPU and pipeline stage: model states, activations, buffers, allocator overhead.

Model states (Rajbhandari et al., ZeRO, 2020): low-precision weights, the fp32 gradient
accumulation buffer and Adam's fp32 master weights, m and v, each sharded over the data-parallel
group from the ZeRO stage that shards it (1: optimizer, 2: + gradients, 3: + weights; FSDP
FULL_SHARD is 3, its fp32 shard the master itself), the routed experts' over their expert-DP
replicas. Activations follow Korthikanti et al. ("Reducing Activation Recomputation in
Large Transformer Models", 2022, sec. 4) tensor by tensor, with flash attention (no s^2 scores)
and gated MLPs, divided by TP inside the TP regions and by TP everywhere under sequence parallel.

The step has two peaks, and a plan must fit both: during forward/backward (states + in-flight
activations + logits) and during the optimizer step (states + communication buffers). Near
capacity the caching allocator stalls the step (:func:`allocator_stall`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.activation_memory import BF16, activation_bytes_per_layer
from costmodel.dispatch import warms_up_one_more
from costmodel.mapping import (
    STAGES,
    StageLayers,
    expert_dp,
    expert_tp,
    inflight_micro_batches,
    micro_batches,
)
from costmodel.memory_model import normal_cdf
from costmodel.mtp import block_saved_bytes, mtp_params
from costmodel.params import (
    attention_params,
    dense_mlp_params,
    embedding_params,
    expert_params,
    norm_params,
)
from costmodel.plans import PlanArrays
from costmodel.recompute import recomputed_layers
from costmodel.specs import ClusterSpec, GpuSpec, ModelSpec, Training


@dataclass(frozen=True, slots=True)
class MemoryCoefficients:
    """Per-GPU bytes that are linear in the layers a stage holds; see :func:`stage_memory`."""

    dense_params_per_layer: np.ndarray  # local non-expert parameters of an average layer
    expert_params_per_layer: np.ndarray  # local routed-expert parameters of an average layer
    act_per_layer: np.ndarray  # stored activations, one micro-batch, plan's recompute mode
    ckpt_per_layer: np.ndarray  # stored for a fully recomputed layer, one micro-batch
    working: np.ndarray  # one layer's full activations (recompute / backward transient)
    embed_params: np.ndarray  # local embedding (first stage) / LM head (last stage) params
    head_params: np.ndarray
    bytes_per_param: dict[str, np.ndarray]  # weights, grads, optimizer, opt_buffer
    expert_bytes_per_param: dict[str, np.ndarray]  # the same over the expert-DP shard
    logits: np.ndarray  # last stage, one micro-batch
    mtp_dense_params: np.ndarray  # last stage: the MTP depths' local parameters (costmodel.mtp)
    mtp_expert_params: np.ndarray
    mtp_act: np.ndarray  # ... and their stored activations, one micro-batch
    gather_buffer: np.ndarray  # ZeRO-3 / FSDP unsharded units in flight
    # a leading dense layer (DeepSeek-V3's first 3) less a pattern layer, local parameters: the
    # first stage holds them (:func:`leading_dense_on`)
    lead_dense_params: np.ndarray
    lead_expert_params: np.ndarray


def zero2_reduces_each_micro_batch(tr: Training, p: PlanArrays) -> np.ndarray:
    """Where ZeRO-2 reduce-scatters every micro-batch (and so keeps only its gradient shard)
    rather than once per step from a whole gradient buffer
    (``training.framework.dp.zero2_grad_sync``)."""
    mode = np.where(p.pp > 1, tr.framework.dp.zero2_grad_sync_pp == "micro_batch",
                    tr.framework.dp.zero2_grad_sync == "micro_batch")
    return (p.zero_stage == 2) & (mode | (micro_batches(tr.global_batch, p) == 1))


def zero3_accumulates_whole(tr: Training, p: PlanArrays) -> np.ndarray:
    """Where ZeRO-3 accumulates whole gradients and reduce-scatters once per step
    (``training.framework.dp.zero3_grad_sync``) rather than every micro-batch."""
    return ((p.zero_stage >= 3) & (tr.framework.dp.zero3_grad_sync == "step")
            & (micro_batches(tr.global_batch, p) > 1))


def fp8_weights(tr: Training) -> bool:
    """Whether the weights themselves are fp8 (``fp8_param_gather`` at fp8)."""
    return tr.precision == "fp8" and tr.framework.numerics.fp8_param_gather


def fp8_weight_bytes(tr: Training, gpu: GpuSpec) -> tuple[float, float]:
    """Bytes per parameter of the weights under fp8 beside the optimizer's: (held as sharded,
    held whole). Transformer Engine's fp8 copy of a weight is its data and, where the GPU's fp8
    GEMMs take only the TN layout, its transpose (``GpuSpec.fp8_weight_copy_bytes``). fp8
    weights (``fp8_param_gather``) are that copy: the distributed optimizer builds each one's
    transpose after its all-gather (megatron/core/distributed/distributed_data_parallel.py,
    fp8_utils.post_all_gather_processing, core_v0.16.1), while Megatron-FSDP drops it after use
    (keep_fp8_transpose_cache off) and holds the fp8 shard. bf16 weights under a stack that caches
    their cast (``fp8_weight_cache``: Megatron-Core passes is_first_microbatch) keep the cast
    copy all step in the module's workspace (transformer_engine/pytorch/module/base.py
    get_weight_workspace, v2.9), made from the gathered weight and kept whole under ZeRO-3:
    Megatron-Core hands Transformer Engine no FSDP group to shard it by. A stack that casts each
    GEMM's weight afresh holds no copy."""
    if tr.precision != "fp8":
        return BF16, 0.0
    if fp8_weights(tr):
        return 1.0, gpu.fp8_weight_copy_bytes - 1.0
    return BF16, gpu.fp8_weight_copy_bytes if tr.framework.numerics.fp8_weight_cache else 0.0


def _states_per_param(tr: Training, p: PlanArrays, shard: np.ndarray,
                      gpu: GpuSpec) -> dict[str, np.ndarray]:
    z = p.zero_stage
    w, copy = fp8_weight_bytes(tr, gpu)
    # under ZeRO-3 fp8 weights keep no transpose between uses; a bf16 weight's cached cast does
    fp8_own = fp8_weights(tr)
    g = float(tr.framework.numerics.grad_dtype_bytes)
    master = 4.0 if tr.framework.numerics.master_weights else 0.0
    state = float(tr.framework.numerics.optimizer_state_bytes)
    o = master + (2.0 if tr.optimizer == "adam" else 1.0) * state
    # FSDP's ZeRO-3 holds the fp32 master shard as the parameter itself, no bf16 shard beside
    # it (``training.framework.dp.zero3_master_is_param``): the weights are the master, the rest
    # optimizer
    one_copy = tr.framework.dp.zero3_master_is_param and tr.framework.numerics.master_weights
    weights = np.where(z >= 3, (master if one_copy else w) / shard + (0.0 if fp8_own else copy),
                       w + copy)
    # ZeRO-2 accumulating whole gradients over micro-batches holds them unsharded; so does
    # ZeRO-3 with its sync off until the last micro-batch, in the reduce dtype, where the group
    # is sharded at all (FSDP leaves a group of one, e.g. experts without replicas, to autograd)
    grads = np.where((z >= 3) | zero2_reduces_each_micro_batch(tr, p), g / shard, g)
    grads = np.where(zero3_accumulates_whole(tr, p) & (shard > 1),
                     float(tr.framework.numerics.grad_reduce_dtype_bytes), grads)
    optimizer = np.where(z >= 1, np.where((z >= 3) & one_copy, o - master, o) / shard, o)
    # A framework that reduces gradients out of a separate buffer keeps a low-precision copy for
    # the all-reduce all step long (ZeRO-0), or a full-precision one plus the gathered shard at
    # the optimizer step (ZeRO-1/2).
    zero = np.zeros_like(shard, dtype=float)
    if tr.framework.dp.separate_grad_comm_buffer:
        comm_buffer = np.where((shard > 1) & (z == 0), BF16, 0.0)
        opt_buffer = np.where((shard > 1) & (z >= 1), g + BF16 / shard, 0.0)
    else:
        comm_buffer, opt_buffer = zero, zero
    return {"weights": weights, "grads": grads, "optimizer": optimizer,
            "comm_buffer": comm_buffer, "opt_buffer": opt_buffer}


def logits_bytes(tr: Training) -> float:
    """Bytes a logit holds from the loss's forward to its backward: Transformer Engine's
    in-place cross-entropy keeps the logits alone, its gradient written over them
    (``costmodel.compute.LOSS_LOGIT_PASSES``); any other loss, the memory model's count."""
    if tr.framework.kernels.loss_kernel == "te_inplace":
        return tr.framework.numerics.activation_dtype_bytes
    return tr.framework.memory_model.logits_bytes_per_element


def coefficients(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                 p: PlanArrays) -> MemoryCoefficients:
    mm = tr.framework.memory_model
    tp, ep = p.tp.astype(float), p.ep.astype(float)
    etp = expert_tp(p).astype(float)
    shard = (p.dp * p.cp).astype(float)
    expert_shard = expert_dp(p).astype(float)
    # an average layer of the pattern after the leading dense layers (every layer of a model
    # without them); those leading layers are the first stage's (:func:`leading_dense_on`)
    lead = model.moe_dense_layers if model.is_moe else 0
    moe_frac = model.moe_layers / max(model.layers - lead, 1)
    dense_mlp = dense_mlp_params(model) / tp
    dense = attention_params(model) / tp + norm_params(model) + (1 - moe_frac) * dense_mlp
    if model.is_moe:
        router = model.hidden * model.moe_experts
        shared = model.moe_shared_experts * expert_params(model) / tp + router
        routed = model.moe_experts / ep * expert_params(model) / etp
        dense = dense + moe_frac * shared
        experts = moe_frac * routed
        # a leading dense layer holds a dense MLP, sharded over data parallel by the
        # distributed optimizer, where a pattern layer holds the shared expert and the router
        # beside its routed experts, sharded over their expert-DP replicas only
        lead_dense = moe_frac * (dense_mlp - shared)
        lead_experts = -experts
    else:
        experts = np.zeros_like(tp)
        lead_dense, lead_experts = np.zeros_like(tp), np.zeros_like(tp)
    stored, ckpt, full_layer = activation_bytes_per_layer(model, tr, p)
    act_f = mm.activation_factor
    M = p.micro_batch * tr.seq_len / p.cp
    embed = embedding_params(model) / tp
    # ZeRO-3 / FSDP: two units gathered in bf16 (the one computing and the one prefetched), or
    # as fp8 weights with the transposes built after the gather (:func:`fp8_weight_bytes`).
    # Experts are gathered over their expert-DP replicas; with none (ep x expert TP spans the
    # stage) their shard is whole and resident, and only a framework whose shard is the fp32
    # master casts a bf16 copy of it per unit
    one_copy = tr.framework.dp.zero3_master_is_param and tr.framework.numerics.master_weights
    gathered = dense + experts * ((expert_shard > 1) | one_copy)
    unit = sum(fp8_weight_bytes(tr, cluster.gpu)) if fp8_weights(tr) else BF16
    gather = np.where(p.zero_stage >= 3, 2.0 * gathered * unit, 0.0)
    mtp_dense, mtp_experts = mtp_params(model, p)
    # each depth: its layer's activations as a decoder layer's (under full recompute the module's
    # checkpoint alone) and the block's own
    mtp_layer_act = np.where(p.recompute == 2, 0.0, stored)
    mtp_act = model.mtp_layers * act_f * (mtp_layer_act + block_saved_bytes(model, tr, p))
    return MemoryCoefficients(
        dense_params_per_layer=dense, expert_params_per_layer=experts,
        act_per_layer=act_f * stored, ckpt_per_layer=act_f * ckpt,
        working=act_f * full_layer,
        embed_params=embed, head_params=embed,
        bytes_per_param=_states_per_param(tr, p, shard, cluster.gpu),
        expert_bytes_per_param=_states_per_param(tr, p, expert_shard, cluster.gpu),
        logits=logits_bytes(tr) * M * model.vocab / tp,
        mtp_dense_params=mtp_dense, mtp_expert_params=mtp_experts, mtp_act=mtp_act,
        gather_buffer=gather, lead_dense_params=lead_dense, lead_expert_params=lead_experts,
    )


def leading_dense_on(model: ModelSpec, stage: str, n: np.ndarray) -> np.ndarray:
    """How many of the model's leading dense layers (``moe_dense_layers``: DeepSeek-V3's first 3)
    a stage holding ``n`` layers holds: the first stage's, up to its ``n``. Layers 0..k-1 are
    the first virtual stage's, on the first pipeline rank (Megatron-Bridge's DeepSeek-V3 recipes
    put the embedding and decoder layers 0-3 there at pp 8 vpp 2, 0-7 at pp 8: deepseek_v3.py
    set_deepseek_v3_pipeline_model_parallel_layout, v0.4.2); a first stage shorter than k leaves
    the rest priced as pattern layers."""
    k = model.moe_dense_layers if model.is_moe else 0
    return np.minimum(k, n) if stage == "first" else np.zeros_like(n)


@dataclass(frozen=True, slots=True)
class StageBytes:
    params: np.ndarray
    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    buffers: np.ndarray
    overhead: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return (self.weights + self.grads + self.optimizer + self.activations + self.buffers
                + self.overhead)


def allocator_fraction(tr: Training) -> float:
    """What the caching allocator reserves beyond the volatile bytes it hands out, as their
    fraction: the memory model's fitted fragmentation, or none where the allocator maps
    expandable segments (``kernels.expandable_segments``; PyTorch's CUDA semantics notes,
    "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": freed memory of any size is reused
    by growing one segment instead of splitting fixed ones) — a prior no measured row fits,
    which the interval's unvalidated terms re-price at the fitted value (search.uncertainty)."""
    if tr.framework.kernels.expandable_segments:
        return 0.0
    return tr.framework.memory_model.allocator_fraction


def stage_memory(model: ModelSpec, tr: Training, p: PlanArrays, co: MemoryCoefficients,
                 layers: StageLayers, m: np.ndarray, stage: str) -> StageBytes:
    """Peak bytes of one stage, the larger of the forward/backward and the optimizer peaks.

    Activations: ``inflight`` micro-batches of ``n`` layers, of which ``r`` fully recomputed
    (``recompute_layers``, 0 = all when recompute is full) or offloaded to host memory
    (``cpu_offload_layers``), plus one layer's working set.
    """
    mm = tr.framework.memory_model
    n = layers.of(stage)
    pp = p.pp
    has_embed = stage == "first"
    has_head = stage == "last"
    extra = np.zeros_like(n)
    if has_embed:
        extra = extra + co.embed_params
    if has_head:
        head_here = (pp > 1) | (not model.tied_embeddings)
        extra = extra + np.where(head_here, co.head_params, 0.0)
    if has_embed and not has_head:  # pp == 1 puts the head on the first stage too
        extra = extra + np.where((pp == 1) & (not model.tied_embeddings), co.head_params, 0.0)
    # the MTP depths sit with the head (costmodel.mtp)
    ends = np.where(pp == 1, 1.0, 0.0) if has_embed else np.full_like(n, float(has_head))
    lead = leading_dense_on(model, stage, n)
    dense = (n * co.dense_params_per_layer + lead * co.lead_dense_params + extra
             + ends * co.mtp_dense_params)
    experts = (n * co.expert_params_per_layer + lead * co.lead_expert_params
               + ends * co.mtp_expert_params)
    bpp, bpp_e = co.bytes_per_param, co.expert_bytes_per_param

    def part(key: str) -> np.ndarray:
        return dense * bpp[key] + experts * bpp_e[key]

    r = recomputed_layers(p, n)
    kept = n - np.minimum(p.cpu_offload_layers, n)  # the rest in host memory (costmodel.offload)
    per_mb = np.where(p.recompute == 2, (n - r) * co.working + r * co.ckpt_per_layer,
                      kept * co.act_per_layer)
    inflight = inflight_micro_batches(p, m, stage, warms_up_one_more(model, tr, p))
    # the MTP depths sit in the last virtual chunk, which runs each micro-batch's backward right
    # after its forward: one micro-batch in flight (GPipe: all)
    mtp_inflight = np.where(p.pp_schedule == 2, m, 1.0)
    activations = inflight * per_mb + co.working + ends * mtp_inflight * co.mtp_act
    # each depth's logits through the loss, held with the main head's until backward
    logits = ends * (1.0 + model.mtp_layers) * co.logits
    volatile = activations + logits + co.gather_buffer
    opt_buffers = part("opt_buffer")
    comm_buffers = part("comm_buffer")
    frag = allocator_fraction(tr)
    overhead = frag * volatile + mm.allocator_const_bytes
    # the larger of the two peaks decides; what the optimizer step needs beyond the
    # forward/backward peak is reported as buffers so the parts add up to the peak
    extra_at_opt = np.maximum(opt_buffers - volatile - frag * volatile, 0.0)
    buffers = logits + co.gather_buffer + extra_at_opt + comm_buffers
    return StageBytes(params=dense + experts, weights=part("weights"), grads=part("grads"),
                      optimizer=part("optimizer"),
                      activations=activations, buffers=buffers, overhead=overhead)


def step_memory(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays,
                layers: StageLayers, m: np.ndarray
                ) -> tuple[MemoryCoefficients, dict[str, StageBytes]]:
    """The coefficients and every stage's peak bytes."""
    co = coefficients(model, cluster, tr, p)
    return co, {st: stage_memory(model, tr, p, co, layers, m, st) for st in STAGES}


def largest_stage_params(co: MemoryCoefficients,
                         layers: StageLayers) -> tuple[np.ndarray, np.ndarray]:
    """Local (dense, routed-expert) parameters of the stage with the most layers, counted with
    the embedding, or of the last stage where its MTP depths make it hold more: what the
    data-parallel collectives and the optimizer step move."""
    n_big, n_last = layers.largest, layers.last
    big = (n_big * co.dense_params_per_layer + co.embed_params,
           n_big * co.expert_params_per_layer)
    last = (n_last * co.dense_params_per_layer + co.embed_params + co.mtp_dense_params,
            n_last * co.expert_params_per_layer + co.mtp_expert_params)
    more = last[0] + last[1] > big[0] + big[1]
    return np.where(more, last[0], big[0]), np.where(more, last[1], big[1])


def allocator_stall(step_s: np.ndarray, stages: dict[str, StageBytes], cluster: ClusterSpec,
                    tr: Training) -> np.ndarray:
    """Allocator pressure is a cliff, not a ramp: a step whose reserved peak passes
    ``pressure_start`` of usable memory pays the allocator's free-and-retry every step
    (``pressure_slowdown``). The peak is a prediction, so the stall is charged by the chance that
    the real one passes: a normal in log memory of ``pressure_width``."""
    mm = tr.framework.memory_model
    if mm.pressure_slowdown == 0.0:
        return np.zeros_like(step_s)
    peak = np.max(np.stack([stages[st].total for st in STAGES]), axis=0)
    edge = mm.pressure_start * cluster.gpu.usable_bytes
    z = np.log(np.maximum(peak, 1.0) / edge) / max(mm.pressure_width, 1e-6)
    return step_s * mm.pressure_slowdown * normal_cdf(z)
