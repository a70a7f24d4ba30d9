"""``tcf-search compare STUDY.yaml --base PLAN --with recompute=full --with tp=8 ...``

The framework's trade-off table computed for one model and cluster: for each technique (one or
more knobs changed from the base plan), the change in every challenge — memory by component on
the peak stage, compute time and utilisation, communication volume and exposed time, the bubble,
and tokens/s. A technique that breaks validity is repaired the way ``explain`` repairs its
neighbours (dp keeps the world size, ...) and the table says what moved.

Exit codes: 0 compared, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from costmodel import Plan, StepEstimate, estimate
from costmodel.specs import SpecError
from search import baseline_doc, baseline_of, build_space, calibration_status, p_best_faster
from search.inputs import Specs, build_specs, load_study, plan_dict, with_calibration
from tcf_search.errors import user_errors
from tcf_search.explain.planspec import (
    PlanSpecError,
    apply_change,
    format_plan,
    parse_assignments,
    parse_plan,
)

GIB = 2**30
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "buffers")


def measures(e: StepEstimate) -> dict[str, float]:
    """What the table compares, for one plan (memory on its peak stage)."""
    peak = e.memory.peak
    out = {f"mem_{p}_gib": getattr(peak, f"{p}_bytes") / GIB for p in MEMORY_PARTS[:-1]}
    out["mem_buffers_gib"] = (peak.buffers_bytes + peak.overhead_bytes) / GIB
    out.update(peak_mem_gib=e.memory.peak_bytes / GIB, compute_s=e.compute.time_s,
               mfu=e.mfu, hfu=e.hfu, comm_gib=sum(c.bytes for c in e.collectives) / GIB,
               comm_exposed_s=e.comm_exposed_s, bubble_s=e.bubble_time_s,
               step_time_s=e.step_time_s, tokens_per_s_per_gpu=e.tokens_per_s_per_gpu)
    return out


def _relative(new: float, old: float) -> float | None:
    if old == 0:
        return None if new == 0 else float("inf")
    return new / old - 1.0


# (measure, label in the summary sentence); utilisation differences are in points, not %
SENTENCE = (("mem_activations_gib", "activations"), ("mem_weights_gib", "weights"),
            ("mem_optimizer_gib", "optimizer states"), ("mem_grads_gib", "gradients"),
            ("peak_mem_gib", "peak memory"), ("compute_s", "compute"),
            ("comm_gib", "comm volume"), ("comm_exposed_s", "exposed comm"),
            ("bubble_s", "bubble"), ("tokens_per_s_per_gpu", "tokens/s"))


def _sentence(label: str, deltas: dict[str, dict[str, Any]]) -> str:
    parts = []
    for key, name in SENTENCE:
        rel = deltas[key]["relative"]
        if rel is None or abs(deltas[key]["absolute"]) < 1e-9:
            continue
        if rel == float("inf"):
            parts.append(f"{name} appears")
        elif abs(rel) >= 0.005 or key == "tokens_per_s_per_gpu":
            parts.append(f"{name} {rel:+.0%}".replace("-", "−"))
    return f"{label}: " + ", ".join(parts)


DEGREES = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch")


def _check_degrees(change: dict[str, Any]) -> None:
    """A degree or micro-batch a technique sets is a positive integer below 2**53 (the repair
    divides by them), checked by the plan's own rule before any repair."""
    for key in DEGREES:
        if key in change:
            try:
                Plan(**{"tp": 2, "pp": 2, key: change[key]})
            except SpecError as exc:
                raise PlanSpecError(str(exc)) from None


def _row(label: str, plan: Plan, notes: list[str], specs: Specs, m0: dict[str, float]
         ) -> dict[str, Any]:
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    m = measures(e)
    deltas = {k: {"value": m[k], "absolute": m[k] - m0[k], "relative": _relative(m[k], m0[k])}
              for k in m}
    # how surely the technique is really faster than the base (held-out pairs this close)
    p = p_best_faster(m["tokens_per_s_per_gpu"], m0["tokens_per_s_per_gpu"])
    summary = _sentence(label, deltas)
    if p is not None and m["tokens_per_s_per_gpu"] != m0["tokens_per_s_per_gpu"]:
        summary += f" (really faster with P {p:.0%})"
    return {"technique": label, "plan": plan_dict(plan),
            "plan_text": format_plan(plan), "adjusted": notes,
            "fits": e.memory.fits, "binding": e.dominant_challenge,
            "deltas": deltas, "p_faster": p, "summary": summary}


