"""One plan explained in the framework's order: memory, compute, communication, then a verdict.

Everything here is read off :func:`costmodel.estimate` (one :class:`StepEstimate`) and the
plan's one-knob neighbours; nothing is re-derived. The result is a plain JSON-ready document so
that the terminal, ``--json`` and the HTML report show the same numbers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from costmodel import (
    ClusterSpec,
    ModelSpec,
    Plan,
    StepEstimate,
    Training,
    dispatch,
    estimate,
    plan_placement,
    plans_to_arrays,
)
from costmodel.parallel.expert import groups_hit, nodes_reached, sm_share
from costmodel.recompute_modules import mask_modules
from hardware_catalog.frameworks import is_megatron_core
from search import (
    AnchoredSpread,
    AnchorLocal,
    baseline_doc,
    baseline_of,
    build_space,
    calibration_status,
    local_for,
    p_best_faster,
    plan_regime,
    plan_rests_on,
    spread_for,
    step_breakdown,
    uncertainty_metrics,
)
from search.inputs import Specs, plan_dict
from tcf_search.explain.neighbours import best_move, improves, neighbours
from tcf_search.explain.planspec import format_plan
from tcf_search.explain.source import Subject

GIB = 2**30
FLOP_CONVENTION = (
    "MFU counts model FLOPs = 6·N·tokens + 12·L·h·s·tokens (PaLM/Megatron convention: "
    "attention without causal halving, recomputation not counted) over dense bf16 peak; "
    "HFU adds the recomputed forward passes.")
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "buffers", "overhead")


def moe_dispatch(model: ModelSpec, cluster: ClusterSpec, training: Training, plan: Plan,
                 placement: dict[str, Any]) -> dict[str, Any]:
    """The MoE dispatch the plan runs: its own (plan fields moe_dispatcher, moe_a2a_overlap)
    or the training's, and which of the two it is; under flex across nodes, how many of the EP
    group's nodes a token's copies reach (``costmodel.parallel.expert.nodes_reached``: its own
    among them, as DeepEP counts them; fewer under group-limited routing)."""
    own = training.framework.moe
    out: dict[str, Any] = {
        "dispatcher": plan.moe_dispatcher or own.moe_dispatcher,
        "a2a_overlap": (plan.moe_a2a_overlap == "on" if plan.moe_a2a_overlap
                        else own.moe_a2a_overlap),
        "plan_own": bool(plan.moe_dispatcher or plan.moe_a2a_overlap),
        "training": {"dispatcher": own.moe_dispatcher, "a2a_overlap": own.moe_a2a_overlap}}
    if out["a2a_overlap"]:  # the SMs its kernels hold from the compute it overlaps
        code = np.array([dispatch.CODES[out["dispatcher"]]])
        out["sm_share"] = float(sm_share(cluster, training, code)[0])
    if out["dispatcher"] != "flex":
        return out
    ep = next((g for g in placement.get("groups", []) if g["group"] == "ep"), None)
    nodes = np.array([ep["size"] / ep["per_node"] if ep is not None else 1.0])
    hit = float(nodes_reached(nodes, model)[0])
    if hit > 0:
        r = model.moe_router
        out["reach"] = {"nodes": float(nodes[0]), "hit": hit,
                        "uniform": float(groups_hit(nodes, model.moe_experts,
                                                    model.moe_topk)[0]),
                        "groups": (r.group_topk, r.groups) if r and r.group_topk < r.groups
                        else None}
    return out


def _memory(e: StepEstimate) -> dict[str, Any]:
    usable = e.memory.usable_bytes
    stages = []
    for st in e.memory.stages:
        row: dict[str, Any] = {"stage": st.stage, "layers": st.layers}
        row.update({f"{p}_gib": getattr(st, f"{p}_bytes") / GIB for p in MEMORY_PARTS})
        row["total_gib"] = st.total_bytes / GIB
        row["headroom_gib"] = (usable - st.total_bytes) / GIB
        row["fits"] = st.total_bytes <= usable
        stages.append(row)
    return {"usable_gib": usable / GIB, "peak_gib": e.memory.peak_bytes / GIB,
            "peak_stage": e.memory.peak.stage, "fits": e.memory.fits,
            "headroom_gib": -e.memory.slack_bytes / GIB, "stages": stages,
            # activations offloaded to pinned host memory (costmodel/offload.py)
            "host_gib": e.memory.host_bytes / GIB,
            "host_usable_gib": e.memory.host_usable_bytes / GIB}


def selective_label(tr: Training, plan: Plan | None = None) -> str:
    """What recompute=selective runs again under the plan's framework, in words: under
    Megatron-Core the plan's own modules where it names some, else the training's."""
    if tr.framework.activations.selective_recompute == "modules":
        own = plan is not None and plan.recompute_modules
        modules = own or tr.framework.activations.recompute_modules
        return (f"Megatron-Core modules {', '.join(modules)}"
                + (" (the plan's own)" if own else ""))
    if tr.framework.activations.selective_recompute == "every_other_mm":
        return "every elementwise op and every second GEMM (torchtitan's op policy)"
    return "the MLP's activation function"


def _compute(e: StepEstimate) -> dict[str, Any]:
    c = e.compute
    return {"model_flops_per_gpu": c.model_flops, "hardware_flops_per_gpu": c.hardware_flops,
            "peak_tflops_per_gpu": e.precision_peak_flops_per_gpu / 1e12,
            "bf16_peak_tflops_per_gpu": e.peak_flops_per_gpu / 1e12,
            "gemm_efficiency": c.gemm_efficiency, "time_s": c.time_s,
            "recompute_time_s": c.recompute_time_s,
            "contention_time_s": c.contention_time_s,
            "stall_time_s": c.stall_time_s,
            "recompute_share": c.recompute_time_s / c.time_s if c.time_s else 0.0,
            "bubble_time_s": e.bubble_time_s,
            "bubble_share": e.bubble_time_s / e.step_time_s,
            "optimizer_time_s": c.optimizer_time_s,
            "model_tflops_per_gpu": e.model_tflops_per_gpu, "mfu": e.mfu, "hfu": e.hfu,
            "mfu_precision_peak": e.mfu_precision_peak, "mfu_causal": e.mfu_causal,
            "flop_convention": FLOP_CONVENTION, "pipeline": _pipeline(e)}


def _pipeline(e: StepEstimate) -> list[dict[str, Any]]:
    """One micro-batch through each pipeline stage (none without a pipeline), and each stage's
    wait for the slowest, as a share of the slowest's time."""
    times = e.compute.stage_times if len(e.compute.stage_times) > 1 else ()
    pace = max((t.total_s for t in times), default=0.0)
    return [{"stage": t.stage, "layers": t.layers, "compute_s": t.compute_s,
             "comm_s": t.comm_s, "total_s": t.total_s, "paces": t.total_s == pace,
             "waits_share": 1.0 - t.total_s / pace if pace else 0.0} for t in times]


