"""What a report reads from a finished result folder: ``result.json`` and ``trials.csv``."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.errors import TcfError
from search.files import MIB, InputError, read_input

MAX_RESULT_BYTES = 1024 * MIB


class ReportError(TcfError):
    """The result folder cannot be reported on; the message names the file and the rule."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    number: int
    state: str
    value: float | None  # the primary objective
    tokens_per_s_per_gpu: float | None
    peak_mem_gib: float | None
    usable_mem_gib: float | None
    tp: int | None
    pp: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultData:
    folder: Path
    result: dict[str, Any]
    trials: list[Trial]

    @property
    def top(self) -> list[dict[str, Any]]:
        return list(self.result.get("top") or [])

    @property
    def baseline(self) -> dict[str, Any] | None:
        """The user's recipe (``search.baseline.baseline_doc``), when the run had one."""
        doc = self.result.get("baseline")
        return doc if isinstance(doc, dict) and "figures" in doc and "plan" in doc else None

    @property
    def cost_model(self) -> str | None:
        """The version of the cost model that scored the trials (``search.rescore``), when the
        result records it."""
        version = (self.result.get("search") or {}).get("cost_model")
        return version if isinstance(version, str) else None

    @property
    def usable_gib(self) -> float | None:
        for row in self.top:
            return float(row["predicted"]["usable_mem_gib"])
        for t in self.trials:
            if t.usable_mem_gib is not None:
                return t.usable_mem_gib
        return None

    @property
    def headroom_gib(self) -> float:
        return float((self.result.get("objective") or {}).get("memory_headroom_gib") or 0.0)


def _float(raw: str | None) -> float | None:
    if raw in (None, ""):
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _int(raw: str | None) -> int | None:
    value = _float(raw)
    return None if value is None else int(value)


def read_trials(path: Path) -> list[Trial]:
    if not path.exists():
        return []
    try:
        text = read_input(path, "RESULT", MAX_RESULT_BYTES).decode("utf-8")
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (InputError, UnicodeDecodeError, csv.Error) as exc:
        raise ReportError(f"{path}: not a readable trials table ({exc})") from None
    out = []
    for row in rows:
        number = _int(row.get("number"))
        if number is None:
            continue
        out.append(Trial(number=number, state=row.get("state") or "",
                         value=_float(row.get("value_0")),
                         tokens_per_s_per_gpu=_float(row.get("tokens_per_s_per_gpu")),
                         peak_mem_gib=_float(row.get("peak_mem_gib")),
                         usable_mem_gib=_float(row.get("usable_mem_gib")),
                         tp=_int(row.get("tp")), pp=_int(row.get("pp"))))
    return sorted(out, key=lambda t: t.number)


def load_result(folder: Path) -> ResultData:
    path = folder / "result.json"
    if not folder.is_dir():
        raise ReportError(f"RESULT: {folder} is not a folder (give a study's result folder)")
    if not path.exists():
        raise ReportError(f"RESULT: {path} is missing (run the study first)")
    try:
        result = json.loads(read_input(path, "RESULT", MAX_RESULT_BYTES).decode("utf-8"))
    except InputError as exc:
        raise ReportError(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReportError(f"{path}: not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(result, dict) or "cells" not in result or "top" not in result:
        raise ReportError(f"{path}: not a tcf-search result (needs keys top and cells)")
    return ResultData(folder=folder, result=result, trials=read_trials(folder / "trials.csv"))
