"""The validity table (costmodel/rules.py) is the only place a rule is written: check_plan, the
search space, explain and the exporters' common rules give one verdict on every plan, valid or
not, and name the same first rule."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import replace

import numpy as np
import pytest

from costmodel import Plan, SpecError, check_plan, rules
from costmodel.mapping import rank_split, stage_counts, stage_layers
from costmodel.plans import as_plan_arrays
from search.inputs import own_dispatch_unsaid
from search.inputs.planfile import PlanFile
from search.inputs.specs import Specs, build_specs
from search.inputs.study import load_study, parse_study
from search.space import (
    SearchSpace,
    build_space,
    enumerate_layouts,
    plan_from_row,
    space_facts,
    violations,
)
from tcf_search.explain.planspec import PlanSpecError, apply_change, format_plan, parse_plan
from tcf_search.export import ExportOptions
from tcf_search.export.rules import COMMON, Shared
from tcf_search.export.view import facts_of, format_switches

STUDY = """
model:
  architecture: {layers: 12, hidden: 256, ffn_hidden: 512, heads: 16, kv_heads: 4,
                 vocab: 1000, moe: {experts: 4, topk: 2}}
training: {seq_len: 100, global_batch: 48}
cluster: {gpu: h100-sxm-80gb, gpus: 48, gpus_per_node: 4}
search_space:
  tp: [1, 2, 3, 4, 8, 16]
  pp: [1, 2, 3, 4, 8, 12]
  cp: [1, 2, 4]
  ep: [1, 2, 3, 4]
  vpp: [1, 2, 3]
  micro_batch: [1, 2, 3]
  zero_stage: [0, 1]
  sequence_parallel: [false, true]
  pp_schedule: [1f1b, gpipe]
