"""Hosts that start one study together, and a database that goes away under them.

:func:`together` forks ``tcf-search`` commands from this process (imports done once, so each
starts in milliseconds) and holds every one at a barrier right before it opens the study's
storage: their schema creation, queueing and first trials overlap however slow the machine.
:func:`fresh_database` makes a PostgreSQL database of their own on the ``TCF_TEST_PG_URL``
server (``.ci/postgres.sh``); :func:`cut` makes it refuse connections and ends the ones open, as
a database server that dies does. Shared by tests/test_robust_hosts.py and
benchmarks/robust_storage.py.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

PG_URL = os.environ.get("TCF_TEST_PG_URL", "")
BARRIER_S = 120  # a host that never reaches the barrier (it failed before) frees the others
# 12 parallel layouts (units): a space smaller than the trials asked, so every host enqueues
# the whole space (brute force) and they share the queue
SMALL = ("name: small\nmodel: {preset: tiny}\ntraining: {seq_len: 256, global_batch: 64}\n"
         "cluster: {gpu: h100-sxm-80gb, gpus: 64, gpus_per_node: 8}\n"
         "search_space: {cp: auto, ep: 1, zero_stage: [0, 1], micro_batch: [1, 2]}\n"
         "search: {trials: 500}\n")


def together(argvs: Sequence[list[str]], setup: Callable[[], None] | None = None,
             timeout_s: float = 600) -> list[tuple[int, str]]:
    """Exit code and output (stdout and stderr) of each ``tcf-search ARGV``, all started at
    once; ``setup`` runs in each before its command (a fault to inject)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(argvs))
    logs = [Path(os.environ.get("TMPDIR", "/tmp")) / f"tcf-host-{uuid.uuid4().hex}.log"
            for _ in argvs]
    procs = [ctx.Process(target=_host, args=(barrier, argv, log, setup))
             for argv, log in zip(argvs, logs, strict=True)]
    for p in procs:
        p.start()
    out = []
    for p, log in zip(procs, logs, strict=True):
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
        out.append((p.exitcode if p.exitcode is not None else -1,
                    log.read_text(errors="replace")))
        log.unlink(missing_ok=True)
    return out


def _host(barrier: Any, argv: list[str], log: Path, setup: Callable[[], None] | None) -> None:
    from search import pipeline
    from tcf_search.cli import main

    opened = pipeline.open_study

    def at_barrier(*args: Any, **kwargs: Any) -> Any:
        pipeline.open_study = opened
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(BARRIER_S)
        return opened(*args, **kwargs)

    pipeline.open_study = at_barrier
    f = open(log, "w", buffering=1)  # noqa: SIM115 - this process ends with os._exit
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    sys.stdout = sys.stderr = f
    code = 99
    try:
        if setup is not None:
            setup()
        code = main(argv)
    except BaseException:  # noqa: BLE001 - what a real process would print
        traceback.print_exc()
    finally:
        f.flush()
        os._exit(code)


def trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def check_shared(url: str, name: str, units: int, hosts: int, late: int = 0) -> list[str]:
    """What is wrong with a study that hosts shared, brute force over ``units`` layouts (empty:
    nothing): every layout judged, no trial number twice, none left waiting or running, and one
    complete trial per layout: the hosts took turns to claim them (``search.optimize.run_trials``),
    so none passed the count, but for ``late`` layouts queued again by hand (drained, judged
    twice)."""
    held = trials(url, name)
    complete = [t for t in held if t.state == TrialState.COMPLETE]
    judged = {int(t.user_attrs["unit"]) for t in complete}
    wrong = []
    if sorted(t.number for t in held) != list(range(len(held))):
        wrong.append("a trial number recorded twice or skipped")
    if judged != set(range(units)):
        wrong.append(f"layouts never judged: {sorted(set(range(units)) - judged)}")
    if left := [t.number for t in held if t.state in (TrialState.WAITING, TrialState.RUNNING)]:
        wrong.append(f"trials left waiting or running: {left}")
    if len(complete) != units + late:
        wrong.append(f"{len(complete)} complete trials for {units} layouts ({late} queued again) "
                     f"and {hosts} hosts")
    return wrong


def result(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "result.json").read_text())
    return doc


# ---- PostgreSQL -------------------------------------------------------------------------------

def postgres_missing() -> str | None:
    """Why the PostgreSQL cases cannot run here (None: they can)."""
    if not PG_URL:
        return "TCF_TEST_PG_URL is unset: run `export TCF_TEST_PG_URL=$(.ci/postgres.sh)`"
    import sqlalchemy

    try:  # loads the driver SQLAlchemy picks for the URL, connects to nothing
        sqlalchemy.create_engine(PG_URL).dispose()
    except ImportError as exc:
        return f"no PostgreSQL driver for {PG_URL!r} ({exc}): pip install 'psycopg[binary]'"
    return None


def _admin(url: str) -> Any:
    import sqlalchemy

    return sqlalchemy.create_engine(sqlalchemy.make_url(url).set(database="postgres"),
                                    isolation_level="AUTOCOMMIT",
                                    poolclass=sqlalchemy.pool.NullPool)


def _execute(url: str, *statements: str) -> None:
    import sqlalchemy

    engine = _admin(url)
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(sqlalchemy.text(statement))
    finally:
        engine.dispose()


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards; its URL."""
    import sqlalchemy

    name = f"tcf_hosts_{uuid.uuid4().hex[:12]}"
    _execute(PG_URL, f'CREATE DATABASE "{name}"')
    try:
        yield sqlalchemy.make_url(PG_URL).set(database=name).render_as_string(
            hide_password=False)
    finally:
        _execute(PG_URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cut(url: str) -> None:
    """The database refuses new connections and its open ones end: what its clients see when
    the server dies, but only for this database (the server goes on for others)."""
    import sqlalchemy

    name = sqlalchemy.make_url(url).database
    _execute(url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false',
             f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")


def restore(url: str) -> None:
    import sqlalchemy

    _execute(url, f'ALTER DATABASE "{sqlalchemy.make_url(url).database}" ALLOW_CONNECTIONS true')


def at_judged(count: int, fault: Callable[[], None], *, asked: bool = False
              ) -> Callable[[], None]:
    """A ``setup`` for :func:`together`: ``fault`` runs inside the process's ``count``-th trial,
    once its plan is recorded (its values not yet told), or with ``asked`` as soon as the trial
    exists: a fixed point of the study's progress whatever the speed of the machine."""

    def install() -> None:
        seen = [0]

        def step() -> None:
            seen[0] += 1
            if seen[0] == count:
                fault()

        if asked:
            ask = optuna.study.Study.ask

            def asking(self: optuna.study.Study, *args: Any, **kwargs: Any) -> Any:
                trial = ask(self, *args, **kwargs)
                step()
                return trial

            optuna.study.Study.ask = asking  # type: ignore[method-assign]
            return
        record = optuna.trial.Trial.set_user_attr

        def recorded(self: optuna.trial.Trial, key: str, value: Any) -> None:
            record(self, key, value)
            if key == "plan":
                step()

        optuna.trial.Trial.set_user_attr = recorded  # type: ignore[method-assign]

    return install
