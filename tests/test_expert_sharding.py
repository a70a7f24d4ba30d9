"""Expert parallelism beside every data-parallel sharding frameworks run: the expert-DP group
(Megatron-Core's folding, torchtitan's efsdp, NeMo AutoModel's ep_shard), the model states each
ZeRO stage keeps over it, FSDP's single fp32 copy, and the collectives over its own links."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from costmodel.mapping import expert_dp, expert_tp
from costmodel.placement import ORDER_DIMS, place
from costmodel.plans import as_plan_arrays, plans_to_arrays
from search.inputs.specs import build_specs
from search.inputs.study import load_study
from search.space import build_space, violations

GIB = 2**30
# a small MoE: 8 layers, 16 experts of width 1024, top-2
MOE = ModelSpec(name="moe", layers=8, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=8,
                vocab=32000, moe_experts=16, moe_topk=2, moe_ffn_hidden=1024)


def arrays(*plans: Plan):
    return as_plan_arrays(plans_to_arrays(list(plans)))


@pytest.mark.parametrize("tp,cp,dp,ep,etp", [
    (t, c, d, e, x) for t, c, d, e, x in itertools.product((1, 2, 4), (1, 2), (1, 2, 4, 8),
                                                           (1, 2, 4, 8), (0, 1, 2, 4))
    if (t * c * d) % (e * (x or 1)) == 0 and (x or (t if (d * c) % e == 0 else 1)) * e
    <= t * c * d])
def test_expert_ranks_fill_the_stage(tp: int, cp: int, dp: int, ep: int, etp: int) -> None:
    """Megatron-Core's expert rank order (parallel_state.py): expert TP x EP x expert DP are
    a stage's tp x cp x dp ranks; expert TP fastest, then EP, then expert DP."""
    p = arrays(Plan(tp=tp, cp=cp, dp=dp, ep=ep, expert_tp=etp))
    e_tp, e_dp = int(expert_tp(p)[0]), int(expert_dp(p)[0])
    assert e_tp * ep * e_dp == tp * cp * dp
    if etp:
        assert e_tp == etp
    # Megatron's order on the expert grid: EP neighbours e_tp ranks apart, expert-DP e_tp x ep
    # apart, so a block of e_tp x ep ranks holds a whole EP group and one expert-DP member
    one = np.ones(1)
    at = place(ORDER_DIMS, {"tp": one * tp, "cp": one * cp, "ep": one, "dp": one * dp,
                            "pp": one},
               {"tp": one * e_tp, "cp": one, "ep": one * ep, "dp": one * e_dp, "pp": one},
               e_tp * ep, e_tp * ep)
    assert at.span("ep").per_domain[0] == ep and at.span("edp").per_domain[0] == 1
    assert at.span("etp").per_domain[0] == e_tp


def _states(est) -> float:
    st = est.memory.stages[0]
    return st.weights_bytes + st.grads_bytes + st.optimizer_bytes


def test_zero1_shards_expert_optimizer_over_expert_dp(h100) -> None:
    """Megatron's distributed optimizer: dense optimizer states over dp x cp, expert states
    over the expert-DP group. 16 GPUs, dp 16, ep 8: dense / 16, experts / 2. By hand, the
    optimizer bytes (12 per param: fp32 master, m, v) are
    12 * (dense / 16 + local experts / 2)."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=1024, global_batch=64)
    plan = Plan(dp=16, ep=8, zero_stage=1)
    est = estimate(MOE, cluster, plan, tr)
    from costmodel.params import expert_params

    local_experts = MOE.layers * MOE.moe_experts / 8 * expert_params(MOE)
    one = estimate(MOE, cluster, replace(plan, ep=1, zero_stage=0), tr)
    dense_and_experts = one.memory.stages[0].optimizer_bytes / 12  # all params, unsharded
    dense = dense_and_experts - MOE.layers * MOE.moe_experts * expert_params(MOE)
    expected = 12 * (dense / 16 + local_experts / 2)
    assert est.memory.stages[0].optimizer_bytes == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_zero_stages_order_model_states_with_ep(h100, ep: int) -> None:
    """ZeRO-3 <= ZeRO-2 <= ZeRO-1 <= ZeRO-0 for model-state bytes, EP or not."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=1024, global_batch=64, zero2_grad_sync="micro_batch")
    states = [_states(estimate(MOE, cluster, Plan(dp=16, ep=ep, zero_stage=z), tr))
              for z in (0, 1, 2, 3)]
    assert states == sorted(states, reverse=True)
    assert states[3] < states[0]


