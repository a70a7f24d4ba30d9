"""A study's output: the ranked table on the terminal and the result folder.

Folder layout (read by export, validate and report): ``trials.csv``, ``best_plan.yaml``,
``top/rank-<N>.yaml`` (plan files of ``search.inputs.planfile``), ``result.json`` (the document
``tcf-search run --json`` prints) and the Optuna storage (``study.journal`` by default). Every file
is written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hardware_catalog import fabric_topology
from search.inputs.files import Output
from search.inputs.planfile import PlanFile, dump_plan_file
from search.inputs.specs import Specs
from search.result import RankedPlan, StudyResult
from search.storage import STORAGE_FILE


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


def plan_file(result: StudyResult, specs: Specs, ranked: RankedPlan, folder: Path) -> str:
    """The plan file of ``ranked``, to be written in ``folder``: a calibration file the study
    named by a relative path is named relative to ``folder`` (``load_plan_file`` reads it so)."""
    calibration = specs.calibration
    if calibration and specs.calibration_relative:
        calibration = Path(os.path.relpath(calibration, folder.resolve())).as_posix()
    c = specs.cluster
    rails, over = fabric_topology(c.fabric)  # the fabric's: a plan file writes only its own
    return dump_plan_file(PlanFile(
        study=result.study, model=specs.model, gpu=result.gpu, num_gpus=result.num_gpus,
        gpus_per_node=result.gpus_per_node, fabric=c.fabric,
        rail_group_nodes=c.rail_group_nodes if c.rail_group_nodes != rails else None,
        oversubscription=c.oversubscription if c.oversubscription != over else None,
        training=specs.training, plan=ranked.plan,
        rank=ranked.rank, predicted={**ranked.predicted, "source": ranked.source},
        framework=specs.framework, calibration=calibration))


# The files a run keeps in its result folder beside its storage (search.storage.STORAGE_FILE, its
# lock and torn tail): no other command replaces one, --force or not.
RUN_FILES = ("result.json", "trials.csv", "best_plan.yaml", "top/rank-*.yaml")


def run_file(path: Path) -> bool:
    """Whether ``path`` is one of a run's files: :data:`RUN_FILES`, a journal (``*.journal``
    and the files named after it), or a file its folder's manifest records as the run's."""
    name = path.name
    if any(PurePosixPath(path.parent.name, name).match(pattern) if "/" in pattern
           else name == pattern for pattern in RUN_FILES):
        return True
    if name.endswith(".journal") or name.startswith(STORAGE_FILE):
        return True
    return Output(path.parent, "run").recorded_owner(path) == "run"


def write_outputs(result: StudyResult, specs: Specs, trial_rows: list[dict[str, Any]],
                  out_dir: Path, *, adopt: bool = False) -> None:
    """The result files, by the output policy of :class:`search.inputs.files.Output`: a rerun
    replaces the files a run wrote (``adopt``: the folder's storage holds this very study, so
    its files are the run's), never anything else."""
    out = Output(out_dir, "run", adopt=adopt)
    files: dict[str, str] = {"trials.csv": trials_csv(trial_rows)}
    for ranked in result.top:
        files[f"top/rank-{ranked.rank}.yaml"] = plan_file(result, specs, ranked, out_dir / "top")
    if result.best is not None:
        files["best_plan.yaml"] = plan_file(result, specs, result.best, out_dir)
    files["result.json"] = json.dumps(result.to_dict(), indent=2) + "\n"
    stale = [f"top/{p.name}" for p in (out_dir / "top").glob("rank-*.yaml")
             if f"top/{p.name}" not in files]  # plans of an earlier, longer ranking mislead
    if result.best is None:
        stale.append("best_plan.yaml")
    out.write_many(files)
    for name in stale:
        out.remove(name)


# ---- terminal ------------------------------------------------------------------------------

# a plan's own selective modules, short enough for the table's column
_MODULE_LABELS = {"core_attn": "attn", "moe_act": "moe_act", "layernorm": "norm",
                  "mla_up_proj": "mla_up", "mlp": "mlp"}


def _dispatch_label(plan: dict[str, Any]) -> str:
    """The plan's own MoE dispatch: its dispatcher ("=" the training's) and ``+a2a`` where it
    overlaps the all-to-all (``-a2a`` where it turns the training's overlap off)."""
    overlap = {"on": "+a2a", "off": "-a2a"}.get(plan.get("moe_a2a_overlap", ""), "")
    return (plan.get("moe_dispatcher") or "=") + overlap


def _recompute_label(plan: dict[str, Any]) -> str:
    """What the plan does with its activations: recompute (``full×N``: N layers a stage), and
    ``offload×N``: N layers' kept in host memory (rule cpu_offload: beside no recompute)."""
    kind, offload = plan["recompute"], plan.get("cpu_offload_layers", 0)
    if kind == "full" and plan["recompute_layers"]:
        label = f"full×{plan['recompute_layers']}"
    elif kind == "selective" and plan.get("recompute_modules"):  # its own Megatron-Core modules
        label = f"sel({'+'.join(_MODULE_LABELS[m] for m in plan['recompute_modules'])})"
    else:
        label = {"none": "-", "selective": "sel", "full": "full"}[kind]
    if not offload:
        return label
    return f"offload×{offload}" if label == "-" else f"{label}+offload×{offload}"


def _stages_label(plan: dict[str, Any]) -> str:
    if plan["first_stage_layers"] or plan["last_stage_layers"]:
        return f"{plan['first_stage_layers']}…{plan['last_stage_layers']}"
    return "even"


RANKING_SURE = 0.8  # the confidence at which the run's ranking line names a plan #1 beats
# Objectives whose value no other column shows: (column, metrics key, format).
OBJECTIVE_COLUMNS = {"time_to_train": ("days", "time_to_train_days", "{:,.2f}"),
                     "cost": ("cost $", "cost_usd", "{:,.0f}")}


def _no_layout(result: StudyResult, console: Console) -> None:
    """Why nothing ranks: the nearest misses in memory or, where no layout is even valid (none
    reaches the memory stage, so none is near), the rules that left none."""
    if result.near_misses:
        near = result.near_misses[0]
        over = near["needs_gib"] - near["usable_gib"]
        console.print(f"[bold red]no feasible layout[/bold red]: no layout fits in memory; the "
                      f"closest needs {near['needs_gib']:,.1f} GiB on its {near['stage']} stage, "
                      f"{over:,.1f} GiB over the {near['usable_gib']:,.1f} GiB usable; nearest "
                      f"misses:", soft_wrap=True)
        for miss in result.near_misses:
            plan = ", ".join(f"{k}={v}" for k, v in miss["plan"].items())
            console.print(f"  {plan}: {escape(miss['reason'])}")
        return
    console.print("[bold red]no valid layout[/bold red], so none is near fitting in memory; "
                  "every layout breaks a rule:")
    for name, count in result.pruned_by.items():
        if count and name in result.rules:
            console.print(f"  {name}: {escape(result.rules[name])} ({count:,} layouts)")


def _interval_label(m: dict[str, Any]) -> str:
    """The interval, and after a † one letter per term it rests on that no measured row
    validates (search.priors.MARKS; the legend under the table names them)."""
    lo_hi = m.get("tokens_per_s_interval")
    if not lo_hi:
        return ""
    marks = "".join(t.get("mark", "?") for t in m.get("interval_rests_on", []))
    return f"{lo_hi[0]:,.0f}–{lo_hi[1]:,.0f}" + (f" †{marks}" if marks else "")


# an MFU above this share of the dense peak is flagged: published runs of dense transformers sit
# at 35-60% (Llama 3 405B 38-43%, Dubey et al. 2024 Table 4; Megatron's 175B 51.4%, Korthikanti
# et al. 2022); above it the figure is usually the convention's uncounted causal halving
MFU_FLAG = 0.75


def mfu_label(m: dict[str, Any]) -> str:
    """The table's MFU cell: the convention's figure, '!' above ``MFU_FLAG``."""
    return f"{m['mfu']:.1%}" + ("!" if m["mfu"] > MFU_FLAG else "")


def mfu_legend(metrics: Iterable[dict[str, Any]]) -> list[str]:
    """A line under the table where a plan's MFU is flagged: what the figure counts, and the
    causal-aware figure beside it."""
    flagged = [m for m in metrics if m["mfu"] > MFU_FLAG]
    if not flagged:
        return []
    line = (f"! MFU above {MFU_FLAG:.0%} of the dense peak: model FLOPs count attention "
            f"without causal halving (PaLM/Megatron convention)")
    if "mfu_causal" in flagged[0]:  # absent from a study stored before the figure existed
        line += (f"; counting the scores a causal mask computes, the first flagged plan's MFU "
                 f"is {flagged[0]['mfu_causal']:.1%} (mfu_causal in --json and trials.csv)")
    return [line]


def prior_legend(metrics: Iterable[dict[str, Any]]) -> list[str]:
    """One line per unvalidated term the plans' intervals rest on: what it is, and the range
    it was re-priced at (search.priors.prior_spread)."""
    seen: dict[str, dict[str, Any]] = {}
    for m in metrics:
        for term in m.get("interval_rests_on", []):
            seen.setdefault(term["flag"], term)
    return [f"†{t.get('mark', '?')} {flag}: the interval widens where a plan rests on "
            f"{t['term']}; {t['basis']}" for flag, t in seen.items()]


def interval_text(m: dict[str, Any]) -> str:
    """'1,100 tokens/s, 80% interval 950–1,230; P(OOM) 3%' for one plan's metrics."""
    text = f"{m['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU"
    if m.get("tokens_per_s_interval"):
        text += (f", {m['interval_level']:.0%} interval {_interval_label(m)}"
                 f"; P(OOM) {m['p_oom']:.0%}")
        if m.get("interval_note"):
            text += f" ({m['interval_note']})"
        for t in m.get("interval_rests_on", []):
            lo, hi = t["tokens_per_s_ratio"]
            text += f"; widened {lo - 1:+.1%}/{hi - 1:+.1%} for {t['term']} ({t['basis']})"
    return text


def ranking_line(ranking: dict[str, Any], sure: float = RANKING_SURE) -> str:
    """How surely #1 beats #2, and the first plan it beats with ``sure`` confidence."""
    vs = ranking.get("vs_best") or []
    if not vs:
        return ""
    first = vs[0]
    line = (f"ranking: #1 is predicted {first['tokens_per_s_gap']:+.1%} over #2, and really "
            f"faster with P {first['p_best_faster']:.0%}")
    beaten = next((r for r in vs if r["p_best_faster"] >= sure), None)
    if beaten is None:
        line += f"; none of the {len(vs) + 1} shown is below #1 with P >= {sure:.0%}"
    elif beaten is not first:
        line += (f"; the first it beats with P >= {sure:.0%} is #{beaten['rank']} "
                 f"({beaten['tokens_per_s_gap']:+.1%})")
    return line + (" (P: the share of held-out pairs of runs with that predicted gap the model "
                   "ordered right)")


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
        _no_layout(result, console)
        for note in result.notes:
            console.print(f"note: {note}")
        for line in (result.baseline or {}).get("lines", []):
            console.print(line, markup=False, soft_wrap=True)
        return
    plans = [r.to_dict()["plan"] for r in result.top]
    # expert_tp: shown when a plan gives it (0 is derived, 1 folds EP over TP)
    knobs = [k for k in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "vpp")
             if k in ("tp", "pp", "dp") or any(p[k] > (k != "expert_tp") for p in plans)]
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    shown = [OBJECTIVE_COLUMNS[m] for m in (result.objective["metric"],
                                            result.objective.get("second"))
             if m in OBJECTIVE_COLUMNS]  # what was optimised, first among the metrics
    degrees = "×".join("etp" if k == "expert_tp" else k for k in knobs)
    # the MoE dispatch: shown when a plan runs one of its own
    dispatch = any(p.get("moe_dispatcher") or p.get("moe_a2a_overlap") for p in plans)
    columns = ["#", degrees, "zero", "mbs", "recomp", "sp", "stages",
               *(["dispatch"] if dispatch else []),
               *(name for name, _, _ in shown), "tok/s/GPU", "80% interval", "P(OOM)", "MFU",
               "step s", "mem GiB", "bound by", "net"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("recomp", "stages", "dispatch",
                                                        "bound by", "net")
                         else "right", no_wrap=True)
    for r, p in zip(result.top, plans, strict=True):
        m = r.predicted
        table.add_row(
            str(r.rank), "×".join(str(p[k]) for k in knobs), str(p["zero_stage"]),
            str(p["micro_batch"]), _recompute_label(p), "y" if p["sequence_parallel"] else "-",
            _stages_label(p), *([_dispatch_label(p)] if dispatch else []),
            *(fmt.format(m[key]) for _, key, fmt in shown),
            f"{m['tokens_per_s_per_gpu']:,.0f}", _interval_label(m),
            f"{m['p_oom']:.0%}" if "p_oom" in m else "", mfu_label(m),
            f"{m['step_time_s']:.2f}", f"{m['peak_mem_gib']:.1f}/{m['usable_mem_gib']:.1f}",
            m["dominant_challenge"], m.get("network_groups") or "-")
    console.print(table)
    for line in [*prior_legend(r.predicted for r in result.top),
                 *mfu_legend(r.predicted for r in result.top)]:
        console.print(line, markup=False, soft_wrap=True)
    if line := ranking_line(result.ranking):
        console.print(line, markup=False, soft_wrap=True)
    if result.optimum is not None:
        o = result.optimum
        reach = o.get("trials_to_99pct")
        console.print(f"exhaustive optimum {o['value']:.6g} over {o['evaluated']:,} plans; "
                      f"Optuna best {o['optuna_best']:.6g} (regret {o['regret']:.2%}); "
                      f"99% reached after "
                      f"{reach if reach is not None else 'more than ' + str(result.trials)} "
                      f"trials")
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    for line in (result.baseline or {}).get("lines", []):
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"results in {result.output_dir}")
