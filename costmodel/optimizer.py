"""The optimizer's memory-bound passes over the parameters: the step's Adam (or SGD) update over
this GPU's shard, and the passes that accumulate each micro-batch's gradients where nothing
fuses them into the weight-gradient GEMM."""

from __future__ import annotations

import numpy as np

from costmodel.mapping import StageLayers, expert_dp
from costmodel.memory import (
    MemoryCoefficients,
    largest_stage_params,
    zero2_reduces_each_micro_batch,
    zero3_accumulates_whole,
)
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec, Training

BF16 = 2.0


def optimizer_time(co: MemoryCoefficients, layers: StageLayers, p: PlanArrays,
                   cluster: ClusterSpec, tr: Training) -> np.ndarray:
    """Adam over the largest stage's shard (ZeRO >= 1 shards the dense parameters over dp x cp
    and the routed experts over their expert-DP replicas): reads grad, master, m, v; writes
    master, m, v, weights (SGD: the gradient and the weights; its momentum is not counted)."""
    dense, experts = largest_stage_params(co, layers)
    sharded = p.zero_stage >= 1
    params_local = (dense / np.where(sharded, (p.dp * p.cp).astype(float), 1.0)
                    + experts / np.where(sharded, expert_dp(p).astype(float), 1.0))
    eff = cluster.gpu.efficiency
    # read the gradient, read and write each state; the fp32 master is read and written and the
    # bf16 weights written from it, or without a master the weights are read and written
    states = ((2.0 if tr.optimizer == "adam" else 0.0)
              * float(tr.framework.numerics.optimizer_state_bytes))
    weights = 2 * 4.0 + BF16 if tr.framework.numerics.master_weights else 2 * BF16
    bytes_per_param = float(tr.framework.numerics.grad_dtype_bytes) + 2 * states + weights
    hbm = cluster.gpu.hbm_bw_bytes_per_s * eff.memory_bw_fraction
    return params_local * bytes_per_param / hbm + 20 * eff.kernel_overhead_s


def grad_accumulation_time(co: MemoryCoefficients, layers: StageLayers, micro_batches: np.ndarray,
                           p: PlanArrays, cluster: ClusterSpec, tr: Training) -> np.ndarray:
    """The passes that add each micro-batch's fresh gradients into what the step accumulates,
    over all the largest stage's parameters, unsharded. A framework's own pass runs after every
    micro-batch (``grad_accum_pass_bytes``: nanotron's fp32_grad.add_(bf16 grad); ``_pp`` in a
    pipeline at ZeRO-0: DeepSpeed's BF16_Optimizer); without one, where whole gradients stay
    across micro-batches (ZeRO-0/1, ZeRO-2/3 that sync once a step), autograd adds into ``.grad``
    in place on every micro-batch but the first (``grad_accum_inplace_bytes``). Megatron fuses
    the add into the weight-gradient GEMM (0 both)."""
    dense, experts = largest_stage_params(co, layers)
    hbm = cluster.gpu.hbm_bw_bytes_per_s * cluster.gpu.efficiency.memory_bw_fraction
    z = p.zero_stage
    own = np.where((p.pp > 1) & (z == 0) & (tr.framework.dp.grad_accum_pass_bytes_pp >= 0),
                   tr.framework.dp.grad_accum_pass_bytes_pp, tr.framework.dp.grad_accum_pass_bytes)
    whole = ((z <= 1) | ((z == 2) & ~zero2_reduces_each_micro_batch(tr, p))
             | zero3_accumulates_whole(tr, p))
    inplace = np.where((own == 0) & whole,
                       np.maximum(micro_batches - 1, 0) * tr.framework.dp.grad_accum_inplace_bytes,
                       0.0)
    return (micro_batches * own + inplace) * (dense + experts) / hbm