"""
PLACEMENTS = ((0, 0), (2, 2), (3, 0), (5, 5))


@pytest.fixture(scope="module")
def specs() -> Specs:
    return build_specs(parse_study(STUDY, name="rules-table"))


def grid() -> list[Plan]:
    plans = []
    for tp, pp, cp, ep, vpp, mb, zero, sp, sched, (first, last) in itertools.product(
            (1, 2, 3, 4, 16), (1, 2, 4, 12), (1, 2, 4), (1, 3, 4), (1, 2, 3), (1, 2), (0, 1),
            (False, True), ("1f1b", "gpipe"), PLACEMENTS):
        if sp and tp == 1:
            continue  # Plan itself refuses it (the table's sp_tp, read by Plan.__post_init__)
        dp = max(1, 48 // (tp * pp * cp))  # fills the 48 GPUs unless tp * pp * cp > 48
        # ZeRO-1 plans also recompute 3 layers a stage in full (recompute_chunks at vpp 2)
        full = {"recompute": "full", "recompute_layers": 3} if zero == 1 else {}
        plans.append(Plan(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, vpp=vpp, micro_batch=mb,
                          zero_stage=zero, sequence_parallel=sp, pp_schedule=sched,
                          first_stage_layers=first, last_stage_layers=last,
                          **full))  # type: ignore[arg-type]
    # the experts' own TP (Megatron-Core's folding) on a share of them, and a plan's own
    # selective modules (moe_act runs on this MoE model; mla_up_proj needs MLA, which it has not)
    return (plans + [replace(p, expert_tp=e) for p in plans[::11] for e in (1, 2, 8)]
            + [replace(p, recompute="selective", recompute_modules=m) for p in plans[::13]
               if p.recompute == "none" for m in (("moe_act",), ("mla_up_proj", "core_attn"))]
            # activation offloading: of some layers, or of all 12 (never: rule cpu_offload)
            + [replace(p, cpu_offload_layers=n) for p in plans[::17] for n in (3, 12)]
            # a plan's own MoE dispatch: the training's dispatcher named (not canonical), flex
            # (needs ep x expert TP > 1), the all-to-all overlap (needs ep > 1, no full
            # recompute, vpp > 1 under pp)
            + [replace(p, moe_dispatcher=d, moe_a2a_overlap=o) for p in plans[::19]
               for d, o in (("flex", ""), ("alltoall", ""), ("", "on"), ("flex", "on"),
                            ("allgather", "off"))])


def first_rule(message: str) -> str:
    return next(r.name for r in rules.RULES if re.search(rf"\b{r.name}: ", message))


def check_verdict(plan: Plan, specs: Specs, switches: rules.Switches) -> str:
    try:
        check_plan(specs.model, specs.cluster, plan, specs.training, switches)
    except SpecError as exc:
        return first_rule(str(exc))
    return "ok"


def test_the_grid_holds_valid_and_invalid_plans_of_every_rule(specs: Specs) -> None:
    verdicts = {check_verdict(p, specs, specs.switches) for p in grid()}
    # the generic profile allows every combination a framework refuses (test_framework_rules);
    # it runs no CUDA graphs: test_cuda_graph_rule_one_verdict holds those
    framework_only = {"sp_tp", "moe_tp", "moe_zero", "cuda_graphs", "mtp", "framework_zero",
                      "framework_recompute", "precision_aware_optimizer", "moe_bias"}
    assert verdicts == {"ok", *(r.name for r in rules.RULES if r.name not in framework_only)}


@pytest.mark.parametrize("framework,plan,rule", [
    # DeepSpeed's engine refuses ZeRO-3 on a model with MoE layers
    ("deepspeed", Plan(tp=1, pp=1, dp=48, ep=4, zero_stage=3), "moe_zero"),
    ("deepspeed", Plan(tp=1, pp=1, dp=48, ep=1, zero_stage=3), "moe_zero"),
    # NeMo AutoModel's MoE parallelizer asserts tp == 1
    ("nemo-automodel", Plan(tp=2, pp=1, dp=24, ep=4, zero_stage=3, sequence_parallel=True),
     "moe_tp"),
    # the ZeRO stages a framework implements: nanotron's ZeRO-1 optimizer at most; FSDP stacks
    # shard no optimizer states alone without a pipeline; DeepSpeed's pipeline engine < 2
    ("nanotron", Plan(tp=1, pp=1, dp=48, zero_stage=2), "framework_zero"),
    ("torchtitan", Plan(tp=1, pp=1, dp=48, zero_stage=1), "framework_zero"),
    ("deepspeed", Plan(tp=1, pp=2, dp=24, zero_stage=2), "framework_zero"),
    # the recompute modes it implements: whole layers only, or no per-stage count
    ("deepspeed", Plan(tp=1, pp=1, dp=48, recompute="selective"), "framework_recompute"),
    ("nemo-automodel", Plan(tp=1, pp=1, dp=48, ep=4, zero_stage=3, recompute="selective"),
     "framework_recompute"),
    ("torchtitan", Plan(tp=1, pp=2, dp=24, zero_stage=2, recompute="full", recompute_layers=2),
     "framework_recompute"),
    # NeMo AutoModel's DDP builds no expert parallelism, under PP or not
    ("nemo-automodel", Plan(tp=1, pp=2, dp=24, ep=4, zero_stage=0), "framework_zero"),
    # the pipeline schedules it implements: nanotron's engines hold one model chunk a rank
    ("nanotron", Plan(tp=1, pp=2, vpp=2, dp=24, zero_stage=1), "framework_schedule"),
])
def test_framework_rules(framework: str, plan: Plan, rule: str) -> None:
    """A combination a framework refuses is refused by check_plan, the search space and that
    framework's exporter alike, read from its profile's switch; another profile allows it."""
    text = STUDY.replace("training: {", f"training: {{framework: {framework}, ").replace(
        "zero_stage: [0, 1]", "zero_stage: [0, 1, 2, 3]")
    study = parse_study(text, name="rules-table")
    specs = build_specs(study)
    assert check_verdict(plan, specs, specs.switches) == rule
    assert [v.split(":")[0] for v in violations(build_space(study, specs), plan)] == [rule]
    generic = build_specs(parse_study(STUDY, name="rules-table"))
    # Megatron-Core (the generic profile) runs no ZeRO-2/3 beside a pipeline
    # (test_launcher_support); here the generic profile stands for one that runs them all
    generic = replace(generic, training=generic.training.with_switches(zero_stages_pp=(0, 1, 2, 3)))
    assert check_verdict(plan, generic, generic.switches) == "ok"
    if framework == "deepspeed":
        pf = PlanFile(study="rules-table", model=specs.model, gpu=specs.cluster.gpu.id,
                      num_gpus=specs.cluster.num_gpus, gpus_per_node=specs.cluster.gpus_per_node,
                      training=specs.training, plan=plan)
        f = facts_of(pf, ExportOptions(), "deepspeed")
        assert [r.rule.name for r in COMMON if isinstance(r, Shared) and not r.holds(f)] == [rule]


@pytest.mark.parametrize("graphs,plan,refused", [
    # Megatron-Core: full recompute only under a full-iteration graph
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",)},
     Plan(tp=1, pp=1, dp=48, ep=4, recompute="full"), True),
    # dropless MoE: no static-shape capture of the layer; the router's graphs run
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe",)},
     Plan(tp=1, pp=1, dp=48, ep=4), True),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe",),
      "moe_pad_to_capacity": True}, Plan(tp=1, pp=1, dp=48, ep=4), False),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe_router",
                                                                     "moe_preprocess")},
     Plan(tp=1, pp=1, dp=48, ep=4, recompute="selective"), False),
])
def test_cuda_graph_rule_one_verdict(specs: Specs, graphs: dict[str, object], plan: Plan,
                                     refused: bool) -> None:
    """check_plan, the search space and the exporters' common rules read the training's graphs
    alike."""
    graphed = replace(specs, training=specs.training.with_switches(**graphs))
    expected = "cuda_graphs" if refused else "ok"
    assert check_verdict(plan, graphed, graphed.switches) == expected
    study = parse_study(STUDY, name="rules-table")
    assert [v.split(":")[0] for v in violations(build_space(study, graphed), plan)] == (
        ["cuda_graphs"] if refused else [])
    pf = PlanFile(study="rules-table", model=graphed.model, gpu=graphed.cluster.gpu.id,
                  num_gpus=graphed.cluster.num_gpus, gpus_per_node=graphed.cluster.gpus_per_node,
                  training=graphed.training, plan=plan)
    f = facts_of(pf, ExportOptions(), "megatron")
    assert [r.rule.name for r in COMMON if isinstance(r, Shared) and not r.holds(f)] == (
        ["cuda_graphs"] if refused else [])


def test_explain_repairs_full_recompute_under_graphs(specs: Specs) -> None:
    graphed = replace(specs, training=specs.training.with_switches(
        cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",)))
    base = Plan(tp=1, pp=1, dp=48, ep=4, zero_stage=0, recompute="full")
    plan, notes = apply_change(base, {"zero_stage": 1}, graphed)
    assert (plan.zero_stage, plan.recompute) == (1, "selective")
    assert "recompute" in {n.split()[0] for n in notes}
    assert check_verdict(plan, graphed, graphed.switches) == "ok"


@pytest.mark.parametrize("framework,refused", [
    # Megatron-Core builds MTP modules (multi_token_prediction.py); nanotron's models,
    # torchtitan's exported job configs and DeepSpeed's Hugging Face models do not
    ("", False), ("megatron", False), ("nemo", False),
    ("torchtitan", True), ("deepspeed", True), ("nanotron", True),
])
def test_mtp_needs_a_framework_that_builds_it(framework: str, refused: bool) -> None:
    """A model with multi-token prediction: check_plan, the search space and the framework's
    exporter give one verdict from its profile's switch; without MTP every framework runs it."""
    text = STUDY.replace("training: {", f"training: {{framework: {framework}, ") if framework \
        else STUDY
    text = text.replace("moe: {experts: 4, topk: 2}", "moe: {experts: 4, topk: 2}, mtp_layers: 1")
    study = parse_study(text, name="rules-table")
    specs = build_specs(study)
    assert specs.model.mtp_layers == 1
    plan = Plan(tp=1, pp=2, dp=24, ep=4, zero_stage=1)
    want = "mtp" if refused else "ok"
    assert check_verdict(plan, specs, specs.switches) == want
    assert [v.split(":")[0] for v in violations(build_space(study, specs), plan)] == (
        [want] if refused else [])
    without = replace(specs, model=replace(specs.model, mtp_layers=0))
    assert check_verdict(plan, without, without.switches) == "ok"
    pf = PlanFile(study="rules-table", model=specs.model, gpu=specs.cluster.gpu.id,
                  num_gpus=specs.cluster.num_gpus, gpus_per_node=specs.cluster.gpus_per_node,
                  training=specs.training, plan=plan)
    f = facts_of(pf, ExportOptions(), framework or "megatron")
    assert [r.rule.name for r in COMMON if isinstance(r, Shared) and not r.holds(f)] == (
        [want] if refused else [])


