"""Activation offloading to host memory: Megatron-Core's ``--cpu-offloading-num-layers`` over
Transformer Engine's offload context (Megatron-LM d98e8a64dd, transformer_block.py
``get_cpu_offload_context``; rule ``cpu_offload`` in :mod:`costmodel.rules`).

The first ``cpu_offload_layers`` layers of the (single) pipeline stage save their activations to
pinned host memory: each layer's are copied out while the next layer's forward runs and copied
back while the layer above runs its backward, by the copy engines over the GPU's own host link
(PCIe, or Grace's NVLink-C2C). So on the GPU a micro-batch holds the other layers' activations
only (:func:`costmodel.memory.stage_memory`), host memory holds the offloaded ones
(:func:`host_bytes`), and the step pays what of each copy its neighbour layer's compute cannot
hide (:func:`offload_copies`), at what the NIC's traffic leaves of a PCIe link
(:func:`copy_bandwidth`). The copies use no SMs, so they slow no kernel.
"""

from __future__ import annotations

import numpy as np

from costmodel.comm import CollectiveArrays, link_of
from costmodel.compute import LayerTimes
from costmodel.mapping import inflight_micro_batches
from costmodel.memory import MemoryCoefficients
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec

NETWORK_TIER, HOST_TIER = 2, 3  # costmodel.comm.TIER_NAMES; host: the GPU's link to host memory


def host_bytes(co: MemoryCoefficients, p: PlanArrays, m: np.ndarray) -> np.ndarray:
    """Pinned host bytes a GPU holds at its peak: the offloaded layers' activations of the
    micro-batches in flight (one, under the 1F1B of a single stage)."""
    return inflight_micro_batches(p, m, "first") * p.cpu_offload_layers * co.act_per_layer


def network_busy_s(*groups: tuple[CollectiveArrays, ...]) -> np.ndarray:
    """Seconds a step's collectives spend on the network (what its NIC streams for)."""
    return sum((np.where(c.tier == NETWORK_TIER, c.time_s, 0.0) for cs in groups for c in cs),
               np.zeros(1))


def copy_bandwidth(cluster: ClusterSpec, network_s: np.ndarray, step_s: np.ndarray
                   ) -> np.ndarray:
    """What a copy reaches of the host link. Where the NIC hangs off the GPU's own PCIe link
    (``host_link_network_share``: GPUDirect RDMA reads and writes GPU memory over it; DGX
    H100's ConnectX-7 with its integrated switch between each GPU and the CPU), the copies get
    the whole link while the network is idle and what the NIC leaves of it while the step's
    collectives stream; Grace's NVLink-C2C is apart from the NIC's path."""
    gpu = cluster.gpu
    bw = gpu.host_link_bw_bytes_per_s * gpu.efficiency.host_link_bw_fraction
    busy = gpu.host_link_network_share * np.minimum(network_s / np.maximum(step_s, 1e-30), 1.0)
    return bw * (1.0 - busy) + max(bw - link_of(cluster).network_bw, 0.0) * busy


def offload_copies(cluster: ClusterSpec, co: MemoryCoefficients, p: PlanArrays,
                   lt: LayerTimes, m: np.ndarray, network_s: np.ndarray,
                   step_s: np.ndarray) -> CollectiveArrays:
    """Each offloaded layer's activations out in the forward and back in the backward, every
    micro-batch: a copy hides behind the next layer's forward (out) or the layer above's
    backward (in), and what is longer than that layer stays on the step's critical path
    (Transformer Engine waits for a layer's copy before the one after next). ``network_s``,
    ``step_s``: the step's network time and length without the copies (:func:`copy_bandwidth`)."""
    n = p.cpu_offload_layers.astype(float)
    per_layer = co.act_per_layer * np.ones_like(n)
    bw = copy_bandwidth(cluster, network_s, step_s) * np.ones_like(n)
    with np.errstate(divide="ignore"):
        copy_s = np.where(n > 0, per_layer / bw, 0.0)
    exposed_layer = (np.maximum(copy_s - lt.fwd_s, 0.0) + np.maximum(copy_s - lt.bwd_s, 0.0))
    return CollectiveArrays(
        name="cpu_offload", group="host", op="copy", group_size=np.where(n > 0, 2, 1),
        bytes=2.0 * m * n * per_layer, tier=np.full(n.shape, HOST_TIER),
        time_s=np.where(n > 0, 2.0 * m * n * copy_s, 0.0),
        exposed_s=np.where(n > 0, m * n * exposed_layer, 0.0))
