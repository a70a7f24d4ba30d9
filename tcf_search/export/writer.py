"""The one place exports touch the disk: checked paths, no silent overwrite, atomic writes."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from search.files import write_atomic

from .options import ExportError

EXECUTABLE_SUFFIXES = (".sh", ".sbatch")


class ExportExists(ExportError):
    """Refusing to overwrite existing files without ``force``."""


def _target(root: Path, name: str) -> Path:
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise ExportError(f"export file name must be a relative path inside the output folder, "
                          f"but got {name!r}")
    path = root.joinpath(*rel.parts)
    # resolve() follows symlinks, so a planted link pointing outside is caught too.
    if not path.resolve().is_relative_to(root.resolve()):
        raise ExportError(f"export file {name!r} resolves outside the output folder {root}")
    if path.is_dir():
        raise ExportError(f"export file {name!r} is an existing folder in {root}")
    return path


def write_exports(files: dict[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write ``files`` (relative name -> text) under ``out_dir``. Every name is checked, and
    existing files are refused unless ``force``, before the first write; each file then lands
    whole by temp file + ``os.replace``. Scripts (.sh, .sbatch) are made executable."""
    root = Path(out_dir)
    targets = {name: _target(root, name) for name in files}
    existing = sorted(str(p) for p in targets.values() if p.exists() or p.is_symlink())
    if existing and not force:
        raise ExportExists(f"refusing to overwrite {', '.join(existing)}; pass --force to replace")
    written: list[Path] = []
    for name, text in files.items():
        path = targets[name]
        mode = 0o755 if path.suffix in EXECUTABLE_SUFFIXES else 0o644
        written.append(write_atomic(path, text, mode=mode))
    return written
