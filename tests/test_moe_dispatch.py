"""The MoE dispatch as a plan's own choice (plan fields ``moe_dispatcher``, ``moe_a2a_overlap``;
``costmodel.dispatch``): the rules Megatron-Core's TransformerConfig states, the study's switches
and searched axes, the search judging every option a layout allows and keeping the fastest, one
figure for the same plan in the search and in explain, and the exports writing what was priced."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from export_helpers import launcher_flags, megatron_kwargs, nemo_overrides
from export_plans import plan_file
from megatron_lm import megatron_lm_reads

from costmodel import (
    Plan,
    SpecError,
    check_plan,
    dispatch,
    estimate,
    estimate_batch,
    plans_to_arrays,
)
from costmodel.parallel.expert import paired_exposed, sm_share
from costmodel.rules import Switches
from search.inputs.specs import StudyError, build_specs
from search.inputs.study import parse_study
from search.pipeline import RunOptions, run_study
from search.space import build_space
from tcf_search.explain.analysis import moe_dispatch
from tcf_search.export import render

# Qwen3-30B-A3B (128 experts, top-8) on 4 nodes of 8 H100: EP 32 crosses the network
STUDY = """
model: {preset: qwen3-30b-a3b}
training: {seq_len: 4096, global_batch: 256, framework: megatron%s}
cluster: {gpu: h100-sxm-80gb, nodes: 4}
search_space: {tp: [1], pp: [1, 2], cp: [1], ep: [8, 32], vpp: [1, 2], micro_batch: [1],
               zero_stage: [1], recompute: [none, selective]%s}
search: {trials: 40, seed: 0}
"""
CROSS = Plan(tp=1, pp=1, dp=32, ep=32, zero_stage=1)


def specs_of(training: str = "", space: str = ""):  # noqa: ANN201
    study = parse_study(STUDY % (training, space), name="dispatch")
    return study, build_specs(study)


def tps(specs, plan: Plan) -> float:  # noqa: ANN001
    return estimate(specs.model, specs.cluster, plan, specs.training).tokens_per_s_per_gpu


def test_the_training_s_dispatch_named_is_the_same_plan() -> None:
    """A plan naming the training's own dispatcher and overlap prices as one naming neither
    (outside a canonical space, where the rule moe_dispatch would refuse the duplicate)."""
    _, specs = specs_of()
    loose = Switches()
    same = dataclasses.replace(CROSS, moe_dispatcher="alltoall", moe_a2a_overlap="off")
    check_plan(specs.model, specs.cluster, same, specs.training, loose)
    assert tps(specs, same) == pytest.approx(tps(specs, CROSS), rel=1e-12)
    with pytest.raises(SpecError, match="moe_dispatch"):
        check_plan(specs.model, specs.cluster, same, specs.training, specs.switches)


def test_flex_sends_a_token_once_per_node_and_the_overlap_hides_the_exchange() -> None:
    _, specs = specs_of()
    base = estimate(specs.model, specs.cluster, CROSS, specs.training)
    flex = estimate(specs.model, specs.cluster,
                    dataclasses.replace(CROSS, moe_dispatcher="flex"), specs.training)
    both = estimate(specs.model, specs.cluster,
                    dataclasses.replace(CROSS, moe_dispatcher="flex", moe_a2a_overlap="on"),
                    specs.training)

    def a2a(e) -> tuple[float, float]:  # noqa: ANN001
        c = next(c for c in e.collectives if c.group == "ep")
        return c.time_s, c.exposed_s

    # top-8 of 128 experts over 4 nodes: a token's copies reach fewer than 8 ranks' worth of
    # nodes, so the fused dispatch moves less over the network than NCCL's per-copy exchange
    assert a2a(flex)[0] < a2a(base)[0]
    # the overlap hides part of the exchange and never shows more than it has
    assert a2a(both)[1] < a2a(flex)[1] <= a2a(flex)[0]
    assert both.tokens_per_s_per_gpu > flex.tokens_per_s_per_gpu


def test_each_dispatcher_counts_the_bytes_it_moves() -> None:
    """explain's bytes for the EP exchange are the dispatcher's own: alltoall every routed copy
    (top-8 of a token), flex a token once per destination rank, allgather the hidden states
    of the group's other members (one copy each, whatever top-k is)."""
    _, specs = specs_of()
    plan = Plan(tp=1, pp=1, dp=32, ep=8, zero_stage=1)  # EP 8 in one node
    moved = {d: next(c.bytes for c in estimate(
        specs.model, specs.cluster, dataclasses.replace(plan, moe_dispatcher=d),
        specs.training).collectives if c.group == "ep") for d in ("alltoall", "flex", "allgather")}
    top_k = specs.model.moe_topk
    assert moved["allgather"] == pytest.approx(moved["alltoall"] / top_k * (8 - 1), rel=1e-9)
    # 8 distinct experts of 128 over 8 ranks of 16: fewer ranks than copies, more than one
    assert moved["alltoall"] / top_k < moved["flex"] < moved["alltoall"]


