"""The pipeline's pace in ``explain``: one micro-batch through each stage, the stage the step
runs at, and how long the others wait (``ComputeEstimate.stage_times``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from costmodel import estimate
from search.inputs.specs import Specs, build_specs
from search.inputs.study import load_study
from tcf_search.explain import explain_cmd, parse_plan

STUDY = Path(__file__).resolve().parents[1] / "studies" / "gpt-oss-120b-h100x64.yaml"
# Megatron-Bridge's recipe: nine layers a stage, the 201,088-token LM head on the last
EVEN = "tp=1,pp=4,dp=16,ep=8,mbs=1,zero=1,recompute=selective"


@pytest.fixture(scope="module")
def specs() -> Specs:
    return build_specs(load_study(STUDY))


def _explain(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    app.command("explain")(explain_cmd)
    app.command("noop")(lambda: None)
    got = CliRunner().invoke(app, ["explain", str(STUDY), *args])
    return got.exit_code, got.stdout


def test_the_step_runs_at_its_slowest_stage(specs: Specs) -> None:
    """The kernels' time of a step is the slowest stage's micro-batch times the micro-batches
    (with the contention and allocator stall on top), and the last stage, which holds the LM
    head and the loss besides nine layers, is that stage."""
    plan = parse_plan(EVEN, specs)
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    stages = {t.stage: t for t in e.compute.stage_times}
    assert set(stages) == {"first", "middle", "last"}
    assert {t.layers for t in stages.values()} == {9}
    slowest = max(stages.values(), key=lambda t: t.total_s)
    assert slowest.stage == "last" and slowest.total_s > 1.2 * stages["middle"].total_s
    micro_batches = specs.training.global_batch // (plan.dp * plan.micro_batch)
    c = e.compute
    assert micro_batches * slowest.compute_s + c.contention_time_s + c.stall_time_s == (
        pytest.approx(c.time_s, rel=1e-9))


def test_moving_layers_off_the_head_s_stage_evens_the_pace(specs: Specs) -> None:
    even = parse_plan(EVEN, specs)
    moved = replace(even, first_stage_layers=10, last_stage_layers=6)
    est = {p: estimate(specs.model, specs.cluster, p, specs.training) for p in (even, moved)}

    def spread(p: object) -> float:
        totals = [t.total_s for t in est[p].compute.stage_times]  # type: ignore[index]
        return max(totals) / min(totals)

    assert spread(moved) < spread(even)
    assert est[moved].step_time_s < est[even].step_time_s


def test_explain_says_which_stage_paces_the_step() -> None:
    code, out = _explain("--plan", EVEN)
    assert code == 0
    assert "pipeline pace" in out and "the step runs at the last stage's pace" in out
    code, out = _explain("--plan", EVEN, "--json")
    rows = json.loads(out)["compute"]["pipeline"]
    assert [r["stage"] for r in rows] == ["first", "middle", "last"]
    assert [r["paces"] for r in rows] == [False, False, True]
    # the head's stage paces: the others wait what they lack of its time (the 201k-word head
    # beside nine layers of 2,880)
    for r in rows:
        assert r["waits_share"] == pytest.approx(1.0 - r["total_s"] / rows[2]["total_s"])
    assert rows[0]["waits_share"] > 0.0 and rows[2]["waits_share"] == 0.0


def test_no_pipeline_no_pace(specs: Specs) -> None:
    code, out = _explain("--plan", "tp=1,pp=1,dp=64,ep=8,mbs=1,zero=1,recompute=full", "--json")
    assert code == 0 and json.loads(out)["compute"]["pipeline"] == []
