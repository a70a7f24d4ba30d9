"""Issue 39, item 3 and 4: hosts that start the same command together on one database never
crash, and a database or a process that dies under a run is one line, then resumed.

* 4 commands held at a barrier right before they open the storage, on a fresh SQLite file or
  PostgreSQL database (schema creation raced: ``table studies already exists``, ``UNIQUE
  constraint failed: alembic_version``, ``pg_type_typname_nsp_index``) and on an existing study
  whose space is smaller than the trials asked (one queued trial taken by two processes:
  ``Cannot tell a COMPLETE trial``): every one exits 0, every layout is judged, no trial is
  recorded twice, none is left waiting or running, and each host's result holds the study;
* PostgreSQL cut mid-trial (it refuses connections, its backends end): one line that says to
  rerun, exit 1, and the rerun completes the study, failing the dead trials at once;
* a process SIGKILLed mid-trial on SQLite: the rerun fails its trial at once (its process is
  gone) and completes the study, rather than counting it as running and ending one short;
* a study that ends short (a trial under way on another host) says so.

A journal file serves one command at a time (the others are refused in one line: held already).
PostgreSQL cases need ``TCF_TEST_PG_URL`` (``.ci/postgres.sh``) and are skipped, saying why,
without it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import hosts
import optuna
import pytest
import sqlalchemy
from clirunner import cli
from hosts import SMALL, at_judged, fresh_database, postgres_missing, result, together, trials
from optuna.trial import TrialState

from search import optimize
from search.rdb import OWNER_ATTR

HOSTS = 4
UNITS = 12  # parallel layouts of SMALL


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'study.db'}"
        return
    if (why := postgres_missing()) is not None:
        pytest.skip(why)
    with fresh_database() as url:
        yield url


def _study(tmp_path: Path) -> Path:
    study = tmp_path / "small.yaml"
    study.write_text(SMALL)
    return study


def _hosts(study: Path, url: str, out: Path, *extra: str) -> list[list[str]]:
    return [["run", str(study), "-o", str(out / f"host{i}"), "-q", "--storage", url, *extra]
            for i in range(HOSTS)]


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "existing-study"])
def test_four_hosts_start_together(tmp_path: Path, database: str, existing: bool) -> None:
    study = _study(tmp_path)
    if existing:  # one trial there already: the hosts all find a study to fill by brute force
        code, _, err = cli("run", str(study), "-o", str(tmp_path / "first"), "-q",
                           "--storage", database, "--trials", "1")
        assert code == 0, err
    ran = together(_hosts(study, database, tmp_path))
    for code, output in ran:
        assert code == 0 and "Traceback" not in output and "error" not in output, output
    assert not hosts.check_shared(database, "small", UNITS, HOSTS)
    for i in range(HOSTS):  # each waited for the trials the others had under way
        assert result(tmp_path / f"host{i}")["trials"] >= UNITS


@pytest.mark.parametrize("asked", [False, True], ids=["inside-a-trial", "as-a-trial-starts"])
def test_a_database_cut_mid_run_is_one_line_and_the_rerun_completes(tmp_path: Path,
                                                                     asked: bool) -> None:
    if (why := postgres_missing()) is not None:
        pytest.skip(why)
    study = _study(tmp_path)
    out = tmp_path / "out"
    with fresh_database() as url:
        args = ["run", str(study), "-o", str(out), "-q", "--storage", url, "--trials", "10",
                "--workers", "2"]
        [(code, output)] = together([args], setup=at_judged(2, lambda: hosts.cut(url),
                                                            asked=asked))
        hosts.restore(url)
        assert code == 1, output
        assert output.count("\n") == 1 and output.startswith(
            "error: search.storage: lost the connection to postgresql://"), output
        assert "rerun the same command" in output
        code, _, err = cli(*args)
        assert code == 0 and not err, err
        done = result(out)
        assert done["trials"] == 10 and done["search"]["recovered_trials"] >= 1
        assert not [t for t in trials(url, "small") if t.state == TrialState.RUNNING]


def test_a_process_killed_mid_trial_is_resumed_at_once(tmp_path: Path) -> None:
    """Its trial stays RUNNING (a database cannot tell a dead host from a slow one until the
    heartbeat is 2 minutes old), but the rerun on its machine sees the process is gone."""
    study = _study(tmp_path)
    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["run", str(study), "-o", str(out), "-q", "--storage", url, "--trials", "8"]
    [(code, _)] = together([args], setup=at_judged(3, lambda: os.kill(os.getpid(),
                                                                      signal.SIGKILL)))
    assert code == -signal.SIGKILL
    [dead] = [t for t in trials(url, "small") if t.state == TrialState.RUNNING]
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:  # so that other hosts fail it once it is 2 minutes old
        beats = conn.execute(sqlalchemy.text("SELECT count(*) FROM trial_heartbeats WHERE "
                                             "trial_id = :t"), {"t": dead._trial_id}).scalar()
    engine.dispose()
    code, _, err = cli(*args)
    assert code == 0 and not err, err
    assert result(out)["trials"] == 8 and result(out)["search"]["recovered_trials"] == 1
    assert beats == 1 and dead.system_attrs[OWNER_ATTR]  # how other hosts and a rerun tell


def test_a_study_that_ends_short_says_so(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial under way on another host (a live heartbeat, another machine) counts toward the
    trials asked; once the wait for it is over, the run says how many are complete."""
    study = _study(tmp_path)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "a"), "-q", "--storage", url,
                       "--trials", "3")
    assert code == 0, err
    shared = optuna.load_study(study_name="small", storage=url)
    elsewhere = shared.ask()
    shared._storage.record_heartbeat(elsewhere._trial_id)  # type: ignore[attr-defined]
    shared._storage.set_trial_system_attr(elsewhere._trial_id, OWNER_ATTR,
                                          "another-machine/1/2/3")
    monkeypatch.setattr(optimize, "SETTLE_S", 0.5, raising=False)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "b"), "-q", "--storage", url,
                       "--trials", "5")
    assert code == 0
    assert err.count("\n") == 1 and err.startswith("note: search: the study holds 4 of 5 "
                                                   "complete trials; 1 still running"), err
    assert result(tmp_path / "b")["trials"] == 4


def test_a_layout_queued_late_is_drained_not_left_waiting(tmp_path: Path) -> None:
    """A host that queues the space while another's sampled trial has not yet claimed its
    layout queues that layout again; once every layout is judged, nobody asked for that queued
    trial and it stayed WAITING (one of four hosts starting together on a loaded machine). A
    host takes every queued trial before it stops: the late one is judged (past the count) and
    nothing is left waiting. (Hosts now take turns to ask and claim, so no host queues a layout
    a trial is about to claim; a storage written before that may still hold one.)"""
    study, url = _study(tmp_path), f"sqlite:///{tmp_path / 'late.db'}"
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "first"), "-q", "--storage", url)
    assert code == 0, err
    shared = optuna.load_study(study_name="small", storage=url)
    shared.enqueue_trial(shared.trials[0].params)  # the layout queued again, too late
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "again"), "-q", "--storage", url)
    assert code == 0, err
    assert not hosts.check_shared(url, "small", UNITS, HOSTS, late=1)
