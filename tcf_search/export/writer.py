"""The one place exports touch the disk: checked paths, no silent overwrite, atomic writes.

The output policy is :class:`search.inputs.files.Output`'s: an export replaces only files an earlier
export wrote (so a rerun re-exports in place), anything else only with ``force``; devices,
FIFOs, folders and symbolic links are never replaced.
"""

from __future__ import annotations

from pathlib import Path

from search.inputs import Output, OutputError, OutputExists

from .options import ExportError

EXECUTABLE_SUFFIXES = (".sh", ".sbatch")


class ExportExists(ExportError):
    """Refusing to overwrite existing files without ``force``."""


def write_exports(files: dict[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write ``files`` (relative name -> text) under ``out_dir``. Every name is checked, and
    files an export did not write are refused unless ``force``, before the first write; each
    file then lands whole by temp file + ``os.replace``. Scripts (.sh, .sbatch) are executable."""
    try:
        out = Output(Path(out_dir), "export", force=force)
        modes = {name: 0o777 if Path(name).suffix in EXECUTABLE_SUFFIXES else 0o666
                 for name in files}
        return out.write_many(files, modes)
    except OutputExists as exc:
        raise ExportExists(str(exc)) from None
    except OutputError as exc:
        raise ExportError(str(exc)) from None
