"""Interruption: ``tcf-search run`` killed with SIGKILL at random moments (during start-up,
between trials, inside a trial, while writing the result files) is resumed from its folder a
dozen times; no completed trial is ever lost or duplicated and the end result is the one an
uninterrupted run with the same seed gives. Ctrl-C (SIGINT) stops cleanly with exit 130 and says
how to resume; worker processes never outlive their command; a second command on a folder in use
is refused with one line instead of corrupting the first.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from search.pipeline import RunOptions, run_study
from search.planfile import load_plan_file
from search.storage import StorageSpec
from search.study import load_study

ROOT = Path(__file__).resolve().parents[1]
# Mixtral on 1,024 GPUs, CP and EP searched: 377 parallel layouts, so TPE samples (no brute force)
# and one trial takes tens of milliseconds: kills land inside and between trials alike.
STUDY = """
name: moe-kill
model: {preset: mixtral-8x7b}
training: {seq_len: 8192, global_batch: 1024}
cluster: {gpu: h100-sxm-80gb, nodes: 128}
search_space: {cp: auto, ep: auto}
search: {seed: 11}
"""
TRIALS = 180  # more than a dozen killed starts complete between them (about 10 each)
KILLS = 12
LONG = 200  # trials of a run that must still be going when the test acts on it
ENDLESS = 100_000  # trials of a run that is only ever interrupted


def study_file(folder: Path) -> Path:
    path = folder / "moe-kill.yaml"
    path.write_text(STUDY)
    return path


def command(study: Path, out: Path, trials: int = TRIALS, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tcf_search", "run", str(study), "-o", str(out),
            "--trials", str(trials), "-q", *extra]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    if not (out / "study.journal").exists():
        return []
    try:
        return optuna.load_study(study_name="moe-kill", storage=StorageSpec.parse(
            None, out).open()).get_trials(deepcopy=False)
    except KeyError:  # killed before the study was created
        return []


def completed(out: Path) -> dict[int, tuple[int, float]]:
    """Trial number -> (layout unit, objective value) of every COMPLETE trial."""
    return {t.number: (int(t.user_attrs["unit"]), float(t.values[0]))
            for t in trials(out) if t.state == TrialState.COMPLETE}


def result_files_whole(out: Path) -> None:
    """Whatever result files exist parse completely: none is ever half-written."""
    if (out / "result.json").exists():
        json.loads((out / "result.json").read_text())
    if (out / "best_plan.yaml").exists():
        load_plan_file(out / "best_plan.yaml")
    for plan in (out / "top").glob("*.yaml") if (out / "top").is_dir() else []:
        load_plan_file(plan)


def wait_for_growth(journal: Path, size: int, limit_s: float, proc: subprocess.Popen[bytes]
                    ) -> bool:
    """Until the command has appended to the journal (it is past start-up, among the trials)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.stat().st_size > size:
            return True
        time.sleep(0.01)
    return False


@dataclass
class KillLog:
    kills: int = 0
    finished_early: int = 0
    seen: dict[int, tuple[int, float]] = field(default_factory=dict)


