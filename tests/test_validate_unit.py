"""Validation pieces that need no torch: rank agreement, the pipeline order, the stage split,
the run config, the result folder, and the CLI's message when torch is missing."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import typer
from costmodel_helpers import training_for

from costmodel.specs import ModelSpec, Plan
from search.inputs.planfile import PlanFile, dump_plan_file
from tcf_search.validate.agreement import Row, plan_label, rank_agreement, spearman
from tcf_search.validate.config import (
    RunConfig,
    Unsupported,
    ValidationError,
    micro_batches,
)
from tcf_search.validate.runs import ResultFolderError, top_plan_files

TINY = ModelSpec(name="t", layers=4, hidden=32, ffn_hidden=64, heads=4, kv_heads=2, vocab=64)
TRAIN = training_for(seq_len=16, global_batch=4)


def test_spearman_perfect_reversed_and_ties() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share the average rank: ranks x = 1.5, 1.5, 3; y = 1, 2, 3 -> rho = 0.866
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([1], [2]))


def _row(rank: int, pred: float, meas: float, outcome: str = "ok") -> Row:
    nan = math.nan
    return Row(rank=rank, plan="p", outcome=outcome, predicted_step_time_s=pred,
               measured_step_time_s=meas, predicted_tokens_per_s_per_gpu=nan,
               measured_tokens_per_s_per_gpu=nan, predicted_peak_gib=1.0, measured_peak_gib=1.5,
               loss_first=nan, loss_last=nan)


def test_rank_agreement_skips_failed_plans() -> None:
    rows = [_row(1, 1.0, 2.0), _row(2, 2.0, 3.0), _row(3, 3.0, math.nan, "oom"),
            _row(4, 4.0, 5.0)]
    assert rank_agreement(rows) == pytest.approx(1.0)
    assert rows[0].time_error == pytest.approx(1.0)  # measured twice the prediction
    assert rows[0].memory_error == pytest.approx(0.5)


def test_plan_label_names_the_layout() -> None:
    plan = Plan(tp=2, pp=2, dp=1, sequence_parallel=True, zero_stage=1, micro_batch=2,
                recompute="full")
    assert plan_label(plan) == "tp2-pp2-dp1-sp-1f1b-z1-mb2-rc-full"


def test_pipeline_actions_match_1f1b_and_keep_every_micro_batch() -> None:
    from tcf_search.validate.memory_only import pipeline_actions

    plan = Plan(pp=4, micro_batch=1)
    first = pipeline_actions(plan, 8, 0)
    # stage 0 of 4 runs 4 forwards before its first backward (pp - rank in flight)
    assert [a[0] for a in first[:5]] == ["F", "F", "F", "F", "B"]
    last = pipeline_actions(plan, 8, 3)
    assert [a[0] for a in last[:4]] == ["F", "B", "F", "B"]
    for acts in (first, last, pipeline_actions(Plan(pp=2, vpp=2, micro_batch=1), 4, 0)):
        forwards = sorted(a[1:] for a in acts if a[0] == "F")
        backwards = sorted(a[1:] for a in acts if a[0] == "B")
        assert forwards == backwards  # every forward is matched by its backward
        for i, a in enumerate(acts):  # and no backward comes before its forward
            if a[0] == "B":
                assert ("F", *a[1:]) in acts[:i]


def test_interleaved_rank_holds_both_virtual_stages() -> None:
    from tcf_search.validate.memory_only import pipeline_actions

    acts = pipeline_actions(Plan(pp=2, vpp=2, micro_batch=1), 4, 0)
    assert {a[1] for a in acts} == {0, 2}


@pytest.mark.parametrize(("layers", "plan"), [
    (126, Plan(tp=8, pp=16, vpp=4, first_stage_layers=7, last_stage_layers=7)),  # Llama 3.1 405B
    (32, Plan(pp=4, first_stage_layers=5, last_stage_layers=9)),
    (32, Plan(pp=4, vpp=2)),
])
def test_harness_places_layers_as_the_exports_do(layers: int, plan: Plan) -> None:
    pytest.importorskip("torch", reason="the harness's stage split lives beside its torch code")
    from costmodel.mapping import chunk_counts, stage_counts
    from tcf_search.validate.parallel import stage_layers

    ranges = stage_layers(layers, plan)
    ranks = stage_counts(layers, plan.pp, plan.first_stage_layers or 0,
                         plan.last_stage_layers or 0)
    assert [len(r) for r in ranges] == list(chunk_counts(ranks, plan.vpp))
    # chunk c of rank r is virtual stage c * pp + r, and the ranks hold their pinned counts
    held = [sum(len(ranges[c * plan.pp + r]) for c in range(plan.vpp)) for r in range(plan.pp)]
    assert tuple(held) == ranks
    assert [i for r in ranges for i in r] == list(range(layers))


def test_run_config_round_trips_through_json() -> None:
    cfg = RunConfig(model=TINY, plan=Plan(tp=2, sequence_parallel=True), training=TRAIN,
                    steps=2, fault="crash")
    back = RunConfig.from_json(cfg.to_json())
    assert back == cfg
    assert back.world_size == 2


@pytest.mark.parametrize(("plan", "error", "words"), [
    (Plan(cp=2, tp=2), Unsupported, "context parallel runs beside data parallel only"),
    # the shared rule (costmodel.rules cp_seq), stricter than the harness's own CP needs
    (Plan(cp=3), ValidationError, "cp_seq: seq_len % (2 * cp) == 0"),
    (Plan(tp=4), ValidationError, "kv_heads % plan.tp"),
    (Plan(pp=4, micro_batch=2), Unsupported, "micro-batches >= plan.pp"),
    (Plan(dp=3), ValidationError, "batch: global_batch % (micro_batch * dp) == 0"),
    # Transformer Engine's asynchronous offload has no counterpart here
    (Plan(cpu_offload_layers=1), Unsupported, "no asynchronous activation offloading"),
])
def test_unrunnable_plans_say_which_rule(plan: Plan, error: type, words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*")):
        RunConfig(model=TINY, plan=plan, training=TRAIN)


def test_micro_batches_per_rank() -> None:
    assert micro_batches(Plan(dp=2, micro_batch=1), TRAIN) == 2


def test_top_plan_files_sorted_by_rank(tmp_path: Path) -> None:
    (tmp_path / "top").mkdir()
    for rank in (10, 2, 1):
        pf = PlanFile(study="s", model=TINY, gpu="cpu", num_gpus=2, gpus_per_node=2,
                      training=TRAIN, plan=Plan(dp=2), rank=rank)
        (tmp_path / "top" / f"rank-{rank}.yaml").write_text(dump_plan_file(pf))
    assert [pf.rank for pf in top_plan_files(tmp_path, 3)] == [1, 2, 10]
    assert [pf.rank for pf in top_plan_files(tmp_path, 2)] == [1, 2]


def test_result_folder_without_top_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ResultFolderError, match="no top/ folder"):
        top_plan_files(tmp_path, 3)


def test_cli_without_torch_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from tcf_search.cli import main
    from tcf_search.validate import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    for command in ("validate", "calibrate"):
        with pytest.raises(typer.Exit) as exit_info:
            cli.require_torch(command)
        assert exit_info.value.exit_code == 2
        err = capsys.readouterr().err
        assert err.endswith("\n") and err.count("\n") == 1, "one whole line"
        assert "pip install -e '.[validate]'" in err and command in err
    # the same line through the command line, with its exit code
    assert main(["validate", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("tcf-search validate needs PyTorch") and err.endswith(")\n")
    assert err.count("\n") == 1


def test_costmodel_and_search_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, costmodel, search.inputs.study, tcf_search.validate.agreement; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True)
    assert out.stdout.strip() == "False"


def test_row_dict_has_errors() -> None:
    d = _row(1, 2.0, 3.0).to_dict()
    assert d["time_error"] == pytest.approx(0.5)
    assert set(dataclasses.asdict(_row(1, 1, 1))) < set(d)


def test_cpu_runs_are_predicted_with_fp32_activations() -> None:
    """CPU runs have no autocast: validate compares them with the cost model's prediction for
    fp32 activations, not the study's bf16 one (which it keeps where the catalog has no SKU)."""
    from costmodel import ClusterSpec, estimate
    from hardware_catalog import get_gpu
    from tcf_search.validate.config import as_run
    from tcf_search.validate.runs import fp32_prediction

    plan = Plan(tp=2, sequence_parallel=True, micro_batch=2)
    pf = PlanFile(study="s", model=TINY, gpu="cpu-local", num_gpus=2, gpus_per_node=2,
                  training=TRAIN, plan=plan, predicted={"step_time_s": 1.0, "trial": 3})
    got = fp32_prediction(pf)
    cluster = ClusterSpec(gpu=get_gpu("cpu-local"), num_gpus=2, gpus_per_node=2)
    bf16 = estimate(TINY, cluster, plan, TRAIN)
    fp32 = estimate(TINY, cluster, plan, as_run(TRAIN, "cpu"))
    assert got["step_time_s"] == fp32.step_time_s > bf16.step_time_s
    assert got["trial"] == 3
    assert as_run(TRAIN, "cuda") == TRAIN
    cpu = as_run(TRAIN, "cpu").framework.memory_model  # malloc, not the CUDA caching allocator
    assert cpu.allocator_fraction == 0.0 and cpu.allocator_const_bytes == 0.0
    assert got["peak_mem_gib"] < bf16.memory.peak_bytes / 2**30
    unknown = dataclasses.replace(pf, gpu="no-such-gpu")
    assert fp32_prediction(unknown) == unknown.predicted


def test_gemm_saturation_fit_recovers_a_curve_and_never_extrapolates_past_it() -> None:
    from tcf_search.calibration.device import fit_saturation

    sizes = [64, 128, 256, 512]
    a, h = fit_saturation(sizes, [50e9 * x / (x + 100) for x in sizes])
    assert a == pytest.approx(50e9, rel=1e-6) and h == pytest.approx(100, rel=1e-6)
    # almost linear timings (an asymptote far beyond 512) hold h at the largest size
    a, h = fit_saturation(sizes, [10e9, 20e9, 39e9, 77e9])
    assert h == 512 and 77e9 < a < 2 * 77e9
