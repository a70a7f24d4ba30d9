"""The placement's proxy never costs the search a plan the space holds: the placement model
weighs a stage's work by a proxy (the LM head as 13 quarter-layers on Llama 3 70B), by which
21/20/20/19 beats 20/20/20/20, while the step time the trials report prefers the even split. An
exhaustive search's best is at least every even split of a layout it holds (what a recipe
writes), and a shipped baseline the space holds never beats it."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import Plan, estimate, estimate_batch, plans_to_arrays
from costmodel.specs import SpecError
from search.baseline import baseline_doc, baseline_lines, parse_baseline
from search.evaluate import Evaluator
from search.inputs.specs import Specs, build_specs
from search.inputs.study import load_study
from search.prune import MemoryStage, memory_stage
from search.space import AXES, build_space, enumerate_layouts, exclusions, plan_from_row


def searched(name: str) -> tuple[Specs, MemoryStage, Evaluator]:
    study = load_study(f"studies/{name}.yaml")
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    return specs, stage, Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))


def even_splits(stage: MemoryStage) -> list[Plan]:
    """Every feasible layout with its layers split evenly (pinned where vpp chunks do not
    divide them) and every layer recomputed under 'full', as a recipe writes it."""
    L = stage.space.facts.layers
    out = []
    for i in np.flatnonzero(stage.feasible):
        row = {a: int(stage.cols[a][i]) for a in AXES}
        pp, vpp = row["pp"], row["vpp"]
        if L % pp:
            continue
        pinned = pp > 1 and L % (pp * vpp) != 0
        row["first_stage_layers"] = row["last_stage_layers"] = L // pp if pinned else 0
        try:
            plan = plan_from_row(row)
        except SpecError:
            continue
        if not exclusions(stage.space, plan):
            out.append(plan)
    return out


@pytest.mark.parametrize("name", ["llama3-70b-h100x64", "llama3-8b-h100x8"])
def test_exhaustive_best_is_not_below_any_even_split_the_space_holds(name: str) -> None:
    specs, stage, ev = searched(name)
    best = ev.exhaustive(1).best[0]
    plans = even_splits(stage)
    out = estimate_batch(specs.model, specs.cluster, specs.training, plans_to_arrays(plans))
    room = (out["usable_bytes"] - out["peak_mem_bytes"]) / 2**30 - specs.headroom_gib
    tput = np.where(room >= 0, out["tokens_per_s_per_gpu"], 0.0)
    assert tput.max() > 0
    assert best.metrics["tokens_per_s_per_gpu"] >= tput.max() * (1 - 1e-9), (
        best.plan, plans[int(np.argmax(tput))])


def test_the_shipped_70b_baseline_does_not_beat_the_exhaustive_best() -> None:
    # Megatron-Bridge's tp4 pp4 cp2 vpp5, evenly split: 1,018 tokens/s per GPU, where the
    # search's best was 1,017 with its layout placed 21/20/20/19
    specs, stage, ev = searched("llama3-70b-h100x1024")
    study = load_study("studies/llama3-70b-h100x1024.yaml")
    assert study.baseline is not None
    base = parse_baseline(study.baseline, specs)
    space = build_space(study, specs)
    assert not exclusions(space, base)
    best = ev.exhaustive(1).best[0]
    b = estimate(specs.model, specs.cluster, base, specs.training)
    assert best.metrics["tokens_per_s_per_gpu"] >= b.tokens_per_s_per_gpu * (1 - 1e-9)
    # the one-objective trial of its (tp, pp, cp, ep) unit keeps at least the baseline too
    unit = next(u for u in range(ev.units)
                if ev.params_of(u) == {"tp": 4, "pp": 4, "cp": 2})
    assert ev.evaluate(unit).metrics["tokens_per_s_per_gpu"] >= b.tokens_per_s_per_gpu * (
        1 - 1e-9)
    doc = baseline_doc(specs, base, "study baseline", space=space, best=best.plan)
    assert not any("beats the search's best" in line for line in doc["lines"])


def test_the_advice_follows_what_the_search_makes_of_the_baseline_layout() -> None:
    """An in-space baseline beating a plan: 'more trials, or --exhaustive' only where the
    search's own placement of its layout reaches the baseline's figure."""
    study = load_study("studies/llama3-70b-h100x64.yaml")
    specs = build_specs(study)
    space = build_space(study, specs)
    base = parse_baseline("tp=4,pp=4,cp=2,vpp=5,mbs=1,sp=true,zero=1,recompute=none", specs)
    worse = parse_baseline("tp=8,pp=8,mbs=1,sp=true,zero=1,recompute=full", specs)
    # ``worse`` stands for the search's best (the label): only then do the lines speak of the
    # search (a plan the user picked, beaten by the baseline, says so instead: issue #38)
    doc = baseline_doc(specs, base, "--baseline", space=space, best=worse)
    tps = doc["figures"]["tokens_per_s_per_gpu"]
    assert doc["in_space"] and doc["versus"]["gain"]["total"] < 0
    assert doc["searched"]["tokens_per_s_per_gpu"] >= tps * (1 - 1e-9)  # the even split
    assert "the search has not converged (more trials, or --exhaustive)" in doc["lines"][-1]
    placed = {**doc, "searched": {"plan_text": "tp=4,pp=4,...", "tokens_per_s_per_gpu": tps / 2}}
    line = baseline_lines(placed, specs.headroom_gib)[-1]
    assert "--exhaustive" not in line and "judges its layout placed as tp=4,pp=4,..." in line
    screened = baseline_lines({**doc, "searched": None}, specs.headroom_gib)[-1]
    assert "--exhaustive" not in screened and "memory screen rules its layout out" in screened
