"""The single change that helps a plan most, computed rather than guessed.

Every one-knob move of the plan (a parallel degree doubled or halved with dp following to keep the
world size, another micro-batch, ZeRO stage, recompute mode, virtual stages, sequence parallel,
an even stage split, more or fewer layers offloaded) is made valid by :func:`apply_change`,
judged in one :func:`costmodel.estimate_batch` call, and ranked: plans that fit first, then
tokens/s per GPU (every study objective — tokens/s, MFU, time-to-train, cost — orders plans of
one model on one cluster alike), or, when nothing fits, least peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costmodel import Plan, estimate_batch, plans_to_arrays
from search import p_best_faster
from search.inputs import Specs, plan_dict
from tcf_search.explain.planspec import SHORT, PlanSpecError, apply_change

GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    change: str  # what the user would type: "tp=4", "recompute=full"
    plan: Plan
    notes: tuple[str, ...]  # knobs moved to keep the plan valid
    tokens_per_s_per_gpu: float
    peak_mem_gib: float
    fits: bool
    gain: float  # relative tokens/s change against the plan explained

    def to_dict(self) -> dict[str, Any]:
        # how surely the move is really faster than the plan explained (held-out pairs)
        base = self.tokens_per_s_per_gpu / (1.0 + self.gain) if self.gain > -1.0 else 0.0
        return {"change": self.change, "adjusted": list(self.notes), "plan": plan_dict(self.plan),
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "peak_mem_gib": self.peak_mem_gib, "fits": self.fits, "gain": self.gain,
                "p_faster": p_best_faster(self.tokens_per_s_per_gpu, base)}


def _scaled(value: int, *, up: int | None = None) -> list[int]:
    out = [value * 2]
    if value > 1:
        out.append(value // 2)
    return [v for v in out if up is None or v <= up]


def candidate_changes(plan: Plan, specs: Specs,
                      module_sets: tuple[tuple[str, ...], ...] = ()) -> list[dict[str, Any]]:
    """One-knob changes worth trying (some turn out invalid; :func:`neighbours` drops those);
    ``module_sets``: the selective module sets the study searches (() the training's)."""
    n = specs.cluster.num_gpus
    out: list[dict[str, Any]] = []
    for knob in ("tp", "pp", "cp"):
        out += [{knob: v} for v in _scaled(getattr(plan, knob), up=n)]
    if specs.model.is_moe:
        out += [{"ep": v} for v in _scaled(plan.ep, up=specs.model.moe_experts)]
        # the MoE dispatch: each other dispatcher, the overlap turned the other way (those the
        # launcher does not offer are dropped by the rules)
        out += [{"moe_dispatcher": d} for d in ("", "alltoall", "allgather", "flex")
                if d != plan.moe_dispatcher]
        out += [{"moe_a2a_overlap": o} for o in ("", "off", "on") if o != plan.moe_a2a_overlap]
    out += [{"micro_batch": v} for v in _scaled(plan.micro_batch)]
    out += [{"zero_stage": z} for z in range(4) if z != plan.zero_stage]
    out += [{"recompute": r} for r in ("none", "selective", "full") if r != plan.recompute]
    if plan.recompute == "full" and plan.recompute_layers:
        out.append({"recompute_layers": 0})
    if plan.recompute == "selective":
        out += [{"recompute_modules": m} for m in module_sets if m != plan.recompute_modules]
    if plan.pp > 1:
        out += [{"vpp": v} for v in _scaled(plan.vpp)]
        if plan.first_stage_layers or plan.last_stage_layers:
            out.append({"first_stage_layers": 0, "last_stage_layers": 0})
    if plan.tp > 1:
        out.append({"sequence_parallel": not plan.sequence_parallel})
    # activation offloading (rule cpu_offload: one stage, no recompute): half or twice the
    # layers, none, or half of all where it has none
    n, layers = plan.cpu_offload_layers, specs.model.layers
    steps = [0, n // 2, min(2 * n, layers - 1)] if n else [layers // 2]
    out += [{"cpu_offload_layers": v} for v in dict.fromkeys(steps) if v != n]
    return out


def describe(change: dict[str, Any]) -> str:
    if set(change) == {"first_stage_layers", "last_stage_layers"}:
        return "even stage split"
    short = dict(SHORT)
    return ",".join(f"{short.get(k, k)}={_shown(v)}" for k, v in change.items())


def _shown(value: Any) -> str:
    """A value as the plan syntax writes it (a module set joined by '+', () the training's)."""
    if isinstance(value, tuple):
        return "+".join(value) or "training"
    if value == "":  # a MoE dispatch field: the training's
        return "training"
    return str(value).lower() if isinstance(value, bool) else str(value)


def neighbours(plan: Plan, specs: Specs, base_tokens_per_s: float,
               module_sets: tuple[tuple[str, ...], ...] = ()) -> list[Move]:
    """Every valid one-knob neighbour of ``plan``, best first."""
    made: list[tuple[str, Plan, list[str]]] = []
    seen = {plan}
    for change in candidate_changes(plan, specs, module_sets):
        try:
            moved, notes = apply_change(plan, change, specs)
        except PlanSpecError:
            continue
        if moved in seen:
            continue
        seen.add(moved)
        made.append((describe(change), moved, notes))
    if not made:
        return []
    out = estimate_batch(specs.model, specs.cluster, specs.training,
                         plans_to_arrays([p for _, p, _ in made]))
    moves = [Move(change=c, plan=p, notes=tuple(notes),
                  tokens_per_s_per_gpu=float(out["tokens_per_s_per_gpu"][k]),
                  peak_mem_gib=float(out["peak_mem_bytes"][k]) / GIB,
                  fits=bool(out["fits"][k]),
                  gain=float(out["tokens_per_s_per_gpu"][k]) / base_tokens_per_s - 1.0)
             for k, (c, p, notes) in enumerate(made)]
    return sorted(moves, key=_rank_key)


def _rank_key(m: Move) -> tuple[float, float]:
    return (0.0, -m.tokens_per_s_per_gpu) if m.fits else (1.0, m.peak_mem_gib)


def best_move(moves: list[Move]) -> Move | None:
    """The single change that helps most: the best-ranked neighbour (None without any)."""
    return moves[0] if moves else None


def improves(move: Move | None, plan_fits: bool, tokens_per_s: float) -> bool:
    """Whether the move is an improvement: it fits where the plan did not, or it fits and is
    faster."""
    if move is None or not move.fits:
        return False
    return not plan_fits or move.tokens_per_s_per_gpu > tokens_per_s
