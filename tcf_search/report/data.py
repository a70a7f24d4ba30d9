"""What a report reads from a finished result folder: ``result.json`` and ``trials.csv``, each
validated on load by :mod:`tcf_search.report.schema` (a broken field is one line naming it)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from costmodel.errors import TcfError
from search.files import MIB, InputError, read_input
from tcf_search.report.schema import Baseline, Ranked, Result, TrialRow, one_line

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
    result: Result
    trials: list[Trial]

    @property
    def top(self) -> list[Ranked]:
        return self.result.top

    @property
    def baseline(self) -> Baseline | None:
        """The user's recipe (``search.baseline.baseline_doc``), when the run had one."""
        return self.result.baseline

    @property
    def cost_model(self) -> str | None:
        """The version of the cost model that scored the trials (``search.rescore``), when the
        result records it."""
        return self.result.search.cost_model

    @property
    def usable_gib(self) -> float | None:
        for row in self.top:
            return row.predicted.usable_mem_gib
        for t in self.trials:
            if t.usable_mem_gib is not None:
                return t.usable_mem_gib
        return None

    @property
    def headroom_gib(self) -> float:
        return self.result.objective.memory_headroom_gib


def _cell(raw: str | None) -> int | float | str | None:
    """A CSV cell as the number it spells (the schema judges it), None when empty."""
    if raw is None or raw == "":
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def read_trials(path: Path) -> list[Trial]:
    if not path.exists():
        return []
    try:
        text = read_input(path, "RESULT", MAX_RESULT_BYTES).decode("utf-8")
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (InputError, UnicodeDecodeError, csv.Error) as exc:
        raise ReportError(f"{path}: not a readable trials table ({exc})") from None
    out = []
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        try:
            t = TrialRow.model_validate({k: _cell(row.get(k)) for k in TrialRow.model_fields})
        except ValidationError as exc:
            raise ReportError(f"{path}: line {line}: {one_line(exc)}") from None
        out.append(Trial(number=t.number, state=t.state, value=t.value_0,
                         tokens_per_s_per_gpu=t.tokens_per_s_per_gpu,
                         peak_mem_gib=t.peak_mem_gib, usable_mem_gib=t.usable_mem_gib,
                         tp=t.tp, pp=t.pp))
    return sorted(out, key=lambda t: t.number)


def load_result(folder: Path) -> ResultData:
    path = folder / "result.json"
    if not folder.is_dir():
        raise ReportError(f"RESULT: {folder} is not a folder (give a study's result folder)")
    if not path.exists():
        raise ReportError(f"RESULT: {path} is missing (run the study first)")
    try:
        doc = json.loads(read_input(path, "RESULT", MAX_RESULT_BYTES).decode("utf-8"))
    except InputError as exc:
        raise ReportError(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReportError(f"{path}: not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(doc, dict) or "cells" not in doc or "top" not in doc:
        raise ReportError(f"{path}: not a tcf-search result (needs keys top and cells)")
    try:
        result = Result.model_validate(doc)
    except ValidationError as exc:
        raise ReportError(f"{path}: {one_line(exc)}") from None
    return ResultData(folder=folder, result=result, trials=read_trials(folder / "trials.csv"))


def with_baseline(data: ResultData, doc: dict[str, object]) -> ResultData:
    """``data`` with the baseline ``--baseline`` gave (a ``search.baseline.baseline_doc``)."""
    baseline = Baseline.model_validate(doc)
    return ResultData(folder=data.folder, trials=data.trials,
                      result=data.result.model_copy(update={"baseline": baseline}))
