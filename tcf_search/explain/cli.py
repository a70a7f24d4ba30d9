"""``tcf-search explain STUDY.yaml --plan "tp=8,pp=4,..."`` (or ``--rank N`` of a finished study).

Exit codes: 0 explained (also a plan that does not fit: that is the explanation), 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tcf_search.errors import user_errors


def explain_cmd(
    target: Annotated[Path, typer.Argument(
        help="A study YAML, a result folder, or a plan file.", show_default=False)],
    plan: Annotated[str | None, typer.Option(
        "--plan", help="The plan, e.g. 'tp=8,pp=4,vpp=2,dp=32,mbs=1,recompute=selective,"
                       "zero=1' (dp defaults to what fills the cluster).")] = None,
    rank: Annotated[int | None, typer.Option(
        "--rank", min=1, help="Explain top/rank-N.yaml of a finished study.")] = None,
    result: Annotated[Path | None, typer.Option(
        "--result", help="The study's result folder for --rank [default: runs/<study stem>].")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the verdict line.")
                     ] = False,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Your current plan, shown beside this one with the gain split by "
                           "challenge (overrides the study's baseline).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="Price the cluster's links on this calibration file (tcf-search "
                              "calibrate --nccl-tests -o FILE), in place of the study's.")] = None,
) -> None:
    """Why a plan is as fast as it is: memory, compute, communication, and the change that
    helps most."""
    from tcf_search.explain.analysis import explain, with_baseline
    from tcf_search.explain.render import render
    from tcf_search.explain.source import ranking_note, resolve

    with user_errors():
        subject = resolve(target, plan, rank, result, calibration)
        if note := ranking_note(subject.folder):
            typer.echo(f"note: {note}", err=True)
        doc = with_baseline(explain(subject), subject, baseline)
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
    elif quiet:
        v = doc["verdict"]
        typer.echo(f"{doc['plan_text']}: bound by {v['binding']}; {v['advice']}")
        if doc.get("baseline", {}).get("versus"):
            typer.echo(doc["baseline"]["versus"]["summary"])
    else:
        con = Console(highlight=False)
        render(doc, con if con.is_terminal else Console(width=120, highlight=False))
