"""Validate the top plans of a study's result folder: run each (real or memory-only), one
subprocess per plan, and compare with what the study predicted.

An out-of-memory error, a crash, a hang (timeout) or a plan the harness cannot build is that
plan's outcome; the next plan runs regardless.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel import estimate
from costmodel.errors import TcfError
from search.inputs import PlanFile, load_plan_file, plan_dict, plan_file_specs
from tcf_search.validate.agreement import Row, make_row, rank_agreement
from tcf_search.validate.config import (
    Device,
    Outcome,
    RunConfig,
    RunResult,
    Unsupported,
    ValidationError,
    as_run,
)
from tcf_search.validate.launch import REPO_ROOT, _tail, kill_group, launch


class ResultFolderError(ValidationError):
    """The RESULT folder is not a study output folder."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    top: int = 3
    steps: int = 3
    warmup: int = 1
    device: Device = "cpu"
    timeout_s: float = 600.0
    memory_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    rows: list[Row]
    results: list[RunResult]
    spearman: float
    mode: str  # "real (gloo, cpu)", "memory-only"
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.rows if r.outcome == "ok"]
        errors = [abs(r.time_error) for r in ok if math.isfinite(r.time_error)]
        return {"mode": self.mode, "plans": len(self.rows), "ok": len(ok),
                "spearman_step_time": self.spearman,
                "mean_abs_time_error": sum(errors) / len(errors) if errors else math.nan,
                "outcomes": {o: sum(r.outcome == o for r in self.rows)
                             for o in sorted({r.outcome for r in self.rows})}}

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "rows": [r.to_dict() for r in self.rows],
                "results": [r.to_dict() for r in self.results], "notes": self.notes}


def top_plan_files(folder: Path, k: int) -> list[PlanFile]:
    top = folder / "top"
    if not top.is_dir():
        raise ResultFolderError(f"RESULT must be a study output folder with top/rank-<N>.yaml, "
                                f"but {str(folder)!r} has no top/ folder")
    ranked = sorted(((int(m.group(1)), p) for p in top.glob("rank-*.yaml")
                     if (m := re.fullmatch(r"rank-(\d+)\.yaml", p.name))), key=lambda t: t[0])
    if not ranked:
        raise ResultFolderError(f"{str(top)!r} holds no rank-<N>.yaml plan files")
    return [load_plan_file(p) for _, p in ranked[:k]]


def fp32_prediction(pf: PlanFile) -> dict[str, Any]:
    """The study's prediction for ``pf`` made again as a CPU run executes it (fp32
    activations); a plan the catalog cannot place keeps the study's values."""
    try:
        cluster = plan_file_specs(pf).cluster
        est = estimate(pf.model, cluster, pf.plan, as_run(pf.training, "cpu"))
    except TcfError:
        return pf.predicted
    return {**pf.predicted, "step_time_s": est.step_time_s,
            "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
            "peak_mem_gib": est.memory.peak_bytes / 2**30}


def run_plan(pf: PlanFile, opts: Options, work_dir: Path) -> RunResult:
    """One plan, isolated in its own process group; every failure becomes the outcome."""
    try:
        cfg = RunConfig(model=pf.model, plan=pf.plan,
                        training=pf.training, steps=opts.steps,
                        warmup=opts.warmup, device=opts.device)
    except Unsupported as exc:
        return RunResult(outcome="unsupported", error=str(exc))
    except ValidationError as exc:
        return RunResult(outcome="unsupported", error=f"not runnable as given: {exc}")
    if opts.memory_only:
        return run_memory_only(cfg, timeout_s=opts.timeout_s, work_dir=work_dir)
    return launch(cfg, timeout_s=opts.timeout_s, work_dir=work_dir)


def run_memory_only(cfg: RunConfig, *, timeout_s: float, work_dir: Path) -> RunResult:
    """``memory_only.measure_memory`` in a subprocess of its own (fake process group state is
    global to a process), killed with its group on timeout."""
    work_dir.mkdir(parents=True, exist_ok=True)
    request, out = work_dir / "memory_request.json", work_dir / "memory_result.json"
    out.unlink(missing_ok=True)
    request.write_text(json.dumps({"model": dataclasses.asdict(cfg.model),
                                   "plan": plan_dict(cfg.plan),
                                   "training": cfg.training.to_dict()}))
    start = time.monotonic()
    log_path = work_dir / "log-memory.txt"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tcf_search.validate.memory_only", str(request), str(out)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, process_group=0,
            env=_env_with_repo())
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            return RunResult(outcome="timeout", wall_s=time.monotonic() - start,
                             error=f"no result within timeout_s={timeout_s:g}")
        except BaseException:  # Ctrl-C: the group of its own would outlive this process
            kill_group(proc.pid)
            proc.wait()
            raise
    wall = time.monotonic() - start
    if code != 0 or not out.exists():
        text = log_path.read_text(errors="replace")
        outcome: Outcome = "oom" if "MemoryError" in text or "OutOfMemoryError" in text \
            else "crash"
        return RunResult(outcome=outcome, wall_s=wall,
                         error=f"memory-only exited {code}: {_tail(log_path)}")
    raw = json.loads(out.read_text())
    return RunResult(outcome="ok", peak_bytes=raw["peak_bytes"], memory_parts=raw["categories"],
                     memory_maxima=raw["maxima"], layer_activation_bytes=raw["layer_activations"],
                     memory_source=raw["source"], wall_s=wall, notes=raw["notes"])


def _env_with_repo() -> dict[str, str]:
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def validate_folder(folder: Path, opts: Options,
                    on_result: Callable[[Row], None] | None = None) -> Report:
    plan_files = top_plan_files(folder, opts.top)
    work_root = Path(tempfile.mkdtemp(prefix="tcf-validate-"))
    rows: list[Row] = []
    results: list[RunResult] = []
    cpu_real = opts.device == "cpu" and not opts.memory_only
    for pf in plan_files:
        result = run_plan(pf, opts, work_root / f"rank-{pf.rank}")
        predicted = fp32_prediction(pf) if cpu_real else pf.predicted
        row = make_row(pf.rank, pf.plan, predicted, result)
        rows.append(row)
        results.append(result)
        if on_result is not None:
            on_result(row)
    mode = "memory-only (fake tensors)" if opts.memory_only else \
        f"real ({'nccl' if opts.device == 'cuda' else 'gloo'}, {opts.device})"
    notes = sorted({n for r in results for n in r.notes})
    if opts.device == "cpu" and not opts.memory_only:
        notes.append("CPU runs compute in fp32 (no fast bf16 on CPU) without a caching "
                     "allocator: the predictions shown are the cost model's for that run, not "
                     "the study's (bf16, CUDA allocator)")
    return Report(rows=rows, results=results, spearman=rank_agreement(rows), mode=mode,
                  notes=notes)
