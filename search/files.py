"""The one way tcf-search writes a file: whole or not at all.

The bytes go to a temporary file beside the target, are flushed to disk, and replace the target
in one ``os.replace``; on any exception (a full disk, a signal turned into ``KeyboardInterrupt``)
the temporary file is removed and the target is left as it was. New files get the user's umask
(or the ``mode`` asked for), not ``mkstemp``'s private 0600.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask_mode(base: int = 0o666) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` (text is UTF-8, newlines as given) to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
