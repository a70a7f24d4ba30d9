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

import csv
import datetime as dt
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from costmodel.errors import TcfError
from search.files import MIB, Output, path_component, read_input
from search.uncertainty import p_best_faster
from tcf_search.errors import user_errors

COLUMNS = ("date", "study", "sku", "num_gpus", "status", "best_plan", "tokens_per_s_per_gpu",
           "mfu", "step_time_s", "peak_mem_gib", "usable_mem_gib", "dominant_challenge",
           "feasible_count", "trials", "elapsed_s", "error", "cost_model")
# last, so that a table written before it existed keeps its columns' order; its rows read "" here
SHORT_VERSION = 12  # hex digits of the cost-model version a row records, as the CLI notes print
RESULTS_FILE = "results.csv"


class NightlyError(TcfError):
    """Bad nightly input: the message names the option and the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    study: str
    sku: str
    kind: str  # best_plan_changed, throughput_up, throughput_down, no_longer_fits, lost_plan,
    #            failed
    regression: bool
    message: str


@dataclass(kw_only=True)
class Night:
    date: str
    previous: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    reports: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.regression]

    def model_changes(self) -> list[dict[str, Any]]:
        """Per (previous date, previous model, tonight's model), the runs whose cost model
        differs from their previous night's; a previous row that recorded none (written before
        the column existed) says nothing either way."""
        changes: dict[tuple[str, str, str], list[str]] = {}
        for r in self.rows:
            prev = self.previous.get((r["study"], r["sku"]))
            was, now = (prev or {}).get("cost_model") or "", r.get("cost_model") or ""
            if prev is not None and was and now and was != now:
                changes.setdefault((prev["date"], was, now), []).append(
                    f"{r['study']}@{r['sku']}")
        return [{"since": d, "from": was, "to": now, "runs": runs}
                for (d, was, now), runs in sorted(changes.items())]

    def to_dict(self) -> dict[str, Any]:
        return {"date": self.date, "runs": self.rows,
                "findings": [{"study": f.study, "sku": f.sku, "kind": f.kind,
                              "regression": f.regression, "message": f.message}
                             for f in self.findings],
                "regressions": len(self.regressions),
                "cost_model_changes": self.model_changes(),
                "previous_dates": sorted({r["date"] for r in self.previous.values()})}


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


def on_sku(study: Any, sku: str | None) -> Any:
    """The study with its cluster's GPU replaced (a gpu_spec device too)."""
    if sku is None:
        return study
    cluster = study.cluster.model_copy(update={"gpu": sku, "gpu_spec": None})
    return study.model_copy(update={"cluster": cluster})


# ---- the results table ----------------------------------------------------------------------

