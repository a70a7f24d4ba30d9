"""The pipeline: one micro-batch through each stage, the bubble the stages leave, and the
activations sent between stages.

One micro-batch crosses every stage and the other m - 1 follow at the slowest stage's pace
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC21, sec. 2.2): the bubble is the other stages' time for one micro-batch, (p - 1)/m
of the step when the stages are balanced, split v ways when interleaved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.kernels import BWD_HOST_FACTOR
from costmodel.mapping import STAGES, StageLayers
from costmodel.mtp import MtpStage, no_mtp
from costmodel.parallel.mesh import Mesh
from costmodel.plans import PlanArrays
from costmodel.recompute import recomputed_layers
from costmodel.specs import ModelSpec, Training


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Seconds of one micro-batch through each stage: kernels (and the host's waits), exposed
    communication, and the share of the kernels that recomputes."""

    compute_s: dict[str, np.ndarray]
    comm_s: dict[str, np.ndarray]
    recompute_s: dict[str, np.ndarray]
    total_s: dict[str, np.ndarray]
    slowest: np.ndarray  # index into STAGES of the stage that takes longest
    # where the fp32 cast and the loss run on ranks after the LM head's (StageLayers.loss_ranks):
    # the time of the pipeline's end ranks that ``last`` does not stand for (0 where none)
    end_extra_s: np.ndarray

    def at_slowest(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """``values`` of the slowest stage (per plan)."""
        return np.take_along_axis(np.stack([values[st] for st in STAGES]),
                                  self.slowest[None, :], axis=0)[0]


@dataclass(frozen=True, slots=True)
class _EndRanks:
    """The ranks after the LM head's that run only the fp32 cast and the loss (nanotron's cost
    balance, :func:`costmodel.mapping.cost_balanced_ranks`): one rank for both, or the cast's
    and then the loss's. The head's rank sends its logits shard on and receives its gradient
    (a blocking send and receive per micro-batch each way)."""

    head_saved_s: np.ndarray  # the loss's kernels, which the head's rank no longer runs
    head_comm_s: np.ndarray  # the head's rank sending the logits and receiving their gradient
    compute_s: np.ndarray  # the longest end rank: its kernels
    comm_s: np.ndarray  # ... and its transfers
    sum_s: np.ndarray  # all the end ranks' time, for the bubble


def _end_ranks(layers: StageLayers, lt: LayerTimes,
               hops: tuple[np.ndarray, np.ndarray]) -> _EndRanks:
    k = np.zeros_like(lt.loss_s) if layers.loss_ranks is None else layers.loss_ranks
    hop_act, hop_fp32 = hops  # the logits in the activation dtype; in fp32, after the cast
    cast, softmax = lt.cast_s, lt.loss_s - lt.cast_s
    one_c, one_m = cast + softmax, 2.0 * hop_act
    cast_c, cast_m = cast, 2.0 * (hop_act + hop_fp32)
    loss_c, loss_m = softmax, 2.0 * hop_fp32
    cast_longer = cast_c + cast_m >= loss_c + loss_m
    two_c, two_m = np.where(cast_longer, cast_c, loss_c), np.where(cast_longer, cast_m, loss_m)
    zero = np.zeros_like(lt.loss_s)
    return _EndRanks(
        head_saved_s=np.where(k > 0, lt.loss_s, 0.0),
        head_comm_s=np.where(k > 0, 2.0 * hop_act, 0.0),
        compute_s=np.where(k == 1, one_c, np.where(k == 2, two_c, zero)),
        comm_s=np.where(k == 1, one_m, np.where(k == 2, two_m, zero)),
        sum_s=np.where(k == 1, one_c + one_m,
                       np.where(k == 2, cast_c + cast_m + loss_c + loss_m, zero)))


def logits_hops(model: ModelSpec, tr: Training, g: Mesh, layers: StageLayers
                ) -> tuple[np.ndarray, np.ndarray]:
    """One micro-batch's logits shard (its tokens x vocab / tp) sent one way between pipeline
    ranks: in the activation dtype from the LM head's rank, in fp32 from the cast's. Each is one
    pair of ranks (the head's h to h + 1, the cast's h + 1 to h + 2), on the network only where
    that pair straddles a domain boundary (:meth:`costmodel.placement.Placement.hop_crosses`)."""
    x = g.tokens * float(model.vocab) / g.tp
    head = g.pp - 1.0 if layers.head_rank is None else layers.head_rank.astype(float)
    at = g.placement
    return (comm.p2p_time(x * tr.framework.numerics.activation_dtype_bytes,
                          at.hop_crosses(head), g.link),
            comm.p2p_time(x * 4.0, at.hop_crosses(head + 1.0), g.link))


def stage_times(p: PlanArrays, layers: StageLayers, lt: LayerTimes, comm_fwd_s: np.ndarray,
                comm_bwd_s: np.ndarray, host_fwd_s: np.ndarray, vocab_s: Mapping[str, np.ndarray],
                synchronous: bool, mtp: MtpStage | None = None,
                logits_hops_s: tuple[np.ndarray, np.ndarray] | None = None) -> StageTimes:
    """Each stage's layers forward and backward, the recomputed forward, the LM head and the
    multi-token prediction depths where they sit (``costmodel.mtp``), and per layer the exposed
    communication and the host time to issue its kernels. Where the loss runs on ranks after the
    head's (``logits_hops_s``: :func:`logits_hops`), ``last`` is the longest of the head's rank
    and those."""
    fwd, bwd, pp = lt.fwd_s, lt.bwd_s, p.pp
    zero = np.zeros_like(lt.loss_s)
    end = _end_ranks(layers, lt, logits_hops_s or (zero, zero))
    mtp = mtp or no_mtp(zero)
    head = lt.head_fwd_s + lt.head_bwd_s - end.head_saved_s
    out: dict[str, dict[str, np.ndarray]] = {"compute": {}, "comm": {}, "recompute": {}}
    # the last stage holds the head and the MTP depths; pp == 1 puts them on the first too
    at_end = {"first": (pp == 1).astype(float), "middle": 0.0 * pp, "last": 1.0 + 0.0 * pp}
    for st in STAGES:
        n = layers.of(st)
        ends = at_end[st]
        r = recomputed_layers(p, n)
        selective = np.where(p.recompute == 1, n * lt.selective_extra_avg_s, 0.0)
        comp = n * (fwd + bwd) + selective
        comp = comp + r * fwd
        comp = comp + ends * (head + mtp.compute_s)
        comm_mb = (n * (comm_fwd_s + comm_bwd_s) + r * comm_fwd_s + vocab_s[st]
                   + ends * mtp.comm_s)
        if st == "last":
            comm_mb = comm_mb + end.head_comm_s
        host = ((n * (1.0 + BWD_HOST_FACTOR) + r) * host_fwd_s + ends * mtp.host_s
                + np.where(p.recompute == 1, n * lt.selective_host_avg_s, 0.0))
        # a host-bound stage waits for its kernels to be issued: count the wait as compute;
        # on a synchronous device issuing is part of every kernel's time
        comp = comp + (host if synchronous else np.maximum(host - comp - comm_mb, 0.0))
        out["compute"][st], out["comm"][st] = comp, comm_mb
        # the kernels that re-run, as a share of ``compute``: the re-run forward's exposed
        # communication (the EP all-to-all of a recomputed MoE layer) is in ``comm`` already
        out["recompute"][st] = r * fwd + selective + ends * mtp.recompute_s
    head_rank = out["compute"]["last"] + out["comm"]["last"]
    end_longer = end.compute_s + end.comm_s > head_rank
    out["compute"]["last"] = np.where(end_longer, end.compute_s, out["compute"]["last"])
    out["comm"]["last"] = np.where(end_longer, end.comm_s, out["comm"]["last"])
    out["recompute"]["last"] = np.where(end_longer, 0.0, out["recompute"]["last"])
    total = {st: out["compute"][st] + out["comm"][st] for st in STAGES}
    return StageTimes(compute_s=out["compute"], comm_s=out["comm"], recompute_s=out["recompute"],
                      total_s=total,
                      slowest=np.argmax(np.stack([total[st] for st in STAGES]), axis=0),
                      end_extra_s=head_rank + end.sum_s - total["last"])


def chunk_share(layers: StageLayers, vpp: np.ndarray, stage: str) -> np.ndarray:
    """The largest virtual chunk's share of a stage's layers, what one of its chunk steps takes
    of the stage's time: 1 / vpp where vpp divides its layers; with fewer layers than chunks
    (Megatron-Core's --pipeline-model-parallel-layout allows empty virtual stages) a chunk step
    still runs a whole layer: 4 layers in 8 chunks take a quarter each, not an eighth."""
    n = layers.of(stage)
    return np.where(n > 0, np.ceil(n / vpp) / np.maximum(n, 1.0), 1.0 / vpp)


def bubble_time(stages: StageTimes, g: Mesh, layers: StageLayers) -> np.ndarray:
    """The other stages' time for one micro-batch, in chunk steps: interleaving divides it by
    the chunks a stage's layers make (``chunk_share``), no further."""
    pp = g.pp
    total = stages.total_s
    share = {st: chunk_share(layers, g.vpp, st) for st in STAGES}
    # the loss's own ranks (counted among the middle ones, with no layer) add their time; the
    # middle ranks a layer apart take the mean's share of the most loaded one's time
    all_stages = (total["first"] * share["first"] + total["last"] * share["last"]
                  + np.maximum(pp - 2, 0) * total["middle"] * share["middle"]
                  * layers.middle_share
                  + stages.end_extra_s / g.vpp)
    slowest = stages.at_slowest({st: total[st] * share[st] for st in STAGES})
    return np.where(pp > 1, np.maximum(all_stages - slowest, 0.0), 0.0)


def point_to_point(model: ModelSpec, tr: Training, g: Mesh, layers: StageLayers,
                   lt: LayerTimes) -> CollectiveArrays:
    """Activations forward and gradients backward across every stage boundary, per step."""
    p, tp, pp, v, m, link = g.plan, g.tp, g.pp, g.vpp, g.micro_batches, g.link
    cross = g.pp_crosses_network
    sp_div = np.where(p.sequence_parallel > 0, tp, 1.0)
    x_pp = g.tokens * model.hidden * tr.framework.numerics.activation_dtype_bytes / sp_div
    scatter = (tr.framework.pp.pp_scatter_gather & (p.sequence_parallel == 0) & (tp > 1) & cross
               & (g.k_tp >= tp))
    hop = np.where(scatter,
                   comm.p2p_time(x_pp / tp, cross, link) + comm.gather_time(x_pp, tp, g.k_tp,
                                                                            link),
                   comm.p2p_time(x_pp, cross, link))
    time_s = np.where(pp > 1, 2.0 * m * v * hop, 0.0)
    n_big = layers.largest
    if tr.framework.pp.overlap_p2p_comm and not g.synchronous:
        # interleaved: a hop hides behind the next chunk's forward (or backward) of one
        # micro-batch; the pipeline's first receive and last send have nothing to hide behind
        chunk_fwd, chunk_bwd = n_big * lt.fwd_s / v, n_big * lt.bwd_s / v
        overlapped = (np.maximum(hop - chunk_fwd, 0.0) + np.maximum(hop - chunk_bwd, 0.0))
        exposed = np.where((pp > 1) & (v > 1),
                           np.minimum(m * v * overlapped + 2.0 * hop, time_s), time_s)
    else:
        exposed = time_s
    return CollectiveArrays(
        "pp_activation_send_recv", "pp", "send_recv", p.pp,
        np.where(pp > 1, 2.0 * m * v * np.where(scatter, x_pp / tp, x_pp), 0.0),
        np.where(pp > 1, np.where(cross, 2, 1), 0), time_s, exposed)


def shared_embedding_sync(model: ModelSpec, tr: Training, g: Mesh,
                          embed_params: np.ndarray) -> CollectiveArrays:
    """The word embedding's gradient where two stages hold it: the first (the embedding) and the
    last (the tied LM head, or the MTP depths' embedding), all-reduced between the two after
    backward, with nothing to hide behind. Megatron-Core: ``finalize_model_grads`` ->
    ``_allreduce_word_embedding_grads`` on the embedding group (share_embeddings_and_output_weights
    or MTP; distributed/finalize_model_grads.py); nanotron: ``sync_tied_weights_gradients`` on the
    fp32 accumulator after the data-parallel sync (trainer.py, parallel/tied_parameters.py);
    DeepSpeed's pipeline engine its tied modules alike. The pair is as far apart as the job is
    wide (pp is outermost): one NVLink domain only if the job is."""
    on = (g.pp > 1) & (model.tied_embeddings or model.mtp_layers > 0)
    x = np.where(on, embed_params * tr.framework.numerics.grad_reduce_dtype_bytes, 0.0)
    n = np.where(on, 2.0, 1.0)
    k = np.where(g.tp * g.cp * g.dp * g.pp > g.link.domain, 1.0, 2.0)  # the pair's members a domain
    time_s = comm.all_reduce_time(x, n, k, g.link)
    return CollectiveArrays("pp_shared_embedding_grad", "pp", "all_reduce", np.where(on, 2, 1),
                            x, comm.tier(n, k), time_s, time_s)
