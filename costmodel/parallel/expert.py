"""Expert parallelism (GShard, Lepikhin et al., 2020): every MoE layer dispatches its tokens to
the ranks holding their experts and combines the results, forward and backward, by the
dispatcher Megatron-Core runs (megatron/core/transformer/moe/token_dispatcher.py):

* ``alltoall`` (MoEAlltoAllTokenDispatcher): permute -> all-to-all over EP -> all-gather over
  expert TP; back: reduce-scatter over expert TP -> all-to-all -> unpermute. Every one of a
  token's top-k copies travels, to the EP ranks inside the NVLink domain and over the NIC beyond;
* ``allgather`` (MoEAllGatherTokenDispatcher): every token of the TP x EP group all-gathered,
  the experts' outputs reduce-scattered back (NCCL rings);
* ``flex`` (MoEFlexTokenDispatcher, DeepEP / HybridEP's fused dispatch and combine): a token
  travels once to each destination rank, and through the RDMA stage once to each destination
  node (its own node's copy staged locally, as DeepEP's figures count it), whose NVLink forwards
  it to its ranks, at the fused kernels' own bandwidth (``Efficiency.flex_*``).

The all-to-all runs at ``all_to_all_bw_ratio`` times the ring collectives' bandwidth of each link
(the cluster's fitted NVLink and network fractions, so a fabric's fraction applies), at most the
link's own. The busiest rank
receives ``moe_load_imbalance`` times the mean and the exchange waits on it. Nothing overlaps it
(Megatron runs the dispatch on the compute stream) unless ``moe_a2a_overlap``
(--overlap-moe-expert-parallel-comm): then one micro-batch's forward exchange hides behind
another's backward compute and vice versa, and only what exceeds the layer's compute shows; or,
with the alltoall dispatcher, ``moe_shared_expert_overlap`` (--moe-shared-expert-overlap): the
shared experts' MLP runs during the exchange."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodel import comm, dispatch
from costmodel.comm import CollectiveArrays
from costmodel.compute import LayerTimes
from costmodel.mapping import expert_tp
from costmodel.parallel.mesh import Mesh
from costmodel.recompute import recomputed_share
from costmodel.specs import ClusterSpec, ModelSpec, Training


@dataclass(frozen=True, slots=True)
class ExpertComm:
    """EP's time per MoE layer per micro-batch: the exchange (forward; the backward mirrors it)
    and what of it stays exposed forward and backward."""

    token_bytes: np.ndarray  # one rank's dispatched bytes, per layer, one way (_dispatch_s)
    moe_fraction: float
    moe_on: float  # 1 for a MoE model, else 0
    layer_fwd_s: np.ndarray
    exposed_fwd_s: np.ndarray
    exposed_bwd_s: np.ndarray
    op: str = "all_to_all"

    @property
    def average_layer_s(self) -> np.ndarray:
        """Exposed forward time per layer of an average stage (dense layers have none)."""
        return self.moe_fraction * self.exposed_fwd_s

    @property
    def average_bwd_s(self) -> np.ndarray:
        return self.moe_fraction * self.exposed_bwd_s

    def collective(self, g: Mesh, layers: int) -> CollectiveArrays:
        per_stage = layers / g.pp
        per_step = g.micro_batches * per_stage * self.moe_fraction
        # forward, backward, and the forward's dispatch and combine again for the layers full
        # recompute reruns
        passes = 2.0 + recomputed_share(g.plan, per_stage)
        name = "ep_token_all_gather" if self.op == "all_gather" else "ep_token_all_to_all"
        return CollectiveArrays(
            name, "ep", self.op, g.plan.ep,
            per_step * passes * 2 * self.token_bytes * self.moe_on, comm.tier(g.ep, g.k_ep),
            per_step * passes * self.layer_fwd_s,
            per_step * ((passes - 1.0) * self.exposed_fwd_s + self.exposed_bwd_s))


def groups_hit(groups: np.ndarray, experts: int, k: int) -> np.ndarray:
    """Expected groups (of experts / groups experts each) that a token's k distinct experts fall
    in, uniformly routed: groups x (1 - C(E - E/groups, k) / C(E, k))."""
    miss = np.ones_like(groups, dtype=float)
    per = experts / np.maximum(groups, 1.0)
    for i in range(k):
        miss = miss * np.maximum(experts - per - i, 0.0) / (experts - i)
    return groups * (1.0 - miss)


def _limited_hit(units: float, experts: int, k: int, groups: int, chosen: int) -> float:
    """Expected units hit by a token whose k experts are uniform over the experts of its
    ``chosen`` expert groups (of ``groups``), where units and groups nest; NaN where not."""
    pool = chosen * experts // groups  # the experts a token may take

    def missed(held: int) -> float:  # C(pool - held, k) / C(pool, k)
        return math.comb(pool - held, k) / math.comb(pool, k)

    u = int(units)
    if u != units or u < 1:
        return math.nan
    if u % groups == 0:  # units inside a group: chosen x u / groups candidates
        return chosen * u / groups * (1.0 - missed(experts // u))
    if groups % u:
        return math.nan
    per = groups // u  # groups inside a unit: it holds j chosen ones, hypergeometrically
    odds = (math.comb(per, j) * math.comb(groups - per, chosen - j) / math.comb(groups, chosen)
            for j in range(1, min(per, chosen) + 1))
    return u * sum(w * (1.0 - missed(j * experts // groups))
                   for j, w in enumerate(odds, start=1))


def units_hit(units: np.ndarray, model: ModelSpec) -> np.ndarray:
    """Expected units (EP ranks or nodes, E / units experts each) a token's top-k experts fall
    in. Under group-limited routing (``model.moe_router``: the k experts taken among the
    ``group_topk`` best of its ``groups`` expert groups; DeepSeek-V3's 4 of 8, at most 4 nodes
    at EP 64, Megatron-Core's --moe-router-num-groups / --moe-router-group-topk) a token's
    experts are uniform over its chosen groups' experts, and it reaches fewer units than
    uniform routing (:func:`groups_hit`) does; where units and groups do not nest, the uniform
    count, which the limit only lowers."""
    uniform = groups_hit(units, model.moe_experts, model.moe_topk)
    r = model.moe_router
    if r is None or r.group_topk >= r.groups:
        return uniform
    values, back = np.unique(np.asarray(units, dtype=float), return_inverse=True)
    limited = np.array([_limited_hit(v, model.moe_experts, model.moe_topk, r.groups,
                                     r.group_topk) for v in values])[back].reshape(uniform.shape)
    return np.where(np.isnan(limited), uniform, limited)


def nodes_reached(nodes: np.ndarray, model: ModelSpec) -> np.ndarray:
    """The nodes a token's copies pass through the fused (flex) dispatch's RDMA stage, of an EP
    group over ``nodes`` nodes: each destination node once, its own included, as DeepEP's
    internode kernels stage it and its figures count it (:func:`_dispatch_s`); none where the
    group sits in one node."""
    return np.where(nodes > 1.0, units_hit(nodes, model), 0.0)


def _all_to_all(nv_bytes: np.ndarray, net_bytes: np.ndarray, g: Mesh, cluster: ClusterSpec,
                flex: bool = False) -> np.ndarray:
    """NVLink and NIC transfers of one exchange run concurrently, each at the all-to-all's
    bandwidth on that link: NCCL's (``all_to_all_bw_ratio`` of the ring collectives'), or under
    ``flex`` the fused dispatch's own kernels' (``flex_*_bw_fraction`` of the links)."""
    gpu, link, eff = cluster.gpu, g.link, cluster.gpu.efficiency
    if flex:
        nv_bw = gpu.intra_node_bw_bytes_per_s * eff.flex_nvlink_bw_fraction
        net_bw = gpu.network_bw_bytes_per_s * eff.flex_network_bw_fraction
    else:
        ratio = eff.all_to_all_bw_ratio
        nv_bw = min(link.nvlink_bw * ratio, gpu.intra_node_bw_bytes_per_s)
        net_bw = min(link.network_bw * ratio, gpu.network_bw_bytes_per_s)
    n, k = g.ep, g.k_ep
    lat = np.where(n > k, link.network_latency_s, link.nvlink_latency_s) + link.call_overhead_s
    t = np.maximum(nv_bytes / nv_bw, net_bytes / net_bw * spine_factor(g, cluster)) + lat
    return np.where(n > 1, t, 0.0)


def spine_factor(g: Mesh, cluster: ClusterSpec) -> np.ndarray:
    """How much slower an EP all-to-all's network bytes go where the group leaves its rail
    group. A rail-optimised fabric keeps every node's k-th NIC on the k-th leaf of its group (a
    DGX SuperPOD scalable unit of 32 nodes; NCCL's PXN forwards over NVLink to the rail-matched
    GPU), so rings and trees cross the spine once per group boundary, but an all-to-all sends
    (nodes outside the sender's group) / (other nodes) of its bytes across it, all nodes at
    once: under an oversubscribed spine that share drains at the uplinks' 1/oversubscription
    of the NICs' rate. 1 on a non-blocking spine, inside one group, or without groups given."""
    nodes = g.placement.span("ep").nodes.astype(float)
    group = float(cluster.rail_group_nodes)
    if group <= 0 or cluster.oversubscription <= 1.0:
        return np.ones_like(nodes)
    outside = np.where(nodes > group, (nodes - group) / np.maximum(nodes - 1.0, 1.0), 0.0)
    return np.maximum(1.0, outside * cluster.oversubscription)


def _dispatch_s(model: ModelSpec, cluster: ClusterSpec, tr: Training, g: Mesh,
                x_tok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One way (dispatch, or combine) of one MoE layer's forward, on the busiest rank: its
    seconds, and one rank's bytes by its dispatcher (alltoall every routed copy ``x_tok``, its
    own rank's among them; flex a token once per destination rank; allgather the ring's, the
    hidden states of the group's other members)."""
    etp = expert_tp(g.plan).astype(float)
    n, k = g.ep, g.k_ep
    d = dispatch.dispatcher(tr, g.plan)
    per_copy = x_tok / max(model.moe_topk, 1)
    # allgather: the TP x EP group's tokens, a ring each way
    size = n * etp
    gathered = comm.gather_time(per_copy * size, size,
                                np.minimum(size, float(cluster.nvlink_domain)), g.link)
    # flex: one copy per destination rank (each expert-TP shard of an expert is a destination
    # rank; the shards share a node), and across nodes one per destination node, the sender's
    # own included: DeepEP's internode kernels pass a token for its own node through the same
    # RDMA-stage buffers (csrc/kernels/legacy/internode.cu: the local node's send buffer is its
    # recv buffer, the others' go out by nvshmemi_ibgda_put_nbi_warp) and the forwarders, and
    # its published RDMA figures count those bytes (tests/legacy/test_internode.py
    # num_rdma_token_sent: the distinct nodes of each token's top-k, its own among them), so the
    # bytes the fraction paces are counted the same way
    nodes = np.maximum(n / k, 1.0)
    ranks = units_hit(n, model) * etp
    fused = _all_to_all(per_copy * ranks * (n - 1) / n, per_copy * nodes_reached(nodes, model), g,
                        cluster, flex=True)
    # alltoall: every copy to its EP rank; under expert TP the expert-TP ranks all-gather what
    # they received and reduce-scatter the results, over the expert-TP group's links
    # (Megatron-Core's --expert-tensor-parallel-size: tp by default, 1 where EP folds, any size
    # under folding)
    nccl = (_all_to_all(x_tok * (k - 1) / n, x_tok * (n - k) / n, g, cluster)
            + np.where(etp > 1, comm.gather_time(x_tok * etp, etp, g.k_etp, g.link), 0.0))
    t = np.where(d == dispatch.FLEX, fused, nccl)
    # the allgather dispatcher has no busiest rank to wait on: every rank gathers everything
    seconds = np.where(d == dispatch.ALLGATHER, gathered, t * tr.framework.moe.moe_load_imbalance)
    moved = np.select([d == dispatch.FLEX, d == dispatch.ALLGATHER],
                      [per_copy * ranks, per_copy * (size - 1.0)], x_tok)
    return seconds, moved


def unpaired_share(g: Mesh) -> np.ndarray:
    """The share of a rank's forward chunk steps (and as many backward ones) that Megatron-Core's
    combined 1F1B schedule (--overlap-moe-expert-parallel-comm) runs unpaired, their exchange
    exposed. Without PP (pipeline_parallel/combined_1f1b.py
    combined_1f1b_schedule_for_no_pipelining) the first micro-batch's forward runs alone and the
    last one's backward; under interleaved PP (the only PP the overlap allows:
    transformer_config.py asserts virtual_pipeline_model_parallel_size) the warm-up forwards
    and the cool-down backwards do, (pp - rank - 1) * 2 + (vp - 1) * group + 1 of them with
    group = pp (schedules.py get_pp_rank_microbatches, overlap_moe_expert_parallel_comm's extra
    one; model_parallel_config.py microbatch_group_size_per_vp_stage), on the first rank, which
    has the most (Megatron-LM 0d8e0714cd, core_dev_r0.15.0). Of m * vp forward chunk steps."""
    m, pp, vp = g.micro_batches.astype(float), g.pp.astype(float), g.vpp.astype(float)
    warmup = np.where(pp > 1, 2.0 * (pp - 1.0) + (vp - 1.0) * pp + 1.0, 1.0)
    return np.minimum(warmup / np.maximum(m * vp, 1.0), 1.0)


def sm_share(cluster: ClusterSpec, tr: Training, d: np.ndarray) -> np.ndarray:
    """The share of the GPU's SMs the exchange's kernels hold while they run: flex's fused
    kernels their budget (``Moe.moe_flex_sms`` over the catalog's ``sm_count``; none priced
    where it gives none), NCCL's all-to-all one CTA per channel (``Efficiency.comm_sm_share``,
    the share every hidden NCCL collective is priced at). A compute kernel beside them runs on
    the rest: Hopper's and Blackwell's GEMM CTAs take a whole SM's registers and shared
    memory, so none shares an SM with them."""
    sms = cluster.gpu.sm_count
    flex = min(tr.framework.moe.moe_flex_sms / sms, 1.0) if sms > 0 else 0.0
    return np.where(d == dispatch.FLEX, flex, cluster.gpu.efficiency.comm_sm_share)


def lapped(comm_s: np.ndarray, compute_s: np.ndarray, share: np.ndarray) -> np.ndarray:
    """What an exchange of ``comm_s`` adds to ``compute_s`` of other work run beside it when its
    kernels hold ``share`` of the SMs: the compute runs on the rest while the exchange lasts,
    so it shows the exchange's excess over the compute, or, where the compute is the longer,
    the compute's ``share * comm_s`` of work pushed past the exchange's end."""
    return np.maximum(comm_s - compute_s, share * comm_s)


def paired_exposed(one_way_s: np.ndarray, lt: LayerTimes, share: np.ndarray) -> np.ndarray:
    """What of a MoE layer's four exchanges (dispatch and combine, forward and backward, each
    ``one_way_s``) stays exposed when Megatron-Core's combined 1F1B runs one micro-batch's
    forward of the layer beside another's backward: the communication stream's three windows
    each wait for the compute stream's (models/common/model_chunk_schedule_plan.py
    ``TransformerLayerSchedulePlan.run``, core_v0.16.1: combine backward | dispatch forward ->
    dispatch backward | combine forward, beside attention forward | expert MLP backward ->
    weight gradients -> forward | attention backward). The attention node holds all but the
    routed experts (norms, attention, the shared experts, router and permute:
    models/gpt/fine_grained_callables.py ``submodule_attn_forward``); the experts' backward runs
    their GEMMs twice. Each window's compute runs on the SMs the exchange leaves
    (:func:`lapped`)."""
    attn_fwd = np.maximum(lt.fwd_moe_s - lt.experts_fwd_s, 0.0)
    attn_bwd = np.maximum(lt.bwd_moe_s - 2.0 * lt.experts_fwd_s, 0.0)
    mlp = 3.0 * lt.experts_fwd_s
    return (lapped(one_way_s, attn_fwd, share) + lapped(2.0 * one_way_s, mlp, share)
            + lapped(one_way_s, attn_bwd, share))


def expert_parallel(model: ModelSpec, cluster: ClusterSpec, tr: Training, g: Mesh,
                    lt: LayerTimes) -> ExpertComm:
    # each rank dispatches its own M / tp sequence shard (MoE with TP runs sequence parallel):
    # top-k copies of each token
    x_tok = (g.tokens / g.tp * max(model.moe_topk, 1) * model.hidden
             * tr.framework.numerics.activation_dtype_bytes)
    moe_on = 1.0 if model.is_moe else 0.0
    one_way_s, moved = _dispatch_s(model, cluster, tr, g, x_tok)
    layer_fwd = 2.0 * one_way_s * moe_on
    d = dispatch.dispatcher(tr, g.plan)
    # overlapped: a forward's exchange behind another micro-batch's backward, and the other
    # way round; the chunk steps the combined 1F1B schedule runs alone show all of theirs
    share = sm_share(cluster, tr, d)
    paired = paired_exposed(layer_fwd / 2.0, lt, share) / 2.0
    alone = unpaired_share(g)
    shown = (1.0 - alone) * paired + alone * layer_fwd
    # the fused dispatch hides its share of that (Efficiency.flex_overlap_credit, a prior)
    credit = np.where(d == dispatch.FLEX, cluster.gpu.efficiency.flex_overlap_credit, 1.0)
    shown = credit * shown + (1.0 - credit) * layer_fwd
    # the alltoall dispatcher with the shared experts' MLP behind the exchange (its backward:
    # twice the forward's GEMMs)
    shared = (tr.framework.moe.moe_shared_expert_overlap & (d == dispatch.ALLTOALL)
              & (not g.synchronous))
    fwd_s = np.where(shared, lapped(layer_fwd, lt.shared_expert_fwd_s, share), layer_fwd)
    bwd_s = np.where(shared, lapped(layer_fwd, 2.0 * lt.shared_expert_fwd_s, share), layer_fwd)
    overlap = dispatch.a2a_overlap(tr, g.plan) & (not g.synchronous)
    fwd_s, bwd_s = np.where(overlap, shown, fwd_s), np.where(overlap, shown, bwd_s)
    # the collective's name: a batch of plans all on the allgather dispatcher gathers
    op = "all_gather" if bool(np.all(d == dispatch.ALLGATHER)) else "all_to_all"
    return ExpertComm(token_bytes=moved,
                      moe_fraction=model.moe_layers / model.layers, moe_on=moe_on,
                      layer_fwd_s=layer_fwd, exposed_fwd_s=fwd_s, exposed_bwd_s=bwd_s, op=op)