MOE_TP = Plan(tp=2, pp=1, dp=24, ep=4)


@pytest.mark.parametrize("framework,refused", [
    # Megatron-Core's MoELayer.forward: tp > 1 without sequence parallelism is a ValueError
    ("", True), ("megatron", True), ("nemo", True),
    # torchtitan's router reshards a replicated input; DeepSpeed drops duplicate tokens;
    # nanotron's MoE takes either tp_mode
    ("torchtitan", False), ("deepspeed", False), ("nanotron", False),
])
def test_moe_tp_needs_sequence_parallel_where_the_framework_does(framework: str,
                                                                 refused: bool) -> None:
    """MoE under TP without sequence parallelism: check_plan, the search space and the export
    of the framework's format give one verdict from its profile's switch; with sp it runs."""
    text = STUDY.replace("training: {", f"training: {{framework: {framework}, ") if framework \
        else STUDY
    study = parse_study(text, name="rules-table")
    specs = build_specs(study)
    want = "moe_tp_sp" if refused else "ok"
    assert check_verdict(MOE_TP, specs, specs.switches) == want
    assert [v.split(":")[0] for v in violations(build_space(study, specs), MOE_TP)] == (
        [want] if refused else [])
    with_sp = replace(MOE_TP, sequence_parallel=True)
    assert check_verdict(with_sp, specs, specs.switches) == "ok"
    fmt = framework or "megatron"
    pf = PlanFile(study="rules-table", model=specs.model, gpu=specs.cluster.gpu.id,
                  num_gpus=specs.cluster.num_gpus, gpus_per_node=specs.cluster.gpus_per_node,
                  training=specs.training, plan=MOE_TP)
    f = facts_of(pf, ExportOptions(), fmt)
    assert [r.rule.name for r in COMMON if isinstance(r, Shared) and not r.holds(f)] == (
        [want] if refused else [])


