"""Your current recipe beside the recommendation.

A study's ``baseline:`` (or ``--baseline``, which overrides it) is a plan in the syntax of
``explain --plan`` (:mod:`search.inputs.planspec`). It must be a valid plan for the model and
cluster (the rules table with the switches the cost model prices): else it is bad input. The search
space may still exclude it — an axis whose searched values do not hold its value, or a rule the
study's search switches add — and :func:`exclusions` names which; its figures are the tool's own
either way, and a baseline that does not fit in memory is said to (memory is a hard constraint).

:func:`versus` splits the gain of a plan over the baseline by challenge. Tokens per step are the
same for both (same model, batch and cluster), so tokens/s goes as 1 / step time and

    gain = T_base / T_plan - 1 = sum over parts k of (t_base,k - t_plan,k) / T_plan

exactly, with the step's parts as ``step_breakdown`` reads them off the estimate: compute
(kernels with recomputation, the pipeline bubble, the optimizer, stage imbalance) and exposed
communication. Memory costs no time of its own: what it changes is what a plan can afford, so its
line names the peak, the headroom and the knobs the difference paid for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel import Plan, StepEstimate, estimate, estimate_batch, rules
from costmodel.plan_fields import SCHEDULE_CODES, SCHEDULE_NAMES
from costmodel.rules import Switches
from search.evaluate import PLACED, placements
from search.inputs.planfile import plan_dict
from search.inputs.planspec import SHORT, PlanSpecError, format_plan, parse_plan
from search.inputs.specs import Specs
from search.inputs.study import Study
from search.prune import memory_stage
from search.space import AXES, SearchSpace, exclusions, plan_columns, plan_from_row

GIB = 2**30
SEARCHED_BEST = "the best"  # the label of versus() when the plan is the search's best
COMPUTE_PARTS = ("compute", "bubble", "optimizer", "other")  # the compute challenge's time


def step_breakdown(e: StepEstimate) -> dict[str, float]:
    """Where the step goes; ``other`` is what the parts do not account for (stage imbalance)."""
    parts = {"compute": e.compute.time_s, "exposed_comm": e.comm_exposed_s,
             "bubble": e.bubble_time_s, "optimizer": e.compute.optimizer_time_s}
    parts["other"] = max(e.step_time_s - sum(parts.values()), 0.0)
    return parts


def parse_baseline(text: str, specs: Specs, field: str = "baseline") -> Plan:
    """The baseline plan; bad input names ``field`` (``baseline`` or ``--baseline``) and the
    rule. Checked by the rules the cost model prices, not the study's search switches."""
    try:
        return parse_plan(text, specs, Switches())
    except PlanSpecError as exc:
        raise PlanSpecError(field + str(exc).removeprefix("plan")) from None


def baseline_of(study: Study | None, specs: Specs, flag: str | None) -> tuple[Plan, str] | None:
    """The baseline and where it came from: ``--baseline`` over the study's ``baseline:``."""
    if flag is not None:
        return parse_baseline(flag, specs, "--baseline"), "--baseline"
    if study is not None and study.baseline is not None:
        return parse_baseline(study.baseline, specs, "baseline"), "study baseline"
    return None


def figures(e: StepEstimate, headroom_gib: float) -> dict[str, Any]:
    """One plan's figures on the three challenges, in report units."""
    parts = step_breakdown(e)
    usable, peak = e.memory.usable_bytes / GIB, e.memory.peak_bytes / GIB
    return {"tokens_per_s_per_gpu": e.tokens_per_s_per_gpu, "step_time_s": e.step_time_s,
            "peak_mem_gib": peak, "usable_mem_gib": usable, "headroom_gib": usable - peak,
            "fits": bool(e.memory.fits), "within_headroom": bool(usable - peak >= headroom_gib),
            "compute_challenge_s": sum(parts[k] for k in COMPUTE_PARTS),
            "compute_s": parts["compute"], "recompute_s": e.compute.recompute_time_s,
            "bubble_s": parts["bubble"], "bubble_share": parts["bubble"] / e.step_time_s,
            "optimizer_s": parts["optimizer"], "other_s": parts["other"],
            "exposed_comm_s": parts["exposed_comm"], "mfu": e.mfu,
            "binding": e.dominant_challenge}


