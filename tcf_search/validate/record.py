"""Write validation results into a study's result folder: ``validation.csv`` and the study's
Optuna storage.

Optuna refuses to change a finished trial (its storages raise ``UpdateFinishedTrialError``), so
the measured values go into *study* user attributes, one per validated plan, keyed
``validation/rank-<N>`` and naming the trial the plan came from; ``validation/summary`` holds
the rank agreement.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from search.files import write_atomic
from tcf_search.validate.agreement import Row

CSV_NAME = "validation.csv"


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_csv(folder: Path, rows: Sequence[Row]) -> Path:
    """Rewrite ``validation.csv`` atomically (a reader never sees half a file)."""
    buf = io.StringIO()
    dicts = [r.to_dict() for r in rows]
    fields = list(dicts[0]) if dicts else list(Row.__dataclass_fields__)
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(dicts)
    return write_atomic(folder / CSV_NAME, buf.getvalue())


def read_csv(folder: Path) -> list[dict[str, str]]:
    with (folder / CSV_NAME).open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def study_storage(folder: Path) -> tuple[str, Any] | None:
    """(study name, storage) of the study in ``folder``, or None when it has none we can open.
    Only a journal or SQLite file inside the folder: a result folder may come from someone else,
    and what its ``result.json`` names is opened as the user (a SQLite URL creates its file, a
    server URL's options can name files), so nothing outside the folder is opened."""
    result = folder / "result.json"
    if not result.exists():
        return None
    search = json.loads(result.read_text()).get("search", {})
    name, url = search.get("study_name"), str(search.get("storage", ""))
    if not name or not url:
        return None
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from search.rdb import in_memory, sqlite_file

    if "://" in url:
        path = sqlite_file(url)
        if path is None or in_memory(url) or "?" in url or not _inside(path, folder):
            return None
        return name, optuna.storages.RDBStorage(f"sqlite:///{quote(str(path.resolve()))}")
    path = Path(url) if Path(url).is_absolute() else folder / Path(url).name
    if not _inside(path, folder):
        return None
    return name, JournalStorage(JournalFileBackend(str(path)))


def _inside(path: Path, folder: Path) -> bool:
    """An existing regular file inside ``folder`` (no link out of it)."""
    return path.is_file() and path.resolve().is_relative_to(folder.resolve())


def record_in_study(folder: Path, rows: Sequence[Row], summary: dict[str, Any]) -> str:
    """Store the rows as study user attributes; returns where they went, or why not."""
    try:
        found = study_storage(folder)
        if found is None:
            return "no Optuna storage found in the folder; validation.csv only"
        import optuna

        name, storage = found
        study = optuna.load_study(study_name=name, storage=storage)
        for row in rows:
            study.set_user_attr(f"validation/rank-{row.rank}",
                                {k: _finite(v) for k, v in row.to_dict().items()})
        study.set_user_attr("validation/summary", {k: _finite(v) for k, v in summary.items()})
    except Exception as exc:  # noqa: BLE001 - the CSV is written either way; say why not here
        return f"study storage not updated: {type(exc).__name__}: {exc}"
    return f"study {name!r} user attributes validation/rank-<N>, validation/summary"