def test_fsdp_keeps_one_fp32_copy(h100) -> None:
    """FSDP's sharded fp32 parameter is the master (framework.dp.zero3_master_is_param): 16 bytes a
    parameter (fp32 shard, fp32 grad, m, v) over the shard, where a framework with a bf16 shard
    beside its fp32 main weights keeps 18. With one expert-DP replica (ep spans the stage) the
    experts' shard is whole."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, ep=8, zero_stage=3)
    two = estimate(MOE, cluster, plan, training_for(seq_len=1024, global_batch=64))
    one = estimate(MOE, cluster, plan, training_for(seq_len=1024, global_batch=64,
                                                zero3_master_is_param=True))
    assert _states(one) == pytest.approx(_states(two) * 16 / 18, rel=1e-9)
    assert one.memory.stages[0].weights_bytes == pytest.approx(
        two.memory.stages[0].weights_bytes * 2, rel=1e-9)  # fp32 shard, not bf16


def test_expert_gather_buffer_only_with_expert_replicas(h100) -> None:
    """ZeRO-3 gathers expert weights only where they have expert-DP replicas: with ep = dp the
    experts are whole on their rank and the prefetch buffers hold the dense units alone."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=1024, global_batch=64)
    whole = estimate(MOE, cluster, Plan(dp=8, ep=8, zero_stage=3), tr)
    halves = estimate(MOE, cluster, Plan(dp=8, ep=4, zero_stage=3), tr)
    zero2 = estimate(MOE, cluster, Plan(dp=8, ep=8, zero_stage=2), tr)
    z3, z2 = whole.memory.stages[0].buffers_bytes, zero2.memory.stages[0].buffers_bytes
    from costmodel.params import expert_params

    layer_experts_ep4 = MOE.moe_experts / 4 * expert_params(MOE)
    assert halves.memory.stages[0].buffers_bytes - z3 == pytest.approx(
        2 * 2 * layer_experts_ep4, rel=1e-6)  # two units of bf16 experts now gathered
    assert z3 > z2  # the dense units still are


def test_expert_dp_collectives_on_their_own_links(h100) -> None:
    """EP packed inside a node leaves the expert-DP replicas across nodes: 32 GPUs, ep 8 in
    each node, dp 32 over 4 nodes. The experts' gradient reduce-scatter runs over 4 ranks on
    the network, the dense one over 32; the bytes split as the parameters do."""
    cluster = ClusterSpec(gpu=h100, num_gpus=32)
    est = estimate(MOE, cluster, Plan(dp=32, ep=8, zero_stage=1),
                   training_for(seq_len=1024, global_batch=64))
    by = {c.name: c for c in est.collectives}
    assert by["ep_token_all_to_all"].tier == "nvlink"
    assert by["edp_grad_reduce"].group_size == 4 and by["edp_grad_reduce"].tier == "network"
    assert by["dp_grad_reduce"].group_size == 32
    from costmodel.params import expert_params

    assert by["edp_grad_reduce"].bytes == pytest.approx(
        4 * MOE.layers * MOE.moe_experts / 8 * expert_params(MOE), rel=1e-9)


def test_dense_model_has_no_expert_collective(h100) -> None:
    dense = replace(MOE, moe_experts=0, moe_topk=0, moe_ffn_hidden=0)
    est = estimate(dense, ClusterSpec(gpu=h100, num_gpus=16), Plan(dp=16, zero_stage=1),
                   training_for(seq_len=1024, global_batch=64))
    assert not [c for c in est.collectives if c.group == "edp"]


