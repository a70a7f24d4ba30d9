"""Where a plan to explain comes from: a study file with ``--plan``, or a finished result folder
(``best_plan.yaml`` or ``top/rank-N.yaml``), or one plan file. Each gives the specs the cost
model needs, built the way the search builds them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from costmodel import Plan
from costmodel.errors import TcfError
from search.inputs import (
    MAX_PLAN_FILE_BYTES,
    MIB,
    Specs,
    Study,
    anchor_specs,
    build_specs,
    load_plan_file,
    load_study,
    load_yaml,
    plan_file_specs,
    read_input,
    with_calibration,
)
from tcf_search.explain.planspec import PlanSpecError, check, parse_plan

MAX_RESULT_BYTES = 1024 * MIB  # as report reads result.json
DEFAULT_RUNS_DIR = Path("runs")  # where ``tcf-search run`` writes when -o is not given


class SourceError(TcfError):
    """The study, result folder or plan asked for cannot be found or read."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """One plan with the model, cluster and training it is judged on."""

    name: str  # the study's name
    specs: Specs
    plan: Plan
    origin: str  # "--plan", "rank 1 of runs/x", a plan file path
    study: Study | None = None  # when a study file was given: its baseline and search space
    folder: Path | None = None  # the result folder whose ranking the plan comes from


def is_plan_file(path: Path) -> bool:
    """Whether ``path`` holds a plan file (else it is read as a study). What cannot be read
    here (a FIFO, a device, a huge file) is left to the study reader, which says why."""
    try:
        doc = load_yaml(read_input(path, "STUDY", MAX_PLAN_FILE_BYTES).decode("utf-8"), "STUDY")
    except (TcfError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and "format_version" in doc and "plan" in doc


def ranked_plan_path(result: Path, rank: int | None) -> Path:
    path = result / "best_plan.yaml" if rank is None else result / "top" / f"rank-{rank}.yaml"
    if not path.is_file():
        ranks = sorted((p.stem.removeprefix("rank-") for p in (result / "top").glob("rank-*.yaml")),
                       key=lambda s: int(s) if s.isdigit() else 0)
        raise SourceError(f"--rank: {path} does not exist "
                          f"(ranks available: {', '.join(ranks) or 'none'})")
    return path


def ranked_plan(folder: Path, rank: int | None, specs: Specs, mismatch: str) -> Plan:
    """Plan ``rank`` (None: the best) of a finished study's result folder, checked against the
    study's specs; ``mismatch`` leads the error when the folder's plan does not fit them."""
    pf = load_plan_file(ranked_plan_path(folder, rank))
    try:
        check(pf.plan, specs)
    except PlanSpecError as exc:
        raise SourceError(f"{mismatch}: {exc}") from None
    return pf.plan


def resolve(target: Path, plan_text: str | None, rank: int | None,
            result: Path | None = None, calibration: Path | None = None) -> Subject:
    """The subject named on the command line (see the module docstring); ``calibration``: the
    cluster calibration file to anchor it on (``--calibration``), in place of its own."""
    if plan_text is not None and rank is not None:
        raise SourceError("give --plan or --rank, not both")
    if not target.exists():
        raise SourceError(f"STUDY: no such file or folder: {target}")
    if target.is_dir() or is_plan_file(target):
        path = ranked_plan_path(target, rank) if target.is_dir() else target
        pf = load_plan_file(path)
        specs = anchor_specs(plan_file_specs(pf), calibration)
        if plan_text is not None:
            return Subject(name=pf.study, specs=specs, plan=parse_plan(plan_text, specs),
                           origin="--plan")
        check(pf.plan, specs)
        return Subject(name=pf.study, specs=specs, plan=pf.plan, origin=f"rank {pf.rank} "
                       f"of {path.parent.parent if target.is_dir() and rank else target}",
                       folder=target if target.is_dir() else None)
    study = with_calibration(load_study(target), calibration)
    specs = build_specs(study)
    if plan_text is not None:
        return Subject(name=study.study_name, specs=specs, plan=parse_plan(plan_text, specs),
                       origin="--plan", study=study)
    if rank is None:
        raise SourceError("give the plan to explain: --plan 'tp=8,pp=4,...' or --rank N of a "
                          "finished study (its result folder with --result)")
    folder = result or DEFAULT_RUNS_DIR / target.stem
    if not folder.is_dir():
        raise SourceError(f"--result: {folder} is not a result folder (run the study first, or "
                          f"pass --result DIR)")
    plan = ranked_plan(folder, rank, specs, f"rank {rank} of {folder} does not match {target}")
    return Subject(name=study.study_name, specs=specs, plan=plan,
                   origin=f"rank {rank} of {folder}", study=study, folder=folder)


def ranking_note(folder: Path | None, doing: str = "explained") -> str | None:
    """Why the numbers ``doing`` (explained, compared) may differ from the folder's ranking:
    another cost model ranked it (``result.json``'s ``search.cost_model``) than the one judging
    it now."""
    from search import cost_model_version

    if folder is None:
        return None
    try:
        doc = json.loads(read_input(folder / "result.json", "RESULT", MAX_RESULT_BYTES))
        ranked = doc.get("search", {}).get("cost_model")
    except (TcfError, ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return None  # no readable result.json: nothing says which model ranked the plans
    if not isinstance(ranked, str) or ranked == cost_model_version():
        return None
    return (f"{folder} was ranked by cost model {ranked[:12]}; {doing} under "
            f"{cost_model_version()[:12]} (rerun the study to re-score its trials)")
