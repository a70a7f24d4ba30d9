"""Storage and scale-out: a study killed with SIGKILL resumes with no trial lost or duplicated,
and 4 worker processes on one journal file run exactly the requested number of trials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from clirunner import KILL_AT, self_killing
from optuna.trial import TrialState

from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study
from search.storage import StorageSpec

ROOT = Path(__file__).resolve().parents[1]
# Mixtral on 1,024 GPUs with CP and EP searched: 377 parallel layouts, more than the trials
# asked for, so TPE samples (rather than brute force) and a run lasts long enough to kill.
STUDY = """
model: {preset: mixtral-8x7b}
training: {seq_len: 8192, global_batch: 1024}
cluster: {gpu: h100-sxm-80gb, nodes: 128}
search_space: {cp: auto, ep: auto}
search: {seed: 3}
"""
TRIALS = 60


def study_file(tmp_path: Path) -> Path:
    path = tmp_path / "moe.yaml"
    path.write_text(STUDY)
    return path


def cli(study: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tcf_search", "run", str(study), "-o", str(out),
            "--trials", str(TRIALS), "-q", *extra]


def stored(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="moe", storage=StorageSpec.parse(None, out).open())


def complete(out: Path) -> list[optuna.trial.FrozenTrial]:
    if not (out / "study.journal").exists():
        return []
    try:
        return stored(out).get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    except KeyError:  # the study is not created yet
        return []


def env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path: Path,
                                                          frozen_checkout: Path) -> None:
    # Every run here (killed, resumed, the uninterrupted reference) is a process of one copy of
    # the code: never this process (modules and catalog as loaded when the session began)
    # against ones that import the checkout as it is now.
    root = frozen_checkout
    study = study_file(tmp_path)
    out = tmp_path / "killed"
    # Killed by the study's progress: by itself, right after its journal append 120 (about 10
    # trials of 12 operations each), however fast the machine.
    proc = subprocess.run(self_killing(cli(study, out)), cwd=root,
                          env={**env(root), KILL_AT: str(10 * 12)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=300)
    before = len(complete(out))
    if proc.returncode != -signal.SIGKILL or before >= TRIALS:
        pytest.fail(f"the run was not killed mid-way (rc={proc.returncode}, {before} trials)")

    resumed = subprocess.run(cli(study, out), cwd=root, env=env(root), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    trials = complete(out)
    assert len(trials) == TRIALS
    assert len({t.number for t in trials}) == TRIALS
    units = [t.user_attrs["unit"] for t in trials]
    assert len(set(units)) == TRIALS, "no parallel layout judged twice"
    states = [t.state for t in stored(out).get_trials(deepcopy=False)]
    assert TrialState.RUNNING not in states

    # the same seed, uninterrupted: the same trials in the same order, the same best
    whole = tmp_path / "whole"
    reference = subprocess.run(cli(study, whole), cwd=root, env=env(root), capture_output=True,
                               text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    ref_trials = complete(whole)
    assert units == [t.user_attrs["unit"] for t in ref_trials]
    best = max(trials, key=lambda t: t.values[0])
    assert best.values[0] == pytest.approx(max(t.values[0] for t in ref_trials), rel=1e-12)


def test_four_workers_run_exactly_the_requested_trials(tmp_path: Path) -> None:
    out = tmp_path / "workers"
    result = run_study(load_study(study_file(tmp_path)),
                       RunOptions(out_dir=out, trials=TRIALS, workers=4))
    assert result.search["sampler"] == "auto" and result.search["units"] > TRIALS  # TPE
    trials = stored(out).get_trials(deepcopy=False)
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == TRIALS == result.trials
    assert len({t.number for t in trials}) == len(trials)
    assert result.search["trials_this_run"] == TRIALS


def test_rdb_url_is_shared_by_runs_and_workers(tmp_path: Path) -> None:
    study = load_study(ROOT / "studies" / "llama3-8b-h100x8.yaml")
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = run_study(study, RunOptions(out_dir=tmp_path / "a", trials=8, storage=url, workers=2))
    assert first.trials == 8 and first.search["storage"] == url
    # another host (here: another output folder) on the same storage extends the same study
    second = run_study(study, RunOptions(out_dir=tmp_path / "b", trials=12, storage=url))
    assert second.trials == 12 and second.search["trials_this_run"] == 4
    assert not (tmp_path / "a" / "study.journal").exists()
