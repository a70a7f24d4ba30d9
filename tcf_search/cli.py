"""The ``tcf-search`` command line.

``tcf-search STUDY.yaml`` is ``tcf-search run STUDY.yaml``. Exit codes: 0 done (also when no
layout fits: the answer then lists the nearest misses), 1 failure, 2 bad input (one line on
stderr, no traceback), 130 interrupted by Ctrl-C, 143 by SIGTERM (rerun the same command to
resume). SIGTERM is raised as :class:`Terminated` (a ``KeyboardInterrupt``) where the process
is, so every cleanup runs: no temporary file is left behind.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

try:  # Ctrl-C while the commands load (up to a second) is an interruption, not a traceback
    import typer
    from rich.console import Console

    from tcf_search.calibration.predict import predict_cmd
    from tcf_search.compare import compare_cmd
    from tcf_search.errors import TcfError, one_line
    from tcf_search.explain import explain_cmd
    from tcf_search.export.cli import export_cmd
    from tcf_search.nightly import nightly_cmd
    from tcf_search.report import report_cmd
    from tcf_search.validate.cli import calibrate_cmd, validate_cmd
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    raise SystemExit(130) from None

DEFAULT_RUNS_DIR = Path("runs")

app = typer.Typer(name="tcf-search", no_args_is_help=True, add_completion=True,
                  pretty_exceptions_enable=False,
                  help="For this model, on this cluster, which distributed-training "
                       "configuration trains fastest — and why?")
catalog_app = typer.Typer(no_args_is_help=True, help="The hardware catalog.")
app.add_typer(catalog_app, name="catalog")


def version() -> str:
    try:
        return metadata.version("tcf-search")
    except metadata.PackageNotFoundError:
        return "0.1.0+source"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tcf-search {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    """For this model, on this cluster, which training configuration is fastest, and why."""


@app.command("run")
def run_cmd(
    study_file: Annotated[Path, typer.Argument(help="The study YAML.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Result folder (default: runs/<study file stem>).")] = None,
    trials: Annotated[int | None, typer.Option(
        "--trials", min=1,
        help="COMPLETE trials the study must hold (default: search.trials).")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, help="Worker processes on one storage (default: search.workers).")
    ] = None,
    storage: Annotated[str | None, typer.Option(
        "--storage", help="journal:PATH or an RDB URL (default: <output>/study.journal).")
    ] = None,
    exhaustive: Annotated[bool, typer.Option(
        "--exhaustive", help="Also evaluate every feasible plan; report Optuna's regret.")
    ] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print the result document as JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No table, no progress.")] = False,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Your current plan, e.g. 'tp=4,pp=4,mbs=1,recompute=selective,zero=1'"
                           ", shown beside the best (overrides the study's baseline).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="Anchor the cluster's links on this calibration file (tcf-search "
                              "calibrate --nccl-tests -o FILE), in place of "
                              "cluster.calibration.")] = None,
) -> None:
    """Run a study (resumes when the output folder already holds it)."""
    from search import RunOptions, run_study
    from search.inputs import load_study, with_calibration

    study = with_calibration(load_study(study_file), calibration)
    options = RunOptions(out_dir=output or DEFAULT_RUNS_DIR / study_file.stem, trials=trials,
                         workers=workers, storage=storage, exhaustive=exhaustive,
                         baseline=baseline)
    err = Console(stderr=True)
    try:
        with _progress(err, enabled=not quiet and err.is_terminal) as progress:
            result = run_study(study, options, export=_export_hook, progress=progress)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: run the same command again to resume the study in "
                   f"{options.out_dir}", err=True)
        raise typer.Exit(130) from None
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif not quiet:
        from search import render

        # A pipe gets the full table rather than one cut to 80 columns.
        render(result, Console() if sys.stdout.isatty() else Console(width=180))


def _export_hook(out_dir: Path, section: Any) -> Any:
    from tcf_search.export.cli import export_for_study

    target = out_dir / section.output if section.output else None
    return export_for_study(out_dir, section.formats, target, section.force,
                            dict(section.options), section.rank)


class _progress:
    """A rich progress bar on stderr for long tasks; a no-op when disabled."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.enabled = enabled
        self.console = console
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Any:
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                            transient=True)
        self.bar.__enter__()
        return self.update

    def update(self, task: str, done: int, total: int) -> None:
        if task not in self.tasks:
            self.tasks[task] = self.bar.add_task(task, total=total)
        self.bar.update(self.tasks[task], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.__exit__(None, None, None)


@catalog_app.command("list")
def catalog_list(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The SKU ids of the hardware catalog."""
    from hardware_catalog import load_catalog

    gpus = load_catalog()
    if json_out:
        typer.echo(json.dumps({i: g.name for i, g in gpus.items()}, indent=2))
        return
    for gpu_id, gpu in sorted(gpus.items()):
        typer.echo(f"{gpu_id:22s} {gpu.name}")


@catalog_app.command("show")
def catalog_show(
    sku: Annotated[str, typer.Argument(help="A catalog SKU id.", show_default=False)],
) -> None:
    """One SKU's numbers, as JSON, with the source of each (``sources``)."""
    import dataclasses

    from hardware_catalog import get_gpu, sources

    typer.echo(json.dumps({**dataclasses.asdict(get_gpu(sku)), "sources": sources(sku)},
                          indent=2))


# Commands of other areas, one line each.
app.command("export")(export_cmd)
app.command("predict")(predict_cmd)
app.command("validate")(validate_cmd)
app.command("calibrate")(calibrate_cmd)
app.command("explain")(explain_cmd)
app.command("compare")(compare_cmd)
app.command("report")(report_cmd)
app.command("nightly")(nightly_cmd)


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """``name`` from click and from the copy of click that newer typer releases vendor (click
    itself is then not installed)."""
    import importlib

    found: list[type[BaseException]] = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


_CLICK_ERRORS = _click_classes("ClickException")
_ABORTS = _click_classes("Abort")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that cleanups run as for Ctrl-C."""


@contextlib.contextmanager
def _signals_raise() -> Iterator[list[int]]:
    """SIGINT raises KeyboardInterrupt (as by default) and SIGTERM :class:`Terminated`; the
    signals that came are listed, so that an error they caused (a C extension's import turns
    KeyboardInterrupt into ImportError) still reads as the interruption it is."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append(signum)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, old in previous.items():
        if old in (signal.SIG_DFL, signal.default_int_handler):  # not one ignored on purpose
            signal.signal(s, handler)
    try:
        yield got
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0].endswith((".yaml", ".yml")):
        args.insert(0, "run")
    with _signals_raise() as signals:
        try:
            code = _main(args)
        except Exception:
            if not signals:
                raise
            code = 130
            typer.echo("interrupted: rerun the same command to resume from the output folder",
                       err=True)
    if signal.SIGTERM in signals:
        return 128 + signal.SIGTERM
    return 130 if signals else code


def _main(args: list[str]) -> int:
    try:
        code = app(args=args, prog_name="tcf-search", standalone_mode=False)
    except _CLICK_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    except (*_ABORTS, KeyboardInterrupt):  # type: ignore[misc]
        typer.echo("interrupted: rerun the same command to resume from the output folder",
                   err=True)
        return 130
    except TcfError as exc:  # bad input (or a failed storage, exit 1): one line, no traceback
        typer.echo(f"error: {one_line(exc)}", err=True)
        return int(getattr(exc, "exit_code", 2))
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