def test_the_overlap_hides_each_exchange_only_behind_its_own_window() -> None:
    """Megatron-Core's combined 1F1B (models/common/model_chunk_schedule_plan.py): the combine
    backward behind the attention forward, both dispatches behind the experts' backward and
    forward, the combine forward behind the attention backward. An exchange the layer's compute
    could hide in all still shows where its own window is short."""
    # attention forward 1 and backward 2, experts forward 2 and backward 4: 9 of compute
    lt = SimpleNamespace(fwd_moe_s=np.array([3.0]), bwd_moe_s=np.array([6.0]),
                         experts_fwd_s=np.array([2.0]))
    free = np.zeros(1)  # the exchange holds no SMs
    # four exchanges of 2 (8, under the 9): the attention forward hides 1 of its 2
    assert paired_exposed(np.array([2.0]), lt, free)[0] == pytest.approx(1.0)
    assert paired_exposed(np.array([1.0]), lt, free)[0] == 0.0
    # past every window: what the layer's compute cannot hide, 4 x 4 - 9
    assert paired_exposed(np.array([4.0]), lt, free)[0] == pytest.approx(7.0)


def test_an_overlapped_exchange_costs_the_compute_the_sms_it_holds() -> None:
    """Compute beside an exchange runs on the SMs its kernels leave: a window whose compute
    outlasts the exchange ends share x exchange later, one shorter than it ends with it."""
    lt = SimpleNamespace(fwd_moe_s=np.array([3.0]), bwd_moe_s=np.array([6.0]),
                         experts_fwd_s=np.array([2.0]))
    quarter = np.array([0.25])
    # exchanges of 1: windows of 1 | 2 x 1 beside 6 | 1 beside 4 all longer: 1/4 of each
    assert paired_exposed(np.array([1.0]), lt, quarter)[0] == pytest.approx(0.25 * 4.0)
    # exchanges of 2: the attention forward's window (1) shows the exchange's excess, 1, as
    # without the share; the other two are longer than theirs, 1/4 of 4 and of 2
    assert paired_exposed(np.array([2.0]), lt, quarter)[0] == pytest.approx(1.0 + 1.0 + 0.5)
    # an exchange that holds every SM hides nothing
    assert paired_exposed(np.array([1.0]), lt, np.ones(1))[0] == pytest.approx(4.0)


def test_explain_says_what_share_of_the_sms_an_overlapped_exchange_holds() -> None:
    _, specs = specs_of()
    placed: dict = {"groups": []}
    plan = Plan(tp=1, pp=2, vpp=2, dp=16, ep=8, zero_stage=1, moe_dispatcher="flex",
                moe_a2a_overlap="on")
    d = moe_dispatch(specs.model, specs.cluster, specs.training, plan, placed)
    assert d["sm_share"] == pytest.approx(20 / 132)
    plain = dataclasses.replace(plan, moe_a2a_overlap="off")
    assert "sm_share" not in moe_dispatch(specs.model, specs.cluster, specs.training, plain,
                                          placed)


