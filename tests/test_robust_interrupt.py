"""Interruption: ``tcf-search run`` killed with SIGKILL at points chosen by the study's own
progress (as it starts, while it opens and recovers its storage, inside a trial, between trials)
is resumed from its folder a dozen times; no completed trial is ever lost or duplicated and the
end result is the one an uninterrupted run with the same seed gives. Ctrl-C (SIGINT) stops
cleanly with exit 130 and says how to resume; worker processes never outlive their command; a
second command on a folder in use is refused with one line instead of corrupting the first.
Every test acts at a point in the study's progress, read from its journal, never after a sleep;
the time limits are safety nets against a hang. The killed runs and the uninterrupted one they
are held to are separate processes of one copy of the code (``frozen_checkout``): never this
process, whose modules and catalog were loaded when the session began, against ones that import
the checkout as it is now (a merge or a refit landing mid-suite made them disagree).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from clirunner import KILL_AT, self_killing
from optuna.trial import TrialState

from search.inputs.planfile import load_plan_file
from search.storage import StorageSpec

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
TRIALS = 180  # more than a dozen killed starts complete between them (at most 10 each)
KILLS = 12
OPS_PER_TRIAL = 12  # journal lines a trial appends (about): created, 4 params, 5-6 attrs, told
LIMIT_S = 120  # a safety net against a hang: a command that stalls this long has failed
LONG = 200  # trials of a run that must still be going when the test acts on it
ENDLESS = 100_000  # trials of a run that is only ever interrupted


def study_file(folder: Path) -> Path:
    path = folder / "moe-kill.yaml"
    path.write_text(STUDY)
    return path


def command(study: Path, out: Path, trials: int = TRIALS, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tcf_search", "run", str(study), "-o", str(out),
            "--trials", str(trials), "-q", *extra]


def env(root: Path = ROOT) -> dict[str, str]:
    """The environment of a command run from ``root`` (with ``cwd=root``): it imports the code
    there."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}


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


def appended_ops(journal: Path, since: int) -> int:
    """Operations (one JSON line each) appended to the study's journal past byte ``since``."""
    if not journal.exists():
        return 0
    with journal.open("rb") as f:
        f.seek(since)
        return f.read().count(b"\n")


def wait_for_ops(journal: Path, since: int, ops: int, proc: subprocess.Popen[Any]) -> bool:
    """Until the command has appended ``ops`` operations to the journal past byte ``since``;
    False if it ended first (or stalled past the safety net)."""
    deadline = time.monotonic() + LIMIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        if appended_ops(journal, since) >= ops:
            return True
        time.sleep(0.002)
    return False


def kill_points(rng: random.Random, count: int) -> list[int]:
    """Journal operations a start appends before it is killed, in turn: 0 (killed as soon as it
    starts, before it writes anything), 1-3 (creating or loading the study, failing the trial a
    kill left RUNNING), then anywhere in the trials, inside one or between two (at most 10
    trials' worth, so that a dozen kills leave most of the study owed)."""
    phases = [(0, 0), (1, 3), (4, 10 * OPS_PER_TRIAL), (4, 10 * OPS_PER_TRIAL)]
    return [rng.randint(*phases[i % len(phases)]) for i in range(count)]


def kill_and_resume(study: Path, out: Path, count: int, seed: int, tmp: Path,
                    root: Path = ROOT) -> dict[int, tuple[int, float]]:
    """Start the same command (from ``root``) ``count`` times, each SIGKILLed right after the
    chosen number of its journal appends (``self_killing``): where a kill lands is decided by the
    study's progress alone, not by how fast the machine or this process is, and a start that
    ends otherwise (the study finished first, an error) fails the test. Returns the completed
    trials after the last kill."""
    seen: dict[int, tuple[int, float]] = {}
    for i, ops in enumerate(kill_points(random.Random(seed), count)):
        with (tmp / f"start-{i}.err").open("w+b") as err:
            proc = subprocess.run(self_killing(command(study, out)), cwd=root,
                                  env={**env(root), KILL_AT: str(ops)},
                                  stdout=subprocess.DEVNULL, stderr=err, timeout=LIMIT_S)
            err.seek(0)
            assert proc.returncode == -signal.SIGKILL, (
                f"start {i} ended (rc={proc.returncode}) before appending {ops} journal "
                f"operations: {err.read().decode(errors='replace')[-2000:]}")
        now = completed(out)
        lost = {n: v for n, v in seen.items() if now.get(n) != v}
        assert not lost, f"kill {i} (after {ops} operations): completed trials lost or " \
                         f"changed: {lost}"
        seen = now
        result_files_whole(out)
    return seen


