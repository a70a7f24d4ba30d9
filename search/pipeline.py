"""One study, end to end: load → validate → enumerate → prune → optimize → rank → export."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from costmodel import Plan
from search import optimize as opt
from search.alternatives import batch_note, cp_note
from search.baseline import baseline_doc, baseline_of
from search.evaluate import Evaluation, Evaluator, Exhaustive
from search.inputs.files import output_folder
from search.inputs.planfile import plan_dict
from search.inputs.planspec import format_plan
from search.inputs.presets import APPROXIMATIONS
from search.inputs.specs import Specs, build_specs
from search.inputs.study import ExportSection, Study
from search.misses import nearest_misses
from search.output import write_outputs
from search.prune import memory_stage
from search.rdb import GRACE_S
from search.rescore import current_study, scoring
from search.result import RankedPlan, StudyResult
from search.space import Layouts, SearchSpace, build_space, enumerate_layouts
from search.storage import STORAGE_FILE, StorageSpec, open_study, recover, unlock_journal
from search.uncertainty import calibration_status, ranking_resolution

ExportHook = Callable[[Path, ExportSection], Any]
Progress = Callable[[str, int, int], None]  # (task, done, total)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Command-line choices; ``None`` means the study file's setting."""

    out_dir: Path
    trials: int | None = None
    workers: int | None = None
    storage: str | None = None
    exhaustive: bool = False
    baseline: str | None = None  # --baseline: overrides the study's baseline


def run_study(study: Study, options: RunOptions, *, export: ExportHook | None = None,
              progress: Progress | None = None) -> StudyResult:
    started = time.perf_counter()
    output_folder(options.out_dir)
    storage_spec(study, options)  # a storage the study may not use fails before the search
    specs = build_specs(study)  # validate: the study's numbers as cost-model inputs
    space = build_space(study, specs)
    base = baseline_of(study, specs, options.baseline)  # bad input fails before the search
    layouts = enumerate_layouts(space)  # only valid layouts, pruning counted per rule
    headroom = specs.headroom_gib
    stage = memory_stage(specs, space, layouts.columns, headroom)  # memory first
    ev = Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))
    ostudy, search_info = optimize(ev, study, space, options, progress)
    adopt = bool(search_info.pop("resumed_own_folder", False))
    exhaustive = (ev.exhaustive(study.search.top_k)
                  if options.exhaustive and len(ev.feasible) else None)
    top = rank(ev, ostudy, exhaustive, study.search.top_k)
    result = summarize(study, ev, layouts, top, ostudy, exhaustive, search_info,
                       elapsed_s=time.perf_counter() - started, out_dir=options.out_dir)
    found = float(top[0].predicted["tokens_per_s_per_gpu"]) if top else None
    left_out = [n for n in (cp_note(study, specs, found),
                            batch_note(study, specs, layouts, found)) if n]
    if left_out:
        result = dataclasses.replace(result, notes=[*result.notes, *left_out])
    if base is not None:
        result = dataclasses.replace(result, baseline=baseline_doc(
            specs, base[0], base[1], space=space, best=top[0].plan if top else None))
    write_outputs(result, specs, opt.trial_rows(ostudy) if ostudy else [], options.out_dir,
                  adopt=adopt)
    if export is not None and study.export is not None and result.best is not None:
        export(options.out_dir, study.export)
    return result


