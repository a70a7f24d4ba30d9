"""Tensor and sequence parallelism (Shoeybi et al., 2019; Korthikanti et al., 2022): the
activation collectives of every layer, the host time their calls cost, and the
vocabulary-parallel embedding and LM head."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.kernels import host_op_s
from costmodel.parallel.mesh import Mesh
from costmodel.recompute import recomputed_share
from costmodel.specs import ClusterSpec, ModelSpec, Training

# Tensor ops of one Llama layer's forward, views included (norms, 4+3 projections, q/k/v views
# and transposes, RoPE's chunk/neg/cat/mul/add on q and k, attention, reshape, SwiGLU, residual
# adds): what a DTensor layer dispatches, counted in tcf_search/validate/model.py.
DTENSOR_OPS_PER_LAYER_FWD = 40.0


@dataclass(frozen=True, slots=True)
class TensorComm:
    """TP's time per micro-batch: per layer forward (the backward mirrors it) and per stage for
    the vocabulary-parallel ends."""

    activation_bytes: np.ndarray  # one micro-batch's activations on one GPU
    layer_fwd_s: np.ndarray
    layer_exposed_s: np.ndarray  # what TP overlap leaves on the critical path
    layer_bwd_s: np.ndarray  # the backward's (its gathers at the activations' dtype)
    layer_exposed_bwd_s: np.ndarray
    gathered_bytes: np.ndarray  # what one forward all-gather moves per rank's input
    host_fwd_s: np.ndarray  # host time the TP calls add to a layer's forward
    vocab_s: dict[str, np.ndarray]  # per stage: embedding and LM head collectives
    vocab_sides: dict[str, np.ndarray]  # per stage: how many of the embedding and head it holds
    vocab_side_s: np.ndarray  # one embedding-sized collective forward and its backward

    def collectives(self, g: Mesh, layers: int, vocab_s: np.ndarray,
                    vocab_sides: np.ndarray) -> tuple[CollectiveArrays, CollectiveArrays]:
        """Per step, with ``vocab_s`` and ``vocab_sides`` those of the slowest stage."""
        p, tp, m, x_act = g.plan, g.tp, g.micro_batches, self.activation_bytes
        # forward, the forward again of the layers full recompute reruns, and backward
        per_stage = layers / g.pp
        fwd = m * per_stage * (1.0 + recomputed_share(p, per_stage))
        bwd = m * per_stage
        tier = comm.tier(tp, g.k_tp)
        # two activations' worth a pass (two all-reduces, or two all-gathers and two
        # reduce-scatters); the forward's gathers may move the quantised input
        fwd_bytes = x_act + np.where(g.plan.sequence_parallel > 0, self.gathered_bytes, x_act)
        return (
            CollectiveArrays("tp_activation_allreduce", "tp", "all_reduce", p.tp,
                             fwd * fwd_bytes + bwd * 2 * x_act, tier,
                             fwd * self.layer_fwd_s + bwd * self.layer_bwd_s,
                             fwd * self.layer_exposed_s + bwd * self.layer_exposed_bwd_s),
            CollectiveArrays("tp_vocab_parallel", "tp", "all_reduce", p.tp,
                             np.where(tp > 1, m * vocab_sides * 2 * x_act, 0.0), tier,
                             m * vocab_s, m * vocab_s),
        )


def _host_fwd(cluster: ClusterSpec, tr: Training, g: Mesh, calls: np.ndarray) -> np.ndarray:
    """Host time per layer forward: the TP calls, and (under a pipeline engine that serialises
    p2p with TP collectives) a wait per TP ring step when the stages' p2p crosses the network."""
    tp, pp = g.tp, g.pp
    host = calls * (host_op_s(cluster, tr)
                    + np.where((pp > 1) & g.pp_crosses_network,
                               (tp - 1) * tr.framework.pp.pp_tp_step_overhead_s, 0.0))
    if tr.framework.tp.dtensor_tp:  # every tensor op of a TP layer dispatches through DTensor
        dtensor = cluster.gpu.efficiency.dtensor_op_overhead_s
        host = host + np.where(tp > 1, DTENSOR_OPS_PER_LAYER_FWD * dtensor, 0.0)
    return host


