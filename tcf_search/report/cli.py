"""``tcf-search report RESULT [-o report.html] [--png-dir DIR]``. Exit 0 written, 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tcf_search.errors import user_errors


def report_cmd(
    result: Annotated[Path, typer.Argument(help="A study's result folder.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="The HTML file [default: RESULT/report.html].")] = None,
    png_dir: Annotated[Path | None, typer.Option(
        "--png-dir", help="Also write each figure as PNG here [default: RESULT/report_png].")
    ] = None,
    no_png: Annotated[bool, typer.Option("--no-png", help="Write no PNG files.")] = False,
    study: Annotated[Path | None, typer.Option(
        "--study", help="The study YAML, for the explain section when its GPU is not in the "
                        "catalog (a gpu_spec study).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace files at the outputs that no report wrote.")] = False,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Your current plan, marked beside the best (overrides the run's "
                           "baseline; judged on --study, else on the best plan's file).")
    ] = None,
) -> None:
    """One self-contained HTML report (and PNG figures) of a finished study."""
    from tcf_search.report.build import build_report

    out = output or result / "report.html"
    pngs = None if no_png else (png_dir or result / "report_png")
    with user_errors():
        files = build_report(result, out, pngs, study, force=force, baseline=baseline)
    if json_out:
        typer.echo(json.dumps(files.to_dict(), indent=2))
    elif not quiet:
        typer.echo(f"wrote {files.html} ({len(files.figures)} figures"
                   + (f", {len(files.pngs)} PNGs in {pngs}" if files.pngs else "") + ")")
        for note in files.notes:
            typer.echo(f"note: {note}", err=True)