def summarize(study: Study, ev: Evaluator, layouts: Layouts, top: list[RankedPlan],
              ostudy: optuna.Study | None, exhaustive: Exhaustive | None,
              search_info: dict[str, Any], *, elapsed_s: float, out_dir: Path) -> StudyResult:
    specs, stage = ev.specs, ev.stage
    headroom = specs.headroom_gib
    return StudyResult(
        study=study.study_name, model=specs.model.name, gpu=specs.cluster.gpu.id,
        num_gpus=specs.cluster.num_gpus, gpus_per_node=specs.cluster.gpus_per_node,
        objective={"metric": study.objective.metric, "direction": ev.directions[0],
                   "second": study.objective.second, "memory_headroom_gib": headroom},
        space_size=layouts.space_size, valid_count=len(layouts),
        feasible_count=len(ev.feasible),
        pruned_by={**layouts.pruned_by, "memory": int((~stage.feasible).sum())},
        rules={r.name: r.text for r in stage.space.rules},
        near_misses=nearest_misses(stage, specs, headroom) if not top else [],
        cells=cells(layouts, stage.feasible, top, ev.cell_best()),
        top=top, trials=opt.completed(ostudy) if ostudy else 0, search=search_info,
        placement={"cpsat_solves": stage.solves,
                   "uneven_in_top": sum(bool(p.plan.first_stage_layers) for p in top),
                   "partial_recompute_in_top": sum(bool(p.plan.recompute_layers) for p in top)},
        elapsed_s=elapsed_s, output_dir=str(out_dir),
        optimum=optimum(ev, exhaustive, ostudy) if exhaustive else None,
        notes=notes(study, ev), calibration=calibration_status(specs.cluster),
        ranking=ranking_resolution([r.predicted["tokens_per_s_per_gpu"] for r in top]))


def fingerprints(study: Study, specs: Specs, space: SearchSpace) -> tuple[str, str]:
    """What makes two runs the same study: the resolved model, cluster (the GPU without its
    calibrated efficiency, which scores a plan: ``priced_by``), training, space, objective and
    sampler settings (not the trial count, workers or storage). Returns it and the fingerprint
    tcf-search wrote before (the efficiency in it), which a study made then still answers to."""
    gpu = dataclasses.asdict(specs.cluster.gpu)
    return (_digest(study, specs, space, {k: v for k, v in gpu.items() if k != "efficiency"}),
            _digest(study, specs, space, gpu))


