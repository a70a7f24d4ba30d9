"""The one output policy of tcf-search, and the one way it reads an input file.

Writing (:class:`Output`, :func:`write_atomic`):

* only regular files, inside the folder a command was given: a device, FIFO, socket, folder or
  symbolic link at a target is refused, never replaced;
* a file is replaced only if this command wrote it before (recorded in the folder's manifest
  ``.tcf-search-files.json``: owner and content hash), or with ``force``;
* whole or not at all: the bytes go to a temporary file beside the target, are flushed to disk
  and replace it in one ``os.replace``; on any exception (a full disk, a signal turned into an
  exception by the command line) the temporary file is removed and the target is left as it was;
* new files get the user's umask (of ``0o666``, or of the ``mode`` asked for), not ``mkstemp``'s
  private 0600;
* an ``OSError`` (a full disk, a read-only folder) is one :class:`OutputError` naming the path.

A file written piece by piece (``predict``'s rows, chunk by chunk) goes through
:func:`open_atomic`, under the same rules: the target appears whole when the block ends, or not
at all.

Reading (:func:`read_input`, or :func:`open_input` to read a file piece by piece): regular files
only (a FIFO is never opened, a device never read), and at most a stated number of bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any

from costmodel.errors import TcfError

MANIFEST = ".tcf-search-files.json"
MIB = 2**20


class OutputError(TcfError):
    """A command cannot write where it was asked to; the message names the path and why."""


class OutputExists(OutputError):
    """A file the command did not write is in the way (pass ``force`` to replace it)."""


class InputError(TcfError):
    """An input file cannot be read: not a regular file, too large, unreadable."""


def _umask_mode(base: int = 0o666) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for a message; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_target(path: Path) -> bool:
    """Whether ``path`` exists; refuse it when it is anything but a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise OutputError(f"refusing to replace {path}: it is {kind}, not a regular file")
    return True


