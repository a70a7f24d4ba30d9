"""A study in a database (SQLite, PostgreSQL) that hosts share: its schema made once, a queued
trial taken once, a failure in one line, and the trials of a dead process found at once.

Optuna's RDB storage is meant for this, but hosts that start the same command together broke
it (issue 39):

* its schema creation checks, then creates (each table, then the alembic stamp), so processes
  starting together on a fresh database create one table twice. :func:`exclusive` serialises it
  (a PostgreSQL advisory lock, a file lock beside a SQLite file), and the brute-force queue
  (``search.optimize.enqueue_all``) too, so that hosts enqueue each layout once;
* a queued (WAITING) trial is taken by reading its state, then writing RUNNING: SQLite ignores
  ``SELECT ... FOR UPDATE``, so two processes could take one trial and the second crashed on
  telling it. :class:`SharedRDB` takes it with one conditional UPDATE, atomic on any database;
* a database gone mid-run gave chained tracebacks ending in Optuna's "invalid data in the
  commit": it is one :class:`StorageFailed` line here, naming the storage and what to do.

A RUNNING trial names its process (:func:`owner`): a rerun on the same machine fails the trials
of its dead processes at once, rather than 2 minutes later by their heartbeat.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from costmodel.errors import TcfError

OWNER_ATTR = "tcf_search_owner"  # a trial's system attribute: the process running it
_LOCK_KEY = 0x7463662D736561  # the advisory lock's key on PostgreSQL ("tcf-sea")
GRACE_S = 120  # a RUNNING trial whose heartbeat is this old is a dead process's
SQLITE_BUSY_S = 60  # a SQLite writer waits this long for another host's write before failing


class StorageFailed(TcfError):
    """The storage failed under a run (a lost connection, a full disk): not bad input, so the
    command exits 1; the trials already told are kept, and a rerun resumes."""

    exit_code = 1

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # the driver's line, passwords scrubbed


# ---- what a URL may show ----------------------------------------------------------------------

def _secrets(url: str) -> list[str]:
    """The URL's passwords (the user's, and ``password=`` in the query), longest first, read
    every way a parser could split the URL so that none is missed."""
    tail = url.partition("://")[2]
    found: set[str] = set()
    if "@" in tail:
        for cred in (tail.rsplit("@", 1)[0], tail.split("@", 1)[0], _userinfo(tail)):
            if ":" in cred:
                found.add(cred.split(":", 1)[1])
    for part in tail.partition("?")[2].split("&"):
        key, eq, value = part.partition("=")
        if eq and "password" in urllib.parse.unquote(key).lower():
            found.add(value)
    return sorted((s for s in found if s), key=len, reverse=True)


def _userinfo(tail: str) -> str:
    """What precedes the host: up to the last ``@``, unless that one is in the query."""
    at = tail.rfind("@")
    query = tail.find("?")
    if 0 <= query < at and "=" in tail[query:at]:
        at = tail.rfind("@", 0, query)
    return tail[:at] if at >= 0 else ""


def scrub(text: str, url: str) -> str:
    """``text`` without the URL's passwords (quoted or not) in it."""
    for secret in _secrets(url):
        for form in (secret, urllib.parse.unquote(secret), urllib.parse.quote(secret, safe="")):
            if form:
                text = text.replace(form, "***")
    return text


def redact(url: str) -> str:
    """An RDB URL without its passwords, for messages, logs and result files."""
    head, sep, tail = url.partition("://")
    cred = _userinfo(tail)
    if ":" in cred:
        tail = f"{cred.split(':', 1)[0]}:***{tail[len(cred):]}"
    base, q, query = tail.partition("?")
    if q:
        parts = [(f"{k}=***" if eq and "password" in urllib.parse.unquote(k).lower()
                  else k + eq + v) for k, eq, v in (p.partition("=") for p in query.split("&"))]
        tail = f"{base}?{'&'.join(parts)}"
    return scrub(f"{head}{sep}{tail}", url)


def backend(url: str) -> str:
    """``sqlite``, ``postgresql``, ``mysql``, ... (the dialect, without its driver)."""
    return url.partition("://")[0].split("+", 1)[0].lower()


def in_memory(url: str) -> bool:
    head, _, tail = url.partition("://")
    return head.startswith("sqlite") and (tail in ("", "/", "/:memory:")
                                          or "mode=memory" in tail or ":memory:" in tail)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (relative to the working directory as SQLAlchemy opens it);
    None for another database."""
    if backend(url) != "sqlite":
        return None
    # as SQLAlchemy reads it: up to the query, then percent-decoded (%2e%2e is ..)
    path = urllib.parse.unquote(url.partition("://")[2].removeprefix("/").partition("?")[0])
    return Path(path) if path and path != ":memory:" else None


# ---- failures, as one line ----------------------------------------------------------------------

def _translator(url: str) -> Callable[[Any], BaseException | None]:
    """SQLAlchemy's ``handle_error`` hook: a database error under a run becomes one
    :class:`StorageFailed` line (the driver's first line, passwords scrubbed). Integrity errors
    stay Optuna's (it reads them as "another process wrote this first")."""
    import sqlalchemy.exc

    shown = redact(url)

    def translate(ctx: Any) -> BaseException | None:
        error = ctx.sqlalchemy_exception
        if ctx.is_pre_ping or error is None or isinstance(error, sqlalchemy.exc.IntegrityError):
            return None
        text = str(ctx.original_exception).strip().splitlines()
        why = scrub(text[0] if text else type(ctx.original_exception).__name__, url)
        if ctx.is_disconnect or ctx.connection is None:
            return StorageFailed(f"search.storage: lost the connection to {shown} ({why}); "
                                 f"rerun the same command to resume once it is reachable", why)
        return StorageFailed(f"search.storage: {shown} failed ({why}); rerun the same command "
                             f"to resume once that is fixed", why)

    return translate


# ---- one process at a time ----------------------------------------------------------------------

@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """One process at a time, on every host, inside the block: a transaction-scoped advisory
    lock on PostgreSQL (released with its connection, even by a killed process), a ``flock`` on
    ``<file>.tcf-lock`` beside a SQLite file. Other databases: no lock."""
    kind = backend(url)
    if kind == "sqlite" and (path := sqlite_file(url)) is not None:
        lock = path.with_name(path.name + ".tcf-lock")
        with _locked(lock):
            yield
    elif kind == "postgresql":
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        sqlalchemy.event.listen(engine, "handle_error", _translator(url))
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _LOCK_KEY})
                yield
        finally:
            engine.dispose()
    else:
        yield


