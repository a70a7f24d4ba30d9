"""A study's output: the ranked table on the terminal and the result folder.

Folder layout (read by export, validate and report): ``trials.csv``, ``best_plan.yaml``,
``top/rank-<N>.yaml`` (plan files of ``search.planfile``), ``result.json`` (the document
``tcf-search run --json`` prints) and the Optuna storage (``study.journal`` by default). Every file
is written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from search.files import write_atomic
from search.planfile import PlanFile, dump_plan_file
from search.result import RankedPlan, StudyResult
from search.specs import Specs


def trials_csv(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def plan_file(result: StudyResult, specs: Specs, ranked: RankedPlan) -> str:
    return dump_plan_file(PlanFile(
        study=result.study, model=specs.model, gpu=result.gpu, num_gpus=result.num_gpus,
        gpus_per_node=result.gpus_per_node, fabric=specs.cluster.fabric,
        training=specs.training, plan=ranked.plan,
        rank=ranked.rank, predicted={**ranked.predicted, "source": ranked.source}))


def write_outputs(result: StudyResult, specs: Specs, trial_rows: list[dict[str, Any]],
                  out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "trials.csv", trials_csv(trial_rows))
    top_dir = out_dir / "top"
    kept = set()
    for ranked in result.top:
        name = f"rank-{ranked.rank}.yaml"
        write_atomic(top_dir / name, plan_file(result, specs, ranked))
        kept.add(name)
    if top_dir.is_dir():  # plans of an earlier, longer ranking would mislead readers
        for old in top_dir.glob("rank-*.yaml"):
            if old.name not in kept:
                old.unlink()
    if result.best is not None:
        write_atomic(out_dir / "best_plan.yaml", plan_file(result, specs, result.best))
    else:
        (out_dir / "best_plan.yaml").unlink(missing_ok=True)
    write_atomic(out_dir / "result.json", json.dumps(result.to_dict(), indent=2) + "\n")


# ---- terminal ------------------------------------------------------------------------------

def _recompute_label(plan: dict[str, Any]) -> str:
    kind = plan["recompute"]
    if kind == "full" and plan["recompute_layers"]:
        return f"full×{plan['recompute_layers']}"
    return {"none": "-", "selective": "sel", "full": "full"}[kind]


def _stages_label(plan: dict[str, Any]) -> str:
    if plan["first_stage_layers"] or plan["last_stage_layers"]:
        return f"{plan['first_stage_layers']}…{plan['last_stage_layers']}"
    return "even"


def _interval_label(m: dict[str, Any]) -> str:
    lo_hi = m.get("tokens_per_s_interval")
    return f"{lo_hi[0]:,.0f}–{lo_hi[1]:,.0f}" if lo_hi else ""


def interval_text(m: dict[str, Any]) -> str:
    """'1,100 tokens/s, 80% interval 950–1,230; P(OOM) 3%' for one plan's metrics."""
    text = f"{m['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU"
    if m.get("tokens_per_s_interval"):
        text += (f", {m['interval_level']:.0%} interval {_interval_label(m)}"
                 f"; P(OOM) {m['p_oom']:.0%}")
        if m.get("interval_note"):
            text += f" ({m['interval_note']})"
    return text


def render(result: StudyResult, console: Console) -> None:
    """The ranked table and the few lines around it."""
    console.print(f"[bold]{result.study}[/bold]: {result.model} on {result.num_gpus}× "
                  f"{result.gpu} — {result.space_size:,} layouts, {result.valid_count:,} valid, "
                  f"{result.feasible_count:,} fit in memory; {result.trials} trials, "
                  f"{result.elapsed_s:.1f} s")
    if result.calibration:
        console.print(result.calibration["line"], markup=False)
    pruned = ", ".join(f"{k} {v:,}" for k, v in result.pruned_by.items() if v)
    if pruned:
        console.print(f"pruned: {pruned}")
    if not result.top:
        console.print("[bold red]no feasible layout[/bold red]; nearest misses:")
        for miss in result.near_misses:
            plan = ", ".join(f"{k}={v}" for k, v in miss["plan"].items())
            console.print(f"  {plan}: {miss['reason']}")
        for note in result.notes:
            console.print(f"note: {note}")
        return
    plans = [r.to_dict()["plan"] for r in result.top]
    knobs = [k for k in ("tp", "pp", "dp", "cp", "ep", "vpp") if k in ("tp", "pp", "dp")
             or any(p[k] > 1 for p in plans)]
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    columns = ["#", "×".join(knobs), "zero", "mbs", "recomp", "sp", "stages", "tok/s/GPU",
               "80% interval", "P(OOM)", "MFU", "step s", "mem GiB", "bound by"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("recomp", "stages", "bound by")
                         else "right", no_wrap=True)
    for r, p in zip(result.top, plans, strict=True):
        m = r.predicted
        table.add_row(
            str(r.rank), "×".join(str(p[k]) for k in knobs), str(p["zero_stage"]),
            str(p["micro_batch"]), _recompute_label(p), "y" if p["sequence_parallel"] else "-",
            _stages_label(p), f"{m['tokens_per_s_per_gpu']:,.0f}", _interval_label(m),
            f"{m['p_oom']:.0%}" if "p_oom" in m else "", f"{m['mfu']:.1%}",
            f"{m['step_time_s']:.2f}", f"{m['peak_mem_gib']:.1f}/{m['usable_mem_gib']:.1f}",
            m["dominant_challenge"])
    console.print(table)
    if result.optimum is not None:
        o = result.optimum
        reach = o.get("trials_to_99pct")
        console.print(f"exhaustive optimum {o['value']:.6g} over {o['evaluated']:,} plans; "
                      f"Optuna best {o['optuna_best']:.6g} (regret {o['regret']:.2%}); "
                      f"99% reached after "
                      f"{reach if reach is not None else 'more than ' + str(result.trials)} "
                      f"trials")
    for note in result.notes:
        console.print(f"note: {note}")
    console.print(f"results in {result.output_dir}")