def test_the_sms_an_exchange_holds_are_its_kernels() -> None:
    """DeepEP's budget (Megatron-Core's moe_deepep_num_sms, 20) over the GPU's SMs for flex;
    NCCL's share of every hidden collective for the alltoall dispatcher; flex's not priced
    where the catalog gives no SM count."""
    _, specs = specs_of()
    d = np.array([dispatch.FLEX, dispatch.ALLTOALL])
    nccl = specs.cluster.gpu.efficiency.comm_sm_share
    assert specs.cluster.gpu.sm_count == 132
    assert sm_share(specs.cluster, specs.training, d) == pytest.approx([20 / 132, nccl])
    bare = dataclasses.replace(specs.cluster,
                               gpu=dataclasses.replace(specs.cluster.gpu, sm_count=0))
    assert sm_share(bare, specs.training, d) == pytest.approx([0.0, nccl])


@pytest.mark.parametrize(("plan", "rule"), [
    # --overlap-moe-expert-parallel-comm: vpp under pp, no full recompute, EP (transformer_config)
    (Plan(tp=1, pp=2, dp=16, ep=8, zero_stage=1, moe_a2a_overlap="on"), "moe_a2a_overlap"),
    (Plan(tp=1, pp=1, dp=32, ep=8, zero_stage=1, recompute="full", moe_a2a_overlap="on"),
     "moe_a2a_overlap"),
    (Plan(tp=1, pp=1, dp=32, ep=1, zero_stage=1, moe_a2a_overlap="on"), "moe_a2a_overlap"),
    # the overlap runs with the alltoall or flex dispatcher only
    (Plan(tp=1, pp=1, dp=32, ep=8, zero_stage=1, moe_dispatcher="allgather",
          moe_a2a_overlap="on"), "moe_a2a_overlap"),
    # MoEFlexTokenDispatcher: "DeepEP dispatcher requires TPxEP > 1"
    (Plan(tp=1, pp=1, dp=32, ep=1, zero_stage=1, moe_dispatcher="flex"), "moe_flex"),
])
def test_what_megatron_core_refuses_the_table_refuses(plan: Plan, rule: str) -> None:
    _, specs = specs_of()
    with pytest.raises(SpecError, match=rf"^{rule}: "):
        check_plan(specs.model, specs.cluster, plan, specs.training, specs.switches)


def test_flex_beside_padding_to_capacity_is_refused() -> None:
    """The deepep backend refuses moe_pad_expert_input_to_capacity (transformer_config.py)."""
    _, specs = specs_of(", moe_pad_to_capacity: true")
    with pytest.raises(SpecError, match="^moe_flex: "):
        check_plan(specs.model, specs.cluster, dataclasses.replace(CROSS, moe_dispatcher="flex"),
                   specs.training, specs.switches)


def test_the_space_judges_what_the_launcher_offers_unless_the_study_fixes_it() -> None:
    study, specs = specs_of()
    # the training's own (0, 0), each other dispatcher and the overlap on: 3 x 2
    assert len(build_space(study, specs).dispatch) == 6
    study, specs = specs_of(", moe_dispatcher: flex")
    assert specs.training.framework.moe.moe_dispatcher == "flex"
    assert build_space(study, specs).dispatch == ((0, 0), (0, 2))
    study, specs = specs_of("", ", moe_dispatcher: [alltoall], moe_a2a_overlap: [false]")
    assert build_space(study, specs).dispatch == ((0, 0),)
    dense = parse_study(STUDY.replace("qwen3-30b-a3b", "llama3-8b") % ("", ""), name="dense")
    assert build_space(dense, build_specs(dense)).dispatch == ((0, 0),)


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_a_stack_without_the_switch_refuses_it_by_name(framework: str) -> None:
    study = parse_study(STUDY.replace("framework: megatron", f"framework: {framework}")
                        % (", moe_a2a_overlap: true", ""), name="dispatch")
    with pytest.raises(StudyError, match=r"^training\.moe_a2a_overlap: .*"
                                         r"--overlap-moe-expert-parallel-comm"):
        build_specs(study)
    # and its search judges no dispatch of a plan's own
    plain = parse_study(STUDY.replace("framework: megatron", f"framework: {framework}")
                        % ("", ""), name="dispatch")
    assert build_space(plain, build_specs(plain)).dispatch == ((0, 0),)