def _changes(base: Plan, plan: Plan) -> list[str]:
    """The knobs that differ, the schedule as it runs (vpp > 1 is interleaved either way)."""
    def value(p: Plan, k: str) -> str:
        if k == "pp_schedule":
            return SCHEDULE_NAMES[int(rules.schedule_code(SCHEDULE_CODES[p.pp_schedule], p.vpp))]
        return str(getattr(p, k)).lower()

    return [f"{short} {value(base, k)}→{value(plan, k)}" for k, short in SHORT
            if value(base, k) != value(plan, k)]


def _memory_line(b: dict[str, Any], p: dict[str, Any], changes: list[str]) -> str:
    head = (f"memory: {b['peak_mem_gib']:.0f} → {p['peak_mem_gib']:.0f} GiB peak (headroom "
            f"{b['headroom_gib']:.1f} → {p['headroom_gib']:.1f} GiB)")
    if not b["fits"]:  # the summary leads with it
        return head
    more = p["peak_mem_gib"] - b["peak_mem_gib"]
    if not changes or abs(more) < 0.5:
        return head
    verb = f"{more:.0f} GiB more buys" if more > 0 else f"{-more:.0f} GiB less comes from"
    return f"{head}; {verb} {', '.join(changes)}"


def versus(specs: Specs, base: Plan, plan: Plan, label: str = SEARCHED_BEST) -> dict[str, Any]:
    """``plan`` against the baseline ``base``: both plans' figures and the gain in tokens/s
    split by challenge (the parts add up to the total; see the module docstring)."""
    b = figures(estimate(specs.model, specs.cluster, base, specs.training), specs.headroom_gib)
    p = figures(estimate(specs.model, specs.cluster, plan, specs.training), specs.headroom_gib)
    t_plan = p["step_time_s"]
    gain = {"total": p["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"] - 1.0,
            "compute": (b["compute_challenge_s"] - p["compute_challenge_s"]) / t_plan,
            "communication": (b["exposed_comm_s"] - p["exposed_comm_s"]) / t_plan,
            "memory": 0.0}  # no time of its own: see the memory line
    changes = _changes(base, plan)
    memory = _memory_line(b, p, changes)
    oom = (f"the baseline does not fit in memory ({b['peak_mem_gib']:.1f} > "
           f"{b['usable_mem_gib']:.1f} GiB usable), so {label} is what runs; by time alone, "
           if not b["fits"] else "")
    summary = (f"{label} vs the baseline: {oom}{gain['total']:+.1%} tokens/s: compute "
               f"{gain['compute']:+.1%} (bubble {b['bubble_share']:.0%}→{p['bubble_share']:.0%},"
               f" recomputation {b['recompute_s']:.1f} s → {p['recompute_s']:.1f} s, MFU "
               f"{b['mfu']:.1%} → {p['mfu']:.1%}), communication {gain['communication']:+.1%} "
               f"(exposed {b['exposed_comm_s']:.2f} s → {p['exposed_comm_s']:.2f} s), {memory}")
    return {"plan": plan_dict(plan), "plan_text": format_plan(plan), "label": label,
            "baseline_figures": b, "figures": p, "gain": gain, "changes": changes,
            "memory": memory, "summary": summary}


def searched_layout(specs: Specs, space: SearchSpace, plan: Plan) -> dict[str, Any] | None:
    """What the search makes of ``plan``'s layout (its knobs, the search's placement): of the
    placements it judges (``search.evaluate.placements``) the one with the most tokens/s, its
    plan and figure; None when the memory screen (with the study's headroom) rules it out."""
    cols = {k: np.asarray([v]) for k, v in plan_columns(plan).items()}
    stage = memory_stage(specs, space, cols)
    if not stage.feasible[0]:
        return None
    placed, _ = placements(stage, np.asarray([0]))
    tps = estimate_batch(specs.model, specs.cluster, specs.training, placed)[
        "tokens_per_s_per_gpu"]
    k = int(np.argmax(tps))
    keys = (*AXES, *PLACED)
    return {"plan_text": format_plan(plan_from_row({a: int(placed[a][k]) for a in keys})),
            "tokens_per_s_per_gpu": float(tps[k])}