def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    text = read_input(path, "nightly history", 256 * MIB)
    try:
        rows = list(csv.DictReader(io.StringIO(text.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise NightlyError(f"{path}: not a readable results table ({exc})") from None
    if rows and not {"date", "study", "sku", "status"} <= set(rows[0]):
        raise NightlyError(f"{path}: not a tcf-search nightly results table")
    return rows


def rows_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def previous_rows(rows: list[dict[str, str]], date: str) -> dict[tuple[str, str], dict[str, str]]:
    """Per (study, sku), the latest row dated before ``date``."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for row in sorted(rows, key=lambda r: r["date"]):
        if row["date"] < date:
            out[(row["study"], row["sku"])] = row
    return out


def run_folder(name: str, sku: str) -> str:
    """The run's folder name in the night's folder: the study name and SKU are checked to be
    one file-name component each, never a path."""
    return path_component(f"{name}@{sku}", f"study name {name!r} on {sku}")


# ---- one run ---------------------------------------------------------------------------------

def run_one(study: Any, sku: str, date: str, out: Path, trials: int | None,
            storage: str) -> dict[str, Any]:
    from search import rescore
    from search.pipeline import RunOptions, run_study

    name = study.study_name
    run_dir = out / date / run_folder(name, sku)
    search = study.search.model_copy(update={"study_name": f"{name}@{sku}@{date}"})
    row: dict[str, Any] = {"date": date, "study": name, "sku": sku,
                           "num_gpus": study.cluster.num_gpus, "error": "",
                           "cost_model": rescore.cost_model_version()[:SHORT_VERSION]}
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


def diff(study: Any, row: dict[str, Any], prev: dict[str, str] | None,
         threshold: float) -> list[Finding]:
    """What moved since the previous night for one (study, sku)."""
    if prev is None:
        return []
    s, k = row["study"], row["sku"]
    out: list[Finding] = []

    def add(kind: str, regression: bool, message: str) -> None:
        out.append(Finding(study=s, sku=k, kind=kind, regression=regression, message=message))

    if row["status"] != "ok":
        if prev["status"] == "ok":
            add("lost_plan" if row["status"] == "no_fit" else "failed", True,
                f"found {prev['best_plan']} on {prev['date']}, now {row['status']}"
                + (f": {row['error']}" if row.get("error") else ""))
        elif row["status"] == "error":
            add("failed", True, f"run failed: {row['error']}")
        return out
    if prev["status"] != "ok":
        add("found_plan", False, f"no plan on {prev['date']} ({prev['status']}), now "
                                 f"{row['best_plan']}")
        return out
    old, new = float(prev["tokens_per_s_per_gpu"]), float(row["tokens_per_s_per_gpu"])
    still, old_tonight = rejudge(study, prev["best_plan"])
    if prev["best_plan"] != row["best_plan"]:
        add("best_plan_changed", False, f"best plan {prev['best_plan']} → {row['best_plan']}"
            + (versus(new, old_tonight) if still is None else ""))
    moved = new / old - 1.0 if old else 0.0
    if abs(moved) > threshold:
        add("throughput_down" if moved < 0 else "throughput_up", moved < 0,
            f"predicted tokens/s per GPU {old:,.0f} → {new:,.0f} ({moved:+.1%}, threshold "
            f"±{threshold:.0%})")
    if still is not None:
        add("no_longer_fits", True, f"{prev['best_plan']} fitted on {prev['date']}; {still}")
    return out


def versus(new_tokens: float, old_tokens: float | None) -> str:
    """How surely tonight's best beats the previous best, both judged by tonight's model: the
    share of held-out pairs of runs with that predicted gap the model ordered right."""
    p = p_best_faster(new_tokens, old_tokens) if old_tokens else None
    if p is None or old_tokens is None:
        return ""
    return (f" (tonight predicted {new_tokens / old_tokens - 1:+.1%} over the previous best, "
            f"really faster with P {p:.0%})")


def rejudge(study: Any, plan_text: str) -> tuple[str | None, float | None]:
    """The previous best plan under tonight's model: why it fails (None when it is still valid
    and fits) and its predicted tokens/s per GPU (None when it no longer parses)."""
    from costmodel import estimate
    from search.specs import build_specs
    from tcf_search.explain.planspec import parse_plan

    specs = build_specs(study)
    try:
        plan = parse_plan(plan_text, specs)
    except ValueError as exc:
        return f"it is no longer valid ({exc})", None
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    why = None if e.memory.fits else (f"now it needs {e.memory.peak_bytes / 2**30:.1f} GiB of "
                                      f"{e.memory.usable_bytes / 2**30:.1f} GiB usable")
    return why, e.tokens_per_s_per_gpu


# ---- the night ------------------------------------------------------------------------------

def summary_markdown(night: Night, threshold: float) -> str:
    lines = [f"# tcf-search nightly {night.date}", ""]
    regress = night.regressions
    models = ", ".join(sorted({r["cost_model"] for r in night.rows if r.get("cost_model")}))
    lines.append(f"**{len(regress)} regression(s)**, {len(night.findings) - len(regress)} other "
                 f"change(s) against the previous night (throughput threshold ±{threshold:.0%}"
                 + (f"; cost model {models}" if models else "") + ").")
    for c in night.model_changes():
        lines += ["", f"Cost model changed since {c['since']} ({c['from']} → {c['to']}) for "
                      f"{len(c['runs'])} of {len(night.rows)} run(s): a move in prediction since "
                      f"then is partly the model's; predictions are not comparable to earlier "
                      f"nights without a re-run."]
    lines += ["", "| study | sku | status | best plan | tokens/s/GPU | MFU | peak GiB | "
              "bound by | report |", "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in night.rows:
        report = night.reports.get((r["study"], r["sku"]), "")
        tput = f"{r['tokens_per_s_per_gpu']:,.0f}" if r["status"] == "ok" else ""
        mfu = f"{r['mfu']:.1%}" if r["status"] == "ok" else ""
        mem = (f"{r['peak_mem_gib']:.1f}/{r['usable_mem_gib']:.1f}" if r["status"] == "ok"
               else "")
        lines.append(f"| {r['study']} | {r['sku']} | {r['status']} | `{r.get('best_plan', '')}` "
                     f"| {tput} | {mfu} | {mem} | {r.get('dominant_challenge', '')} | "
                     + (f"[report]({report})" if report else "") + " |")
    if night.findings:
        lines += ["", "## Changes since the previous night", ""]
        for f in night.findings:
            mark = "**REGRESSION**" if f.regression else "change"
            lines.append(f"- {mark} `{f.study}` on `{f.sku}` ({f.kind}): {f.message}")
    errors = [r for r in night.rows if r.get("error")]
    if errors:
        lines += ["", "## Failed runs", ""]
        lines += [f"- `{r['study']}` on `{r['sku']}`: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def run_night(files: list[Path], skus: list[str], out: Path, date: str, *,
              trials: int | None = None, threshold: float = 0.05, report: bool = True,
              storage: str | None = None, progress: Any = None) -> Night:
    from search.study import load_study

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
    for done, (base, target) in enumerate(jobs):
        study = on_sku(base, target)
        row = run_one(study, study.cluster.gpu, date, out, trials, storage)
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
        bar = _Bar(err) if not quiet and err.is_terminal else None
        try:
            night = run_night(files, list(skus or []), output, day, trials=trials,
                              threshold=threshold, report=not no_report, storage=storage,
                              progress=bar.update if bar else None)
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