def test_explain_repairs_moe_tp_with_sequence_parallel(specs: Specs) -> None:
    base = Plan(tp=1, pp=1, dp=48, ep=4, zero_stage=1)
    plan, notes = apply_change(base, {"tp": 2}, specs)  # generic profile: Megatron's rule
    assert (plan.tp, plan.dp, plan.sequence_parallel) == (2, 24, True)
    assert "sequence_parallel" in {n.split()[0] for n in notes}


@pytest.fixture(scope="module")
def space(specs: Specs) -> SearchSpace:
    return build_space(parse_study(STUDY, name="rules-table"), specs)


@pytest.mark.parametrize("plan", grid()[::23], ids=format_plan)
def test_check_plan_space_explain_and_export_agree(plan: Plan, specs: Specs,
                                                   space: SearchSpace) -> None:
    verdict = check_verdict(plan, specs, specs.switches)
    # the rules broken, not the domains: dp is derived, this space searches no module sets,
    # and the training's own dispatch is no searched value (a plan runs it by naming none)
    broken = [v.split(":")[0] for v in violations(space, plan)
              if not v.startswith(("dp", "recompute_modules=", "moe_dispatcher=",
                                   "moe_a2a_overlap="))]
    assert (broken[0] if broken else "ok") == verdict
    try:
        parse_plan(format_plan(plan), specs)
        explained = "ok"
    except PlanSpecError as exc:
        explained = first_rule(str(exc))
    # a plan string naming the MoE dispatch the training runs anyway is that training's plan
    # (own_dispatch_unsaid), which the table judges as such
    unsaid = Plan(**own_dispatch_unsaid(dataclasses.asdict(plan), specs.training))
    assert explained == check_verdict(unsaid, specs, specs.switches)

    pf = PlanFile(study="rules-table", model=specs.model, gpu=specs.cluster.gpu.id,
                  num_gpus=specs.cluster.num_gpus, gpus_per_node=specs.cluster.gpus_per_node,
                  training=specs.training, plan=plan)
    f = facts_of(pf, ExportOptions(), "megatron")
    exported = [r.rule.name for r in COMMON if isinstance(r, Shared) and not r.holds(f)]
    # the exporters read the same table with their own switches (the launcher's chunks, any
    # plan)
    assert (exported[0] if exported else "ok") == check_verdict(plan, specs,
                                                                format_switches("megatron"))


