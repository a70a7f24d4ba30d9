"""Where a study's trials live, and how a run takes over a study already there.

The default is an Optuna journal file in the output folder (one command at a time per file);
an RDB URL (SQLite, PostgreSQL; ``search.rdb``) lets many hosts share one study. ``--storage``
names it anywhere; a study file's ``search.storage`` stays inside the result folder. A study
remembers a fingerprint of the study definition it was made from, so that a folder is never
resumed with another one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from costmodel.errors import TcfError
from search.files import Output, write_atomic
from search.rdb import (
    SharedRDB,
    StorageFailed,
    exclusive,
    fail_dead,
    in_memory,
    redact,
    scrub,
    sqlite_file,
)

STORAGE_FILE = "study.journal"
FINGERPRINT_ATTR = "tcf_search_fingerprint"
MAX_RECORD_BYTES = 16 * 2**20  # a journal line; Optuna's own hold a trial's attributes


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
    can drop the last trials. An append that fails (a full disk) is cut back off the file, so no
    torn record is left for the next append to follow; :func:`repair_journal` sets aside one
    left by a kill in mid-write."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs)
                + "\n").encode("utf-8")
        path = self._file_path
        # Ctrl-C or SIGTERM inside the lock's release leaves a stale lock file.
        with signals_deferred():
            try:
                self._lock.acquire()
            except OSError as exc:
                raise SearchError(f"search.storage: cannot lock {path} "
                                  f"({exc.strerror or exc})") from None
            try:
                _append(path, data)
            finally:
                self._lock.release()


def _append(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    except OSError as exc:
        raise SearchError(f"search.storage: cannot write {path} ({exc.strerror or exc})"
                          ) from None
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, end)  # no torn record: the file is as before the append
        raise SearchError(f"search.storage: cannot append to {path} "
                          f"({exc.strerror or exc}); rerun the same command to resume once "
                          f"there is room") from None
    finally:
        os.close(fd)


def _record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _tail_is_whole(path: Path) -> bool:
    """Whether the journal ends with a newline after a whole JSON record (or is empty)."""
    size = path.stat().st_size
    if size == 0:
        return True
    with path.open("rb") as f:
        f.seek(max(0, size - MAX_RECORD_BYTES))
        tail = f.read()
    return tail.endswith(b"\n") and _record(tail[:-1].rsplit(b"\n", 1)[-1])


def repair_journal(path: Path, *, full: bool = False) -> str | None:
    """Set aside torn records: bytes that are no whole JSON line (a kill or a full disk in
    mid-append) move to ``<journal>.torn``; a whole record appended after a torn one is kept.
    Checks the tail only unless ``full``. Returns what was done, for the user, or None."""
    if not path.is_file() or (not full and _tail_is_whole(path)):
        return None
    kept, torn = [], []
    for line in path.read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n") and _record(line):
            kept.append(line)
            continue
        cut = next((i for i in _starts(line) if line.endswith(b"\n") and _record(line[i:])),
                   None)
        torn.append(line[:cut] if cut is not None else line)
        if cut is not None:
            kept.append(line[cut:])
    if not torn:
        return None
    side = path.with_name(path.name + ".torn")
    junk = b"".join(t if t.endswith(b"\n") else t + b"\n" for t in torn)
    try:
        with side.open("ab") as f:
            f.write(junk)
        write_atomic(path, b"".join(kept))
    except (OSError, TcfError) as exc:
        raise SearchError(f"search.storage: {path} holds a torn record that cannot be set "
                          f"aside ({exc})") from None
    return (f"{path}: set aside {len(junk):,} bytes of {len(torn)} torn record(s) (an append "
            f"cut short by a kill or a full disk) in {side}; every whole record is kept")


def _starts(line: bytes) -> list[int]:
    """Where a record may begin inside a torn line (after the torn start)."""
    out, i = [], line.find(b'{"', 1)
    while i > 0:
        out.append(i)
        i = line.find(b'{"', i + 1)
    return out


def _looks_like_journal(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline(MAX_RECORD_BYTES)
    try:
        doc = json.loads(first)
    except ValueError:
        return False
    return isinstance(doc, dict) and "op_code" in doc


def check_journal(path: Path) -> None:
    """A journal path must be absent, or a regular file holding an Optuna journal."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SearchError(f"search.storage: cannot use journal file {path} "
                          f"({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device or FIFO)"
        raise SearchError(f"search.storage: journal file {path} is {what}")
    if st.st_size and not _looks_like_journal(path):
        raise SearchError(f"search.storage: {path} is not an Optuna journal file; name a new "
                          f"file or an existing journal")


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold a SIGINT or SIGTERM that arrives inside the block and deliver it to the handler in
    place once the block is done (main thread only: Python handles signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []
    kinds = (signal.SIGINT, signal.SIGTERM)
    previous: dict[int, Any] = {
        k: signal.signal(k, lambda sig, frame: pending.append((sig, frame))) for k in kinds}
    try:
        yield
    finally:
        for k in kinds:
            signal.signal(k, previous[k])
        for sig, frame in pending[:1]:
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), sig)


_sigint_deferred = signals_deferred  # the name tests/test_robust_interrupt.py knows