def test_a_self_killing_command_dies_right_after_the_chosen_append(tmp_path: Path,
                                                                   frozen_checkout: Path) -> None:
    study = study_file(tmp_path)
    for ops in (0, 1, 2 * OPS_PER_TRIAL + 5):
        out = tmp_path / f"at-{ops}"
        proc = subprocess.run(self_killing(command(study, out)), cwd=frozen_checkout,
                              env={**env(frozen_checkout), KILL_AT: str(ops)},
                              capture_output=True, text=True, timeout=LIMIT_S)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert appended_ops(out / "study.journal", 0) == ops


def test_commands_run_from_the_frozen_checkout_import_it(frozen_checkout: Path) -> None:
    """The premise of comparing one run with another: both import the copy, not the checkout
    (which a merge may change under a running suite) nor an installed package."""
    code = ("import costmodel, hardware_catalog, search, tcf_search\n"
            "print(*(m.__file__ for m in (costmodel, hardware_catalog, search, tcf_search)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=frozen_checkout,
                          env=env(frozen_checkout), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    files = [Path(f) for f in done.stdout.split()]
    assert len(files) == 4 and all(f.is_relative_to(frozen_checkout) for f in files), files


@pytest.mark.slow
def test_a_dozen_sigkills_lose_and_duplicate_nothing(tmp_path: Path,
                                                     frozen_checkout: Path) -> None:
    study = study_file(tmp_path)
    out = tmp_path / "killed"
    seen = kill_and_resume(study, out, KILLS, seed=2024, tmp=tmp_path, root=frozen_checkout)
    assert len(seen) < TRIALS, "the kills should leave work to resume"

    done = subprocess.run(command(study, out), cwd=frozen_checkout, env=env(frozen_checkout),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = completed(out)
    assert len(final) == TRIALS
    assert all(final[n] == v for n, v in seen.items()), "a completed trial was lost"
    units = [final[n][0] for n in sorted(final)]
    assert len(set(units)) == TRIALS, "a layout was judged twice"
    assert not [t for t in trials(out) if t.state == TrialState.RUNNING]

    whole = tmp_path / "whole"  # the same command, never interrupted
    reference = subprocess.run(command(study, whole), cwd=frozen_checkout,
                               env=env(frozen_checkout), capture_output=True, text=True,
                               timeout=300)
    assert reference.returncode == 0, reference.stderr
    ref = completed(whole)
    assert units == [ref[n][0] for n in sorted(ref)], "the same trials in the same order"
    doc, ref_doc = (json.loads((d / "result.json").read_text()) for d in (out, whole))
    assert ref_doc["best"] is not None and doc["best"] is not None
    assert doc["best"]["plan"] == ref_doc["best"]["plan"]
    assert doc["best"]["objective_values"] == pytest.approx(ref_doc["best"]["objective_values"],
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
    assert wait_for_ops(out / "study.journal", 0, 3 * OPS_PER_TRIAL, proc), "no trials ran"
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
    assert wait_for_ops(out / "study.journal", 0, 3 * OPS_PER_TRIAL, proc), "no trials ran"
    os.kill(proc.pid, how)
    proc.wait(timeout=60)
    # PR_SET_PDEATHSIG kills them at once; the wait is only for the kernel to get there.
    deadline = time.monotonic() + LIMIT_S
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
    assert wait_for_ops(out / "study.journal", 0, 1, first), "the first command never started"
    # Paused, the first command holds the folder for as long as the second one takes to start,
    # however slow the machine: it cannot finish (and let go) in between.
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(command(study, out, LONG), cwd=ROOT, env=env(),
                                capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
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