def compare(specs: Specs, base: Plan, techniques: list[str],
            baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The comparison document: the base, then one row per technique; with ``baseline``
    (:func:`search.baseline.baseline_doc` against the base), the baseline's row too."""
    e0 = estimate(specs.model, specs.cluster, base, specs.training)
    m0 = measures(e0)
    rows = []
    for text in techniques:
        change = parse_assignments(text)
        try:
            _check_degrees(change)
            plan, notes = apply_change(base, change, specs)
        except PlanSpecError as exc:
            raise PlanSpecError(f"--with {text}: {exc}") from None
        rows.append(_row(text, plan, notes, specs, m0))
    doc = {"model": specs.model.name, "gpu": specs.cluster.gpu.id,
           "num_gpus": specs.cluster.num_gpus, "usable_gib": e0.memory.usable_bytes / GIB,
           "base": {"plan": plan_dict(base), "plan_text": format_plan(base),
                    "fits": e0.memory.fits, "binding": e0.dominant_challenge, "values": m0},
           "techniques": rows, "calibration": calibration_status(specs.cluster)}
    if baseline is not None:
        plan = Plan(**baseline["plan"])
        doc["baseline"] = {**baseline, "row": _row("baseline", plan, [], specs, m0)}
    return doc


COLUMNS = (("weights", "mem_weights_gib"), ("grads", "mem_grads_gib"),
           ("optim", "mem_optimizer_gib"), ("activ", "mem_activations_gib"),
           ("buffers", "mem_buffers_gib"), ("peak mem", "peak_mem_gib"),
           ("compute", "compute_s"), ("MFU", "mfu"), ("comm vol", "comm_gib"),
           ("exposed", "comm_exposed_s"), ("bubble", "bubble_s"),
           ("tokens/s", "tokens_per_s_per_gpu"))
# Lower is better for these; the rest (MFU, tokens/s) higher is better. Colours only.
LOWER_BETTER = {"mem_weights_gib", "mem_grads_gib", "mem_optimizer_gib", "mem_activations_gib",
                "mem_buffers_gib", "peak_mem_gib", "compute_s", "comm_gib", "comm_exposed_s",
                "bubble_s"}


def _cell(key: str, d: dict[str, Any]) -> str:
    if key == "mfu":
        text = f"{d['absolute'] * 100:+.1f} pt"
    elif d["relative"] is None or abs(d["absolute"]) < 1e-9:
        return "[dim]·[/dim]"
    elif d["relative"] == float("inf"):
        text = "new"
    else:
        text = f"{d['relative']:+.0%}"
    if abs(d["absolute"]) < 1e-9:
        return "[dim]·[/dim]"
    good = (d["absolute"] < 0) == (key in LOWER_BETTER)
    return f"[green]{text}[/green]" if good else f"[red]{text}[/red]"


def render(doc: dict[str, Any], con: Console) -> None:
    b = doc["base"]["values"]
    con.print(f"[bold]compare[/bold] on {doc['model']}, {doc['num_gpus']}× {doc['gpu']} "
              f"({doc['usable_gib']:.1f} GiB usable)")
    con.print(f"base [bold]{doc['base']['plan_text']}[/bold]: {b['tokens_per_s_per_gpu']:,.0f} "
              f"tokens/s/GPU, peak {b['peak_mem_gib']:.1f} GiB, MFU {b['mfu']:.1%}, "
              f"compute {b['compute_s']:.1f} s, comm {b['comm_gib']:.0f} GiB "
              f"({b['comm_exposed_s']:.1f} s exposed), bubble {b['bubble_s']:.1f} s")
    if doc.get("calibration"):
        con.print(doc["calibration"]["line"], markup=False)
    t = Table(show_edge=False, header_style="bold", pad_edge=False,
              title="change vs base (memory on the peak stage, per GPU per step)")
    t.add_column("technique")
    for label, _ in COLUMNS:
        t.add_column(label, justify="right")
    t.add_column("fits")
    baseline = doc.get("baseline")
    for row in [*([baseline["row"]] if baseline else []), *doc["techniques"]]:
        t.add_row(row["technique"], *(_cell(k, row["deltas"][k]) for _, k in COLUMNS),
                  "yes" if row["fits"] else "[red]no[/red]")
    con.print(t)
    for row in doc["techniques"]:
        con.print(f"  {row['summary']}")
        if row["adjusted"]:
            con.print(f"    [dim]to stay valid: {'; '.join(row['adjusted'])} → "
                      f"{row['plan_text']}[/dim]")
    for line in baseline["lines"] if baseline else []:
        con.print(f"  {line}", markup=False, soft_wrap=True)


def compare_cmd(
    study_file: Annotated[Path, typer.Argument(help="The study YAML.", show_default=False)],
    base: Annotated[str | None, typer.Option(
        "--base", help="The base plan, e.g. 'tp=4,pp=4,mbs=1,recompute=selective,zero=1' "
                       "[default: the best plan of the finished study, see --result].",
        show_default=False)] = None,
    techniques: Annotated[list[str] | None, typer.Option(
        "--with", help="A technique: knob=value[,knob=value]; repeat for more.",
        show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the summary lines.")
                     ] = False,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Your current plan, shown beside the base with the gain split by "
                           "challenge (overrides the study's baseline).")] = None,
    result: Annotated[Path | None, typer.Option(
        "--result", help="The study's result folder, whose best plan is the base when --base "
                         "is not given [default: runs/<study stem>].")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="Price the cluster's links on this calibration file (tcf-search "
                              "calibrate --nccl-tests -o FILE), in place of the study's.")] = None,
) -> None:
    """The trade-off table: what each technique does to memory, compute and communication."""
    with user_errors():
        study = with_calibration(load_study(study_file), calibration)
        specs = build_specs(study)
        plan, note = ((parse_plan(base, specs), None) if base is not None
                      else _best(study_file, specs, result))
        found = baseline_of(study, specs, baseline)
        if not techniques and found is None:
            raise PlanSpecError("--with: give a technique (knob=value), or a baseline "
                                "(--baseline or the study's baseline:) to compare with")
        doc = compare(specs, plan, list(techniques or []), found and baseline_doc(
            specs, *found, space=build_space(study, specs), best=plan,
            label="the base" if base is not None else "the best"))
    if note:
        typer.echo(f"note: {note}", err=True)
    if json_out:
        typer.echo(json.dumps(doc, indent=2, default=_json_default))
    elif quiet:
        for row in doc["techniques"]:
            typer.echo(row["summary"])
        if doc.get("baseline"):
            typer.echo(doc["baseline"]["versus"]["summary"])
    else:
        con = Console(highlight=False)
        render(doc, con if con.is_terminal else Console(width=140, highlight=False))


def _best(study_file: Path, specs: Specs, result: Path | None) -> tuple[Plan, str | None]:
    """The best plan of the study's result folder, checked against the study, and a note when
    another cost model than the installed one ranked it (the comparison is judged now)."""
    from tcf_search.explain.source import DEFAULT_RUNS_DIR, SourceError, ranked_plan, ranking_note

    folder = result or DEFAULT_RUNS_DIR / study_file.stem
    if not folder.is_dir():
        raise SourceError(f"--base: not given, and {folder} is not a result folder to take the "
                          f"best plan from (give --base PLAN, or --result DIR)")
    plan = ranked_plan(folder, None, specs,
                       f"--result: the best plan of {folder} does not match {study_file}")
    return plan, ranking_note(folder, "compared")


def _json_default(x: Any) -> Any:
    return str(x)