def test_folding_changes_expert_sharding_and_traffic(h100) -> None:
    """TP 2 for attention, experts without TP (Megatron-Core's README, "MoE Parallel Folding":
    TP for attention and TP 1 for the MoE part): the expert-TP token gather is gone and each
    rank holds whole experts, twice as many expert-DP replicas as with expert TP = tp."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=1024, global_batch=64)
    base = Plan(tp=2, dp=8, ep=4, zero_stage=1, sequence_parallel=True)
    folded = replace(base, expert_tp=1)
    p = arrays(base, folded)
    assert expert_tp(p).tolist() == [2, 1] and expert_dp(p).tolist() == [2, 4]
    a, b = estimate(MOE, cluster, base, tr), estimate(MOE, cluster, folded, tr)
    assert {c.name: c.group_size for c in b.collectives}["edp_grad_reduce"] == 4
    a2a = [next(c.time_s for c in e.collectives if c.name == "ep_token_all_to_all")
           for e in (a, b)]
    assert a2a[1] < a2a[0]  # the same dispatch, without the expert-TP gather
    # whole experts: twice the expert weights a rank holds, its bf16 copy unsharded at ZeRO-1
    from costmodel.params import expert_params

    extra = MOE.layers * MOE.moe_experts / 4 * expert_params(MOE) / 2 * 2
    assert b.memory.stages[0].weights_bytes - a.memory.stages[0].weights_bytes == (
        pytest.approx(extra, rel=1e-9))


def test_space_holds_megatron_folding() -> None:
    """Mixtral 8x7B on 64 H100 with attention TP 2 and experts EP 8 without TP (Megatron-Core's
    MoE parallel folding) is in the space; the same plan with expert_tp written as its derived
    value is one the space leaves to its 0."""
    study = load_study("studies/mixtral-8x7b-h100x64.yaml")
    specs = build_specs(study)
    space = build_space(study, specs)
    plan = Plan(tp=2, pp=4, dp=8, ep=8, expert_tp=1, zero_stage=1, sequence_parallel=True)
    assert violations(space, plan) == []
    assert [v.split(":")[0] for v in violations(space, replace(plan, ep=4, expert_tp=2))] == [
        "expert_tp"]


def test_zero_shards_experts_over_folded_replicas(h100) -> None:
    """TP 8 with EP 2 folded over the TP ranks and no data parallelism: the experts still have
    4 expert-DP replicas, so ZeRO-1 shards their optimizer states 4 ways (Megatron's
    distributed optimizer keeps the expert parameters in their own buffer over the
    expert-DP group), and the search keeps that plan (it is not ZeRO-0 in disguise)."""
    model = replace(MOE, moe_experts=8)
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=1024, global_batch=64)
    plan = Plan(tp=8, dp=1, ep=2, sequence_parallel=True)
    z0, z1 = (estimate(model, cluster, replace(plan, zero_stage=z), tr) for z in (0, 1))
    from costmodel.params import expert_params

    local = model.layers * 8 / 2 * expert_params(model)  # whole experts, expert TP 1
    assert z0.memory.stages[0].optimizer_bytes - z1.memory.stages[0].optimizer_bytes == (
        pytest.approx(12 * local * (1 - 1 / 4), rel=1e-9))
    assert {c.name: c.group_size for c in z1.collectives}["edp_grad_reduce"] == 4
    parts = (z1.compute.time_s + z1.comm_exposed_s + z1.bubble_time_s
             + z1.compute.optimizer_time_s)
    assert z1.step_time_s == pytest.approx(parts, rel=1e-9)
    from costmodel import rules

    f = rules.Facts(layers=8, heads=16, kv_heads=8, experts=8, seq_len=1024, global_batch=64,
                    num_gpus=8, nvlink_domain=8, switches=rules.Switches(canonical=True))
    assert rules.broken(replace(plan, zero_stage=1), f) == []
    assert [r.name for r in rules.broken(replace(plan, ep=1, zero_stage=1), f)] == [
        "zero_sharding"]


def test_a_measured_row_gives_expert_tp() -> None:
    """The CSV's optional expert_tp column (empty: derived)."""
    from search.inputs.measured import case_from_row

    row = {"model_name": "m", "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8,
           "vocab": 32000, "seq_len": 2048, "gpu": "h100-sxm-80gb", "num_gpus": 16,
           "global_batch": 64, "tp": 2, "dp": 8, "ep": 8, "moe_experts": 8, "moe_topk": 2,
           "moe_ffn_hidden": 4096, "framework": "megatron", "precision": "bf16"}
    assert case_from_row(row).plan.expert_tp == 0
    assert case_from_row({**row, "expert_tp": "1"}).plan.expert_tp == 1
