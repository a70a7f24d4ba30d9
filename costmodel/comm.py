"""Communication: every collective of a step by name, its bytes, link tier and time.

Collective times use the ring/hierarchical bandwidth model of NCCL (Thakur et al., 2005; NCCL's
"bus bandwidth" convention): an all-reduce of X bytes over n ranks moves 2(n-1)/n·X per rank, an
all-gather or reduce-scatter (n-1)/n·X. When the group spans NVLink domains with k members in
each, the intra-domain phase runs on NVLink over X and the inter-domain phase on each GPU's NIC
over X/k (hierarchical algorithm; every GPU has its own NIC, as on DGX/HGX systems). Latency is
paid per ring step: a ring of n ranks takes n - 1 steps in lockstep, each waiting on the network
once the ring leaves the NVLink domain (TP/CP all-gathers and reduce-scatters across nodes pay
this; the Playbook's tp16/tp32 runs slow down at small micro-batches as it predicts). Bucketed
gradient collectives pay log2(n) steps per bucket (NCCL's tree for large groups).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel.hardware import MeasuredLinks
from costmodel.specs import ClusterSpec


@dataclass(frozen=True, slots=True)
class CollectiveArrays:
    """One named collective of a step, per GPU, over a batch of plans (see
    :class:`costmodel.result.Collective`)."""

    name: str
    group: str
    op: str
    group_size: np.ndarray
    bytes: np.ndarray
    tier: np.ndarray
    time_s: np.ndarray
    exposed_s: np.ndarray


@dataclass(frozen=True, slots=True)
class Link:
    nvlink_bw: float
    network_bw: float  # what a collective's network phase reaches (the fitted fraction)
    p2p_network_bw: float  # what one send/receive pair reaches across the network
    nvlink_latency_s: float
    network_latency_s: float
    call_overhead_s: float
    domain: int


def link_of(cluster: ClusterSpec) -> Link:
    """The cluster's links. A cluster that names its fabric gets that fabric's network fraction
    and ring step (the GPU's NCCL per-step latency where the fabric has none fitted); one that
    names none, its family's measured cluster's (Efficiency.network_fabric)."""
    g, eff = cluster.gpu, cluster.gpu.efficiency
    net = (eff.network_bw_fraction if cluster.network_bw_fraction is None
           else cluster.network_bw_fraction)
    if cluster.network_step_latency_s is not None:
        step = cluster.network_step_latency_s
    else:
        step = (g.network_latency_s if cluster.fabric or eff.network_step_latency_s <= 0
                else eff.network_step_latency_s)
    link = Link(nvlink_bw=g.intra_node_bw_bytes_per_s * eff.nvlink_bw_fraction,
                network_bw=g.network_bw_bytes_per_s * net,
                p2p_network_bw=g.network_bw_bytes_per_s * eff.p2p_network_bw_fraction,
                nvlink_latency_s=g.intra_node_latency_s, network_latency_s=step,
                call_overhead_s=eff.collective_overhead_s, domain=cluster.nvlink_domain)
    return link if cluster.links is None else measured(link, cluster.links)


def measured(link: Link, m: MeasuredLinks) -> Link:
    """``link`` with what the cluster's nccl-tests measured in place of the family's figures
    (a figure of 0 was not measured and keeps the family's)."""
    def pick(own: float, family: float) -> float:
        return own if own > 0 else family
    return replace(link, nvlink_bw=pick(m.nvlink_bw_bytes_per_s, link.nvlink_bw),
                   network_bw=pick(m.network_bw_bytes_per_s, link.network_bw),
                   p2p_network_bw=pick(m.p2p_network_bw_bytes_per_s, link.p2p_network_bw),
                   nvlink_latency_s=pick(m.nvlink_step_latency_s, link.nvlink_latency_s),
                   network_latency_s=pick(m.network_step_latency_s, link.network_latency_s))


def _phases(n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fraction of X moved per rank on NVLink and on the network for one all-gather pass."""
    nodes = np.maximum(n / k, 1.0)
    return (k - 1) / np.maximum(k, 1.0), (nodes - 1) / nodes / k


def gather_time(x_bytes: np.ndarray, n: np.ndarray, k: np.ndarray, link: Link) -> np.ndarray:
    """All-gather or reduce-scatter: X is the full (gathered) size."""
    nv, net = _phases(n, k)
    # a ring of n ranks takes n - 1 steps in lockstep; across domains each waits on the network
    lat = (np.where(k < n, (n - 1) * link.network_latency_s, (k - 1) * link.nvlink_latency_s)
           + link.call_overhead_s)
    t = x_bytes * (nv / link.nvlink_bw + net / link.network_bw) + lat
    return np.where(n > 1, t, 0.0)


def bucketed_gather_time(x_bytes: np.ndarray, n: np.ndarray, k: np.ndarray, link: Link,
                         bucket_bytes: np.ndarray | float) -> np.ndarray:
    """Gradient/parameter collectives issued in buckets (DDP, ZeRO, FSDP units): every bucket
    pays log2(n) latency steps of the slowest link (NCCL's tree/pipelined rings on large groups)
    and the call overhead, so latency grows with the data-parallel size while bandwidth does
    not."""
    nv, net = _phases(n, k)
    buckets = np.maximum(np.ceil(x_bytes / bucket_bytes), 1.0)
    step_lat = np.where(k < n, link.network_latency_s, link.nvlink_latency_s)
    lat = buckets * (np.log2(np.maximum(n, 2)) * step_lat + link.call_overhead_s)
    t = x_bytes * (nv / link.nvlink_bw + net / link.network_bw) + lat
    return np.where(n > 1, t, 0.0)


def all_reduce_time(x_bytes: np.ndarray, n: np.ndarray, k: np.ndarray,
                    link: Link) -> np.ndarray:
    """Reduce-scatter then all-gather, issued as one call."""
    return np.where(n > 1, 2.0 * gather_time(x_bytes, n, k, link) - link.call_overhead_s, 0.0)


def all_to_all_time(x_bytes: np.ndarray, n: np.ndarray, k: np.ndarray,
                    link: Link) -> np.ndarray:
    """Each rank sends X/n to every other rank; NVLink and NIC transfers run concurrently."""
    on_domain = x_bytes * (k - 1) / n / link.nvlink_bw
    off_domain = x_bytes * (n - k) / n / link.network_bw
    lat = np.where(n > k, link.network_latency_s, link.nvlink_latency_s) + link.call_overhead_s
    return np.where(n > 1, np.maximum(on_domain, off_domain) + lat, 0.0)


def p2p_time(x_bytes: np.ndarray, crosses_network: np.ndarray, link: Link) -> np.ndarray:
    """One send/receive of X bytes between two ranks. Across the network it runs at
    ``p2p_network_bw``, not at the collectives' fraction: the collectives' fraction is what a
    ring of ranks in lockstep reaches (each step waits on the slowest of its members and on the
    fabric's congestion under all of them), while one pair streams over the sender's own NIC
    (Efficiency.p2p_network_bw_fraction says where its prior comes from)."""
    bw = np.where(crosses_network, link.p2p_network_bw, link.nvlink_bw)
    lat = np.where(crosses_network, link.network_latency_s, link.nvlink_latency_s)
    return x_bytes / bw + lat + link.call_overhead_s


def tier(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """0 none (group of one), 1 NVLink, 2 network."""
    return np.where(n <= 1, 0, np.where(k >= n, 1, 2))


TIER_NAMES = ("none", "nvlink", "network", "host")  # host: costmodel.offload


def contention_time(collectives: tuple[CollectiveArrays, ...], compute_s: np.ndarray,
                    sm_share: float) -> np.ndarray:
    """What hidden communication costs the compute it hides behind: an overlapped NCCL kernel
    holds ``sm_share`` of the SMs (one CTA per channel) for as long as it runs, so the kernels
    beside it run that much slower; at most the compute there is to slow."""
    hidden = sum((c.time_s - c.exposed_s for c in collectives), np.zeros_like(compute_s))
    return sm_share * np.minimum(np.maximum(hidden, 0.0), compute_s)
