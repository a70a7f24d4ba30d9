"""``tcf-search export RESULT --format F [--rank N] [-o DIR] [--force] [--json]`` and the hook
the search pipeline calls when a study has an ``export:`` section."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from search.planfile import PlanFile, PlanFileError, load_plan_file
from search.yamlinput import YamlInputError, load_yaml, shown

from . import FORMATS, render
from .options import ExportError, ExportOptions, ExportRefused
from .writer import write_exports


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportReport:
    plan: str
    rank: int
    out_dir: str
    written: list[str] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _kinds() -> dict[str, tuple[type, bool]]:
    """Per export option: the type of its value and whether it may be None (not given)."""
    defaults = ExportOptions()
    return {f.name: (type(getattr(defaults, f.name)) if getattr(defaults, f.name) is not None
                     else str, "None" in str(f.type)) for f in dataclasses.fields(ExportOptions)}


def _option(key: str, value: Any, kind: type, optional: bool) -> Any:
    where = f"export.options.{key}"
    if value is None:
        if optional:
            return None
        raise ExportError(f"{where} must be given as {kind.__name__}, but got null")
    if kind is str:
        if not isinstance(value, str):
            raise ExportError(f"{where} must be text, but got {shown(value)} (quote it in YAML)")
        return value
    if kind in (int, float):
        if isinstance(value, str):
            try:
                value = kind(value)
            except ValueError:
                raise ExportError(f"{where} must be a number, but got {shown(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ExportError(f"{where} must be a number, but got {shown(value)}")
        if kind is int and not isinstance(value, int):
            if not float(value).is_integer():
                raise ExportError(f"{where} must be an integer, but got {value!r}")
            value = int(value)
        if not math.isfinite(value) or abs(value) >= 2**53:
            raise ExportError(f"{where} must be a finite number below 2**53, but got {value!r}")
        return kind(value)
    return value


def options_from_mapping(raw: Mapping[str, Any] | None) -> ExportOptions:
    """ExportOptions from a study's ``export.options`` mapping; unknown keys, values of the wrong
    type, null for an option that needs a value and numbers that are not finite are errors."""
    raw = dict(raw or {})
    kinds = _kinds()
    unknown = sorted(set(raw) - set(kinds))
    if unknown:
        raise ExportError(f"export.options.{unknown[0]}: unknown key "
                          f"(valid: {', '.join(sorted(kinds))})")
    values = {key: _option(key, value, *kinds[key]) for key, value in raw.items()}
    try:
        return ExportOptions(**values)
    except TypeError as e:
        raise ExportError(f"export.options: {e}") from None


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs. A text option takes VALUE verbatim (``null`` or ``~``: not given);
    a number is read as a YAML scalar (``1000``, ``3e-4``)."""
    kinds = _kinds()
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ExportError(f"--set takes KEY=VALUE, but got {item!r}")
        kind = kinds.get(key, (str, True))[0]
        if value.strip() in ("null", "~", "Null", "NULL"):
            out[key] = None
        elif kind is str or not value.strip():
            out[key] = value
        else:
            try:
                out[key] = load_yaml(value, f"--set {key}")
            except YamlInputError:
                raise ExportError(f"--set {key}: not a number, but got {shown(value)}") from None
    return out


def resolve_plan(result: Path, rank: int | None) -> tuple[Path, PlanFile]:
    """A plan YAML as given, or from a result folder: best_plan.yaml, or top/rank-<N>.yaml."""
    if result.is_file():
        if rank is not None:
            raise ExportError("--rank applies to a result folder, but RESULT is a plan file")
        return result, load_plan_file(result)
    if not result.is_dir():
        raise ExportError(f"RESULT must be a result folder or a plan YAML, but {result} is neither")
    path = result / "best_plan.yaml" if rank is None else result / "top" / f"rank-{rank}.yaml"
    if not path.is_file():
        ranks = sorted(p.stem.removeprefix("rank-") for p in (result / "top").glob("rank-*.yaml"))
        raise ExportError(f"{path} does not exist (ranks available: {', '.join(ranks) or 'none'})")
    return path, load_plan_file(path)


def default_out_dir(result: Path, plan_path: Path, rank: int | None) -> Path:
    if result.is_dir():
        return result / "export" / (f"rank-{rank}" if rank is not None else "best")
    return plan_path.parent / f"export-{plan_path.stem}"


def export_plan(pf: PlanFile, formats: Sequence[str],
                options: ExportOptions) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Rendered files of every format that accepts the plan, and the reasons of those refusing."""
    files: dict[str, str] = {}
    refused: dict[str, list[str]] = {}
    for fmt in formats:
        try:
            files.update(render(fmt, pf, options))
        except ExportRefused as e:
            refused[fmt] = e.reasons
    return files, refused


def _formats(spec: str | Sequence[str]) -> list[str]:
    names = [spec] if isinstance(spec, str) else list(spec)
    if "all" in names:
        names = list(FORMATS)
    for name in names:
        if name not in FORMATS:
            raise ExportError(f"format must be one of {', '.join(FORMATS)} or all, "
                              f"but got {name!r}")
    return names


def export_for_study(result_dir: str | Path, formats: str | Sequence[str],
                     out_dir: str | Path | None = None, force: bool = False,
                     options: ExportOptions | Mapping[str, Any] | None = None,
                     rank: int | None = None) -> ExportReport:
    """Export a finished study's best plan (or ``rank``); refusals are reported, not raised.

    ``out_dir`` defaults to ``<result_dir>/export/best`` (or ``rank-N``); a relative one is
    taken from the current directory, as on the command line."""
    if not isinstance(options, ExportOptions):
        options = options_from_mapping(options)
    result = Path(result_dir)
    plan_path, pf = resolve_plan(result, rank)
    out = Path(out_dir) if out_dir is not None else default_out_dir(result, plan_path, rank)
    files, refused = export_plan(pf, _formats(formats), options)
    written = write_exports(files, out, force) if files else []
    return ExportReport(plan=str(plan_path), rank=pf.rank, out_dir=str(out),
                        written=[str(p) for p in written], refused=refused)


def export_cmd(
    result: Annotated[Path, typer.Argument(help="A study's result folder or a plan YAML.")],
    format: Annotated[str, typer.Option("--format", "-f",
                                        help=f"One of {', '.join(FORMATS)}, or all.")],
    rank: Annotated[int | None, typer.Option("--rank", help="Export top/rank-N.yaml.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
    target_version: Annotated[str | None, typer.Option(
        "--target-version", help="Launcher release: V or FMT=V[,FMT=V] (torchtitan 0.3|0.2, "
        "nanotron main|0.4; megatron 0.16, nemo 0.3, deepspeed 0.19, accelerate 1.15).")] = None,
    launcher: Annotated[str, typer.Option(
        "--launcher", help="Launcher the slurm script runs.")] = "megatron",
    settings: Annotated[list[str] | None, typer.Option(
        "--set", help="Any export option as KEY=VALUE, e.g. titan_module=deepseek_v3.")] = None,
) -> None:
    """Write launcher configs for a plan; a launcher that cannot run it says which rule breaks."""
    try:
        raw: dict[str, Any] = {"target_version": target_version, "slurm_launcher": launcher}
        raw |= parse_settings(settings or [])
        options = options_from_mapping(raw)
        report = export_for_study(result, format, out, force, options, rank)
    except (ExportError, PlanFileError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for path in report.written:
            typer.echo(f"wrote {path}")
        for fmt, reasons in report.refused.items():
            typer.echo(f"refused {fmt}: " + "; ".join(reasons), err=not report.written)
    if not report.written:
        raise typer.Exit(1)