def kill_and_resume(study: Path, out: Path, count: int, seed: int) -> KillLog:
    """Start the same command and SIGKILL it at a random moment, until ``count`` kills have
    landed while it ran (a start that finishes first is counted, not retried forever: at most
    twice ``count`` starts), so a slow or busy machine does not change what is tested."""
    rng = random.Random(seed)
    log = KillLog()
    journal = out / "study.journal"
    for i in range(2 * count):
        if log.kills >= count or len(log.seen) >= TRIALS:
            break
        size = journal.stat().st_size if journal.exists() else 0
        proc = subprocess.Popen(command(study, out), cwd=ROOT, env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 3 == 0:  # anywhere: imports, CP-SAT stage, opening or recovering the storage
            time.sleep(rng.uniform(0.05, 3.0))
        elif wait_for_growth(journal, size, 60, proc):  # among the trials
            time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL:
            log.kills += 1
        else:
            log.finished_early += 1
        now = completed(out)
        lost = {n: v for n, v in log.seen.items() if now.get(n) != v}
        assert not lost, f"kill {i}: completed trials lost or changed: {lost}"
        log.seen = now
        result_files_whole(out)
    return log


@pytest.mark.slow
def test_a_dozen_sigkills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    study = study_file(tmp_path)
    out = tmp_path / "killed"
    log = kill_and_resume(study, out, KILLS, seed=2024)
    assert log.kills >= 10, (f"only {log.kills} kills landed while the command ran "
                             f"({log.finished_early} starts finished first)")
    assert len(log.seen) < TRIALS, "the kills should leave work to resume"

    done = subprocess.run(command(study, out), cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = completed(out)
    assert len(final) == TRIALS
    assert all(final[n] == v for n, v in log.seen.items()), "a completed trial was lost"
    units = [final[n][0] for n in sorted(final)]
    assert len(set(units)) == TRIALS, "a layout was judged twice"
    assert not [t for t in trials(out) if t.state == TrialState.RUNNING]

    reference = run_study(load_study(study), RunOptions(out_dir=tmp_path / "whole",
                                                        trials=TRIALS))
    ref = completed(tmp_path / "whole")
    assert units == [ref[n][0] for n in sorted(ref)], "the same trials in the same order"
    doc = json.loads((out / "result.json").read_text())
    assert reference.best is not None and doc["best"] is not None
    assert doc["best"]["plan"] == reference.to_dict()["best"]["plan"]
    assert doc["best"]["objective_values"] == pytest.approx(list(reference.best.values),
                                                       rel=1e-12)
    assert doc["trials"] == TRIALS


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    # A session of its own: the test can check that nothing of the command's group survives.
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _survivors(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def _children(pid: int, at_least: int, limit_s: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= at_least:
            return kids
        time.sleep(0.02)
    raise AssertionError(f"the command did not start {at_least} workers")


@pytest.mark.parametrize("workers", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path: Path, workers: int) -> None:
    study = study_file(tmp_path)
    out = tmp_path / "out"
    proc = _start(command(study, out, ENDLESS, "--workers", str(workers)))
    kids = _children(proc.pid, workers) if workers > 1 else []
    assert wait_for_growth(out / "study.journal", 0, 60, proc)  # type: ignore[arg-type]
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # to the command only, as `kill -INT` would
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "resume" in err and str(out) in err
    assert err.strip().count("\n") == 0, "one line"
    assert not _survivors(kids), "a worker outlived Ctrl-C"
    # A worker interrupted inside ask/tell may leave its trial RUNNING: the resumed command
    # fails it (nothing else writes to a journal it holds) and runs the trials still owed.
    running = [t for t in trials(out) if t.state == TrialState.RUNNING]
    assert len(running) <= workers
    before = completed(out)

    target = len(before) + 5 * workers
    done = subprocess.run([*command(study, out, target, "--workers", str(workers)), "--json"],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["search"]["recovered_trials"] == len(running)
    after = completed(out)
    assert all(after[n] == v for n, v in before.items())
    assert len(after) == target
    assert not [t for t in trials(out) if t.state == TrialState.RUNNING]


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_die_with_their_command(tmp_path: Path, how: signal.Signals) -> None:
    """Only the controlling process is killed (the OOM killer picks one process): its workers
    must not run on, or the resumed command would fail their trials under them."""
    study = study_file(tmp_path)
    out = tmp_path / "out"
    proc = _start(command(study, out, LONG, "--workers", "4"))
    kids = _children(proc.pid, 4)
    assert wait_for_growth(out / "study.journal", 0, 60, proc)  # type: ignore[arg-type]
    time.sleep(0.5)
    os.kill(proc.pid, how)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 5
    while _survivors(kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _survivors(kids), "orphaned workers keep writing trials"
    before = completed(out)

    done = subprocess.run(command(study, out, LONG, "--workers", "4"), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    after = trials(out)
    complete = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(complete) == LONG
    assert len({t.number for t in after}) == len(after)
    assert len({t.user_attrs["unit"] for t in complete}) == LONG, "a layout judged twice"
    assert all(completed(out)[n] == v for n, v in before.items())


@pytest.mark.slow
def test_a_second_command_on_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    study = study_file(tmp_path)
    out = tmp_path / "out"
    first = _start(command(study, out, LONG))
    assert wait_for_growth(out / "study.journal", 0, 60, first)  # type: ignore[arg-type]
    second = subprocess.run(command(study, out, LONG), cwd=ROOT, env=env(), capture_output=True,
                            text=True, timeout=120)
    assert first.poll() is None, "the first command should still be running"
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1 and "another tcf-search run" in second.stderr
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    complete = [t for t in trials(out) if t.state == TrialState.COMPLETE]
    assert len(complete) == LONG
    assert not [t for t in trials(out) if t.state == TrialState.FAIL]


def test_ctrl_c_during_a_journal_append_waits_for_the_append() -> None:
    # Ctrl-C inside the journal lock's release once left Optuna's rename-lock half removed and
    # turned the interrupt into a FileNotFoundError traceback.
    from search.storage import _sigint_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with _sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the signal arrives here and is held
            done.append("appended")
    assert done == ["appended"]
    seen = []
    previous = signal.signal(signal.SIGINT, lambda sig, frame: seen.append(sig))
    try:
        with _sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert seen == []
        assert seen == [signal.SIGINT]  # delivered once, to the handler in place
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is previous