def _vocab_side(x_act: np.ndarray, g: Mesh) -> np.ndarray:
    tp, k_tp, link = g.tp, g.k_tp, g.link
    sp = g.plan.sequence_parallel > 0
    return np.where(tp > 1, np.where(sp, 2.0 * comm.gather_time(x_act, tp, k_tp, link),
                                     comm.all_reduce_time(x_act, tp, k_tp, link)), 0.0)


def _vocab_parallel(x_act: np.ndarray, g: Mesh) -> dict[str, np.ndarray]:
    """The vocabulary-parallel embedding and LM head (Megatron-LM, nanotron, torchtitan) talk
    over the TP group once per micro-batch each: the embedding reduces its partial lookups (an
    all-reduce, or with SP a reduce-scatter whose backward all-gathers the gradient); the head's
    input is all-gathered under SP (its gradient reduce-scattered back) or, without SP, its
    gradient all-reduced in backward; the vocabulary-parallel cross-entropy adds three
    all-reduces of one fp32 value per token (max, sum of exponentials, target logit). Nothing
    overlaps them: the first layer waits for its input, the loss for the logits."""
    tp, pp, k_tp, link = g.tp, g.pp, g.k_tp, g.link
    side = _vocab_side(x_act, g)
    embed = side
    head = side + np.where(tp > 1, 3.0 * comm.all_reduce_time(g.tokens * 4.0, tp, k_tp, link),
                           0.0)
    # pp == 1 puts the head on the first stage too
    return {"first": embed + np.where(pp == 1, head, 0.0), "middle": 0.0 * head, "last": head}


def tensor_parallel(model: ModelSpec, cluster: ClusterSpec, tr: Training, g: Mesh,
                    lt: LayerTimes) -> TensorComm:
    tp, pp, k_tp, link = g.tp, g.pp, g.k_tp, g.link
    act = tr.framework.numerics.activation_dtype_bytes
    x_act = g.tokens * model.hidden * act
    # the forward's SP all-gathers feed fp8 GEMMs the input they quantised first (the
    # framework's fp8_sp_gather): one byte an element
    x_gather = (x_act / act if tr.precision == "fp8" and tr.framework.tp.fp8_sp_gather
                else x_act)
    # per layer forward: two all-reduces, or with sequence parallel two all-gathers and two
    # reduce-scatters (the same bytes, twice the calls); the backward mirrors it
    sp = g.plan.sequence_parallel > 0
    gather = comm.gather_time(x_act, tp, k_tp, link)
    layer_bwd = np.where(sp, 4.0 * gather, 2.0 * comm.all_reduce_time(x_act, tp, k_tp, link))
    fp8_gather = gather if x_gather is x_act else comm.gather_time(x_gather, tp, k_tp, link)
    layer_fwd = np.where(sp, 2.0 * (gather + fp8_gather), layer_bwd)
    calls = np.where(tp > 1, np.where(sp, 4.0, 2.0), 0.0)

    def exposed_of(layer_s: np.ndarray) -> np.ndarray:
        if tr.framework.tp.tp_comm_overlap and not g.synchronous:  # the all-gathers and
            # reduce-scatters of sequence parallelism hide behind the GEMMs they feed or
            # drain (all-reduces do not)
            return np.where(sp, np.maximum(layer_s - lt.gemm_fwd_dense_s, 0.0), layer_s)
        return layer_s
    # multi-token prediction on the last stage: per depth an embedding, a head and eh_proj's
    # three embedding-sized sides (costmodel.mtp.mtp_stage)
    mtp_sides = 5.0 * model.mtp_layers
    sides = {"first": 1.0 + (pp == 1) * (1.0 + mtp_sides), "middle": 0.0 * pp,
             "last": 1.0 + mtp_sides + 0.0 * pp}
    return TensorComm(activation_bytes=x_act, layer_fwd_s=layer_fwd,
                      layer_exposed_s=exposed_of(layer_fwd), layer_bwd_s=layer_bwd,
                      layer_exposed_bwd_s=exposed_of(layer_bwd), gathered_bytes=x_gather,
                      host_fwd_s=_host_fwd(cluster, tr, g, calls),
                      vocab_s=_vocab_parallel(x_act, g), vocab_sides=sides,
                      vocab_side_s=_vocab_side(x_act, g))
