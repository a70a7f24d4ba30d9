"""Plans written on the command line, parsed by :mod:`search.inputs.planspec` (re-exported here).

A change to one knob that breaks validity (``tp=8`` with ``dp`` unchanged alters the world
size) is repaired by :func:`apply_change`, which says what it moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from costmodel import Plan, rules
from search.inputs import (
    ALIASES,
    CHOICES,
    FALSE,
    PLAN_FIELDS,
    SHORT,
    TRUE,
    PlanSpecError,
    Specs,
    check,
    format_plan,
    make_plan,
    own_dispatch_unsaid,
    parse_assignments,
    parse_plan,
)

__all__ = ["ALIASES", "CHOICES", "FALSE", "PLAN_FIELDS", "REPAIRS", "SHORT", "TRUE",
           "PlanSpecError", "apply_change", "check", "format_plan", "make_plan",
           "parse_assignments", "parse_plan"]


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


Values = dict[str, Any]
# How to repair each rule of costmodel.rules.RULES that a change breaks: (knob, new value from
# the plan's values and the specs or None for no repair, why). A rule without an entry (or
# whose knobs the change names) is not repaired: the check names it.
Repair = tuple[str, Callable[[Values, Specs], Any], str]


def _dp_filling(v: Values, s: Specs) -> int | None:
    inner, n = v["tp"] * v["pp"] * v["cp"], s.cluster.num_gpus
    return n // inner if n % inner == 0 else None


def _micro_batch_dividing(v: Values, s: Specs) -> int | None:
    b = s.training.global_batch
    return _largest_divisor_at_most(b // v["dp"], v["micro_batch"]) if b % v["dp"] == 0 else None


def _micro_batch_grouping(v: Values, s: Specs) -> int | None:
    """The largest micro-batch up to the plan's that leaves a multiple of pp micro-batches."""
    b, dp, pp = s.training.global_batch, v["dp"], v["pp"]
    fits = [m for m in range(1, v["micro_batch"] + 1)
            if b % (m * dp) == 0 and (b // (m * dp)) % pp == 0]
    return max(fits) if fits else None


def _recompute_per_chunk(v: Values, s: Specs) -> int:
    return -(-v["recompute_layers"] // v["vpp"]) * v["vpp"]


REPAIRS: dict[str, tuple[Repair, ...]] = {
    "world_size": (("dp", _dp_filling, "keeps {num_gpus} GPUs"),),
    "pp_layers": (("first_stage_layers", lambda v, s: 0, "even split for the new pipeline"),
                  ("last_stage_layers", lambda v, s: 0, "even split for the new pipeline")),
    "vpp_layers": (("first_stage_layers", lambda v, s: 0, "even split for the new pipeline"),
                   ("last_stage_layers", lambda v, s: 0, "even split for the new pipeline"),
                   ("vpp", lambda v, s: 1, "{layers} layers do not split into pp*vpp chunks")),
    "sp_tp": (("sequence_parallel", lambda v, s: False, "needs tp > 1"),),
    "moe_tp_sp": (("sequence_parallel", lambda v, s: True,
                   "the framework's MoE layers under TP need sequence parallelism"),),
    "schedule": (("pp_schedule", lambda v, s: "1f1b", "no pipeline"),),
    "zero_sharding": (("zero_stage", lambda v, s: 0, "no data-parallel ranks to shard over"),),
    "batch": (("micro_batch", _micro_batch_dividing, "divides the sequences per replica"),),
    "microbatch_groups": (("micro_batch", _micro_batch_grouping,
                           "interleaving runs micro-batches in groups of pp"),
                          ("vpp", lambda v, s: 1, "no micro-batch count in groups of pp")),
    "recompute_chunks": (("recompute_layers", _recompute_per_chunk,
                          "--recompute-num-layers counts per model chunk"),),
    "recompute_modules": (("recompute_modules", lambda v, s: (),
                           "a plan's own modules need selective recompute under Megatron-Core"),),
    "cuda_graphs": (("recompute", lambda v, s: "selective",
                     "full recompute runs only under a full-iteration CUDA graph"),),
    "cpu_offload": (("cpu_offload_layers", lambda v, s: 0,
                     "offloading needs pp 1, no recompute and fewer than {layers} layers"),
                    ("recompute", lambda v, s: "none", "offloaded activations are not recomputed")),
}


def apply_change(base: Plan, change: dict[str, Any], specs: Specs) -> tuple[Plan, list[str]]:
    """``base`` with ``change`` applied, then made valid by moving only knobs the change did not
    name, driven by the rules (``costmodel.rules``) the changed plan breaks: each broken rule
    tries its ``REPAIRS`` in turn, keeping a move when the rule then holds. Returns the plan and
    one note per knob moved; raises :class:`PlanSpecError` when no such repair exists."""
    values = own_dispatch_unsaid({**dataclasses.asdict(base), **change}, specs.training)
    notes: list[str] = []
    if values["recompute"] != "full" and "recompute_layers" not in change:
        # not a validity rule: only full recompute reads the count
        values["recompute_layers"] = 0
    f = rules.facts_of(specs.model, specs.cluster, specs.training, specs.switches)
    words = {"num_gpus": specs.cluster.num_gpus, "layers": specs.model.layers}
    moved: dict[str, tuple[Any, str]] = {}
    for _ in range(len(rules.RULES) * 3):  # each move fixes a rule or is undone
        try:
            broken = rules.broken(values, f)
        except (KeyError, TypeError, ValueError):  # a malformed value: make_plan names it
            break
        fixed = False
        for rule in broken:
            for knob, value_of, why in REPAIRS.get(rule.name, ()):
                value = value_of(values, specs)
                if knob in change or value is None or values[knob] == value:
                    continue
                moved.setdefault(knob, (values[knob], why.format(**words)))
                values[knob] = value
                fixed = True
                if rule not in rules.broken(values, f):
                    break
            if fixed:
                break
        if not fixed:
            break
    for knob, (old, why) in moved.items():
        if values[knob] != old:
            notes.append(f"{knob} {old}→{values[knob]} ({why})")
    plan = make_plan(values)
    check(plan, specs)
    return plan, notes
