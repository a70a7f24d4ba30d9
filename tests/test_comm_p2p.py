"""Point-to-point transfers across the network run at their own fraction of the NIC's line rate
(Efficiency.p2p_network_bw_fraction, a cited prior), not at the collectives' fitted fraction;
and the logits hop of nanotron's placement crosses the network only where its own pair of
ranks straddles a domain boundary."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, comm, estimate
from costmodel.mapping import stage_layers
from costmodel.parallel.mesh import mesh_of
from costmodel.pipeline import logits_hops
from costmodel.placement import ORDER_DIMS, place
from costmodel.plans import as_plan_arrays, plans_to_arrays

GB = 1e9


def _cluster(h100, num_gpus: int, network: float = 0.25, p2p: float = 0.9) -> ClusterSpec:
    eff = replace(h100.efficiency, network_bw_fraction=network, p2p_network_bw_fraction=p2p)
    return ClusterSpec(gpu=replace(h100, efficiency=eff), num_gpus=num_gpus)


def test_a_network_send_runs_at_the_p2p_fraction_of_line_rate(h100) -> None:
    cluster = _cluster(h100, 16)
    link = comm.link_of(cluster)
    x = np.array([1.0 * GB])
    t = float(comm.p2p_time(x, np.array([True]), link)[0])
    nic = h100.network_bw_bytes_per_s
    # one network step (the family's fitted one: the cluster names no fabric) and the call
    overhead = link.network_latency_s + cluster.gpu.efficiency.collective_overhead_s
    assert t == pytest.approx(1.0 * GB / (0.9 * nic) + overhead, rel=1e-12)
    # not at the collectives' fraction: that would take 3.6x as long
    assert t < 0.5 * (1.0 * GB / (0.25 * nic))
    # on NVLink nothing changes: the NVLink fraction of the NVLink bandwidth
    nv = float(comm.p2p_time(x, np.array([False]), link)[0])
    nv_bw = h100.intra_node_bw_bytes_per_s * cluster.gpu.efficiency.nvlink_bw_fraction
    assert nv == pytest.approx(1.0 * GB / nv_bw + h100.intra_node_latency_s
                               + cluster.gpu.efficiency.collective_overhead_s, rel=1e-12)


def test_a_fabric_fraction_moves_the_collectives_not_the_p2p(h100) -> None:
    base = comm.link_of(_cluster(h100, 16))
    slow = comm.link_of(replace(_cluster(h100, 16), network_bw_fraction=0.1))
    assert slow.network_bw == pytest.approx(0.4 * base.network_bw)
    assert slow.p2p_network_bw == base.p2p_network_bw


def test_pipeline_activations_across_nodes_pay_the_p2p_price(h100, llama8b: ModelSpec) -> None:
    """pp 2 with tp 8: the stages sit a node apart; 4 micro-batches each send 4096 x 4096 bf16
    forward and receive its gradient."""
    tr = training_for(seq_len=4096, global_batch=4)
    plan = Plan(tp=8, pp=2, micro_batch=1)
    est = estimate(llama8b, _cluster(h100, 16), plan, tr)
    hop = next(c for c in est.collectives if c.name == "pp_activation_send_recv")
    x = 4096 * 4096 * 2.0
    one = x / (0.9 * h100.network_bw_bytes_per_s) \
        + comm.link_of(_cluster(h100, 16)).network_latency_s + h100.efficiency.collective_overhead_s
    assert hop.tier == "network"
    assert hop.time_s == pytest.approx(2 * 4 * one, rel=1e-9)
    # half the p2p fraction doubles exactly the bandwidth term of this collective
    slower = estimate(llama8b, _cluster(h100, 16, p2p=0.45), plan, tr)
    slow_hop = next(c for c in slower.collectives if c.name == "pp_activation_send_recv")
    assert slow_hop.time_s - hop.time_s == pytest.approx(
        2 * 4 * x / (0.9 * h100.network_bw_bytes_per_s), rel=1e-9)


@pytest.mark.parametrize(("rank", "stride", "crosses"), [
    (0, 8, True), (5, 16, True),  # stages a whole domain apart always cross
    (6, 1, False), (7, 1, True),  # adjacent ranks: only at the domain's edge
    (2, 2, False), (3, 2, True),  # 4 -> 6 stays, 6 -> 8 crosses
    (29, 4, True), (30, 4, False),  # 116 -> 120 crosses, 120 -> 124 stays
])
def test_a_hop_crosses_where_a_domain_boundary_falls_between(rank: int, stride: int,
                                                              crosses: bool) -> None:
    one = np.ones(1)
    at = place(ORDER_DIMS, {d: one for d in ORDER_DIMS} | {"tp": one * stride, "pp": one * 64},
               {d: one for d in ORDER_DIMS}, 8, 8)
    assert bool(at.hop_crosses(np.array([float(rank)]))[0]) is crosses


def test_the_logits_hop_prices_its_own_pair_of_ranks(h100) -> None:
    """nanotron's 8B at pp 32, dp 4 (stride 4 < a node of 8): the head on rank 29 sends its
    logits to rank 30 (global 116 -> 120, across nodes), the cast's rank passes fp32 logits on
    to rank 31 (120 -> 124, the same node). Two stages share each node, so 15 of the
    pipeline's 31 hops leave it: the stage-to-stage sends run at the network's pace."""
    model = ModelSpec(name="8b", layers=32, hidden=4096, ffn_hidden=14336, heads=32,
                      kv_heads=32, vocab=131072)
    cluster = _cluster(h100, 128)
    tr = training_for(seq_len=4096, global_batch=128)
    p = as_plan_arrays(plans_to_arrays([Plan(pp=32, dp=4, micro_batch=1)]))
    h, f = 4096.0, 14336.0
    layers = stage_layers(32, p, (4 * h * h + 3 * f * h, 131072 * h))
    assert layers.head_rank is not None and layers.loss_ranks is not None
    assert (layers.head_rank[0], layers.loss_ranks[0]) == (29, 2)
    g = mesh_of(cluster, tr, p)
    assert g.pp_crosses_network[0] and g.placement.pp_network_hops[0] == 15
    act, fp32 = logits_hops(model, tr, g, layers)
    x = 4096 * 131072.0
    link = g.link
    assert act[0] == pytest.approx(comm.p2p_time(np.array([2 * x]), np.array([True]), link)[0])
    assert fp32[0] == pytest.approx(comm.p2p_time(np.array([4 * x]), np.array([False]),
                                                  link)[0])