def _digest(study: Study, specs: Specs, space: SearchSpace, gpu: dict[str, Any]) -> str:
    doc = {"model": dataclasses.asdict(specs.model), "gpu": gpu,
           "num_gpus": specs.cluster.num_gpus, "gpus_per_node": specs.cluster.gpus_per_node,
           "training": specs.training.to_dict(), "domains": space.domains,
           "flags": [space.switches.uneven_pipeline, space.partial_recompute,
                     space.switches.tp_in_node],
           "objective": study.objective.model_dump(),
           "sampler": [study.search.sampler, study.search.seed]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def priced_by(study: Study, specs: Specs) -> dict[str, Any]:
    """The study numbers that change a trial's values but not the study's fingerprint: part of
    its scoring (``search.rescore``), with the GPU's calibrated efficiency (a refit re-scores a
    study, as a new formula does)."""
    links = specs.cluster.links
    return {"efficiency": dataclasses.asdict(specs.cluster.gpu.efficiency),
            "fabric": specs.cluster.fabric,
            "network_bw_fraction": specs.cluster.network_bw_fraction,
            "token_budget": study.training.token_budget,
            "price_per_gpu_hour": study.cluster.price_per_gpu_hour,
            # the cluster's own measured links (cluster.calibration): a re-anchor re-scores
            **({"links": dataclasses.asdict(links)} if links is not None else {})}


def storage_spec(study: Study, options: RunOptions) -> StorageSpec:
    """``--storage`` is the user's own; a study file's (shared, run unread: ``nightly`` runs a
    folder of them) stays inside the result folder."""
    if options.storage:
        return StorageSpec.parse(options.storage, options.out_dir)
    return StorageSpec.confined(study.search.storage, options.out_dir)


def optimize(ev: Evaluator, study: Study, space: SearchSpace, options: RunOptions,
             progress: Progress | None) -> tuple[optuna.Study | None, dict[str, Any]]:
    s = study.search
    target = options.trials or s.trials
    workers = options.workers or s.workers
    info: dict[str, Any] = {"sampler": s.sampler, "seed": s.seed, "workers": workers,
                            "study_name": study.study_name, "trials_requested": target}
    if len(ev.feasible) == 0:
        return None, {**info, "trials_this_run": 0}
    spec = storage_spec(study, options)
    ostudy = open_study(spec, study.study_name, ev.directions,
                        *fingerprints(study, ev.specs, space))
    info["storage"] = spec.describe()
    # A folder whose own journal already held this study (same fingerprint) is this run's.
    info["resumed_own_folder"] = (spec.journal == options.out_dir / STORAGE_FILE
                                  and len(ostudy.get_trials(deepcopy=False)) > 0)
    # trials scored by another cost model are re-scored into a study of their own, never mixed
    key = scoring(priced_by(study, ev.specs))
    ostudy, rescored = current_study(ostudy, spec, ev, key)
    info.update(study_name=ostudy.study_name, cost_model=key["cost_model"])
    if rescored is not None:
        info["rescored"] = rescored
    info["recovered_trials"] = recover(ostudy, spec)
    kind = s.sampler
    if target >= ev.units:  # every unit once: the result is exact, more trials add nothing
        target = ev.units
        kind = "brute_force" if kind == "auto" else kind
    if kind == "brute_force":
        target = ev.units
        with spec.exclusive():  # hosts starting together enqueue each layout once
            opt.enqueue_all(ev, ostudy)
    info.update(sampler=kind, trials_target=target, units=ev.units,
                unit_axes=list(ev.choices))
    before = opt.completed(ostudy)
    report = (lambda done, total: progress("trials", done, total)) if progress else None
    # a journal serves this command alone: no other host has trials under way
    opt.run_to_target(ev, ostudy, spec, target, workers=workers, sampler=kind, seed=s.seed,
                      progress=report, settle_s=0 if spec.journal else opt.SETTLE_S)
    unlock_journal(spec)
    info["trials_this_run"] = opt.completed(ostudy) - before
    info["trial_states"] = opt.summary(ostudy)
    note_short(ostudy, target)
    return ostudy, info


def note_short(ostudy: optuna.Study, target: int) -> None:
    """Say so when the study ends short of its trials: other hosts' trials still running, or
    a dead process's, which a database fails once its heartbeat is old (exit 0: the result is
    the study so far, and hosts that share a study end at different times)."""
    done = opt.completed(ostudy)
    if done < target:
        running = opt.started(ostudy) - done
        print(f"note: search: the study holds {done} of {target} complete trials; {running} "
              f"still running on other hosts, or left by a process that died (failed "
              f"{GRACE_S} s after its last heartbeat, at once by a rerun on its own machine): "
              f"rerun the same command to complete it", file=sys.stderr)


def _ranked(evals: list[tuple[Evaluation, str]], directions: list[str], top_k: int
            ) -> list[RankedPlan]:
    sign = -1.0 if directions[0] == "maximize" else 1.0
    seen: set[str] = set()
    out: list[RankedPlan] = []
    # equally good plans (the model often ties layouts that move the same bytes, e.g. dp x cp
    # splits of one group) rank by memory headroom, then the simpler layout first (less context,
    # expert, pipeline and tensor parallelism, fewer chunks, less sharding), whichever trial
    # found them
    def order(es: tuple[Evaluation, str]) -> tuple[float, float, tuple[int, ...], str]:
        e = es[0]
        p = e.plan
        simpler = (p.cp, p.ep, p.pp, p.tp, p.vpp, p.zero_stage)
        return (sign * e.values[0], float(e.metrics.get("peak_mem_gib", 0.0)), simpler,
                repr(p))

    for e, source in sorted(evals, key=order):
        key = repr(e.plan)
        if key in seen:
            continue
        seen.add(key)
        out.append(RankedPlan(rank=len(out) + 1, plan=e.plan, predicted=e.metrics,
                              values=e.values, source=source))
        if len(out) == top_k:
            break
    return out


def rank(ev: Evaluator, ostudy: optuna.Study | None, exhaustive: Exhaustive | None,
         top_k: int) -> list[RankedPlan]:
    """The best distinct plans among feasible trials (and the exhaustive ranking if run)."""
    evals: list[tuple[Evaluation, str]] = []
    if ostudy is not None:
        trials = opt.best_trials(ostudy)
        if len(ev.directions) > 1:  # Pareto front first, by the primary objective
            front = {t.number for t in ostudy.best_trials}
            trials = [t for t in trials if t.number in front]
        for t in trials:
            plan = Plan(**t.user_attrs["plan"])
            judged = Evaluation(unit=int(t.user_attrs.get("unit", -1)), plan=plan,
                                metrics=t.user_attrs["metrics"], values=tuple(t.values))
            evals.append((judged, f"trial {t.number}"))
    if exhaustive is not None:
        evals += [(e, "exhaustive") for e in exhaustive.best]
    return _ranked(evals, ev.directions, top_k)


def optimum(ev: Evaluator, ex: Exhaustive, ostudy: optuna.Study | None) -> dict[str, Any]:
    """How close Optuna came to the exhaustive optimum, and after how many trials."""
    maximize = ev.directions[0] == "maximize"
    best = ex.best[0]
    value = best.values[0]
    trials = sorted(opt.best_trials(ostudy), key=lambda t: t.number) if ostudy else []
    reach, running = None, None
    for k, t in enumerate(trials, start=1):
        v = t.values[0]
        running = v if running is None else (max(running, v) if maximize else min(running, v))
        if reach is None and (running >= 0.99 * value if maximize else running <= value / 0.99):
            reach = k
    found = running if running is not None else float("nan")
    regret = (1 - found / value) if maximize else (found / value - 1)
    return {"metric": ev.metric_names[0], "value": value, "evaluated": ex.count,
            "plan": plan_dict(best.plan), "predicted": best.metrics,
            "optuna_best": found, "regret": regret, "trials_to_99pct": reach}


def cells(layouts: Layouts, feasible: np.ndarray, top: list[RankedPlan],
          cell_best: dict[tuple[int, int], tuple[float, Plan]] | None = None
          ) -> list[dict[str, Any]]:
    """Per (tp, pp): valid and feasible layouts, what pruned the rest, the best plan found in
    the top, and (``cell_best``: ``Evaluator.cell_best``) the cell's own best plan and its
    tokens/s per GPU, which the heat map shows."""
    cell_best = cell_best or {}
    tp, pp = layouts.columns["tp"], layouts.columns["pp"]
    keys = set(layouts.cell_pruned) | set(zip(tp.tolist(), pp.tolist(), strict=True))
    best: dict[tuple[int, int], float] = {}
    for r in reversed(top):
        best[(r.plan.tp, r.plan.pp)] = r.values[0]
    out = []
    for t, p in sorted(keys):
        sel = (tp == t) & (pp == p)
        pruned = dict(layouts.cell_pruned.get((t, p), {}))
        memory = int((sel & ~feasible).sum())
        if memory:
            pruned["memory"] = memory
        out.append({"tp": t, "pp": p, "valid": int(sel.sum()),
                    "feasible": int((sel & feasible).sum()), "pruned_by": pruned,
                    "best_in_top": best.get((t, p))})
        if (t, p) in cell_best:
            tps, plan = cell_best[(t, p)]
            out[-1].update(best_tokens_per_s_per_gpu=tps, best_plan=format_plan(plan))
    return out


def notes(study: Study, ev: Evaluator) -> list[str]:
    out = []
    if study.model.preset in APPROXIMATIONS:
        out.append(APPROXIMATIONS[study.model.preset])
    if len(ev.stage.feasible) == 0:
        out.append("no valid layout: every combination breaks a rule (see pruned_by)")
    elif len(ev.feasible) == 0:
        out.append("no layout fits in memory: see near_misses")
    return out
