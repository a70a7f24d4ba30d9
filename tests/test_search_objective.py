"""The Optuna objective, driven with ``optuna.trial.FixedTrial``."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from optuna.trial import FixedTrial

from costmodel import Plan, estimate
from search.evaluate import Evaluator
from search.inputs.specs import build_specs
from search.inputs.study import parse_study
from search.optimize import objective
from search.prune import memory_stage
from search.space import build_space, enumerate_layouts

STUDY = """
model: {preset: llama3-8b}
training: {seq_len: 8192, global_batch: 64, token_budget: 1.0e+11}
cluster: {gpu: h100-sxm-80gb, gpus: 16}
search_space: {cp: [1, 2], micro_batch: [1, 2], vpp: [1, 2]}
"""


@cache
def evaluator(extra: str = "") -> Evaluator:
    study = parse_study(STUDY + extra)
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    return Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))


def test_fixed_trial_judges_the_units_best_plan() -> None:
    ev = evaluator()
    assert list(ev.choices) == ["tp", "pp", "cp"]  # one objective: units are parallel layouts
    ex = ev.exhaustive(top_k=10**6)
    for unit in range(ev.units):
        trial = FixedTrial(ev.params_of(unit))
        (value,) = objective(ev, trial)
        plan = Plan(**trial.user_attrs["plan"])
        independent = estimate(ev.specs.model, ev.specs.cluster, plan, ev.specs.training)
        assert value == pytest.approx(independent.tokens_per_s_per_gpu, rel=1e-9)
        assert trial.user_attrs["unit"] == unit and not trial.user_attrs["search"]["repaired"]
        assert trial.constraints["memory_gib"] <= 0  # fits
        # the unit's best: no feasible plan of the same parallel layout does better
        same = [e.values[0] for e in ex.best
                if (e.plan.tp, e.plan.pp, e.plan.cp) == (plan.tp, plan.pp, plan.cp)]
        assert value == pytest.approx(max(same), rel=1e-9)


def test_a_sample_outside_the_units_is_repaired_to_the_nearest() -> None:
    ev = evaluator()
    units = {tuple(ev.params_of(u).values()) for u in range(ev.units)}
    missing = next(p for p in ((t, pp, c) for t in ev.choices["tp"] for pp in ev.choices["pp"]
                               for c in ev.choices["cp"]) if p not in units)
    trial = FixedTrial(dict(zip(ev.choices, missing, strict=True)))
    objective(ev, trial)
    assert trial.user_attrs["search"]["repaired"]
    plan = trial.user_attrs["plan"]
    assert (plan["tp"], plan["pp"], plan["cp"]) in units


def test_seen_units_are_skipped_until_all_are_seen() -> None:
    ev = evaluator()
    params = ev.params_of(0)
    unit, _ = ev.nearest(params, seen={0})
    assert unit != 0
    assert ev.nearest(params, seen=set(range(ev.units)))[0] == 0  # all seen: the nearest again


def test_time_to_train_is_minimised_from_the_same_plan() -> None:
    ev = evaluator("objective: {metric: time_to_train}\n")
    assert ev.directions == ["minimize"]
    trial = FixedTrial(ev.params_of(0))
    (days,) = objective(ev, trial)
    tps = trial.user_attrs["metrics"]["tokens_per_s_per_gpu"]
    assert days == pytest.approx(1.0e11 / (tps * 16) / 86400)


def test_two_objectives_search_every_knob() -> None:
    ev = evaluator("objective: {second: memory_headroom}\n")
    assert ev.directions == ["maximize", "maximize"]
    assert "micro_batch" in ev.choices and ev.units == len(ev.feasible)
    trial = FixedTrial(ev.params_of(3))
    tps, headroom = objective(ev, trial)
    m = trial.user_attrs["metrics"]
    assert (tps, headroom) == (m["tokens_per_s_per_gpu"], m["memory_headroom_gib"])
    assert headroom >= 0


def test_tied_plans_rank_by_memory_headroom_then_simplicity() -> None:
    from search.evaluate import Evaluation
    from search.pipeline import _ranked

    def ev(plan: Plan, value: float, mem: float) -> tuple[Evaluation, str]:
        return Evaluation(unit=0, plan=plan, metrics={"peak_mem_gib": mem},
                          values=(value,)), "trial"

    a, b, c = Plan(dp=8), Plan(tp=2, dp=4), Plan(tp=4, dp=2)
    found = [ev(a, 100.0, 60.0), ev(b, 100.0, 40.0), ev(c, 120.0, 70.0)]
    for order in (found, found[::-1]):
        assert [r.plan for r in _ranked(order, ["maximize"], 3)] == [c, b, a]
    assert [r.plan for r in _ranked(found, ["minimize"], 3)] == [b, a, c]
    # equal value and memory: the simpler layout (no context parallelism) first
    cp8, dp8 = Plan(cp=8, micro_batch=8), Plan(dp=8)
    tied = [ev(cp8, 100.0, 50.0), ev(dp8, 100.0, 50.0)]
    assert [r.plan for r in _ranked(tied, ["maximize"], 2)] == [dp8, cp8]


def test_plans_that_fit_rank_before_faster_ones_that_do_not() -> None:
    """A unit's placements and dispatch options differ in memory beyond the screen's linear
    terms: its best is the fastest that fits with the study's headroom, and so is the
    exhaustive optimum the search is measured against; among plans that all fit (or all do not)
    the objective alone orders them."""
    ev = evaluator()
    gib = 2.0**30
    usable = 80.0 * gib
    headroom = ev.specs.headroom_gib
    assert headroom > 0  # the study's default keeps some memory free
    out = {"tokens_per_s_per_gpu": np.array([300.0, 500.0, 400.0, 450.0]),
           "usable_bytes": np.full(4, usable),
           # 500 and 450 leave less than the headroom free; 300 and 400 fit
           "peak_mem_bytes": usable - np.array([headroom + 5, headroom - 1, headroom + 1,
                                                headroom - 0.5]) * gib}
    assert ev._rank(out, {}).tolist() == [2, 0, 1, 3]