def baseline_doc(specs: Specs, plan: Plan, origin: str, *, space: SearchSpace | None = None,
                 best: Plan | None = None, label: str = SEARCHED_BEST) -> dict[str, Any]:
    """The baseline's document: its plan, where it came from, whether the space holds it (and
    what excludes it), its figures, and ``best`` against it; ``lines`` says it in words.
    ``label`` names ``best``: :data:`SEARCHED_BEST` only when it is the search's best plan
    (else e.g. "the base", "this plan"), which alone lets the lines speak of the search."""
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    doc: dict[str, Any] = {"plan": plan_dict(plan), "plan_text": format_plan(plan),
                           "origin": origin, "figures": figures(e, specs.headroom_gib)}
    if space is not None:
        doc["excluded_by"] = exclusions(space, plan)
        doc["in_space"] = not doc["excluded_by"]
    if best is not None:
        doc["versus"] = versus(specs, plan, best, label)
        if (space is not None and doc["in_space"] and label == SEARCHED_BEST
                and doc["versus"]["gain"]["total"] < -5e-4):
            doc["searched"] = searched_layout(specs, space, plan)
    doc["lines"] = baseline_lines(doc, specs.headroom_gib)
    return doc


def baseline_lines(doc: dict[str, Any], headroom_gib: float = 0.0) -> list[str]:
    """The baseline in words, one statement a line (terminal, explain, compare, report)."""
    f = doc["figures"]
    fit = ("fits" if f["within_headroom"] else
           f"fits, but inside the {headroom_gib:.1f} GiB headroom the search keeps free"
           if f["fits"] else f"does NOT fit: {-f['headroom_gib']:.1f} GiB over usable memory "
                             f"(a hard constraint: it cannot run as written)")
    lines = [f"baseline {doc['plan_text']} ({doc['origin']}): {f['tokens_per_s_per_gpu']:,.0f} "
             f"tokens/s per GPU, MFU {f['mfu']:.1%}, step {f['step_time_s']:.2f} s, peak "
             f"{f['peak_mem_gib']:.1f}/{f['usable_mem_gib']:.1f} GiB — {fit}; bound by "
             f"{f['binding']}"]
    if doc.get("in_space") is False:
        lines.append("  outside the search space:")
        lines += [f"    {x['text']}" for x in doc["excluded_by"]]
    elif doc.get("in_space"):
        lines.append("  inside the search space")
    v = doc.get("versus")
    if v is not None:
        lines.append(f"  {v['summary']}")
        if v["gain"]["total"] < -5e-4:
            lines += _beaten_lines(doc, v)
    return lines


def _beaten_lines(doc: dict[str, Any], v: dict[str, Any]) -> list[str]:
    """What it means that the baseline beats the plan set beside it. Only the search's best
    (``label`` "the best") says anything about the search: a plan the user chose (compare's
    ``--base``, explain of another rank) beaten by the baseline is the user's plan losing."""
    f, label = doc["figures"], v["label"]
    faster = f"{-v['gain']['total'] / (1 + v['gain']['total']):+.1%}"
    if label != SEARCHED_BEST:
        return [f"  the baseline beats {label} ({f['tokens_per_s_per_gpu']:,.0f} vs "
                f"{v['figures']['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {faster}); "
                f"{label} is not the search's best, so this says nothing of the search"]
    if doc.get("in_space") and f["within_headroom"]:
        return [f"  the baseline beats the search's best, though the space holds it: "
                f"{_why_beaten(doc.get('searched', {}), f['tokens_per_s_per_gpu'])}"]
    return []


def _why_beaten(searched: dict[str, Any] | None, tps: float) -> str:
    """Why an in-space baseline beats the best: a layout the search has not judged yet, or one
    it judges at another placement (``searched``: :func:`searched_layout`) or screens out."""
    if searched is None:
        return ("the search's memory screen rules its layout out (the placement's memory model "
                "with the study's headroom)")
    if searched and searched["tokens_per_s_per_gpu"] < tps * (1 - 5e-4):
        return (f"the search judges its layout placed as {searched['plan_text']} "
                f"({searched['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU; the placement "
                f"model's split and the even split), not as the baseline places it")
    return "the search has not converged (more trials, or --exhaustive)"

