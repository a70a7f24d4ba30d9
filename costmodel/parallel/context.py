"""Context parallelism (ring attention; Liu et al., 2023): the sequence is split over cp ranks,
load-balanced by the zig-zag split Megatron-Core and PyTorch use (2 * cp chunks, each rank the
i-th and the (2cp - i)-th), so every rank does the same attention work in cp blocks, one per key
block. The key/value blocks travel in one of two ways (``training.framework.attention.cp_comm``):

- ``ring`` (Megatron-Core's ``--cp-comm-type p2p``, Transformer Engine): cp - 1 steps, each
  sending the block just used to the next rank while attending to it, so each step's transfer
  hides only behind that step's attention block; backward sends K, V and their gradients.
- ``all_gather`` (torchtitan's default ``context_parallel_rotate_method: allgather``): one
  all-gather of every rank's K and V after the first (local) block, hidden only behind that
  block; backward gathers them again and reduce-scatters their gradients.

The blocks' own cost (one attention call each and the merge of partial outputs) is compute:
``costmodel.compute`` counts it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.attention import kv_dims
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.parallel.mesh import Mesh
from costmodel.recompute import recomputed_share
from costmodel.specs import ModelSpec, Training

BWD_OVER_FWD = 2.5  # flash attention's backward FLOPs over its forward's


@dataclass(frozen=True, slots=True)
class ContextComm:
    """CP's time per layer per micro-batch."""

    kv_bytes: np.ndarray  # the K and V of one rank's block
    layer_s: np.ndarray  # forward and backward transfers of one layer
    exposed_fwd_s: np.ndarray
    exposed_bwd_s: np.ndarray

    def collective(self, g: Mesh, layers: int) -> CollectiveArrays:
        per_stage = layers / g.pp
        per_step = g.micro_batches * per_stage  # layer passes of an average stage
        # the forward's exchange again for the layers full recompute reruns; the backward
        # moves twice the forward's (K and V, then dK and dV)
        again = recomputed_share(g.plan, per_stage)
        return CollectiveArrays(
            "cp_kv_ring", "cp", "send_recv", g.plan.cp,
            per_step * (3 + again) * (g.cp - 1) * self.kv_bytes, comm.tier(g.cp, g.k_cp),
            per_step * self.layer_s * (3 + again) / 3,
            per_step * ((1 + again) * self.exposed_fwd_s + self.exposed_bwd_s))


def context_parallel(model: ModelSpec, tr: Training, g: Mesh, lt: LayerTimes) -> ContextComm:
    cp = g.cp
    # each TP rank exchanges the K and V of its own KV heads (one replicated head when
    # tp > kv_heads); under MLA the up-projected keys (nope + rope) and values (Megatron-Core
    # runs its ring on them)
    x_kv = (g.tokens * np.maximum(model.kv_heads / g.tp, 1.0) * kv_dims(model)
            * tr.framework.numerics.activation_dtype_bytes)
    block_fwd = lt.attention_fwd_s / cp  # one key block's attention, balanced by zig-zag
    block_bwd = BWD_OVER_FWD * block_fwd
    hidden = 0.0 if g.synchronous else 1.0
    if tr.framework.attention.cp_comm == "all_gather":
        gather = comm.gather_time(cp * x_kv, cp, g.k_cp, g.link)
        fwd, bwd = gather, 2.0 * gather  # gather again in backward, reduce-scatter dK, dV
        exposed_fwd = np.maximum(fwd - hidden * block_fwd, 0.0)
        exposed_bwd = np.maximum(bwd - hidden * block_bwd, 0.0)
    else:
        hop = comm.p2p_time(x_kv, g.k_cp < cp, g.link)
        steps = cp - 1.0
        fwd, bwd = steps * hop, steps * 2.0 * hop
        exposed_fwd = steps * np.maximum(hop - hidden * block_fwd, 0.0)
        exposed_bwd = steps * np.maximum(2.0 * hop - hidden * block_bwd, 0.0)
    on = cp > 1
    return ContextComm(kv_bytes=x_kv, layer_s=np.where(on, fwd + bwd, 0.0),
                       exposed_fwd_s=np.where(on, exposed_fwd, 0.0),
                       exposed_bwd_s=np.where(on, exposed_bwd, 0.0))
