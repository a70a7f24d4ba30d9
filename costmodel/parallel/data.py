"""Data parallelism by ZeRO stage (Rajbhandari et al., 2020; PyTorch DDP and FSDP): the gradient
reduction and the parameter all-gather of one step, and what of them hides behind the backward
and forward they overlap with."""

from __future__ import annotations

import numpy as np

from costmodel import comm
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.mapping import StageLayers
from costmodel.memory import (
    MemoryCoefficients,
    fp8_weights,
    largest_stage_params,
    zero2_reduces_each_micro_batch,
    zero3_accumulates_whole,
)
from costmodel.parallel.mesh import Mesh
from costmodel.specs import Training

BF16 = 2.0
# Host time of one eager PyTorch op on a tiny or empty tensor (a slice, torch.empty(0), copy_):
# PyTorch's operator micro-benchmarks give 2.3-3.5 us for an eager split on 8x8 to 512x512
# tensors, CPU or CUDA alike (pytorch/pytorch#32194). A prior, not fitted.
EAGER_OP_HOST_S = 3e-6


def _one_pass(tr: Training, g: Mesh, co: MemoryCoefficients, dense: np.ndarray,
              experts: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seconds of one gradient reduce-scatter and one parameter all-gather, ``(dense,
    experts)`` each: ``dense`` params over dp x cp, ``experts`` params over the expert-DP
    group (Megatron-Core's expert_data_parallel group, megatron/core/parallel_state.py; the
    ranks torchtitan's ``efsdp`` mesh dimension and NeMo AutoModel's ``ep_shard`` hold), on
    that group's own links: EP packed inside a node leaves its replicas across nodes."""
    dpcp, k_dp, edp, k_edp, link = g.dp * g.cp, g.k_dp, g.edp, g.k_edp, g.link
    g_bytes = float(tr.framework.numerics.grad_reduce_dtype_bytes)
    # FSDP / ZeRO-3 gathers and reduces one layer (its unit) per call; ZeRO-1/2 the whole
    # buffer in one call where the framework does (training.framework.dp.sharded_dp_one_call)
    z = g.plan.zero_stage
    layer_unit = (co.dense_params_per_layer + co.expert_params_per_layer) * BF16
    bucket = np.where(z >= 3, np.maximum(layer_unit, tr.framework.dp.dp_bucket_bytes),
                      np.where((z >= 1) & tr.framework.dp.sharded_dp_one_call, np.inf,
                               tr.framework.dp.dp_bucket_bytes))
    w_bytes = _param_bytes(tr)
    out = {}
    for name, per_param in (("grad", g_bytes), ("param", w_bytes)):
        # a model without routed experts makes no expert-DP call (nor pays its latency)
        out[name] = (comm.bucketed_gather_time(dense * per_param, dpcp, k_dp, link, bucket),
                     np.where(experts > 0, comm.bucketed_gather_time(
                         experts * per_param, edp, k_edp, link, bucket), 0.0))
    return out


def _param_bytes(tr: Training) -> float:
    return 1.0 if fp8_weights(tr) else BF16


def data_parallel(tr: Training, g: Mesh, co: MemoryCoefficients, layers: StageLayers,
                  lt: LayerTimes, nic_busy: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[tuple[CollectiveArrays, ...], tuple[CollectiveArrays, ...]]:
    """The gradient reductions and the parameter all-gathers of one step, time and exposed:
    the dense parameters' over dp x cp, the routed experts' over the expert-DP group.
    ``nic_busy``: seconds each GPU's NIC streams other groups' traffic during one micro-batch's
    forward and backward of the largest stage (:func:`nic_busy_of`). Where the data-parallel
    group crosses the network too, its collectives share the NIC with that traffic, so they
    hide only behind the rest of the window: priced where they overlap, not on average."""
    p, m, v, pp, z = g.plan, g.micro_batches, g.vpp, g.pp, g.plan.zero_stage
    dense, experts = largest_stage_params(co, layers)
    passes = _one_pass(tr, g, co, dense, experts)
    grad_rs = passes["grad"][0] + passes["grad"][1]
    param_ag = passes["param"][0] + passes["param"][1]
    n_big = layers.largest
    busy_fwd, busy_bwd = nic_busy if nic_busy is not None else (0.0, 0.0)
    on_nic = g.k_dp < g.dp * g.cp
    fwd_window = np.maximum(n_big * lt.fwd_s - np.where(on_nic, busy_fwd, 0.0), 0.0)
    bwd_window = np.maximum(n_big * lt.bwd_s - np.where(on_nic, busy_bwd, 0.0), 0.0)
    # Interleaved 1F1B finishes a stage's chunks one after another: the deepest chunk's last
    # backward comes (v-1) groups of p chunk-backwards before the end, so its gradients reduce
    # while the other chunks still compute (each chunk reduces on its own, as Megatron-LM's
    # per-chunk DDP does); the forward of the next step gathers parameters chunk by chunk the
    # same way. Without interleaving the window is one micro-batch's backward (forward).
    chunk_window = (1.0 + (v - 1.0) * np.minimum(pp, m)) / v
    first_bucket = 1.0 / np.maximum(n_big, 1.0)

    def hide(t: np.ndarray, window: np.ndarray, enabled: bool) -> np.ndarray:
        return np.maximum(t - window, t * first_bucket) if enabled and not g.synchronous else t

    # ZeRO-0 all-reduces (2 passes), ZeRO-1 reduce-scatters once per step; ZeRO-3 every
    # micro-batch, gathering the weights again in forward and backward (FSDP FULL_SHARD);
    # ZeRO-2 every micro-batch, each behind that micro-batch's backward; ZeRO-2 and -3 once per
    # step where the framework accumulates whole gradients (and the memory holds them whole).
    z3 = z >= 3
    z3_whole = zero3_accumulates_whole(tr, p)
    z2_each = zero2_reduces_each_micro_batch(tr, p) & (m > 1)
    # a ZeRO-3 backward gathers the weights and, unless its sync is off, reduce-scatters
    bwd_mix = param_ag + np.where(z3_whole, 0.0, grad_rs)
    z3_bwd_exposed = hide(bwd_mix, bwd_window, True)
    z3_ag_share = param_ag / np.maximum(bwd_mix, 1e-30)
    full_reduce = (z == 0) | ((z <= 2) & tr.framework.dp.sharded_grad_all_reduce)
    per_micro = (z3 & ~z3_whole) | z2_each
    grad_time = np.where(full_reduce, 2.0, np.where(per_micro, m, 1.0)) * grad_rs
    once_exposed = np.where(z == 0, hide(grad_time, bwd_window * chunk_window,
                                         tr.framework.dp.overlap_grad_reduce),
                            hide(grad_time, bwd_window * chunk_window,
                                 tr.framework.dp.overlap_grad_reduce_sharded))
    each_exposed = np.where(z3, m * z3_bwd_exposed * (1 - z3_ag_share),
                            m * hide(np.where(full_reduce, 2.0, 1.0) * grad_rs, bwd_window,
                                     tr.framework.dp.overlap_grad_reduce_sharded))
    grad_exposed = np.where(per_micro, each_exposed, once_exposed)
    # the host's eager loop around a coalesced ZeRO-1/2 gather, per DP rank and layer, while the
    # GPU waits (training.framework.dp.sharded_gather_host_ops)
    gather_host = np.where((z >= 1) & ~z3, tr.framework.dp.sharded_gather_host_ops * EAGER_OP_HOST_S
                           * g.dp * g.cp * n_big, 0.0)
    ag_time = np.where(z3, 2.0 * m * param_ag, np.where(z >= 1, param_ag, 0.0)) + gather_host
    ag_exposed = gather_host + np.where(
        z3, m * (hide(param_ag, fwd_window, True) + z3_bwd_exposed * z3_ag_share),
        np.where(z >= 1, hide(param_ag, fwd_window * chunk_window,
                              tr.framework.dp.overlap_param_gather),
                 0.0))
    grad_count = np.where(per_micro, m, 1.0)
    ag_count = np.where(z3, 2 * m, np.where(z >= 1, 1.0, 0.0))
    grads = _by_group("grad_reduce", "reduce_scatter", g, (dense, experts), passes["grad"],
                      grad_count * float(tr.framework.numerics.grad_reduce_dtype_bytes), grad_time,
                      grad_exposed)
    params = _by_group("param_all_gather", "all_gather", g, (dense, experts), passes["param"],
                       ag_count * _param_bytes(tr), ag_time, ag_exposed)
    return grads, params


def _by_group(what: str, op: str, g: Mesh, params: tuple[np.ndarray, np.ndarray],
              one_pass: tuple[np.ndarray, np.ndarray], bytes_per_param: np.ndarray,
              time_s: np.ndarray, exposed_s: np.ndarray) -> tuple[CollectiveArrays, ...]:
    """One collective's time and exposure, priced over both groups together, reported as the
    dense part over dp x cp and the routed experts' over their expert-DP group, each with its
    own size and link tier, in proportion to their share of one pass."""
    total = np.maximum(one_pass[0] + one_pass[1], 1e-30)
    dpcp, edp = g.dp * g.cp, np.where(params[1] > 0, g.edp, 1.0)
    out = []
    for group, size, k, n, t in (("dp", dpcp, g.k_dp, params[0], one_pass[0]),
                                 ("edp", edp, g.k_edp, params[1], one_pass[1])):
        share = np.where(one_pass[0] + one_pass[1] > 0, t / total,
                         1.0 if group == "dp" else 0.0)
        out.append(CollectiveArrays(
            f"{group}_{what}", group, op, size, np.where(size > 1, bytes_per_param * n, 0.0),
            comm.tier(size, k), share * time_s, share * exposed_s))
    return tuple(out)