def output_folder(path: Path, what: str = "-o") -> Path:
    """A folder a command may write into: absent (created later) or a folder."""
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what}: {path} exists and is not a folder")
    return path


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` (text is UTF-8, newlines as given) to ``path`` atomically. Refuses a target
    that is not a regular file; an OSError becomes one :class:`OutputError` naming the path."""
    check_target(path)
    raw = _encode(data, path)
    with open_atomic(path, mode=mode) as f:
        f.write(raw)
    return path


class AtomicFile:
    """The temporary file :func:`open_atomic` writes; a failed write is an :class:`OutputError`
    naming the target."""

    def __init__(self, file: IO[bytes], path: Path) -> None:
        self._file, self.path = file, path

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None


@contextmanager
def open_atomic(path: Path, *, mode: int | None = None) -> Iterator[AtomicFile]:
    """A file to write ``path`` piece by piece: its bytes go to a temporary file beside it, which
    replaces ``path`` (flushed to disk, with the umask's mode) when the block ends; on any
    exception, a signal's included, the temporary file is removed and ``path`` left as it was."""
    check_target(path)
    tmp: str | None = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as f:
            yield AtomicFile(f, path)
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        try:
            os.chmod(tmp, _umask_mode(0o666 if mode is None else mode))
            os.replace(tmp, path)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def _encode(data: str | bytes, path: Path) -> bytes:
    try:
        return data.encode("utf-8") if isinstance(data, str) else data
    except UnicodeEncodeError as exc:  # a lone surrogate: text no file can hold
        raise OutputError(f"cannot write {path}: the text is not valid Unicode "
                          f"({exc.reason} at {exc.start})") from None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Output:
    """The files one command (``owner``: ``run``, ``export``, ``report``, ...) writes under one
    folder. Names are relative paths that stay inside it; a file already there is replaced only
    if this owner wrote it (its content is one this owner wrote) or with ``force``; ``adopt``
    takes files already there for this owner's (a result folder from before the manifest)."""

    def __init__(self, root: Path, owner: str, *, force: bool = False,
                 adopt: bool = False) -> None:
        self.root = output_folder(Path(root))
        self.owner = owner
        self.force = force
        self.adopt = adopt
        self._manifest: dict[str, dict[str, object]] | None = None

    # -- paths -------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        rel = PurePosixPath(name)
        if (not name or rel.is_absolute() or ".." in rel.parts or "\\" in name
                or "\x00" in name or rel.name == MANIFEST):
            raise OutputError(f"file name must be a relative path inside the output folder "
                              f"{self.root}, but got {name!r}")
        path = self.root.joinpath(*rel.parts)
        # resolve() follows symlinks, so a planted link pointing outside is caught too.
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise OutputError(f"file {name!r} resolves outside the output folder {self.root}")
        return path

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- the manifest ------------------------------------------------------------------------
    def _entries(self) -> dict[str, dict[str, object]]:
        if self._manifest is None:
            self._manifest = {}
            file = self.root / MANIFEST
            if file.is_file() and not file.is_symlink():
                try:
                    doc = json.loads(read_input(file, "manifest", 16 * MIB))
                    self._manifest = dict(doc.get("files", {}))
                except (TcfError, ValueError, AttributeError):
                    self._manifest = {}  # unreadable: nothing is known to be ours
        return self._manifest

    def _save(self) -> None:
        doc = {"note": "files written by tcf-search commands (owner, sha256); a command "
                       "replaces only its own", "files": self._entries()}
        text = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")
        file = self.root / MANIFEST
        if not (file.is_file() and not file.is_symlink() and file.read_bytes() == text):
            write_atomic(file, text)  # a rerun that changes nothing leaves it alone too

    def owns(self, path: Path) -> bool:
        """Whether ``path`` (absent, or a regular file) holds what this owner wrote there."""
        if not check_target(path):
            return True
        if self.adopt:
            return True
        return self.recorded_owner(path) == self.owner

    def recorded_owner(self, path: Path) -> str | None:
        """The command the manifest records as the writer of ``path`` while the file still
        holds what it wrote; None for any other file (or none at all)."""
        entry = self._entries().get(self._rel(path))
        if not entry or not path.is_file() or path.is_symlink():
            return None
        owner, hashes = entry.get("owner"), entry.get("sha256")
        try:
            ours = isinstance(hashes, list) and _digest(path.read_bytes()) in hashes
        except OSError:
            return None
        return owner if ours and isinstance(owner, str) else None

    def check(self, paths: list[Path]) -> None:
        """Refuse, before anything is written, targets that are not regular files and files
        this owner did not write (unless ``force``)."""
        foreign = [str(p) for p in paths if not self.owns(p)]
        if foreign and not self.force:
            raise OutputExists(f"refusing to overwrite {', '.join(foreign)} (not written by "
                               f"tcf-search {self.owner}); pass --force to replace")

    # -- writing -----------------------------------------------------------------------------
    def write_many(self, files: Mapping[str, str | bytes],
                   modes: Mapping[str, int] | None = None) -> list[Path]:
        """Write ``files`` (relative name -> content): every name checked first, the manifest
        updated before the first write (so a kill mid-way leaves every file this owner's), each
        file whole; a file already holding the content is left untouched."""
        targets = {name: self.path(name) for name in files}
        self.check(list(targets.values()))
        entries = self._entries()
        raw = {n: _encode(d, targets[n]) for n, d in files.items()}
        todo = []
        for name, path in targets.items():
            new = _digest(raw[name])
            old = _digest(path.read_bytes()) if path.is_file() else None
            rel = self._rel(path)
            entries[rel] = {"owner": self.owner,
                            "sha256": [new] + ([old] if old and old != new else [])}
            if old != new:
                todo.append(name)
        self._save()
        for name in todo:
            write_atomic(targets[name], raw[name], mode=(modes or {}).get(name))
        for name, path in targets.items():  # the old content is gone: forget it
            entries[self._rel(path)]["sha256"] = [_digest(raw[name])]
        if todo:
            self._save()
        return list(targets.values())

    def write(self, name: str, data: str | bytes, *, mode: int | None = None) -> Path:
        return self.write_many({name: data}, {name: mode} if mode is not None else None)[0]

    def remove(self, name: str) -> None:
        """Delete a file this owner wrote (one it did not write stays)."""
        path = self.path(name)
        if path.is_file() and not path.is_symlink() and self.owns(path):
            path.unlink()
            self._entries().pop(self._rel(path), None)
            self._save()


def path_component(name: str, what: str) -> str:
    """``name`` as one file-name component, or an error: a study name never becomes a path."""
    bad = (not name or name in (".", "..") or name.startswith(".") or "/" in name
           or "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name))
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise OutputError(f"{what}: must be UTF-8 text (got {name!r})") from None
    if bad or size > 200:
        raise OutputError(f"{what}: cannot be used as a file name: no '/', '\\', control "
                          f"characters or leading '.', at most 200 bytes (got {name[:80]!r})")
    return name


def read_input(path: Path, what: str, limit_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``limit_bytes`` (see :func:`open_input`)."""
    with open_input(path, what, limit_bytes) as f:
        return f.read()


class _Bounded(io.RawIOBase):
    """A file read through to at most ``limit`` bytes: one more is an :class:`InputError`."""

    def __init__(self, file: io.FileIO, path: Path, what: str, limit: int) -> None:
        super().__init__()
        self._file, self._path, self._what = file, path, what
        self._limit = self._left = limit

    def readable(self) -> bool:
        return True

    def tell(self) -> int:  # bytes read so far (the file is read, never sought)
        return self._limit - self._left

    def readinto(self, buffer: Any) -> int:  # a writable buffer (typing's Buffer: 3.12)
        try:
            n = self._file.readinto(buffer)
        except OSError as exc:
            raise InputError(f"{self._what}: cannot read {self._path} "
                             f"({exc.strerror or exc})") from None
        self._left -= n
        if self._left < 0:  # it grew since it was measured
            raise InputError(f"{self._what}: {self._path} is over the limit of "
                             f"{self._limit:,} bytes")
        return int(n)


@contextmanager
def open_input(path: Path, what: str, limit_bytes: int) -> Iterator[IO[bytes]]:
    """A regular file of at most ``limit_bytes``, to read piece by piece. A FIFO is refused
    before it is opened (and opened non-blocking, so one swapped in meanwhile cannot hang the
    read); reading past ``limit_bytes`` (a file that grows) is an :class:`InputError`."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise InputError(f"{what}: {path} is {kind}, not a regular file")
    if st.st_size > limit_bytes:
        raise InputError(f"{what}: {path} is {st.st_size:,} bytes, over the limit of "
                         f"{limit_bytes:,}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        raw = io.FileIO(fd, "rb")
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    with raw, io.BufferedReader(_Bounded(raw, path, what, limit_bytes)) as f:
        if _kind(os.fstat(raw.fileno()).st_mode) is not None:
            raise InputError(f"{what}: {path} is not a regular file")
        yield f
