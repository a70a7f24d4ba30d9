"""The search space's recompute_modules axis (search_space.recompute_modules): absent, no axis
and the space of before; auto, every set of the modules that free memory on the model; a list,
those sets. The training's own set is written 0 and always searched (plans without selective
recompute carry it); a set is refused where Megatron-Core would refuse it."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from test_search_space import tiny_study

from costmodel import check_plan
from search.evaluate import Evaluator
from search.inputs.planfile import PlanFile, dump_plan_file, parse_plan_file, plan_dict
from search.inputs.planspec import PlanSpecError, format_plan, parse_plan
from search.inputs.specs import Specs, build_specs
from search.inputs.study import Study, StudyError, parse_study
from search.output import _recompute_label
from search.pipeline import RunOptions, run_study
from search.prune import memory_stage
from search.space import SearchSpace, build_space, decode, enumerate_layouts, plan_from_row
from tcf_search.explain.neighbours import candidate_changes
from tcf_search.explain.planspec import apply_change


def _space(extra: str = "", framework: str = "") -> tuple[Study, Specs, SearchSpace]:
    text = tiny_study(extra=extra)
    if framework:
        text = text.replace("global_batch: 32}", f"global_batch: 32, framework: {framework}}}")
    study = parse_study(text, name="modules")
    specs = build_specs(study)
    return study, specs, build_space(study, specs)


def _best(extra: str) -> float:
    study, specs, space = _space(extra)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    ev = Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))
    best = ev.exhaustive(1).best[0]
    check_plan(specs.model, specs.cluster, best.plan, specs.training)
    return float(best.metrics["tokens_per_s_per_gpu"])


def test_without_the_field_there_is_no_axis() -> None:
    _, _, space = _space()
    assert space.domains["recompute_modules"] == (0,)
    assert "recompute_modules" not in [r.name for r in space.rules]


def test_auto_searches_every_set_of_the_modules_that_free_memory() -> None:
    """On a MoE model without MLA: core_attn, moe_act and layernorm free memory (mlp frees
    nothing in a MoE layer, mla_up_proj needs MLA); the training's [core_attn] is written 0."""
    _, _, space = _space("  recompute_modules: auto")
    shown = {decode("recompute_modules", v) for v in space.domains["recompute_modules"]}
    assert shown == {"training", "moe_act", "layernorm", "core_attn+moe_act",
                     "core_attn+layernorm", "moe_act+layernorm", "core_attn+moe_act+layernorm"}
    cols = enumerate_layouts(space).columns
    own = cols["recompute_modules"] != 0
    assert own.any() and (cols["recompute"][own] == 1).all()  # a set only with selective
    plan = plan_from_row({k: int(v[np.flatnonzero(own)[0]]) for k, v in cols.items()})
    assert plan.recompute == "selective" and plan.recompute_modules


def test_a_list_searches_those_sets_and_the_trainings() -> None:
    _, _, space = _space("  recompute_modules: [[moe_act, core_attn], [core_attn], [moe_act]]")
    shown = [decode("recompute_modules", v) for v in space.domains["recompute_modules"]]
    assert sorted(shown) == ["core_attn+moe_act", "moe_act", "training"]


@pytest.mark.parametrize(("extra", "framework", "match"), [
    ("  recompute_modules: auto", "torchtitan",
     "search_space.recompute_modules: Megatron-Core's switch"),
    ("  recompute_modules: [[mla_up_proj]]", "",
     "search_space.recompute_modules: 'mla_up_proj' needs multi-latent attention"),
    ("  recompute_modules: [[router]]", "", "search_space.recompute_modules"),
    ("  recompute_modules: [core_attn]", "", "search_space.recompute_modules: must be auto or"),
])
def test_a_set_megatron_core_refuses_is_refused_naming_the_field(extra: str, framework: str,
                                                                   match: str) -> None:
    with pytest.raises(StudyError, match=match):
        _space(extra, framework)


