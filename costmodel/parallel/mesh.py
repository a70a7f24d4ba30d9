"""The plan's parallel groups as the communication formulas read them: each degree as a float,
how many members of each group share an NVLink domain, the links, and the micro-batch every GPU
runs. Bound once per batch of plans, like torchtitan's ``ParallelDims``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.comm import Link, link_of
from costmodel.mapping import (
    expert_dp,
    expert_tp,
    group_strides,
    members_per_domain,
    micro_batches,
)
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec, Training


@dataclass(frozen=True, slots=True)
class Mesh:
    """Degrees, members per domain and links of one batch of plans (see the module docstring)."""

    plan: PlanArrays
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    vpp: np.ndarray
    edp: np.ndarray  # replicas of each expert shard
    # members per NVLink domain of each group (dp: the dp x cp group gradients reduce over)
    k_tp: np.ndarray
    k_etp: np.ndarray  # the routed experts' TP group (expert_tp ranks, adjacent)
    k_cp: np.ndarray
    k_ep: np.ndarray
    k_dp: np.ndarray
    k_edp: np.ndarray
    pp_crosses_network: np.ndarray  # stages are tp * cp * dp ranks apart (pp is outermost)
    link: Link
    micro_batches: np.ndarray  # per DP rank per optimizer step
    tokens: np.ndarray  # of one micro-batch on one GPU
    synchronous: bool  # nothing overlaps (see GpuSpec.synchronous)


def mesh_of(cluster: ClusterSpec, tr: Training, p: PlanArrays) -> Mesh:
    tp, pp, cp, dp, ep, v = (x.astype(float) for x in (p.tp, p.pp, p.cp, p.dp, p.ep, p.vpp))
    strides = group_strides(p)
    D = cluster.nvlink_domain
    return Mesh(
        plan=p, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, vpp=v, edp=expert_dp(p).astype(float),
        k_tp=members_per_domain(p.tp, strides["tp"], D),
        k_etp=members_per_domain(expert_tp(p), strides["tp"], D),
        k_cp=members_per_domain(p.cp, strides["cp"], D),
        k_ep=members_per_domain(p.ep, strides["ep"], D),
        # gradients reduce over dp x cp together: cp varies fastest after tp, so that group's
        # neighbours are tp ranks apart (the dp group alone is tp * cp apart)
        k_dp=members_per_domain(p.dp * p.cp, strides["cp"], D),
        k_edp=members_per_domain(expert_dp(p), strides["edp"], D),
        pp_crosses_network=(p.tp * p.cp * p.dp) >= D,
        link=link_of(cluster),
        micro_batches=micro_batches(tr.global_batch, p),
        tokens=p.micro_batch * float(tr.seq_len) / cp,
        synchronous=cluster.gpu.synchronous,
    )