def test_the_search_keeps_the_fastest_dispatch_and_explain_gives_its_figure(tmp_path) -> None:  # noqa: ANN001
    study, specs = specs_of()
    result = run_study(study, RunOptions(out_dir=tmp_path / "out", trials=40, workers=1))
    assert result.best is not None
    best = result.best.plan
    # EP 32 across the nodes is priced cheapest with the fused dispatch, overlapped
    assert (best.moe_dispatcher, best.moe_a2a_overlap) == ("flex", "on")
    # every option of the best layout the rules allow, judged alone, is no faster
    for d in ("", "allgather", "flex"):
        for o in ("", "on"):
            other = dataclasses.replace(best, moe_dispatcher=d, moe_a2a_overlap=o)
            try:
                check_plan(specs.model, specs.cluster, other, specs.training, Switches())
            except SpecError:
                continue
            assert tps(specs, other) <= tps(specs, best) * (1 + 1e-9)
    got = estimate_batch(specs.model, specs.cluster, specs.training, plans_to_arrays([best]))
    assert result.best.predicted["tokens_per_s_per_gpu"] == pytest.approx(
        float(got["tokens_per_s_per_gpu"][0]), rel=1e-9)


# --- exports ---------------------------------------------------------------------------------


def dispatch_plan(framework: str = "megatron"):  # noqa: ANN201
    plan = Plan(tp=1, pp=2, vpp=2, dp=16, ep=16, zero_stage=1, moe_dispatcher="flex",
                moe_a2a_overlap="on")
    return plan_file("qwen3-30b-a3b", plan, 32, 256, framework=framework)


def test_the_megatron_export_writes_the_dispatch_priced() -> None:
    files = render("megatron", dispatch_plan())
    flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
    assert flags["--moe-token-dispatcher-type"] == "flex"
    assert flags["--moe-flex-dispatcher-backend"] == "deepep"
    assert flags["--overlap-moe-expert-parallel-comm"] is True
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in files["megatron.sh"]
    # the training's (the megatron profile's alltoall, no overlap) where the plan names none
    plain = dataclasses.replace(dispatch_plan(), plan=dataclasses.replace(
        dispatch_plan().plan, moe_dispatcher="", moe_a2a_overlap=""))
    flags = launcher_flags(render("megatron", plain)["megatron.sh"], "pretrain_gpt.py")
    assert flags["--moe-token-dispatcher-type"] == "alltoall"
    assert "--overlap-moe-expert-parallel-comm" not in flags


def test_megatron_core_builds_the_exported_dispatch() -> None:
    tc, flags, kw = megatron_kwargs(render("megatron", dispatch_plan()))
    cfg = tc.TransformerConfig(
        **kw, moe_token_dispatcher_type=flags["--moe-token-dispatcher-type"],
        moe_flex_dispatcher_backend=flags["--moe-flex-dispatcher-backend"],
        overlap_moe_expert_parallel_comm=bool(flags["--overlap-moe-expert-parallel-comm"]))
    assert cfg.moe_token_dispatcher_type == "flex"
    assert cfg.overlap_moe_expert_parallel_comm is True