def _stall(e: StepEstimate, tr: Training) -> dict[str, float]:
    """The allocator stall's chance (that the real peak passes ``pressure_start`` of usable
    memory) and what a stalled step takes, read back from its expected time."""
    slow, stall = tr.framework.memory_model.pressure_slowdown, e.compute.stall_time_s
    chance = stall / (slow * (e.step_time_s - stall)) if slow > 0 and stall > 0 else 0.0
    return {"stall_chance": chance, "stall_slowdown": slow}


def _communication(e: StepEstimate) -> dict[str, Any]:
    rows = [{**dataclasses.asdict(c), "gib": c.bytes / GIB, "hidden_s": c.hidden_s}
            for c in e.collectives]
    return {"time_s": e.comm_time_s, "exposed_s": e.comm_exposed_s,
            "hidden_s": e.comm_time_s - e.comm_exposed_s,
            "bytes": sum(c.bytes for c in e.collectives), "collectives": rows}


REASONS = {
    "memory": "the plan does not fit: memory is a hard constraint and binds first",
    "compute": "compute (kernels, including recompute) is the largest share of the step",
    "communication": "exposed communication is the largest share of the step after compute "
                     "overlap",
    "bubble": "the pipeline bubble is the largest share of the step",
}


# Megatron-Core's numerics switches a study may turn on (search.inputs.sections.TrainingSection):
# not searched, since they change the numbers trained and not only the speed, but priced on the
# plan so that the choice is made knowingly. NVIDIA's performance recipes take both
# (Megatron-Bridge scripts/performance configs: grad_reduce_in_fp32 = False; its fp8 presets:
# fp8_param_gather = True); Llama 3 reduced gradients in fp32 (Dubey et al., sec. 3.3.4).
NUMERICS = {
    "grad_reduce_in_bf16": (True, "gradients accumulated and reduced in bf16",
                            lambda tr: (tr.precision in ("bf16", "fp8")
                                        and tr.framework.numerics.grad_dtype_bytes > 2),
                            lambda tr: tr.with_switches(grad_dtype_bytes=2)),
    "fp8_param_gather": (True, "fp8 weights only, gathered in fp8",
                         lambda tr: (tr.precision == "fp8"
                                     and not tr.framework.numerics.fp8_param_gather),
                         lambda tr: tr.with_switches(fp8_param_gather=True)),
    # ... and its loss kernel: Transformer Engine's in-place cross-entropy, which the
    # performance recipes run (Megatron-Bridge's _set_common_perf_overrides:
    # cross_entropy_fusion_impl "te"), a choice of kernel (fp32 inside it, the same loss)
    "cross_entropy_fusion_impl": ("te", "Transformer Engine's in-place cross-entropy",
                                  lambda tr: tr.framework.kernels.loss_kernel != "te_inplace",
                                  lambda tr: tr.with_switches(loss_kernel="te_inplace")),
}


