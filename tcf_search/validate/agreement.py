"""Predicted against measured: per plan (time, throughput, memory), per memory part, and the
rank agreement of the whole set (Spearman's rho).

Memory parts are compared in PyTorch's layout. The cost model counts Megatron's: bf16 weights
(2 B/param) plus an fp32 master copy inside the optimizer states (4 + 8 B/param). PyTorch-native
mixed precision (FSDP2's ``MixedPrecisionPolicy``) keeps the parameters themselves in fp32 — they
are the master copy — and makes bf16 copies per layer only while computing. So the prediction
is taken with ``master_weights=False`` and its weights at 4 B/param (twice its bf16 bytes);
gradients (fp32) and Adam's two moments (fp32) mean the same thing in both. The harness's
sequence parallel is DTensor's, which keeps the gathered inputs of the column-parallel
projections for backward (``training.framework.tp.sp_saves_gathered_input``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from costmodel import estimate
from costmodel.specs import ClusterSpec, ModelSpec, Plan, Training
from tcf_search.validate.config import RunResult

GIB = 2**30
PARTS = ("weights", "grads", "optimizer", "activations")


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation with average ranks for ties; nan below two points."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs equal lengths, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else float("nan")


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def plan_label(plan: Plan) -> str:
    parts = [f"tp{plan.tp}", f"pp{plan.pp}", f"dp{plan.dp}"]
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.pp > 1:
        parts.append(plan.schedule if plan.vpp == 1 else f"interleaved{plan.vpp}")
    parts += [f"z{plan.zero_stage}", f"mb{plan.micro_batch}"]
    if plan.recompute != "none":
        parts.append(f"rc-{plan.recompute}")
    return "-".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One validated plan, predicted beside measured."""

    rank: int
    plan: str
    outcome: str
    predicted_step_time_s: float
    measured_step_time_s: float
    predicted_tokens_per_s_per_gpu: float
    measured_tokens_per_s_per_gpu: float
    predicted_peak_gib: float
    measured_peak_gib: float
    loss_first: float
    loss_last: float
    trial: int | None = None
    memory_source: str = ""
    error: str = ""

    @property
    def time_error(self) -> float:
        """measured / predicted - 1 (positive: slower than predicted)."""
        return self.measured_step_time_s / self.predicted_step_time_s - 1.0

    @property
    def memory_error(self) -> float:
        return self.measured_peak_gib / self.predicted_peak_gib - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "time_error": self.time_error,
                "memory_error": self.memory_error}


def trial_number(predicted: dict[str, Any]) -> int | None:
    source = str(predicted.get("source", ""))
    return int(source.split()[-1]) if source.startswith("trial ") else None


def make_row(rank: int, plan: Plan, predicted: dict[str, Any], result: RunResult) -> Row:
    return Row(
        rank=rank, plan=plan_label(plan), outcome=result.outcome,
        predicted_step_time_s=float(predicted.get("step_time_s", math.nan)),
        measured_step_time_s=result.step_time_s,
        predicted_tokens_per_s_per_gpu=float(predicted.get("tokens_per_s_per_gpu", math.nan)),
        measured_tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
        predicted_peak_gib=float(predicted.get("peak_mem_gib", math.nan)),
        measured_peak_gib=result.peak_bytes / GIB, loss_first=result.loss_first,
        loss_last=result.loss_last, trial=trial_number(predicted),
        memory_source=result.memory_source, error=result.error)


def rank_agreement(rows: Sequence[Row]) -> float:
    """Spearman's rho of predicted against measured step time over the plans that ran."""
    ok = [r for r in rows if r.outcome == "ok" and math.isfinite(r.measured_step_time_s)
          and math.isfinite(r.predicted_step_time_s)]
    return spearman([r.predicted_step_time_s for r in ok], [r.measured_step_time_s for r in ok])


# ---- memory parts --------------------------------------------------------------------------

def predicted_parts(model: ModelSpec, cluster: ClusterSpec, plan: Plan, training: Training,
                    stage: str = "first") -> dict[str, float]:
    """The cost model's memory parts of one stage, in bytes, in PyTorch's layout (see the
    module docstring)."""
    tr = training.with_switches(master_weights=False, sp_saves_gathered_input=True)
    est = estimate(model, cluster, plan, tr)
    mem = next((s for s in est.memory.stages if s.stage == stage), est.memory.peak)
    return {"weights": 2.0 * mem.weights_bytes, "grads": mem.grads_bytes,
            "optimizer": mem.optimizer_bytes, "activations": mem.activations_bytes,
            "buffers": mem.buffers_bytes}


def measured_parts(maxima: dict[str, float], layer_activations: float) -> dict[str, float]:
    """Each part at its own maximum over the step (weights and optimizer states are constant;
    gradients peak at the optimizer step; activations in backward, logits left out)."""
    def get(*names: str) -> float:
        return sum(maxima.get(n, 0.0) for n in names)
    return {"weights": get("Parameter", "Sharded Param"),
            "grads": get("Gradient", "Sharded Grad"),
            "optimizer": get("Optstate", "OptState"),
            "activations": layer_activations}


def part_errors(measured: dict[str, float], predicted: dict[str, float]) -> dict[str, float]:
    return {k: measured[k] / predicted[k] - 1.0 for k in PARTS if predicted.get(k)}
