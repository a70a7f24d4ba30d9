"""Run one plan as ``world_size`` worker processes in a process group of their own, with a
timeout, and turn whatever happens — success, out of memory, crash, hang — into a ``RunResult``.

The workers follow torchrun's environment contract; this launcher replaces torchrun on CPU so
that the whole run is one process group: on a timeout or on the first failed rank the group is
killed with one ``killpg`` and every process is reaped, leaving no orphans to hold a port or a
core while the next plan runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tcf_search.validate.config import RankReport, RunConfig, RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    threads = max(1, (os.cpu_count() or 1) // world)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               TCF_LAUNCHER_PID=str(os.getpid()))  # a rank outliving it exits (worker.main)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def spawn_ranks(cmd: list[str], world: int, work: Path, timeout_s: float,
                extra_env: dict[str, str] | None = None) -> tuple[list[int], bool, float]:
    """Start ``world`` copies of ``cmd`` as ranks of one process group and wait for all of
    them; the first failure or the timeout kills the whole group. Returns (exit codes,
    timed out, wall seconds); rank r's output is in ``work/log-<r>.txt``."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    start = time.monotonic()
    for rank in range(world):
        log = (work / f"log-{rank}.txt").open("wb")
        env = {**_env(rank, world, port), **(extra_env or {})}
        group = 0 if rank == 0 else procs[0].pid
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=REPO_ROOT, process_group=group))
        log.close()
    (work / "pgid").write_text(str(procs[0].pid))  # lets a caller check nothing survived
    timed_out = False
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
            time.sleep(POLL_S)
    finally:
        # Also on Ctrl-C: the ranks' own process group does not get the terminal's SIGINT.
        kill_group(procs[0].pid)
    return [p.wait() for p in procs], timed_out, time.monotonic() - start


def launch(cfg: RunConfig, *, timeout_s: float = 300.0, work_dir: Path | None = None) -> RunResult:
    """Run ``cfg`` on ``cfg.world_size`` local ranks and wait for all of them, or kill them."""
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="tcf-validate-"))
    work.mkdir(parents=True, exist_ok=True)
    for stale in [*work.glob("rank-*.json"), *work.glob("failed-*.json")]:
        stale.unlink()
    (work / "config.json").write_text(cfg.to_json())
    cmd = [sys.executable, "-m", "tcf_search.validate.worker", str(work / "config.json"),
           str(work)]
    codes, timed_out, wall_s = spawn_ranks(cmd, cfg.world_size, work, timeout_s)
    return collect(work, codes, cfg, timed_out=timed_out, timeout_s=timeout_s, wall_s=wall_s)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def collect(work: Path, codes: list[int], cfg: RunConfig, *, timed_out: bool, timeout_s: float,
            wall_s: float) -> RunResult:
    failures = [json.loads(p.read_text()) for p in sorted(work.glob("failed-*.json"))]
    if timed_out:
        return RunResult(outcome="timeout", wall_s=wall_s,
                         error=f"no result within timeout_s={timeout_s:g}; process group killed")
    if failures:
        first = next((f for f in failures if f["outcome"] == "oom"), failures[0])
        return RunResult(outcome=first["outcome"], wall_s=wall_s,
                         error=f"rank {first['rank']}: {first['error']}")
    bad = [(rank, code) for rank, code in enumerate(codes) if code != 0]
    if bad:
        rank, code = bad[0]
        if code == -signal.SIGKILL:
            return RunResult(outcome="oom", wall_s=wall_s,
                             error=f"rank {rank} killed by SIGKILL (the kernel's OOM killer?)")
        return RunResult(outcome="crash", wall_s=wall_s,
                         error=f"rank {rank} exited {code}: {_tail(work / f'log-{rank}.txt')}")
    ranks = [RankReport(**json.loads((work / f"rank-{r}.json").read_text()))
             for r in range(cfg.world_size)]
    return summarize(ranks, cfg, wall_s)


def summarize(ranks: list[RankReport], cfg: RunConfig, wall_s: float) -> RunResult:
    """The step ends when the slowest rank ends: max over ranks per step, median over steps."""
    step_time = statistics.median(max(ts) for ts in zip(*(r.step_times_s for r in ranks),
                                                        strict=True))
    peak_rank = max(ranks, key=lambda r: r.peak_bytes if r.peak_bytes == r.peak_bytes else 0)
    tokens = cfg.training.tokens_per_step
    notes = sorted({n for r in ranks for n in r.notes})
    return RunResult(
        outcome="ok", step_time_s=step_time,
        tokens_per_s_per_gpu=tokens / step_time / cfg.world_size,
        peak_bytes=peak_rank.peak_bytes, loss_first=ranks[0].losses[0],
        loss_last=ranks[0].losses[-1], memory_parts=dict(peak_rank.memory_parts),
        memory_maxima=dict(peak_rank.memory_maxima),
        layer_activation_bytes=peak_rank.layer_activation_bytes,
        memory_source=peak_rank.memory_source, wall_s=wall_s, notes=notes, ranks=ranks)


def _tail(path: Path, chars: int = 600) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return " | ".join(text[-chars:].strip().splitlines()[-6:])
