"""``tcf-search nightly studies/ --sku h100-sxm-80gb --sku b200-180gb -o history/``

Runs every study on every SKU (the study's ``cluster.gpu`` overridden), appends one dated row per
run to ``history/results.csv``, writes ``history/<date>/summary.md`` and a report per run, and diffs
each run against its previous night: the best plan changed (and how surely tonight's beats the
previous one, both judged tonight: ``search.uncertainty.p_best_faster``), predicted throughput moved
by more than ``--threshold``, the previous best plan no longer fits (re-judged with tonight's model
and catalog), or the run no longer finds a plan. Each row records the cost-model version that scored
it (``search.rescore.cost_model_version``, short form; ``result.json`` holds the full one), and the
summary says where it changed since the previous night: a move in prediction is then partly the
model's, not the study's or the cluster's. All runs share one Optuna storage
(``history/optuna.journal``), one Optuna study per run, browsable in optuna-dashboard.

Exit codes: 0 no regression, 1 a regression or a failed run, 2 bad input.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from search.inputs import Output, path_component
from tcf_search.errors import user_errors
from tcf_search.nightly_history import (
    Night,
    NightlyError,
    diff,
    previous_rows,
    read_rows,
    rows_csv,
    summary_markdown,
)

SHORT_VERSION = 12  # hex digits of the cost-model version a row records, as the CLI notes print
RESULTS_FILE = "results.csv"


# ---- inputs ---------------------------------------------------------------------------------

def study_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise NightlyError(f"STUDIES: {path} is neither a study file nor a folder")
    files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise NightlyError(f"STUDIES: {path} holds no .yaml study files")
    return files


def parse_date(text: str | None) -> str:
    if text is None:
        return dt.date.today().isoformat()
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise NightlyError(f"--date must be YYYY-MM-DD, but got {text!r}") from None


def on_sku(study: Any, sku: str | None, calibration: Path | None = None) -> Any:
    """The study with its cluster's GPU replaced (a gpu_spec device too), anchored on
    ``calibration`` (that SKU's cluster calibration, ``--calibration SKU=FILE``). A study's own
    calibration was measured on its own GPU: it is kept on that GPU only."""
    update: dict[str, Any] = {}
    if sku is not None and sku != study.cluster.gpu:
        update.update(gpu=sku, gpu_spec=None, calibration=None)
    if calibration is not None:
        update["calibration"] = str(calibration.resolve())
    if not update:
        return study
    return study.model_copy(update={"cluster": study.cluster.model_copy(update=update)})


def parse_calibrations(pairs: list[str]) -> dict[str, Path]:
    """``SKU=FILE`` pairs (``--calibration``): each SKU's cluster calibration file (tcf-search
    calibrate --nccl-tests / --measured), checked to load before any run."""
    from costmodel.errors import TcfError
    from hardware_catalog import get_gpu
    from search.inputs import load_calibration

    out: dict[str, Path] = {}
    for pair in pairs:
        sku, sep, file = pair.partition("=")
        if not sep or not sku or not file:
            raise NightlyError(f"--calibration must be SKU=FILE, but got {pair!r}")
        get_gpu(sku)
        if sku in out:
            raise NightlyError(f"--calibration: {sku} is given twice")
        try:
            load_calibration(Path(file))
        except TcfError as exc:  # unreadable, malformed: one line naming the option
            raise NightlyError(f"--calibration {sku}: {exc}") from None
        out[sku] = Path(file)
    return out


def run_folder(name: str, sku: str) -> str:
    """The run's folder name in the night's folder: the study name and SKU are checked to be
    one file-name component each, never a path."""
    return path_component(f"{name}@{sku}", f"study name {name!r} on {sku}")


# ---- one run ---------------------------------------------------------------------------------

def run_one(study: Any, sku: str, date: str, out: Path, trials: int | None,
            storage: str) -> dict[str, Any]:
    from search import RunOptions, cost_model_version, run_study

    name = study.study_name
    run_dir = out / date / run_folder(name, sku)
    search = study.search.model_copy(update={"study_name": f"{name}@{sku}@{date}"})
    row: dict[str, Any] = {"date": date, "study": name, "sku": sku,
                           "num_gpus": study.cluster.num_gpus, "error": "",
                           "cost_model": cost_model_version()[:SHORT_VERSION]}
    started = time.perf_counter()
    try:
        result = run_study(study.model_copy(update={"search": search}),
                           RunOptions(out_dir=run_dir, trials=trials, storage=storage))
    except Exception as exc:  # one broken run must not stop the night; the row says why
        row.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                   elapsed_s=round(time.perf_counter() - started, 2))
        return row
    row.update(feasible_count=result.feasible_count, trials=result.trials,
               elapsed_s=round(result.elapsed_s, 2))
    best = result.best
    if best is None:
        row["status"] = "no_fit"
        return row
    from tcf_search.explain.planspec import format_plan

    m = best.predicted
    row.update(status="ok", best_plan=format_plan(best.plan),
               tokens_per_s_per_gpu=round(m["tokens_per_s_per_gpu"], 3),
               mfu=round(m["mfu"], 5), step_time_s=round(m["step_time_s"], 4),
               peak_mem_gib=round(m["peak_mem_gib"], 3),
               usable_mem_gib=round(m["usable_mem_gib"], 3),
               dominant_challenge=m["dominant_challenge"])
    return row


# ---- the night ------------------------------------------------------------------------------

def run_night(files: list[Path], skus: list[str], out: Path, date: str, *,
              trials: int | None = None, threshold: float = 0.05, report: bool = True,
              storage: str | None = None, progress: Any = None,
              calibrations: dict[str, Path] | None = None) -> Night:
    from search.inputs import load_study

    studies = [load_study(f) for f in files]  # all bad input is reported before any run
    if skus:
        from hardware_catalog import get_gpu

        for sku in skus:
            get_gpu(sku)
    history = Output(out, "nightly")
    for study in studies:
        for sku in skus or [study.cluster.gpu]:
            run_folder(study.study_name, sku)
    table = out / RESULTS_FILE
    old = read_rows(table)
    history.adopt = bool(old)  # a results table of a nightly history: the folder is nightly's
    night = Night(date=date, previous=previous_rows(old, date))
    storage = storage or f"journal:{out / 'optuna.journal'}"
    targets: list[str | None] = list(skus) if skus else [None]
    jobs = [(s, k) for s in studies for k in targets]
    calibrations = calibrations or {}
    for done, (base, target) in enumerate(jobs):
        study = on_sku(base, target, calibrations.get(target or base.cluster.gpu))
        row = run_one(study, study.cluster.gpu, date, out, trials, storage)
        row["calibration"] = Path(study.cluster.calibration).name if study.cluster.calibration \
            else ""
        night.rows.append(row)
        key = (row["study"], row["sku"])
        night.findings += diff(study, row, night.previous.get(key), threshold)
        run_dir = out / date / run_folder(row["study"], row["sku"])
        if report and row["status"] == "ok":
            night.reports[key] = _report(run_dir, out / date)
        if progress is not None:
            progress(done + 1, len(jobs))
    ran = {(r["study"], r["sku"]) for r in night.rows}
    kept = [r for r in old if not (r["date"] == date and (r["study"], r["sku"]) in ran)]
    history.write_many({
        RESULTS_FILE: rows_csv(kept + night.rows),
        f"{date}/summary.md": summary_markdown(night, threshold),
        f"{date}/summary.json": json.dumps(night.to_dict(), indent=2) + "\n"})
    return night


def _report(run_dir: Path, night_dir: Path) -> str:
    from tcf_search.report.build import build_report

    try:
        build_report(run_dir, run_dir / "report.html")
    except (ValueError, ImportError):
        return ""
    return str((run_dir / "report.html").relative_to(night_dir))


def nightly_cmd(
    studies: Annotated[Path, typer.Argument(help="A folder of study YAMLs (or one study).",
                                            show_default=False)],
    skus: Annotated[list[str] | None, typer.Option(
        "--sku", help="Run each study on this catalog SKU; repeat for more [default: each "
                      "study's own GPU].")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The history folder.")
                      ] = Path("history"),
    date: Annotated[str | None, typer.Option(
        "--date", help="The night's date, YYYY-MM-DD [default: today].")] = None,
    trials: Annotated[int | None, typer.Option(
        "--trials", min=1, help="Trials per run [study: search.trials].")] = None,
    threshold: Annotated[float, typer.Option(
        "--threshold", min=0.0, help="Relative throughput move that counts as a change.")
    ] = 0.05,
    storage: Annotated[str | None, typer.Option(
        "--storage", help="Optuna storage shared by all runs [default: "
                          "journal:<output>/optuna.journal].")] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the HTML reports.")
                         ] = False,
    calibration: Annotated[list[str] | None, typer.Option(
        "--calibration", help="SKU=FILE: that SKU's cluster calibration (calibrate "
                              "--nccl-tests / --measured); repeat per SKU.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary, no progress.")
                     ] = False,
) -> None:
    """Run every study on every SKU, record the night, and flag regressions (exit 1)."""
    from rich.console import Console

    err = Console(stderr=True)
    with user_errors():
        files = study_files(studies)
        day = parse_date(date)
        anchors = parse_calibrations(list(calibration or []))
        bar = _Bar(err) if not quiet and err.is_terminal else None
        try:
            night = run_night(files, list(skus or []), output, day, trials=trials,
                              threshold=threshold, report=not no_report, storage=storage,
                              progress=bar.update if bar else None, calibrations=anchors)
        finally:
            if bar is not None:
                bar.close()
    if json_out:
        typer.echo(json.dumps(night.to_dict(), indent=2))
    elif not quiet:
        typer.echo((output / day / "summary.md").read_text(encoding="utf-8"))
    failed = any(r["status"] == "error" for r in night.rows)
    if night.regressions or failed:
        raise typer.Exit(1)


class _Bar:
    """A progress bar over the runs of the night, on stderr."""

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.progress = Progress("nightly", BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.progress.start()
        self.task = self.progress.add_task("runs", total=None)

    def update(self, done: int, total: int) -> None:
        self.progress.update(self.task, completed=done, total=total)

    def close(self) -> None:
        self.progress.stop()
