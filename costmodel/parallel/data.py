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
    largest_stage_params,
    zero2_reduces_each_micro_batch,
)
from costmodel.parallel.mesh import Mesh
from costmodel.specs import Training

BF16 = 2.0


def _one_pass(tr: Training, g: Mesh, co: MemoryCoefficients, dense: np.ndarray,
              experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one gradient reduce-scatter and one parameter all-gather of ``dense`` params
    over dp x cp and ``experts`` params over the expert replicas."""
    dpcp, k_dp, edp, k_edp, link = g.dp * g.cp, g.k_dp, g.edp, g.k_edp, g.link
    g_bytes = float(tr.grad_dtype_bytes)
    # FSDP / ZeRO-3 gathers and reduces one layer (its unit) per call
    layer_unit = (co.dense_params_per_layer + co.expert_params_per_layer) * BF16
    bucket = np.where(g.plan.zero_stage >= 3, np.maximum(layer_unit, tr.dp_bucket_bytes),
                      tr.dp_bucket_bytes)
    grad_rs = (comm.bucketed_gather_time(dense * g_bytes, dpcp, k_dp, link, bucket)
               + comm.bucketed_gather_time(experts * g_bytes, edp, k_edp, link, bucket))
    w_bytes = _param_bytes(tr)
    param_ag = (comm.bucketed_gather_time(dense * w_bytes, dpcp, k_dp, link, bucket)
                + comm.bucketed_gather_time(experts * w_bytes, edp, k_edp, link, bucket))
    return grad_rs, param_ag


def _param_bytes(tr: Training) -> float:
    return 1.0 if tr.precision == "fp8" and tr.fp8_param_gather else BF16


def data_parallel(tr: Training, g: Mesh, co: MemoryCoefficients, layers: StageLayers,
                  lt: LayerTimes) -> tuple[CollectiveArrays, CollectiveArrays]:
    """The gradient reduction and the parameter all-gather of one step, time and exposed."""
    p, m, v, pp, z = g.plan, g.micro_batches, g.vpp, g.pp, g.plan.zero_stage
    dense, experts = largest_stage_params(co, layers)
    grad_rs, param_ag = _one_pass(tr, g, co, dense, experts)
    n_big = layers.largest
    fwd_window = n_big * lt.fwd_s
    bwd_window = n_big * lt.bwd_s
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
    # ZeRO-2 every micro-batch, each behind that micro-batch's backward, unless the framework
    # accumulates whole gradients (then once per step, and the memory holds them whole).
    z3 = z >= 3
    z2_each = zero2_reduces_each_micro_batch(tr, p) & (m > 1)
    bwd_mix = param_ag + grad_rs
    z3_bwd_exposed = hide(bwd_mix, bwd_window, True)
    z3_ag_share = param_ag / np.maximum(bwd_mix, 1e-30)
    full_reduce = (z == 0) | ((z <= 2) & tr.sharded_grad_all_reduce)
    per_micro = z3 | z2_each
    grad_time = np.where(full_reduce, 2.0, np.where(per_micro, m, 1.0)) * grad_rs
    once_exposed = np.where(z == 0, hide(grad_time, bwd_window * chunk_window,
                                         tr.overlap_grad_reduce),
                            hide(grad_time, bwd_window * chunk_window,
                                 tr.overlap_grad_reduce_sharded))
    each_exposed = np.where(z3, m * z3_bwd_exposed * (1 - z3_ag_share),
                            m * hide(np.where(full_reduce, 2.0, 1.0) * grad_rs, bwd_window,
                                     tr.overlap_grad_reduce_sharded))
    grad_exposed = np.where(per_micro, each_exposed, once_exposed)
    ag_time = np.where(z3, 2.0 * m * param_ag, np.where(z >= 1, param_ag, 0.0))
    ag_exposed = np.where(
        z3, m * (hide(param_ag, fwd_window, True) + z3_bwd_exposed * z3_ag_share),
        np.where(z >= 1, hide(param_ag, fwd_window * chunk_window, tr.overlap_param_gather),
                 0.0))
    state_params = dense + experts
    grad_bytes = np.where(per_micro, m, 1.0) * state_params * float(tr.grad_dtype_bytes)
    ag_bytes = np.where(z3, 2 * m, np.where(z >= 1, 1.0, 0.0)) * state_params * _param_bytes(tr)
    dpcp = g.dp * g.cp
    tier = comm.tier(dpcp, g.k_dp)
    return (
        CollectiveArrays("dp_grad_reduce", "dp", "reduce_scatter", p.dp * p.cp,
                         np.where(dpcp > 1, grad_bytes, 0.0), tier, grad_time, grad_exposed),
        CollectiveArrays("dp_param_all_gather", "dp", "all_gather", p.dp * p.cp,
                         np.where(dpcp > 1, ag_bytes, 0.0), tier, ag_time, ag_exposed),
    )