def numerics(subject: Subject, e: StepEstimate) -> list[dict[str, Any]]:
    """Each numerics switch the study leaves unsaid under a Megatron-Core profile, priced on
    the plan: peak memory, whether it fits, and the tokens/s it changes."""
    study, s = subject.study, subject.specs
    if study is None or not is_megatron_core(study.training.framework):
        return []
    out = []
    for field, (value, what, applies, switched) in NUMERICS.items():
        if getattr(study.training, field) is not None or not applies(s.training):
            continue
        alt = estimate(s.model, s.cluster, subject.plan, switched(s.training))
        out.append({"field": f"training.{field}", "value": value, "what": what,
                    "peak_mem_gib": alt.memory.peak_bytes / GIB, "fits": alt.memory.fits,
                    "gain": alt.tokens_per_s_per_gpu / e.tokens_per_s_per_gpu - 1.0})
    return out


def module_sets(subject: Subject) -> tuple[tuple[str, ...], ...]:
    """The selective module sets the study's space searches (() the training's); none where it
    does not search them."""
    study = subject.study
    if study is None or study.search_space.recompute_modules is None:
        return ()
    domain = build_space(study, subject.specs).domains["recompute_modules"]
    return tuple(mask_modules(mask) for mask in domain)


def explain(subject: Subject) -> dict[str, Any]:
    """The explanation document of one plan."""
    s, plan = subject.specs, subject.plan
    e = estimate(s.model, s.cluster, plan, s.training)
    moves = neighbours(plan, s, e.tokens_per_s_per_gpu, module_sets(subject))
    best = best_move(moves)
    better = improves(best, e.memory.fits, e.tokens_per_s_per_gpu)
    binding = e.dominant_challenge
    breakdown = step_breakdown(e)
    if best is None:
        advice = "no valid one-knob neighbour exists"
    elif not e.memory.fits:
        advice = (f"{best.change} makes it fit ({best.peak_mem_gib:.1f} GiB), tokens/s "
                  f"{best.gain:+.1%}" if best.fits else
                  f"{best.change} needs least memory ({best.peak_mem_gib:.1f} GiB) but still "
                  f"does not fit")
    elif better:
        advice = f"{best.change}: tokens/s {best.gain:+.1%}"
        if (p := p_best_faster(best.tokens_per_s_per_gpu, e.tokens_per_s_per_gpu)) is not None:
            advice += f", really faster with P {p:.0%} (held-out pairs this close)"
    else:
        cost = "ties it" if abs(best.gain) < 5e-4 else f"costs {best.gain:+.1%} tokens/s"
        advice = (f"none improves it — a local optimum; the closest, {best.change}, {cost}"
                  if best.fits else
                  "none improves it — every one-knob neighbour breaks the memory limit")
    tokens, spread, sd, near = _anchored(s, plan, e.tokens_per_s_per_gpu)
    placed = plan_placement(s.model, s.cluster, plan, s.training)
    return {
        "study": subject.name, "origin": subject.origin, "model": s.model.name,
        "model_features": model_features(s.model),
        "cluster": {"gpu": s.cluster.gpu.id, "num_gpus": s.cluster.num_gpus,
                    "gpus_per_node": s.cluster.gpus_per_node},
        "training": {"seq_len": s.training.seq_len, "global_batch": s.training.global_batch,
                     "precision": s.training.precision,
                     "selective_recomputes": selective_label(s.training, plan)},
        "plan": plan_dict(plan), "plan_text": format_plan(plan),
        "memory": _memory(e), "compute": {**_compute(e), **_stall(e, s.training)},
        "communication": {**_communication(e),
                          "placement": placed,
                          **({"moe_dispatch": moe_dispatch(s.model, s.cluster, s.training,
                                                           plan, placed)}
                             if s.model.is_moe else {})},
        "step": {"step_time_s": e.step_time_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
                 "tokens_per_step": e.tokens_per_step, "breakdown": breakdown,
                 **({"anchored_tokens_per_s_per_gpu": tokens} if near is not None else {})},
        "uncertainty": uncertainty_metrics(
            {"tokens_per_s_per_gpu": tokens,
             "peak_mem_gib": e.memory.peak_bytes / GIB,
             "usable_mem_gib": e.memory.usable_bytes / GIB},
            plan_regime(s.model, s.cluster, s.training, s.framework),
            rests_on=plan_rests_on(s.model, s.cluster, s.training, plan),
            anchor=spread.at(sd) if spread is not None else None),
        "calibration": calibration_status(s.cluster),
        "verdict": {"binding": binding, "reason": REASONS[binding],
                    "best_change": best.to_dict() if best else None, "improves": better,
                    "advice": advice,
                    "alternatives": [m.to_dict() for m in moves[:5]],
                    "neighbours_evaluated": len(moves),
                    "numerics": numerics(subject, e)},
    }


