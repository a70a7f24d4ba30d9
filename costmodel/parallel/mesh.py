"""The plan's parallel groups as the communication formulas read them: each degree as a float,
how many members of each group share an NVLink domain, the links, and the micro-batch every GPU
runs. Bound once per batch of plans, like torchtitan's ``ParallelDims``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.comm import Link, link_of
from costmodel.mapping import expert_groups, micro_batches
from costmodel.placement import Placement, parse_rank_order, place
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
    pp_crosses_network: np.ndarray  # some hop between consecutive stages leaves the domain
    placement: Placement
    link: Link
    micro_batches: np.ndarray  # per DP rank per optimizer step
    tokens: np.ndarray  # of one micro-batch on one GPU
    synchronous: bool  # nothing overlaps (see GpuSpec.synchronous)


def placement_of(cluster: ClusterSpec, tr: Training, p: PlanArrays) -> Placement:
    """Where the plans' ranks sit on the cluster, in the framework's rank order
    (:mod:`costmodel.placement`): the dense grid tp, cp, dp, pp; the expert grid expert TP, EP,
    expert DP over the same ranks of each stage (:func:`costmodel.mapping.expert_groups`)."""
    etp, edp, _ = expert_groups(p.tp, p.cp, p.dp, p.ep, p.expert_tp)
    one = np.ones_like(p.tp)
    dense = {"tp": p.tp, "cp": p.cp, "ep": one, "dp": p.dp, "pp": p.pp}
    expert = {"tp": etp, "cp": one, "ep": p.ep, "dp": edp, "pp": p.pp}
    order = parse_rank_order(tr.framework.pp.rank_order, "training.rank_order")
    return place(order, dense, expert, cluster.nvlink_domain, cluster.gpus_per_node)


def mesh_of(cluster: ClusterSpec, tr: Training, p: PlanArrays) -> Mesh:
    tp, pp, cp, dp, ep, v = (x.astype(float) for x in (p.tp, p.pp, p.cp, p.dp, p.ep, p.vpp))
    at = placement_of(cluster, tr, p)
    k = {g: at.span(g).per_domain for g in ("tp", "etp", "cp", "ep", "dpcp", "edp")}
    return Mesh(
        plan=p, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, vpp=v, edp=at.span("edp").size,
        k_tp=k["tp"], k_etp=k["etp"], k_cp=k["cp"], k_ep=k["ep"],
        # gradients reduce over dp x cp together
        k_dp=k["dpcp"], k_edp=k["edp"],
        pp_crosses_network=at.pp_crosses_network, placement=at,
        link=link_of(cluster),
        micro_batches=micro_batches(tr.global_batch, p),
        tokens=p.micro_batch * float(tr.seq_len) / cp,
        synchronous=cluster.gpu.synchronous,
    )