def test_megatron_lm_parses_and_validates_the_dispatch_flags() -> None:
    pf = dispatch_plan()
    got = megatron_lm_reads(render("megatron", pf)["megatron.sh"], pf.num_gpus,
                            ["moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                             "overlap_moe_expert_parallel_comm"])
    assert got["moe_token_dispatcher_type"] == "flex"
    assert got["moe_flex_dispatcher_backend"] == "deepep"
    assert got["overlap_moe_expert_parallel_comm"] is True


def test_the_nemo_export_writes_the_dispatch_priced() -> None:
    o = nemo_overrides(render("nemo", dispatch_plan("nemo")))
    assert o["model.moe_token_dispatcher_type"] == "flex"
    assert o["model.moe_flex_dispatcher_backend"] == "deepep"
    # the Qwen3 recipe has no comm_overlap section: the model config's own field
    assert o["model.overlap_moe_expert_parallel_comm"] == "true"


def test_a_launcher_without_the_switch_refuses_a_plan_naming_it() -> None:
    from tcf_search.export import ExportRefused
    with pytest.raises(ExportRefused, match="moe_dispatch"):
        render("torchtitan", dispatch_plan("torchtitan"))


# --- Adam's moments in bf16 (Megatron-Core's precision-aware optimizer) ----------------------


def test_bf16_moments_halve_the_optimizer_states_and_need_the_distributed_optimizer() -> None:
    _, fp32 = specs_of()
    _, bf16 = specs_of(", adam_moments_in_bf16: true")
    plan = dataclasses.replace(CROSS, zero_stage=1)
    a = estimate(fp32.model, fp32.cluster, plan, fp32.training).memory.stages[0]
    b = estimate(bf16.model, bf16.cluster, plan, bf16.training).memory.stages[0]
    # fp32 master (4 bytes) and two moments (8 bytes, then 4) per sharded parameter
    assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes * 8 / 12, rel=1e-9)
    # optimizer_config.py: "--use-precision-aware-optimizer only supported with distributed
    # optimizer"
    with pytest.raises(SpecError, match="^precision_aware_optimizer: "):
        check_plan(bf16.model, bf16.cluster, dataclasses.replace(plan, zero_stage=0),
                   bf16.training, bf16.switches)
    pf = dataclasses.replace(dispatch_plan(), training=bf16.training)
    flags = launcher_flags(render("megatron", pf)["megatron.sh"], "pretrain_gpt.py")
    assert flags["--use-precision-aware-optimizer"] is True
    assert (flags["--exp-avg-dtype"], flags["--exp-avg-sq-dtype"]) == ("bf16", "bf16")
    study = parse_study(STUDY.replace("framework: megatron", "framework: torchtitan")
                        % (", adam_moments_in_bf16: true", ""), name="dispatch")
    with pytest.raises(StudyError, match=r"^training\.adam_moments_in_bf16: "):
        build_specs(study)


def test_the_overlaps_combined_schedule_holds_one_chunk_micro_batch_more() -> None:
    """Megatron-Core's combined 1F1B forwards one chunk-micro-batch more in the interleaved
    warm-up (schedules.py get_pp_rank_microbatches): the first stage's activations grow by one
    model chunk's share of a micro-batch; without a pipeline the forward of one micro-batch
    takes what the mirrored backward of the other frees, so nothing grows."""
    _, specs = specs_of()
    piped = Plan(tp=1, pp=2, vpp=2, dp=16, ep=8, zero_stage=1, pp_schedule="interleaved")
    for plan, grows in ((piped, True), (CROSS, False)):
        off, on = (estimate(specs.model, specs.cluster,
                            dataclasses.replace(plan, moe_a2a_overlap=o), specs.training)
                   for o in ("off", "on"))
        act_off, act_on = (e.memory.stages[0].activations_bytes for e in (off, on))
        if grows:
            # warm-up 2(pp-1) + (v-1)pp + 1 = 5 chunk-micro-batches, then 6: activations scale
            # by 6/5 but for one layer's working set, held once
            assert act_on > act_off * 1.1
        else:
            assert act_on == pytest.approx(act_off, rel=1e-12)