def _made(url: str, kwargs: dict[str, Any]) -> bool:
    """Whether the database holds Optuna's whole schema (its version stamped)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, **kwargs)
    try:
        with engine.connect() as conn:
            return conn.execute(sqlalchemy.text(
                "SELECT version_num FROM alembic_version")).first() is not None
    except sqlalchemy.exc.SQLAlchemyError:  # no such table (or no database: said on opening)
        return False
    finally:
        engine.dispose()


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    try:
        f = open(lock, "a")  # noqa: SIM115 - closed below, after the block
    except OSError as exc:  # a read-only folder
        why = exc.strerror or str(exc)
        raise StorageFailed(f"search.storage: cannot lock {lock} ({why})", why) from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released on close
        yield


class SharedRDB(RDBStorage):
    """Optuna's RDB storage as several hosts share it (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_S}} if backend(url) == "sqlite" else {}
        if (path := sqlite_file(url)) is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        # Optuna stamps the schema's version last: once stamped, opening it only reads, and
        # hosts (and their workers) open it side by side
        with contextlib.nullcontext() if _made(url, kwargs) else exclusive(url):
            super().__init__(url, engine_kwargs=kwargs, heartbeat_interval=30,
                             grace_period=GRACE_S)
        import sqlalchemy

        sqlalchemy.event.listen(self.engine, "handle_error", _translator(url))

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        if state != TrialState.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state, values)
        # Taking a queued trial: compare and set, in one statement.
        from optuna.storages._rdb import models  # SQLAlchemy: loaded for a database only

        trials = models.TrialModel
        session = self.scoped_session()
        try:
            taken = session.execute(
                trials.__table__.update()
                .where(trials.trial_id == trial_id, trials.state == TrialState.WAITING)
                .values(state=TrialState.RUNNING)).rowcount == 1  # type: ignore[attr-defined]
            if taken:
                trials.find_or_raise_by_id(trial_id, session).datetime_start = datetime.now()
                _mark(session, trial_id)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()
        # not taken: Optuna's answer, False if running, UpdateFinishedTrialError if done
        return taken or super().set_trial_state_values(trial_id, state, values)

    def _get_prepared_new_trial(self, study_id: int, template_trial: FrozenTrial | None,
                                session: Any) -> Any:
        trial = super()._get_prepared_new_trial(study_id, template_trial, session)
        if trial.state == TrialState.RUNNING:  # asked for (not a finished trial added)
            _mark(session, trial.trial_id)
        return trial


def _mark(session: Any, trial_id: int) -> None:
    """A trial this process starts, in the transaction that starts it: its first heartbeat (so
    that other hosts fail it if this process dies: ask/tell runs no heartbeat thread, and trials
    take milliseconds, far below the grace period) and its :func:`owner` (so that a rerun on this
    machine fails it at once)."""
    from optuna.storages._rdb import models

    session.add(models.TrialHeartbeatModel(trial_id=trial_id))
    if who := owner():
        session.add(models.TrialSystemAttributeModel(trial_id=trial_id, key=OWNER_ATTR,
                                                     value_json=json.dumps(who)))


# ---- whose trial is it --------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot), "" if there is none: a PID is
    reused, its start time tells the processes apart."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[19] if ")" in stat else ""


def _machine() -> str:
    """This boot of this machine, and this PID namespace (a container sees its own PIDs)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        space = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{space}" if boot else ""


def owner() -> str:
    """This process, as another process on this machine can tell whether it still runs: ""
    where /proc does not say (then only the heartbeat does)."""
    machine, pid = _machine(), os.getpid()
    started = _started(pid)
    return f"{machine}/{pid}/{started}" if machine and started else ""


def dead_here(who: str) -> bool:
    """Whether ``who`` (an :func:`owner`) was a process on this machine that has ended."""
    parts = who.split("/")
    if len(parts) != 4 or not parts[2].isdigit() or "/".join(parts[:2]) != _machine():
        return False
    return _started(int(parts[2])) != parts[3]


def fail_dead(study: optuna.Study) -> int:
    """Fail the RUNNING trials of dead processes: of this machine at once, of other hosts once
    their heartbeat is older than the grace period (a live host's trials run on). Returns how
    many were failed."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    optuna.storages.fail_stale_trials(study)
    for t in running:
        if dead_here(t.system_attrs.get(OWNER_ATTR, "")):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    failed = {t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    return sum(t._trial_id in failed for t in running)