def with_baseline(doc: dict[str, Any], subject: Subject, flag: str | None) -> dict[str, Any]:
    """``doc`` with the baseline (``--baseline``, else the study's) beside the explained plan:
    whether the study's space holds it, its figures, and the gain split by challenge."""
    base = baseline_of(subject.study, subject.specs, flag)
    if base is None:
        return doc
    s = subject.specs
    space = build_space(subject.study, s) if subject.study is not None else None
    label = "the best" if subject.origin.startswith("rank 1 ") else "this plan"
    return {**doc, "baseline": baseline_doc(s, *base, space=space, best=subject.plan,
                                            label=label)}


def model_features(m: ModelSpec) -> str:
    """What the model's layers differ by, as priced: QK-norm, windowed or chunked attention on
    which layers, sinks, a clamped activation, and which layers are MoE ("" for a uniform
    model)."""
    out = []
    if m.qk_norm:
        out.append("QK-norm")
    if m.window:
        kind = (f"sliding window {m.sliding_window}" if m.sliding_window
                else f"chunked attention {m.attention_chunk}")
        every = f", 1 in {m.window_skip_freq} full" if m.window_skip_freq else ""
        out.append(f"{kind} on {m.windowed_layers} of {m.layers} layers{every}")
    if m.attention_sinks:
        out.append("attention sinks")
    if m.swiglu_limit:
        out.append(f"SwiGLU clamped at {m.swiglu_limit:g}")
    if m.is_moe and m.moe_layers < m.layers:
        dense = f", first {m.moe_dense_layers} dense" if m.moe_dense_layers else ""
        every = f", 1 in {m.moe_layer_freq}" if m.moe_layer_freq > 1 else ""
        out.append(f"MoE on {m.moe_layers} of {m.layers} layers{dense}{every}")
    return "; ".join(out)


def _anchored(s: Specs, plan: Plan, tokens: float
              ) -> tuple[float, AnchoredSpread | None, float, AnchorLocal | None]:
    """The plan's tokens/s moved by the calibration's anchor runs near its layout
    (``search.anchored_interval``), the anchored spread, the sd left, and those runs."""
    spread = spread_for(s.calibration, s.model, s.cluster)
    near = local_for(s.calibration, s.model, s.cluster, s.training)
    if near is None:
        return tokens, spread, 1.0, None
    shift, sd = near.shift(plans_to_arrays([plan]))
    return float(tokens * np.exp(shift[0])), spread, float(sd[0]), near
