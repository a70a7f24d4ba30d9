"""One training step, vectorised over plans: memory per stage, compute, every collective, the
pipeline bubble and the optimizer, assembled into step time (the core of ``estimate``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm, compute
from costmodel.compute import layer_times, optimizer_time
from costmodel.layout import (
    STAGES,
    expert_dp,
    expert_tp,
    group_strides,
    members_per_domain,
    micro_batches,
    stage_layers,
)
from costmodel.memory import StageBytes, coefficients, stage_memory
from costmodel.params import model_flops_per_token
from costmodel.plans import PlanArrays
from costmodel.recompute import recomputed_layers
from costmodel.specs import ClusterSpec, ModelSpec, Training

BF16 = 2.0
BWD_HOST_FACTOR = 2.0  # backward issues about twice the forward's kernels
# Tensor ops of one Llama layer's forward, views included (norms, 4+3 projections, q/k/v views
# and transposes, RoPE's chunk/neg/cat/mul/add on q and k, attention, reshape, SwiGLU, residual
# adds): what a DTensor layer dispatches, counted in tcf_search/validate/model.py.
DTENSOR_OPS_PER_LAYER_FWD = 40.0


@dataclass(frozen=True, slots=True)
class CollectiveArrays:
    name: str
    group: str
    op: str
    group_size: np.ndarray
    bytes: np.ndarray
    tier: np.ndarray
    time_s: np.ndarray
    exposed_s: np.ndarray


@dataclass(frozen=True, slots=True)
class StepArrays:
    stages: dict[str, StageBytes]
    stage_layers: dict[str, np.ndarray]
    usable_bytes: float
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    compute_s: np.ndarray
    recompute_s: np.ndarray
    optimizer_s: np.ndarray
    bubble_s: np.ndarray
    gemm_efficiency: np.ndarray
    collectives: tuple[CollectiveArrays, ...]
    step_time_s: np.ndarray
    tokens_per_step: int
    num_gpus: int

    @property
    def peak_stage(self) -> np.ndarray:
        """Index into STAGES of the stage with the most bytes."""
        totals = np.stack([self.stages[s].total for s in STAGES])
        return np.argmax(totals, axis=0)

    def peak_part(self, part: str) -> np.ndarray:
        vals = np.stack([getattr(self.stages[s], part) for s in STAGES])
        return np.take_along_axis(vals, self.peak_stage[None, :], axis=0)[0]


def evaluate(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays) -> StepArrays:
    L, s = model.layers, float(tr.seq_len)
    h = model.hidden
    tp, pp, cp, dp, ep, v = (x.astype(float) for x in (p.tp, p.pp, p.cp, p.dp, p.ep, p.vpp))
    m = micro_batches(tr.global_batch, p)
    layers = stage_layers(L, p)
    lt = layer_times(model, cluster, tr, p)
    link = comm.link_of(cluster)
    strides = group_strides(p)
    D = cluster.nvlink_domain
    M = p.micro_batch * s / cp
    moe_frac = model.moe_layers / L

    # ---- memory -------------------------------------------------------------------------
    co = coefficients(model, cluster, tr, p)
    stages = {st: stage_memory(model, tr, p, co, layers, m, st) for st in STAGES}

    # ---- compute per micro-batch per stage ------------------------------------------------
    fwd, bwd = lt.fwd_s, lt.bwd_s

    # ---- per-layer, per-micro-batch communication on the critical path ------------------
    k_tp = members_per_domain(p.tp, strides["tp"], D)
    act = tr.activation_dtype_bytes
    x_act = M * h * act
    # per layer forward: two all-reduces, or with sequence parallel two all-gathers and two
    # reduce-scatters (the same bytes, twice the calls)
    sp = p.sequence_parallel > 0
    tp_layer_fwd = np.where(sp, 4.0 * comm.gather_time(x_act, tp, k_tp, link),
                            2.0 * comm.all_reduce_time(x_act, tp, k_tp, link))
    tp_calls = np.where(tp > 1, np.where(sp, 4.0, 2.0), 0.0)
    # host time per layer forward: kernels, TP calls, and (under a pipeline engine that
    # serialises p2p with TP collectives) a wait per TP ring step when the stages' p2p crosses
    # the network (pp is the outermost dimension: stages are tp * cp * dp ranks apart)
    pp_cross = (p.tp * p.cp * p.dp) >= D
    host_tp = tp_calls * (tr.host_overhead_s
                          + np.where((pp > 1) & pp_cross, (tp - 1) * tr.pp_tp_step_overhead_s,
                                     0.0))
    if tr.dtensor_tp:  # every tensor op of a TP layer dispatches through DTensor
        dtensor = cluster.gpu.efficiency.dtensor_op_overhead_s
        host_tp = host_tp + np.where(tp > 1, DTENSOR_OPS_PER_LAYER_FWD * dtensor, 0.0)
    host_fwd = lt.host_fwd_s + host_tp
    sync = cluster.gpu.synchronous
    if tr.tp_comm_overlap and not sync:  # the all-gathers and reduce-scatters of sequence
        # parallelism hide behind the GEMMs they feed or drain (all-reduces do not)
        tp_layer_exposed = np.where(sp, np.maximum(tp_layer_fwd - lt.gemm_fwd_dense_s, 0.0),
                                    tp_layer_fwd)
    else:
        tp_layer_exposed = tp_layer_fwd
    k_cp = members_per_domain(p.cp, strides["cp"], D)
    # each TP rank exchanges the K and V of its own KV heads (one replicated head when
    # tp > kv_heads)
    x_kv = 2.0 * M * np.maximum(model.kv_heads / tp, 1.0) * model.d_head * act
    cp_hop = comm.p2p_time(x_kv, k_cp < cp, link)
    cp_layer_fwd = np.where(cp > 1, (cp - 1) * cp_hop, 0.0)
    cp_hidden_fwd, cp_hidden_bwd = (0.0, 0.0) if sync else (lt.attention_fwd_s,
                                                           2.5 * lt.attention_fwd_s)
    cp_layer_exposed_fwd = np.maximum(cp_layer_fwd - cp_hidden_fwd, 0.0)
    cp_layer_exposed_bwd = np.maximum(2 * cp_layer_fwd - cp_hidden_bwd, 0.0)
    k_ep = members_per_domain(p.ep, strides["ep"], D)
    # each rank dispatches its own M / tp sequence shard (MoE with TP runs sequence parallel);
    # when the experts are tensor-parallel (EP carved out of dp x cp) the expert-TP ranks then
    # all-gather what they received and reduce-scatter the results (Megatron's alltoall
    # dispatcher), over the TP group's links
    x_tok = M / tp * max(model.moe_topk, 1) * h * act
    moe_on = 1.0 if model.is_moe else 0.0
    etp_gather = np.where(expert_tp(p) > 1, comm.gather_time(x_tok * tp, tp, k_tp, link), 0.0)
    ep_layer_fwd = 2.0 * (comm.all_to_all_time(x_tok, ep, k_ep, link) + etp_gather) * moe_on

    # The vocabulary-parallel embedding and LM head (Megatron-LM, nanotron, torchtitan) talk
    # over the TP group once per micro-batch each: the embedding reduces its partial lookups
    # (an all-reduce, or with SP a reduce-scatter whose backward all-gathers the gradient);
    # the head's input is all-gathered under SP (its gradient reduce-scattered back) or, without
    # SP, its gradient all-reduced in backward; the vocabulary-parallel cross-entropy adds three
    # all-reduces of one fp32 value per token (max, sum of exponentials, target logit).
    # Nothing overlaps them: the first layer waits for its input, the loss for the logits.
    vocab_side = np.where(tp > 1, np.where(sp, 2.0 * comm.gather_time(x_act, tp, k_tp, link),
                                           comm.all_reduce_time(x_act, tp, k_tp, link)), 0.0)
    embed_mb = vocab_side
    head_mb = vocab_side + np.where(tp > 1, 3.0 * comm.all_reduce_time(M * 4.0, tp, k_tp, link),
                                    0.0)
    per_layer_comm_fwd = tp_layer_exposed + cp_layer_exposed_fwd + moe_frac * ep_layer_fwd
    per_layer_comm_bwd = tp_layer_exposed + cp_layer_exposed_bwd + moe_frac * ep_layer_fwd

    def vocab_mb(st: str) -> np.ndarray:
        if st == "last":
            return head_mb
        return embed_mb + np.where(pp == 1, head_mb, 0.0) if st == "first" else 0.0 * head_mb

    def stage_mb_time(st: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = layers.of(st)
        r = recomputed_layers(p, n)
        selective = np.where(p.recompute == 1, n * lt.selective_extra_avg_s, 0.0)
        rec = r * (fwd + per_layer_comm_fwd) + selective
        comp = n * (fwd + bwd) + selective
        comp = comp + r * fwd
        head = lt.head_fwd_s + lt.head_bwd_s
        if st == "last":
            comp = comp + head
        if st == "first":
            comp = comp + np.where(pp == 1, head, 0.0)
        comm_mb = (n * (per_layer_comm_fwd + per_layer_comm_bwd) + r * per_layer_comm_fwd
                   + vocab_mb(st))
        host = (n * (1.0 + BWD_HOST_FACTOR) + r) * host_fwd
        # a host-bound stage waits for its kernels to be issued: count the wait as compute;
        # on a synchronous device issuing is part of every kernel's time
        comp = comp + (host if sync else np.maximum(host - comp - comm_mb, 0.0))
        return comp, comm_mb, rec

    per_stage = {st: stage_mb_time(st) for st in STAGES}
    total_mb = {st: c + x for st, (c, x, _) in per_stage.items()}
    slowest = np.argmax(np.stack([total_mb[st] for st in STAGES]), axis=0)

    def pick(i: int) -> np.ndarray:
        vals = np.stack([per_stage[st][i] for st in STAGES])
        return np.take_along_axis(vals, slowest[None, :], axis=0)[0]

    comp_mb, comm_mb, rec_mb = pick(0), pick(1), pick(2)
    vocab_slowest = np.take_along_axis(np.stack([vocab_mb(st) for st in STAGES]),
                                       slowest[None, :], axis=0)[0]
    sides = {"first": 1.0 + (pp == 1), "middle": 0.0 * pp, "last": 1.0 + 0.0 * pp}
    vocab_sides = np.take_along_axis(np.stack([sides[st] for st in STAGES]),
                                     slowest[None, :], axis=0)[0]
    # One micro-batch crosses every stage, the other m - 1 follow at the slowest stage's pace:
    # the bubble is the other stages' time for one micro-batch ((p - 1)/m of the step when the
    # stages are balanced; Narayanan et al., 2021), split v ways when interleaved.
    all_stages = (total_mb["first"] + total_mb["last"]
                  + np.maximum(pp - 2, 0) * total_mb["middle"])
    slowest_mb = np.max(np.stack([total_mb[st] for st in STAGES]), axis=0)
    bubble = np.where(pp > 1, np.maximum(all_stages - slowest_mb, 0.0) / v, 0.0)

    # ---- pipeline point-to-point ---------------------------------------------------------
    sp_div = np.where(p.sequence_parallel > 0, tp, 1.0)
    x_pp = M * h * act / sp_div
    scatter = (tr.pp_scatter_gather & (p.sequence_parallel == 0) & (tp > 1) & pp_cross
               & (k_tp >= tp))
    pp_hop = np.where(scatter,
                      comm.p2p_time(x_pp / tp, pp_cross, link) + comm.gather_time(x_pp, tp, k_tp,
                                                                                   link),
                      comm.p2p_time(x_pp, pp_cross, link))
    pp_time = np.where(pp > 1, 2.0 * m * v * pp_hop, 0.0)
    n_big = layers.largest
    if tr.overlap_p2p_comm and not sync:
        # interleaved: a hop hides behind the next chunk's forward (or backward) of one
        # micro-batch; the pipeline's first receive and last send have nothing to hide behind
        chunk_fwd, chunk_bwd = n_big * fwd / v, n_big * bwd / v
        overlapped = (np.maximum(pp_hop - chunk_fwd, 0.0) + np.maximum(pp_hop - chunk_bwd, 0.0))
        pp_exposed = np.where((pp > 1) & (v > 1),
                              np.minimum(m * v * overlapped + 2.0 * pp_hop, pp_time), pp_time)
    else:
        pp_exposed = pp_time

    # ---- data parallel: gradients and parameters -----------------------------------------
    dense_params = n_big * co.dense_params_per_layer + co.embed_params
    expert_params = n_big * co.expert_params_per_layer
    dpcp = dp * cp
    # gradients reduce over dp x cp together: cp varies fastest after tp, so that group's
    # neighbours are tp ranks apart (the dp group alone is tp * cp apart)
    k_dp = members_per_domain(p.dp * p.cp, strides["cp"], D)
    edp = expert_dp(p).astype(float)
    k_edp = members_per_domain(expert_dp(p), strides["edp"], D)
    g_bytes = float(tr.grad_dtype_bytes)
    z = p.zero_stage
    # FSDP / ZeRO-3 gathers and reduces one layer (its unit) per call
    layer_unit = (co.dense_params_per_layer + co.expert_params_per_layer) * BF16
    bucket = np.where(p.zero_stage >= 3, np.maximum(layer_unit, tr.dp_bucket_bytes),
                      tr.dp_bucket_bytes)
    grad_rs = (comm.bucketed_gather_time(dense_params * g_bytes, dpcp, k_dp, link, bucket)
               + comm.bucketed_gather_time(expert_params * g_bytes, edp, k_edp, link, bucket))
    w_bytes = 1.0 if tr.precision == "fp8" and tr.fp8_param_gather else BF16
    param_ag = (comm.bucketed_gather_time(dense_params * w_bytes, dpcp, k_dp, link, bucket)
                + comm.bucketed_gather_time(expert_params * w_bytes, edp, k_edp, link, bucket))
    fwd_window = n_big * fwd
    bwd_window = n_big * bwd
    # Interleaved 1F1B finishes a stage's chunks one after another: the deepest chunk's last
    # backward comes (v-1) groups of p chunk-backwards before the end, so its gradients reduce
    # while the other chunks still compute (each chunk reduces on its own, as Megatron-LM's
    # per-chunk DDP does); the forward of the next step gathers parameters chunk by chunk the
    # same way. Without interleaving the window is one micro-batch's backward (forward).
    chunk_window = (1.0 + (v - 1.0) * np.minimum(pp, m)) / v
    first_bucket = 1.0 / np.maximum(n_big, 1.0)

    def hide(t: np.ndarray, window: np.ndarray, enabled: bool) -> np.ndarray:
        return np.maximum(t - window, t * first_bucket) if enabled and not sync else t

    # ZeRO-0 all-reduces (2 passes), 1-2 reduce-scatter once per step; 3 every micro-batch,
    # gathering the weights again in forward and backward (FSDP FULL_SHARD).
    z3 = z >= 3
    bwd_mix = param_ag + grad_rs
    z3_bwd_exposed = hide(bwd_mix, bwd_window, True)
    z3_ag_share = param_ag / np.maximum(bwd_mix, 1e-30)
    full_reduce = (z == 0) | ((z <= 2) & tr.sharded_grad_all_reduce)
    grad_time = np.where(full_reduce, 2.0 * grad_rs, np.where(z3, m * grad_rs, grad_rs))
    grad_exposed = np.where(z3, m * z3_bwd_exposed * (1 - z3_ag_share),
                            np.where(z == 0, hide(grad_time, bwd_window * chunk_window,
                                                  tr.overlap_grad_reduce),
                                     hide(grad_time, bwd_window * chunk_window,
                                          tr.overlap_grad_reduce_sharded)))
    ag_time = np.where(z3, 2.0 * m * param_ag, np.where(z >= 1, param_ag, 0.0))
    ag_exposed = np.where(
        z3, m * (hide(param_ag, fwd_window, True) + z3_bwd_exposed * z3_ag_share),
        np.where(z >= 1, hide(param_ag, fwd_window * chunk_window, tr.overlap_param_gather),
                 0.0))
    state_params = dense_params + expert_params
    dp_bytes = np.where(z3, m, 1.0) * state_params * g_bytes
    ag_bytes = np.where(z3, 2 * m, np.where(z >= 1, 1.0, 0.0)) * state_params * w_bytes

    # ---- optimizer ------------------------------------------------------------------------
    params_local = dense_params + expert_params
    shard = np.where(z >= 1, dpcp, 1.0)
    opt_s = optimizer_time(params_local, shard, cluster, tr)

    # ---- step -----------------------------------------------------------------------------
    compute_s = m * comp_mb
    step = compute_s + m * comm_mb + bubble + pp_exposed + grad_exposed + ag_exposed + opt_s
    # allocator pressure: cudaMalloc retries near capacity stall the stream (counted as compute)
    mm = tr.memory_model
    peak = np.max(np.stack([stages[st].total for st in STAGES]), axis=0)
    over = np.maximum(peak / cluster.gpu.usable_bytes - mm.pressure_start, 0.0)
    stall = step * mm.pressure_slowdown * over / max(1.0 - mm.pressure_start, 1e-6)
    compute_s = compute_s + stall
    step = step + stall

    n_layers_mb = L / pp  # average layers per GPU
    tp_count = m * L / pp * np.where(p.recompute == 2, 3.0, 2.0)
    collectives = (
        CollectiveArrays("tp_activation_allreduce" , "tp", "all_reduce", p.tp,
                         tp_count * 2 * x_act, comm.tier(tp, k_tp),
                         tp_count * tp_layer_fwd, tp_count * tp_layer_exposed),
        CollectiveArrays("tp_vocab_parallel", "tp", "all_reduce", p.tp,
                         np.where(tp > 1, m * vocab_sides * 2 * x_act, 0.0),
                         comm.tier(tp, k_tp),
                         m * vocab_slowest, m * vocab_slowest),
        CollectiveArrays("cp_kv_ring", "cp", "send_recv", p.cp,
                         m * n_layers_mb * 3 * (cp - 1) * x_kv, comm.tier(cp, k_cp),
                         m * n_layers_mb * 3 * cp_layer_fwd,
                         m * n_layers_mb * (cp_layer_exposed_fwd + cp_layer_exposed_bwd)),
        CollectiveArrays("ep_token_all_to_all", "ep", "all_to_all", p.ep,
                         m * n_layers_mb * moe_frac * 4 * x_tok * (1.0 if model.is_moe else 0.0),
                         comm.tier(ep, k_ep), m * n_layers_mb * moe_frac * 2 * ep_layer_fwd,
                         m * n_layers_mb * moe_frac * 2 * ep_layer_fwd),
        CollectiveArrays("pp_activation_send_recv", "pp", "send_recv", p.pp,
                         np.where(pp > 1, 2.0 * m * v * np.where(scatter, x_pp / tp, x_pp), 0.0),
                         np.where(pp > 1, np.where(pp_cross, 2, 1), 0), pp_time, pp_exposed),
        CollectiveArrays("dp_grad_reduce", "dp", "reduce_scatter", p.dp * p.cp,
                         np.where(dpcp > 1, dp_bytes, 0.0), comm.tier(dpcp, k_dp), grad_time,
                         grad_exposed),
        CollectiveArrays("dp_param_all_gather", "dp", "all_gather", p.dp * p.cp,
                         np.where(dpcp > 1, ag_bytes, 0.0), comm.tier(dpcp, k_dp), ag_time,
                         ag_exposed),
    )

    # ---- FLOPs ------------------------------------------------------------------------------
    tokens = tr.tokens_per_step
    n_gpus = cluster.num_gpus
    model_flops = model_flops_per_token(model, tr.seq_len) * tokens / n_gpus
    hardware_flops = compute.hardware_flops(model, cluster, tr, p, layers, model_flops)

    return StepArrays(
        stages=stages, stage_layers={st: layers.of(st) for st in STAGES},
        usable_bytes=cluster.gpu.usable_bytes, model_flops=np.full_like(step, model_flops),
        hardware_flops=hardware_flops, compute_s=compute_s, recompute_s=m * rec_mb,
        optimizer_s=opt_s, bubble_s=bubble, gemm_efficiency=lt.gemm_efficiency,
        collectives=collectives, step_time_s=step, tokens_per_step=tokens, num_gpus=n_gpus,
    )
