"""Plans typed on the command line, and the repairs a one-knob change needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel import Plan
from search.inputs.specs import Specs, build_specs
from search.inputs.study import load_study
from tcf_search.explain.planspec import (
    PlanSpecError,
    apply_change,
    format_plan,
    parse_assignments,
    parse_plan,
)

STUDIES = Path(__file__).resolve().parents[1] / "studies"


@pytest.fixture(scope="module")
def specs70() -> Specs:
    return build_specs(load_study(STUDIES / "llama3-70b-h100x64.yaml"))


def test_aliases_resolve_to_plan_fields() -> None:
    got = parse_assignments("tp=8, pp=4,vpp=2,dp=32,mbs=1,recompute=selective,zero=1,sp=true")
    assert got == {"tp": 8, "pp": 4, "vpp": 2, "dp": 32, "micro_batch": 1,
                   "recompute": "selective", "zero_stage": 1, "sequence_parallel": True}


@pytest.mark.parametrize(("text", "words"), [
    ("tp=8,foo=2", ["unknown key 'foo'", "micro_batch"]),
    ("tp=eight", ["tp must be an integer", "'eight'"]),
    ("recompute=some", ["recompute must be one of", "'some'"]),
    ("tp8", ["key=value", "'tp8'"]),
    ("tp=2,tp=4", ["given twice"]),
    ("", ["expected key=value"]),
])
def test_bad_plan_text_names_key_and_value(text: str, words: list[str]) -> None:
    with pytest.raises(PlanSpecError) as err:
        parse_assignments(text)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_dp_is_derived_to_fill_the_cluster(specs70: Specs) -> None:
    # 64 GPUs / (tp 8 * pp 4) = dp 2
    assert parse_plan("tp=8,pp=4", specs70).dp == 2


def test_invalid_plan_names_the_rule(specs70: Specs) -> None:
    with pytest.raises(PlanSpecError, match="num_gpus"):
        parse_plan("tp=8,pp=4,dp=32", specs70)


def test_format_round_trips(specs70: Specs) -> None:
    plan = Plan(tp=4, pp=4, dp=4, vpp=2, micro_batch=2, recompute="full", zero_stage=1,
                sequence_parallel=True)
    assert parse_plan(format_plan(plan), specs70) == plan


def test_change_of_tp_moves_dp_to_keep_world_size(specs70: Specs) -> None:
    base = Plan(tp=4, pp=4, dp=4, zero_stage=1)
    plan, notes = apply_change(base, {"tp": 8}, specs70)
    assert (plan.tp, plan.dp) == (8, 2) and plan.world_size == 64
    assert notes == ["dp 4→2 (keeps 64 GPUs)"]


def test_change_to_pp1_drops_interleaving_and_uneven_split(specs70: Specs) -> None:
    base = Plan(tp=2, pp=4, dp=8, vpp=2)
    plan, notes = apply_change(base, {"pp": 1}, specs70)
    assert (plan.pp, plan.vpp, plan.dp) == (1, 1, 32)
    assert any(n.startswith("vpp 2→1") for n in notes)


def test_impossible_change_is_an_error(specs70: Specs) -> None:
    # 64 GPUs do not split into tp=3 * pp=4 groups: no dp keeps the world size
    with pytest.raises(PlanSpecError, match="tp \\* pp \\* cp \\* dp == num_gpus"):
        apply_change(Plan(tp=4, pp=4, dp=4), {"tp": 3}, specs70)