def test_the_axis_never_lowers_the_best_and_optuna_sees_one_categorical() -> None:
    """The space with the axis holds the space without it: its exhaustive best is no worse."""
    assert _best("  recompute_modules: auto") >= _best("")
    study, specs, space = _space("  recompute_modules: auto\nobjective: {metric: tokens_per_s, "
                                 "second: memory_headroom}")
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    ev = Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))
    choices = ev.choices["recompute_modules"]
    assert len(choices) > 1 and all(isinstance(c, str) for c in choices)


def test_a_run_writes_each_plans_set(tmp_path: Path) -> None:
    """trials.csv's recompute_modules column ('' for the training's set), the plan files' list,
    the run table's sel(...), all of the plan the search judged. Every unit is judged once (a
    trial count past the units runs them all: no sampler's path decides what the rows hold), on
    selective recompute only, the training's own set the most that can be recomputed, so a plan
    that fits with less recomputes less."""
    text = tiny_study(seq=4096, extra="  recompute: [selective]\n  recompute_modules: auto"
                      ).replace("training: {seq_len: 4096, global_batch: 32}",
                                "training: {seq_len: 4096, global_batch: 32, "
                                "recompute_modules: [core_attn, moe_act, layernorm]}")
    # wide and long enough that the GPU, not the host's kernel launches, sets the pace, so
    # recomputing more takes longer (at hidden 256 and 512 tokens every set ties on the host's
    # time and the order picks the first); the least that fits is then each layout's choice
    text = text.replace("hidden: 256, ffn_hidden: 512", "hidden: 2048, ffn_hidden: 4096")
    assert "recompute_modules: [core_attn" in text
    study = parse_study(text, name="modules-run")
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=100_000))
    assert result.search["sampler"] == "brute_force"
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    own = [r for r in rows if r["recompute_modules"]]
    assert own and all(r["recompute"] == "selective" for r in own)
    assert {r["recompute_modules"] for r in rows if r["recompute"] != "selective"} <= {""}
    for r in result.top:
        pf = parse_plan_file(dump_plan_file(PlanFile(
            study="modules-run", model=build_specs(study).model, gpu="h100-sxm-80gb",
            num_gpus=16, gpus_per_node=4, training=build_specs(study).training, plan=r.plan)))
        assert pf.plan == r.plan
        assert ("recompute_modules" in plan_dict(r.plan)) == bool(r.plan.recompute_modules)
    assert _recompute_label({"recompute": "selective", "recompute_layers": 0,
                             "recompute_modules": ["core_attn", "moe_act"]}) == "sel(attn+moe_act)"
    assert _recompute_label({"recompute": "selective", "recompute_layers": 0}) == "sel"


def test_the_plan_syntax_names_a_set_and_explain_moves_it() -> None:
    _, specs, _ = _space()
    plan = parse_plan("tp=1,dp=16,ep=4,recompute=selective,modules=moe_act+layernorm", specs)
    assert plan.recompute_modules == ("moe_act", "layernorm")
    assert "modules=moe_act+layernorm" in format_plan(plan)
    assert parse_plan(format_plan(plan), specs) == plan
    assert parse_plan("tp=1,dp=16,ep=4,recompute=selective,modules=training",
                      specs).recompute_modules == ()
    with pytest.raises(PlanSpecError, match="recompute_modules: .* but got "
                                            "recompute_modules=moe_act, recompute=2"):
        parse_plan("tp=1,dp=16,ep=4,recompute=full,modules=moe_act", specs)
    # a move to full recompute drops the plan's set, saying why
    full, notes = apply_change(plan, {"recompute": "full"}, specs)
    assert full.recompute_modules == () and any("recompute_modules" in n for n in notes)
    sets = (("core_attn",), ("moe_act",))
    assert {"recompute_modules": ("core_attn",)} in candidate_changes(plan, specs, sets)
