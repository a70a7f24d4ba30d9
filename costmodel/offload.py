"""Activation offloading to host memory: Megatron-Core's ``--cpu-offloading-num-layers`` over
Transformer Engine's offload context (Megatron-LM d98e8a64dd, transformer_block.py
``get_cpu_offload_context``; rule ``cpu_offload`` in :mod:`costmodel.rules`).

The first ``cpu_offload_layers`` layers of the (single) pipeline stage save their activations to
pinned host memory: each layer's are copied out while the next layer's forward runs and copied
back while the layer above runs its backward, by the copy engines over the GPU's own host link
(PCIe, or Grace's NVLink-C2C). So on the GPU a micro-batch holds the other layers' activations
only (:func:`costmodel.memory.stage_memory`), host memory holds the offloaded ones
(:func:`host_bytes`), and the step pays what of each copy its neighbour layer's compute cannot
hide (:func:`offload_copies`). The copies use no SMs, so they slow no kernel.
"""

from __future__ import annotations

import numpy as np

from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.mapping import inflight_micro_batches
from costmodel.memory import MemoryCoefficients
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec

HOST_TIER = 3  # costmodel.comm.TIER_NAMES: the GPU's link to host memory


def host_bytes(co: MemoryCoefficients, p: PlanArrays, m: np.ndarray) -> np.ndarray:
    """Pinned host bytes a GPU holds at its peak: the offloaded layers' activations of the
    micro-batches in flight (one, under the 1F1B of a single stage)."""
    return inflight_micro_batches(p, m, "first") * p.cpu_offload_layers * co.act_per_layer


def offload_copies(cluster: ClusterSpec, co: MemoryCoefficients, p: PlanArrays,
                   lt: LayerTimes, m: np.ndarray) -> CollectiveArrays:
    """Each offloaded layer's activations out in the forward and back in the backward, every
    micro-batch: a copy hides behind the next layer's forward (out) or the layer above's
    backward (in), and what is longer than that layer stays on the step's critical path
    (Transformer Engine waits for a layer's copy before the one after next)."""
    gpu = cluster.gpu
    n = p.cpu_offload_layers.astype(float)
    per_layer = co.act_per_layer * np.ones_like(n)
    bw = gpu.host_link_bw_bytes_per_s * gpu.efficiency.host_link_bw_fraction
    copy_s = per_layer / bw if bw > 0 else np.where(n > 0, np.inf, 0.0)
    exposed_layer = (np.maximum(copy_s - lt.fwd_s, 0.0) + np.maximum(copy_s - lt.bwd_s, 0.0))
    return CollectiveArrays(
        name="cpu_offload", group="host", op="copy", group_size=np.where(n > 0, 2, 1),
        bytes=2.0 * m * n * per_layer, tier=np.full(n.shape, HOST_TIER),
        time_s=np.where(n > 0, 2.0 * m * n * copy_s, 0.0),
        exposed_s=np.where(n > 0, m * n * exposed_layer, 0.0))
