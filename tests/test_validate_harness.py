"""Real 2-rank gloo runs on CPU with a tiny decoder: every layout completes and computes the
same loss; OOM, crash and hang become the plan's outcome and leave no process behind."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="validation needs the optional torch extra "
                                    "(pip install -e '.[validate]')")

from costmodel_helpers import training_for

from costmodel.specs import ModelSpec, Plan  # noqa: E402
from tcf_search.validate.config import RunConfig, RunResult  # noqa: E402
from tcf_search.validate.launch import group_alive, launch  # noqa: E402

TINY = ModelSpec(name="t", layers=2, hidden=32, ffn_hidden=64, heads=4, kv_heads=2, vocab=128)
TRAIN = training_for(seq_len=16, global_batch=4)
LAYOUTS = {
    "dp2": Plan(dp=2, micro_batch=1),
    "tp2-sp": Plan(tp=2, sequence_parallel=True, micro_batch=2),
    "pp2-1f1b": Plan(pp=2, micro_batch=2),
    "fsdp2": Plan(dp=2, zero_stage=3, micro_batch=2),
    # context parallel: each rank holds half of every sequence and all-gathers K and V
    "cp2": Plan(cp=2, micro_batch=1),
}


def _run(plan: Plan, tmp: Path) -> RunResult:
    cfg = RunConfig(model=TINY, plan=plan, training=TRAIN, steps=1, warmup=1)
    return launch(cfg, timeout_s=120, work_dir=tmp)


def _no_survivors(work: Path) -> bool:
    return not group_alive(int((work / "pgid").read_text()))


@pytest.fixture(scope="module")
def layout_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return {name: _run(plan, tmp_path_factory.mktemp(name)) for name, plan in LAYOUTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_runs_and_reports(layout_results: dict[str, RunResult], name: str) -> None:
    r = layout_results[name]
    assert r.outcome == "ok", r.error
    assert r.step_time_s > 0 and r.tokens_per_s_per_gpu > 0
    assert len(r.ranks) == 2
    # tracker categories: parameters, gradients and Adam states were all seen
    assert r.memory_maxima.get("OptState", r.memory_maxima.get("Optstate", 0)) > 0
    assert r.peak_bytes > 0 and "Tracker" in r.memory_source


@pytest.mark.slow
def test_same_seed_same_loss_across_layouts(layout_results: dict[str, RunResult]) -> None:
    """DP2, TP2+SP, PP2, FSDP2 and CP2 start from the same weights and see the same tokens: the
    loss before the first update and after two AdamW steps must agree (fp32 on CPU)."""
    losses = {name: r.ranks[0].losses for name, r in layout_results.items()}
    reference = losses["dp2"]
    assert math.isclose(reference[0], math.log(TINY.vocab), rel_tol=0.05)  # near-uniform
    for name, values in losses.items():
        assert values == pytest.approx(reference, rel=1e-4), name


def test_crash_is_the_plans_outcome_and_no_process_survives(tmp_path: Path) -> None:
    r = launch(RunConfig(model=TINY, plan=LAYOUTS["dp2"], training=TRAIN, fault="crash"),
               timeout_s=60, work_dir=tmp_path)
    assert r.outcome == "crash"
    assert "injected crash" in r.error and "rank 1" in r.error
    assert _no_survivors(tmp_path)  # rank 0 was waiting for rank 1: killed with the group


def test_hang_times_out_and_the_group_is_killed(tmp_path: Path) -> None:
    r = launch(RunConfig(model=TINY, plan=LAYOUTS["dp2"], training=TRAIN, fault="hang"),
               timeout_s=3, work_dir=tmp_path)
    assert r.outcome == "timeout"
    assert "timeout_s=3" in r.error
    assert r.wall_s >= 3  # it waited the timeout out (how much longer depends on the machine)
    assert _no_survivors(tmp_path)


def test_injected_oom_is_recorded_as_oom(tmp_path: Path) -> None:
    r = launch(RunConfig(model=TINY, plan=LAYOUTS["dp2"], training=TRAIN, fault="oom"),
               timeout_s=60, work_dir=tmp_path)
    assert r.outcome == "oom"
    assert "MemoryError" in r.error
    assert _no_survivors(tmp_path)


def test_real_cpu_oom_under_a_heap_limit(tmp_path: Path) -> None:
    """A single rank whose heap is capped at 64 MiB cannot hold a 2M-token batch of logits."""
    big = training_for(seq_len=2048, global_batch=8)
    cfg = RunConfig(model=TINY, plan=Plan(micro_batch=8), training=big, steps=1, warmup=0,
                    track_memory=False, memory_limit_bytes=64 * 2**20)
    r = launch(cfg, timeout_s=120, work_dir=tmp_path)
    assert r.outcome == "oom", r.error


def test_group_alive_is_false_for_a_finished_group(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    proc.wait()
    assert not group_alive(proc.pid)
