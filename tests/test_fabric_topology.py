"""A fabric's topology (issue #34, item 3): rail groups and an oversubscribed spine. Only an
all-to-all leaving its rail group crosses the spine at scale (rings and trees cross it once per
group boundary), so the EP exchange slows by the share of its bytes that leaves the group times
the oversubscription; a non-blocking spine, or a group inside one rail group, changes nothing."""

from __future__ import annotations

import dataclasses

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, estimate, plan_placement
from costmodel.specs import GpuSpec
from hardware_catalog import get_fabric
from search.inputs.planfile import PlanFile, dump_plan_file, parse_plan_file
from search.inputs.specs import build_specs
from search.inputs.study import StudyError, parse_study

EP16 = Plan(tp=1, pp=1, dp=32, ep=16, micro_batch=1, zero_stage=1)  # 16 ranks: two nodes
DP32 = Plan(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=1)


def _moe(llama8b: ModelSpec) -> ModelSpec:
    return dataclasses.replace(llama8b, moe_experts=16, moe_topk=2, moe_ffn_hidden=4096)


def _a2a(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> float:
    est = estimate(model, cluster, plan, training_for("megatron", seq_len=4096, global_batch=64))
    return next(c.time_s for c in est.collectives if c.name == "ep_token_all_to_all")


def _cluster(h100: GpuSpec, groups: int, over: float) -> ClusterSpec:
    return ClusterSpec(gpu=h100, num_gpus=32, rail_group_nodes=groups, oversubscription=over)


def test_an_all_to_all_leaving_its_rail_group_drains_at_the_spines_rate(
        h100: GpuSpec, llama8b: ModelSpec) -> None:
    """EP 16 over two nodes in rail groups of one node: every remote byte leaves the group,
    so the network part runs at 1/3 of the NICs' rate under a 3:1 spine; in groups of two
    nodes, or on a non-blocking spine, nothing changes."""
    moe = _moe(llama8b)
    flat = _a2a(moe, _cluster(h100, 0, 1.0), EP16)
    assert _a2a(moe, _cluster(h100, 2, 3.0), EP16) == flat
    assert _a2a(moe, _cluster(h100, 1, 1.0), EP16) == flat
    slow = _a2a(moe, _cluster(h100, 1, 3.0), EP16)
    assert slow > 2.0 * flat  # the network bytes dominate; their time triples
    # data parallelism alone (rings and trees) is not priced at the spine
    tr = training_for("megatron", seq_len=4096, global_batch=64)
    assert estimate(llama8b, _cluster(h100, 1, 3.0), DP32, tr).tokens_per_s_per_gpu == \
        estimate(llama8b, _cluster(h100, 0, 1.0), DP32, tr).tokens_per_s_per_gpu


def test_slowing_the_spine_never_speeds_a_plan(h100: GpuSpec, llama8b: ModelSpec) -> None:
    moe = _moe(llama8b)
    times = [_a2a(moe, _cluster(h100, 1, over), EP16) for over in (1.0, 1.5, 2.0, 4.0)]
    assert times == sorted(times)


def test_a_study_sets_the_topology_and_its_plan_files_keep_it(tmp_path) -> None:  # noqa: ANN001
    """The fabric's own (InfiniBand: the DGX SuperPOD's 32-node units, non-blocking) unless the
    study says otherwise; a plan file written from the study reads back the same cluster."""
    ib = get_fabric("infiniband")
    base = """
model: {preset: llama3-8b}
training: {seq_len: 4096, global_batch: 64}
cluster: {gpu: h100-sxm-80gb, nodes: 4, fabric: infiniband%s}
"""
    specs = build_specs(parse_study(base % ""))
    assert (specs.cluster.rail_group_nodes, specs.cluster.oversubscription) == (
        ib.rail_group_nodes, ib.oversubscription) == (32, 1.0)
    own = build_specs(parse_study(base % ", rail_group_nodes: 2, oversubscription: 2"))
    assert (own.cluster.rail_group_nodes, own.cluster.oversubscription) == (2, 2.0)
    pf = PlanFile(study="t", model=own.model, gpu="h100-sxm-80gb", num_gpus=32,
                  gpus_per_node=8, fabric="infiniband", rail_group_nodes=2,
                  oversubscription=2.0, training=own.training, plan=DP32)
    back = parse_plan_file(dump_plan_file(pf))
    assert (back.rail_group_nodes, back.oversubscription) == (2, 2.0)
    with pytest.raises(StudyError, match=r"cluster\.oversubscription"):
        parse_study(base % ", oversubscription: 0.5")


def test_explain_names_an_oversubscribed_spine(h100: GpuSpec, llama8b: ModelSpec) -> None:
    tr = training_for("megatron", seq_len=4096, global_batch=64)
    doc = plan_placement(_moe(llama8b), _cluster(h100, 1, 3.0), EP16, tr)
    assert (doc["rail_group_nodes"], doc["oversubscription"]) == (1, 3.0)
    with pytest.raises(SpecError, match="oversubscription >= 1"):
        _cluster(h100, 1, 0.5)