def test_search_generates_only_plans_the_table_accepts(specs: Specs, space: SearchSpace) -> None:
    layouts = enumerate_layouts(space)
    assert 0 < len(layouts) < space.size
    cols = layouts.columns
    # before the CP-SAT stage pins the split: the space's switches (split_later)
    switches = space_facts(space).switches
    for i in range(0, len(layouts), max(1, len(layouts) // 200)):
        plan = plan_from_row({a: int(v[i]) for a, v in cols.items()})
        check_plan(specs.model, specs.cluster, plan, specs.training, switches)


def test_uneven_interleaved_405b_gets_one_verdict() -> None:
    """126 layers, pp=16, vpp=4 with 7 layers on the first and the last stage (Meta's layout):
    Megatron-LM's first/last stage flags need 7 % 4 == 0, but counting the embedding and the
    loss as layers builds it (transformer_config.py: (126 + 2) / 16 = 8 units a rank, 8 % 4 ==
    0; the first and last ranks hold 8 - 1 = 7 layers), so the search and explain accept it.
    6 + 14 * 8 + 8 is neither (6 % 4 != 0, and 6 is not 8 - 1): it needs an explicit layout
    (Megatron-Core's --pipeline-model-parallel-layout, the profile's ``uneven_chunks``), and a
    framework without one refuses it."""
    study = load_study("studies/llama3.1-405b-h100x16384.yaml")
    specs = build_specs(study)
    text = "tp=8,pp=16,vpp=4,dp=128,mbs=1,zero=1,sp=true,first_stage_layers=7,last_stage_layers=7"
    parse_plan(text, specs)
    plan = Plan(tp=8, pp=16, vpp=4, dp=128, zero_stage=1, sequence_parallel=True,
                first_stage_layers=7, last_stage_layers=7)
    assert not violations(build_space(study, specs), plan)
    check_plan(specs.model, specs.cluster, plan, specs.training, specs.switches)
    with pytest.raises(PlanSpecError, match="vpp_layers: "):  # no split given: 126 % 64 != 0
        parse_plan(text.replace(",first_stage_layers=7,last_stage_layers=7", ""), specs)
    odd = text.replace("first_stage_layers=7,last_stage_layers=7",
                       "first_stage_layers=6,last_stage_layers=8")
    parse_plan(odd, specs)  # the generic profile's explicit layout
    odd_plan = replace(plan, first_stage_layers=6, last_stage_layers=8)
    assert specs.switches.uneven_chunks
    with pytest.raises(SpecError, match="vpp_layers: .*first_stage_layers=6"):
        check_plan(specs.model, specs.cluster, odd_plan, specs.training,
                   replace(specs.switches, uneven_chunks=False))
    check_plan(specs.model, specs.cluster, odd_plan, specs.training)  # default: uneven chunks
    even = Plan(tp=8, pp=16, vpp=2, dp=128, zero_stage=1, sequence_parallel=True,
                first_stage_layers=8, last_stage_layers=6)
    check_plan(specs.model, specs.cluster, even, specs.training, specs.switches)


def test_explain_repairs_follow_the_broken_rules(specs: Specs) -> None:
    base = Plan(tp=2, pp=4, dp=6, vpp=3, zero_stage=1, sequence_parallel=True, micro_batch=8)
    plan, notes = apply_change(base, {"tp": 1}, specs)
    # world_size moves dp to 48 / 4 = 12, sp_tp drops sequence parallel, batch moves the
    # micro-batch to a divisor of 48 / 12 = 4 sequences per replica, and microbatch_groups to
    # one that leaves a multiple of pp = 4 micro-batches (interleaved)
    assert (plan.dp, plan.sequence_parallel, plan.micro_batch) == (12, False, 1)
    assert {n.split()[0] for n in notes} == {"dp", "sequence_parallel", "micro_batch"}
    plan, notes = apply_change(base, {"pp": 1}, specs)  # dp 24; vpp_layers: no pipeline
    assert (plan.dp, plan.vpp, plan.micro_batch) == (24, 1, 2)
    with pytest.raises(PlanSpecError, match="tp_heads: "):
        apply_change(base, {"tp": 3}, specs)  # 16 heads: nothing the change left may repair it


@pytest.mark.parametrize(("layers", "pp", "first", "last"), [
    (12, 4, 0, 0), (12, 4, 2, 4), (12, 3, 2, 0), (12, 3, 0, 2), (12, 2, 5, 7), (126, 16, 7, 7),
    (12, 1, 0, 0)])
def test_the_one_stage_split_is_the_cost_models(layers: int, pp: int, first: int,
                                                last: int) -> None:
    counts = stage_counts(layers, pp, first, last)
    assert sum(counts) == layers and len(counts) == pp
    p = as_plan_arrays({"tp": [1], "pp": [pp], "dp": [1], "micro_batch": [1],
                        "first_stage_layers": [first], "last_stage_layers": [last]})
    s = stage_layers(layers, p)
    assert (counts[0], counts[-1]) == (s.first[0], s.last[0])
    if pp > 2:
        assert counts[1] == s.middle[0]
    _, whole = rank_split(layers, np.asarray([pp]), np.asarray([first]), np.asarray([last]))
    assert whole[0]


def test_no_zero_stage_is_asked_for_where_there_is_nothing_to_shard() -> None:
    """ZeRO-0 with one data-parallel rank is every framework's (the canonical space's only
    choice there), even one whose profile lists no ZeRO-0 (NeMo AutoModel)."""
    study = parse_study(STUDY.replace("training: {", "training: {framework: nemo-automodel, "),
                        name="rules-table")
    specs = build_specs(study)
    lone = replace(specs, cluster=replace(specs.cluster, num_gpus=12))
    assert check_verdict(Plan(tp=1, pp=12, dp=1, ep=1), lone, lone.switches) == "ok"
    assert check_verdict(Plan(tp=1, pp=1, dp=12, ep=4), lone, lone.switches) == "framework_zero"



@pytest.mark.parametrize("framework,verdict", [
    ("generic", "framework_schedule"),  # Megatron-Core: 1F1B or interleaved 1F1B, no GPipe
    ("deepspeed", "framework_schedule"),  # TrainSchedule only
    ("nanotron", "ok"),  # AllForwardAllBackwardPipelineEngine
    ("torchtitan", "ok"),  # torch.distributed.pipelining's ScheduleGPipe
])
def test_gpipe_where_the_framework_runs_it(framework: str, verdict: str) -> None:
    text = STUDY.replace("training: {", f"training: {{framework: {framework}, ")
    specs = build_specs(parse_study(text, name="rules-table"))
    plan = Plan(tp=1, pp=2, dp=24, zero_stage=0, pp_schedule="gpipe")
    assert check_verdict(plan, specs, specs.switches) == verdict
