"""Where a study's trials live, and how a run takes over a study already there.

The default is an Optuna journal file in the output folder (one command at a time per file);
an RDB URL (SQLite, PostgreSQL) lets many hosts share one study. A study remembers a fingerprint
of the study definition it was made from, so that a folder is never resumed with another one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from costmodel.errors import TcfError

STORAGE_FILE = "study.journal"
FINGERPRINT_ATTR = "tcf_search_fingerprint"


class SearchError(TcfError):
    """A search cannot run as asked (storage of another study, bad storage URL, ...)."""


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence Optuna's notes on the features used on purpose here: heartbeats (experimental,
    and meant for ``optimize``, not ask/tell) and multivariate TPE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        yield


class JournalFile(JournalFileBackend):
    """Optuna's journal file without an fsync per append (~13 appends a trial, milliseconds
    each here). A killed process loses nothing: its writes are in the page cache. A power loss
    can drop the last trials; the journal reader skips a torn final line."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        with _sigint_deferred():  # Ctrl-C inside the lock's release leaves a stale lock file
            self._lock.acquire()
            try:
                with open(self._file_path, "ab") as f:
                    f.write(text.encode("utf-8"))
            finally:
                self._lock.release()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block and deliver it to the handler in place once
    the block is done (main thread only: Python handles signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda sig, frame: pending.append((sig, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            if callable(previous):
                previous(*pending[0])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


@dataclass(frozen=True, slots=True)
class StorageSpec:
    """Where trials live: a journal file (default: ``study.journal`` in the output folder) or an
    RDB URL (``sqlite:///…``, ``postgresql://…``) shared by many hosts."""

    url: str | None = None
    journal: Path | None = None

    @classmethod
    def parse(cls, url: str | None, out_dir: Path) -> StorageSpec:
        if url is None:
            return cls(journal=out_dir / STORAGE_FILE)
        if url.startswith("journal:"):
            return cls(journal=Path(url.removeprefix("journal:")))
        if "://" not in url:
            raise SearchError(f"search.storage: must be journal:PATH or an RDB URL such as "
                              f"sqlite:///study.db or postgresql://host/db (got {url!r})")
        return cls(url=url)

    def open(self) -> BaseStorage:
        if self.journal is not None:
            try:
                self.journal.parent.mkdir(parents=True, exist_ok=True)
                return JournalStorage(JournalFile(str(self.journal)))
            except OSError as exc:  # a folder, a file in the way, no permission
                raise SearchError(f"search.storage: cannot use journal file {self.journal} "
                                  f"({exc.strerror or exc})") from None
        assert self.url is not None
        try:
            # Heartbeats let any host fail the trials of a worker that died on another host.
            with quiet():
                return RDBStorage(self.url, heartbeat_interval=30, grace_period=120)
        except Exception as exc:  # SQLAlchemy raises many types; the message says what
            raise SearchError(f"search.storage: cannot open {self.url!r}: "
                              f"{str(exc).splitlines()[0]}") from None

    def describe(self) -> str:
        return str(self.journal) if self.journal is not None else _redact(self.url or "")


def _redact(url: str) -> str:
    """An RDB URL without its password, for logs and result files."""
    head, sep, tail = url.partition("://")
    if "@" not in tail:
        return url
    cred, host = tail.rsplit("@", 1)
    return f"{head}{sep}{cred.split(':', 1)[0]}:***@{host}"


_HELD: dict[Path, Any] = {}  # journal file -> its open lock file, while this process runs it


def lock_journal(journal: Path) -> None:
    """One command at a time per journal file: a second one would take the first one's running
    trials for stale and fail them under it. The lock (``flock``, shared with forked workers) is
    dropped by :func:`unlock_journal`, or by the kernel once every holder has exited."""
    import fcntl

    journal.parent.mkdir(parents=True, exist_ok=True)
    key = journal.resolve()
    if key in _HELD:
        return
    # Not ``<journal>.lock``: Optuna's own append lock takes that name.
    f = open(key.with_name(key.name + ".run-lock"), "a")  # noqa: SIM115 - held past this call
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise SearchError(f"search.storage: another tcf-search run is using {journal}; rerun "
                          f"the command once it has ended to resume") from None
    _HELD[key] = f
    # Optuna's append lock, if a killed command left it: no one else can hold it now, and
    # Optuna would wait 30 s before breaking it.
    key.with_name(key.name + ".lock").unlink(missing_ok=True)


def unlock_journal(spec: StorageSpec) -> None:
    if spec.journal is not None and (f := _HELD.pop(spec.journal.resolve(), None)) is not None:
        f.close()


def open_study(spec: StorageSpec, name: str, directions: list[str],
               fingerprint: str) -> optuna.Study:
    """Create or resume the study; refuse storage that holds another study under this name."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if spec.journal is not None:
        lock_journal(spec.journal)
    storage = spec.open()
    study = optuna.create_study(
        storage=storage, study_name=name, load_if_exists=True,
        directions=[optuna.study.StudyDirection[d.upper()] for d in directions])
    held = study.user_attrs.get(FINGERPRINT_ATTR)
    if held is None:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
    elif held != fingerprint:
        unlock_journal(spec)  # the folder is not this study's: leave it to its own
        raise SearchError(
            f"storage {spec.describe()} holds study {name!r} made from a different study "
            f"definition or hardware numbers (fingerprint {held[:12]}, now {fingerprint[:12]}); "
            f"use another output folder (-o) or storage, or remove it")
    if [d.name.lower() for d in study.directions] != directions:
        unlock_journal(spec)
        raise SearchError(f"storage {spec.describe()} holds study {name!r} with directions "
                          f"{[d.name.lower() for d in study.directions]}, not {directions}")
    return study


def recover(study: optuna.Study, spec: StorageSpec) -> int:
    """Fail trials left RUNNING by a run that was killed; return how many.

    A journal file has one controller (this command), so every RUNNING trial is stale. An RDB
    may be shared by live workers on other hosts: only trials whose heartbeat stopped are.
    """
    if spec.journal is None:
        before = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        with quiet():
            optuna.storages.fail_stale_trials(study)
        return before - len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    return len(running)


