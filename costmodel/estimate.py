"""The cost model's entry points: one plan in, one :class:`StepEstimate` out; or many plans as
columns in, columns out; and the linear memory terms the CP-SAT stage places layers with."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from costmodel import comm
from costmodel.layout import STAGES
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.result import (
    Collective,
    ComputeEstimate,
    MemoryEstimate,
    StageMemory,
    StepEstimate,
)
from costmodel.specs import ClusterSpec, ModelSpec, Plan, SpecError, Training
from costmodel.step import StepArrays, evaluate


def check_plan(model: ModelSpec, cluster: ClusterSpec, plan: Plan, tr: Training) -> None:
    """Validity is arithmetic: raise :class:`SpecError` naming the first rule the plan breaks."""
    rules: list[tuple[bool, str]] = [
        (plan.world_size == cluster.num_gpus,
         f"tp * pp * cp * dp == num_gpus must hold, but got tp={plan.tp}, pp={plan.pp}, "
         f"cp={plan.cp}, dp={plan.dp}, num_gpus={cluster.num_gpus}"),
        (model.heads % plan.tp == 0,
         f"heads % tp == 0 must hold, but got heads={model.heads}, tp={plan.tp}"),
        (model.kv_heads % plan.tp == 0 or plan.tp % model.kv_heads == 0,
         f"kv_heads and tp must divide one another, got kv_heads={model.kv_heads}, tp={plan.tp}"),
        (tr.global_batch % (plan.dp * plan.micro_batch) == 0,
         f"global_batch % (dp * micro_batch) == 0 must hold, but got global_batch="
         f"{tr.global_batch}, dp={plan.dp}, micro_batch={plan.micro_batch}"),
        (tr.seq_len % (2 * plan.cp) == 0 or plan.cp == 1,
         f"seq_len % (2 * cp) == 0 must hold, but got seq_len={tr.seq_len}, cp={plan.cp}"),
        (plan.ep == 1 or (model.is_moe and model.moe_experts % plan.ep == 0),
         f"ep must divide moe_experts, but got ep={plan.ep}, moe_experts={model.moe_experts}"),
        ((plan.tp * plan.dp * plan.cp) % plan.ep == 0,
         f"ep must divide tp * dp * cp (EP spans data-parallel ranks, or folds over "
         f"tensor-parallel ones with expert TP 1), but got ep={plan.ep}, tp={plan.tp}, "
         f"dp={plan.dp}, cp={plan.cp}"),
    ]
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first or last:
        rest = model.layers - (first or 0) - (last or 0)
        middle = plan.pp - (1 if first else 0) - (1 if last else 0)
        even_ok = middle > 0 and rest % middle == 0 and rest // middle > 0
        rules.append((plan.pp > 1 and (even_ok or (middle == 0 and rest == 0)),
                      f"uneven stages must leave the other stages an equal whole number of "
                      f"layers, but got layers={model.layers}, pp={plan.pp}, "
                      f"first_stage_layers={first}, last_stage_layers={last}"))
    elif plan.vpp > 1:
        rules.append((model.layers % (plan.pp * plan.vpp) == 0,
                      f"layers % (pp * vpp) == 0 must hold with interleaving, but got "
                      f"layers={model.layers}, pp={plan.pp}, vpp={plan.vpp}"))
    else:
        rules.append((model.layers >= plan.pp,
                      f"layers >= pp must hold, but got layers={model.layers}, pp={plan.pp}"))
    for ok, message in rules:
        if not ok:
            raise SpecError(message)


def estimate_batch(model: ModelSpec, cluster: ClusterSpec, training: Training,
                   plans: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Evaluate many (valid) plans at once. See ``PLAN_KEYS`` for the input columns."""
    p = as_plan_arrays(plans)
    r = evaluate(model, cluster, training, p)
    peak = np.max(np.stack([r.stages[s].total for s in STAGES]), axis=0)
    exposed = sum(c.exposed_s for c in r.collectives)
    total = sum(c.time_s for c in r.collectives)
    peak_flops = cluster.gpu.peak_flops_bf16  # one MFU convention (costmodel.result)
    return {
        "step_time_s": r.step_time_s,
        "tokens_per_s_per_gpu": r.tokens_per_step / r.step_time_s / r.num_gpus,
        "mfu": r.model_flops / r.step_time_s / peak_flops,
        "hfu": r.hardware_flops / r.step_time_s / peak_flops,
        "mfu_precision_peak": (r.model_flops / r.step_time_s
                               / cluster.gpu.peak_flops(training.precision)),
        "model_tflops_per_gpu": r.model_flops / r.step_time_s / 1e12,
        "peak_mem_bytes": peak,
        "first_stage_mem_bytes": r.stages["first"].total,
        "usable_bytes": np.full_like(peak, r.usable_bytes),
        "mem_slack_bytes": peak - r.usable_bytes,
        "fits": peak <= r.usable_bytes,
        "mem_weights_bytes": r.peak_part("weights"),
        "mem_grads_bytes": r.peak_part("grads"),
        "mem_optimizer_bytes": r.peak_part("optimizer"),
        "mem_activations_bytes": r.peak_part("activations"),
        "mem_buffers_bytes": r.peak_part("buffers") + r.peak_part("overhead"),
        "time_compute_s": r.compute_s,
        "time_comm_s": np.asarray(total, dtype=float),
        "time_comm_exposed_s": np.asarray(exposed, dtype=float),
        "time_bubble_s": r.bubble_s,
        "time_optimizer_s": r.optimizer_s,
    }


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
    collectives = tuple(
        Collective(name=c.name, group=c.group, op=c.op,  # type: ignore[arg-type]
                   group_size=int(_scalar(c.group_size)), bytes=_scalar(c.bytes),
                   tier=comm.TIER_NAMES[int(_scalar(c.tier))],  # type: ignore[arg-type]
                   time_s=_scalar(c.time_s), exposed_s=_scalar(c.exposed_s))
        for c in r.collectives if _scalar(c.group_size) > 1)
    return StepEstimate(
        memory=MemoryEstimate(stages=stages, usable_bytes=r.usable_bytes),
        compute=ComputeEstimate(model_flops=_scalar(r.model_flops),
                                hardware_flops=_scalar(r.hardware_flops),
                                time_s=_scalar(r.compute_s),
                                recompute_time_s=_scalar(r.recompute_s),
                                optimizer_time_s=_scalar(r.optimizer_s),
                                gemm_efficiency=_scalar(r.gemm_efficiency)),
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
