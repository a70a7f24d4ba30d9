"""The cost model's entry points: one plan in, one :class:`StepEstimate` out; or many plans as
columns in, columns out; and the linear memory terms the CP-SAT stage places layers with."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from costmodel import comm
from costmodel.mapping import STAGES
from costmodel.parallel.mesh import placement_of
from costmodel.placement import parse_rank_order
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.result import (
    Collective,
    ComputeEstimate,
    MemoryEstimate,
    StageMemory,
    StageTime,
    StepEstimate,
)
from costmodel.rules import Switches, check, facts_of
from costmodel.specs import ClusterSpec, ModelSpec, Plan, Training
from costmodel.step import StepArrays, evaluate, plan_memory


def check_plan(model: ModelSpec, cluster: ClusterSpec, plan: Plan, tr: Training,
               switches: Switches | None = None) -> None:
    """Validity is arithmetic: raise :class:`SpecError` naming the first rule of
    :data:`costmodel.rules.RULES` the plan breaks, with its values. ``switches``: what the
    framework allows (default: what the cost model prices)."""
    check(plan, facts_of(model, cluster, tr, switches))


def peak_memory_batch(model: ModelSpec, cluster: ClusterSpec, training: Training,
                      plans: Mapping[str, object]) -> np.ndarray:
    """The peak stage's bytes of many plans, as :func:`estimate_batch` gives them
    (``peak_mem_bytes``), without pricing their time."""
    _, _, _, stages = plan_memory(model, cluster, training, as_plan_arrays(plans))
    return np.max(np.stack([stages[s].total for s in STAGES]), axis=0)


def estimate_batch(model: ModelSpec, cluster: ClusterSpec, training: Training,
                   plans: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Evaluate many (valid) plans at once. See ``PLAN_KEYS`` for the input columns."""
    p = as_plan_arrays(plans)
    r = evaluate(model, cluster, training, p)
    peak = np.max(np.stack([r.stages[s].total for s in STAGES]), axis=0)
    exposed = sum(c.exposed_s for c in r.collectives)
    total = sum(c.time_s for c in r.collectives)
    peak_flops = cluster.gpu.peak_flops_bf16  # one MFU convention (costmodel.result)
    mfu = r.model_flops / r.step_time_s / peak_flops
    return {
        "step_time_s": r.step_time_s,
        "tokens_per_s_per_gpu": r.tokens_per_step / r.step_time_s / r.num_gpus,
        "mfu": mfu,
        "mfu_causal": r.causal_flops_share * mfu,
        "hfu": r.hardware_flops / r.step_time_s / peak_flops,
        "mfu_precision_peak": (r.model_flops / r.step_time_s
                               / cluster.gpu.peak_flops(training.precision)),
        "model_tflops_per_gpu": r.model_flops / r.step_time_s / 1e12,
        "peak_mem_bytes": peak,
        "first_stage_mem_bytes": r.stages["first"].total,
        "usable_bytes": np.full_like(peak, r.usable_bytes),
        "mem_slack_bytes": peak - r.usable_bytes,
        "fits": (peak <= r.usable_bytes) & (r.host_bytes <= cluster.gpu.host_memory_bytes),
        "host_offload_bytes": r.host_bytes,
        "mem_weights_bytes": r.peak_part("weights"),
        "mem_grads_bytes": r.peak_part("grads"),
        "mem_optimizer_bytes": r.peak_part("optimizer"),
        "mem_activations_bytes": r.peak_part("activations"),
        "mem_buffers_bytes": r.peak_part("buffers") + r.peak_part("overhead"),
        "time_compute_s": r.compute_s,
        "time_contention_s": r.contention_s,
        "time_stall_s": r.stall_s,
        "time_comm_s": np.asarray(total, dtype=float),
        "time_comm_exposed_s": np.asarray(exposed, dtype=float),
        "time_bubble_s": r.bubble_s,
        "time_optimizer_s": r.optimizer_s,
        # the groups that cross the network (costmodel.placement.mask_groups reads it)
        "network_groups_mask": r.placement.network_mask(model.moe_experts > 0),
    }


def plan_placement(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                   training: Training) -> dict[str, object]:
    """Where one plan's groups sit and the link of each pipeline hop, as plain data
    (:meth:`costmodel.placement.Placement.describe`), in the framework's rank order."""
    at = placement_of(cluster, training, as_plan_arrays(plans_to_arrays([plan])))
    order = parse_rank_order(training.framework.pp.rank_order)
    return {**at.describe(0, model.moe_experts > 0, order),
            "rail_group_nodes": cluster.rail_group_nodes,
            "oversubscription": cluster.oversubscription}


def _scalar(x: np.ndarray) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def _to_result(r: StepArrays, cluster: ClusterSpec, plan: Plan, tr: Training) -> StepEstimate:
    shown = ("first",) if plan.pp == 1 else ("first", "last") if plan.pp == 2 else STAGES
    stages = tuple(
        StageMemory(stage=st, layers=int(round(_scalar(r.stage_layers[st]))),  # type: ignore[arg-type]
                    weights_bytes=_scalar(b.weights), grads_bytes=_scalar(b.grads),
                    optimizer_bytes=_scalar(b.optimizer),
                    activations_bytes=_scalar(b.activations), buffers_bytes=_scalar(b.buffers),
                    overhead_bytes=_scalar(b.overhead))
        for st, b in ((s, r.stages[s]) for s in shown))
    times = tuple(StageTime(stage=m.stage, layers=m.layers,
                            compute_s=_scalar(r.stage_compute_s[m.stage]),
                            comm_s=_scalar(r.stage_comm_s[m.stage])) for m in stages)
    collectives = tuple(
        Collective(name=c.name, group=c.group, op=c.op,  # type: ignore[arg-type]
                   group_size=int(_scalar(c.group_size)), bytes=_scalar(c.bytes),
                   tier=comm.TIER_NAMES[int(_scalar(c.tier))],  # type: ignore[arg-type]
                   time_s=_scalar(c.time_s), exposed_s=_scalar(c.exposed_s))
        for c in r.collectives if _scalar(c.group_size) > 1)
    return StepEstimate(
        memory=MemoryEstimate(stages=stages, usable_bytes=r.usable_bytes,
                              host_bytes=_scalar(r.host_bytes),
                              host_usable_bytes=cluster.gpu.host_memory_bytes),
        compute=ComputeEstimate(model_flops=_scalar(r.model_flops),
                                causal_flops_share=float(r.causal_flops_share),
                                hardware_flops=_scalar(r.hardware_flops),
                                time_s=_scalar(r.compute_s),
                                recompute_time_s=_scalar(r.recompute_s),
                                contention_time_s=_scalar(r.contention_s),
                                stall_time_s=_scalar(r.stall_s),
                                optimizer_time_s=_scalar(r.optimizer_s),
                                gemm_efficiency=_scalar(r.gemm_efficiency),
                                stage_times=times),
        collectives=collectives,
        bubble_time_s=_scalar(r.bubble_s),
        step_time_s=_scalar(r.step_time_s),
        tokens_per_step=r.tokens_per_step,
        num_gpus=r.num_gpus,
        peak_flops_per_gpu=cluster.gpu.peak_flops_bf16,
        precision_peak_flops_per_gpu=cluster.gpu.peak_flops(tr.precision),
    )


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
             training: Training) -> StepEstimate:
    """Judge one plan on the three challenges. Raises :class:`SpecError` for an invalid plan."""
    check_plan(model, cluster, plan, training)
    p = as_plan_arrays(plans_to_arrays([plan]))
    return _to_result(evaluate(model, cluster, training, p), cluster, plan, training)
