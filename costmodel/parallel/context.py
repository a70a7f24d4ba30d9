"""Context parallelism as a ring over the sequence (ring attention; Liu et al., 2023; Megatron-LM's
context parallel): every layer passes K and V around the cp ranks, hidden behind the attention
of the block already received."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.parallel.mesh import Mesh
from costmodel.specs import ModelSpec, Training


@dataclass(frozen=True, slots=True)
class ContextComm:
    """CP's time per layer per micro-batch."""

    kv_bytes: np.ndarray  # the K and V one hop passes on
    layer_fwd_s: np.ndarray
    exposed_fwd_s: np.ndarray
    exposed_bwd_s: np.ndarray  # backward passes K, V and their gradients: twice the bytes

    def collective(self, g: Mesh, layers: int) -> CollectiveArrays:
        per_step = g.micro_batches * (layers / g.pp)  # layer passes of an average stage
        return CollectiveArrays(
            "cp_kv_ring", "cp", "send_recv", g.plan.cp,
            per_step * 3 * (g.cp - 1) * self.kv_bytes, comm.tier(g.cp, g.k_cp),
            per_step * 3 * self.layer_fwd_s, per_step * (self.exposed_fwd_s + self.exposed_bwd_s))


def context_parallel(model: ModelSpec, tr: Training, g: Mesh, lt: LayerTimes) -> ContextComm:
    cp = g.cp
    # each TP rank exchanges the K and V of its own KV heads (one replicated head when
    # tp > kv_heads)
    x_kv = (2.0 * g.tokens * np.maximum(model.kv_heads / g.tp, 1.0) * model.d_head
            * tr.activation_dtype_bytes)
    hop = comm.p2p_time(x_kv, g.k_cp < cp, g.link)
    layer_fwd = np.where(cp > 1, (cp - 1) * hop, 0.0)
    hidden_fwd, hidden_bwd = ((0.0, 0.0) if g.synchronous
                              else (lt.attention_fwd_s, 2.5 * lt.attention_fwd_s))
    return ContextComm(kv_bytes=x_kv, layer_fwd_s=layer_fwd,
                       exposed_fwd_s=np.maximum(layer_fwd - hidden_fwd, 0.0),
                       exposed_bwd_s=np.maximum(2 * layer_fwd - hidden_bwd, 0.0))