@dataclass(frozen=True, slots=True)
class StorageSpec:
    """Where trials live: a journal file (default: ``study.journal`` in the output folder) or an
    RDB URL (``sqlite:///…``, ``postgresql://…``) shared by many hosts."""

    url: str | None = None
    journal: Path | None = None

    @classmethod
    def parse(cls, url: str | None, out_dir: Path) -> StorageSpec:
        """The storage named on the command line (``--storage``): anywhere the user says,
        relative paths from the working directory."""
        if url is None:
            return cls.confined(None, out_dir)
        if url.startswith("journal:"):
            return cls(journal=Path(url.removeprefix("journal:")))
        if "://" not in url:
            raise SearchError(f"search.storage: must be journal:PATH or an RDB URL such as "
                              f"sqlite:///study.db or postgresql://host/db (got {redact(url)!r})")
        return cls(url=url)

    @classmethod
    def confined(cls, url: str | None, out_dir: Path) -> StorageSpec:
        """The storage a study file names (``search.storage``), or the default: a journal or
        SQLite file inside the result folder, its path relative to it. A study file is shared
        and run unread (``nightly`` runs a folder of them), so it may not write elsewhere, nor
        name a database server (whose URL options can name files): that is ``--storage``."""
        if url is None:
            return cls(journal=_inside(STORAGE_FILE, out_dir, f"journal:{STORAGE_FILE}"))
        if url.startswith("journal:"):
            return cls(journal=_inside(url.removeprefix("journal:"), out_dir, url))
        path = sqlite_file(url)
        if path is None or "?" in url or in_memory(url):
            raise SearchError(
                f"search.storage: a study file may name journal:FILE or sqlite:///FILE inside "
                f"the result folder; give a database server or another place on the command "
                f"line (--storage URL) (got {redact(url)!r})")
        inside = urllib.parse.quote(str(_inside(str(path), out_dir, url).resolve()))
        return cls(url=f"{url.partition('://')[0]}:///{inside}")

    def open(self) -> BaseStorage:
        if self.journal is not None:
            check_journal(self.journal)
            try:
                self.journal.parent.mkdir(parents=True, exist_ok=True)
                return JournalStorage(JournalFile(str(self.journal)))
            except OSError as exc:  # a folder, a file in the way, no permission
                raise SearchError(f"search.storage: cannot use journal file {self.journal} "
                                  f"({exc.strerror or exc})") from None
        assert self.url is not None
        if in_memory(self.url):
            raise SearchError(f"search.storage: {self.url} keeps trials in memory, so nothing "
                              f"could resume the study or share it; use a file "
                              f"(sqlite:///study.db) or the default journal")
        try:
            with quiet():
                return SharedRDB(self.url)
        except Exception as exc:  # SQLAlchemy raises many types; the message says what
            text = (exc.reason if isinstance(exc, StorageFailed) else
                    str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__)
            raise SearchError(f"search.storage: cannot open {self.describe()!r}: "
                              f"{scrub(text, self.url)}") from None

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """One process at a time in the block: a journal serves one command (its run lock)."""
        return contextlib.nullcontext() if self.url is None else exclusive(self.url)

    def describe(self) -> str:
        return str(self.journal) if self.journal is not None else redact(self.url or "")


def _inside(name: str, out_dir: Path, shown: str) -> Path:
    """``name`` as a path inside the result folder (no ``..``, no link out of it)."""
    try:
        return Output(out_dir, "run").path(name)
    except TcfError:
        raise SearchError(f"search.storage: from a study file, must be a file inside the result "
                          f"folder {out_dir}, named relative to it (no absolute path, no .., no "
                          f"link out of it) (got {redact(shown)!r})") from None


_HELD: dict[Path, Any] = {}  # journal file -> its open lock file, while this process runs it


def lock_journal(journal: Path) -> None:
    """One command at a time per journal file: a second one would take the first one's running
    trials for stale and fail them under it. The lock (``flock``, shared with forked workers) is
    dropped by :func:`unlock_journal`, or by the kernel once every holder has exited."""
    import fcntl

    try:
        journal.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SearchError(f"search.storage: cannot create the folder of {journal} "
                          f"({exc.strerror or exc})") from None
    key = journal.resolve()
    if key in _HELD:
        return
    # Not ``<journal>.lock``: Optuna's own append lock takes that name.
    try:
        f = open(key.with_name(key.name + ".run-lock"), "a")  # noqa: SIM115 - held past this
    except OSError as exc:  # a read-only or full folder
        raise SearchError(f"search.storage: cannot lock {journal} "
                          f"({exc.strerror or exc})") from None
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
               fingerprint: str, earlier: str = "") -> optuna.Study:
    """Create or resume the study; refuse storage that holds another study under this name.
    A study fingerprinted the ``earlier`` way (by an older tcf-search) is this one: it takes
    the current fingerprint, and its trials are re-scored (``search.rescore``)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if spec.journal is not None:
        check_journal(spec.journal)  # before the lock file: refuse a file that is no journal
        lock_journal(spec.journal)
        for full in (False, True):
            note = repair_journal(spec.journal, full=full)  # one command holds the journal
            if note:
                print(f"note: {note}", file=sys.stderr)
            try:
                storage = spec.open()
                break
            except ValueError as exc:  # a torn record mid-file (left by an older version)
                if full:
                    raise SearchError(f"search.storage: cannot read {spec.journal} "
                                      f"({exc})") from None
    else:
        storage = spec.open()
    study = optuna.create_study(
        storage=storage, study_name=name, load_if_exists=True,
        directions=[optuna.study.StudyDirection[d.upper()] for d in directions])
    held = study.user_attrs.get(FINGERPRINT_ATTR)
    if held is None or (earlier and held == earlier):
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
    may be shared by live workers on other hosts: only trials whose process has ended on this
    machine, or whose heartbeat stopped, are.
    """
    if spec.journal is None:
        with quiet():
            return fail_dead(study)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    return len(running)


