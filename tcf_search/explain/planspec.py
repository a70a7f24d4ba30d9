"""Plans written on the command line: ``"tp=8,pp=4,vpp=2,dp=32,mbs=1,recompute=selective,zero=1"``.

Keys are the fields of :class:`costmodel.Plan`, with the short names people type (``mbs``,
``zero``, ``sp``, ``schedule``). A change to one knob that breaks validity (``tp=8`` with ``dp``
unchanged alters the world size) is repaired by :func:`apply_change`, which says what it moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from costmodel import Plan, SpecError, check_plan, rules
from costmodel.errors import TcfError
from search.specs import Specs

ALIASES: dict[str, str] = {"mbs": "micro_batch", "zero": "zero_stage", "sp": "sequence_parallel",
                           "schedule": "pp_schedule", "recompute_n": "recompute_layers"}
PLAN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Plan))
CHOICES: dict[str, tuple[str, ...]] = {"recompute": ("none", "selective", "full"),
                                       "pp_schedule": ("1f1b", "interleaved", "gpipe")}
TRUE, FALSE = ("true", "yes", "on", "1", "y"), ("false", "no", "off", "0", "n")
# The short form of a plan, in the order people read them.
SHORT = (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"),
         ("micro_batch", "mbs"), ("recompute", "recompute"), ("recompute_layers", "recompute_n"),
         ("zero_stage", "zero"), ("sequence_parallel", "sp"), ("pp_schedule", "schedule"),
         ("first_stage_layers", "first_stage_layers"), ("last_stage_layers", "last_stage_layers"))


class PlanSpecError(TcfError):
    """A plan written as ``key=value,...`` is malformed; the message names the key and value."""


def _value(key: str, raw: str) -> Any:
    text = raw.strip().lower()
    if key in CHOICES:
        if text not in CHOICES[key]:
            raise PlanSpecError(f"plan: {key} must be one of {', '.join(CHOICES[key])}, "
                                f"but got {raw!r}")
        return text
    if key == "sequence_parallel":
        if text not in TRUE + FALSE:
            raise PlanSpecError(f"plan: sequence_parallel must be true or false, but got {raw!r}")
        return text in TRUE
    try:
        return int(text)
    except ValueError:
        raise PlanSpecError(f"plan: {key} must be an integer, but got {raw!r}") from None


def parse_assignments(text: str) -> dict[str, Any]:
    """``"tp=8, zero=1"`` to ``{"tp": 8, "zero_stage": 1}`` (aliases resolved, values typed)."""
    out: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key or not raw.strip():
            raise PlanSpecError(f"plan: each item must be key=value, but got {item!r}")
        name = ALIASES.get(key, key)
        if name not in PLAN_FIELDS:
            valid = sorted({*PLAN_FIELDS, *ALIASES})
            raise PlanSpecError(f"plan: unknown key {key!r} (valid: {', '.join(valid)})")
        if name in out:
            raise PlanSpecError(f"plan: {key} is given twice in {text!r}")
        out[name] = _value(name, raw)
    if not out:
        raise PlanSpecError(f"plan: expected key=value pairs such as 'tp=8,pp=4', got {text!r}")
    return out


def make_plan(values: dict[str, Any]) -> Plan:
    try:
        return Plan(**values)
    except SpecError as exc:
        raise PlanSpecError(str(exc)) from None


def parse_plan(text: str, specs: Specs) -> Plan:
    """A full plan from its short form; ``dp`` defaults to what fills the cluster."""
    values = parse_assignments(text)
    if "dp" not in values:
        inner = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        n = specs.cluster.num_gpus
        if inner <= 0 or n % inner:
            raise PlanSpecError(f"plan: tp * pp * cp must divide num_gpus to derive dp, but got "
                                f"tp * pp * cp = {inner}, num_gpus={n}")
        values["dp"] = n // inner
    plan = make_plan(values)
    check(plan, specs)
    return plan


def check(plan: Plan, specs: Specs) -> None:
    """The table's rules with the study's switches: the verdict the search gives."""
    try:
        check_plan(specs.model, specs.cluster, plan, specs.training, specs.switches)
    except SpecError as exc:
        raise PlanSpecError(f"plan {format_plan(plan)}: {exc}") from None


def format_plan(plan: Plan) -> str:
    """The short form, defaults left out except the degrees people always state."""
    default = Plan()
    always = {"tp", "pp", "dp", "micro_batch", "recompute", "zero_stage"}
    parts = []
    for name, short in SHORT:
        v = getattr(plan, name)
        if name in always or v != getattr(default, name):
            parts.append(f"{short}={str(v).lower() if isinstance(v, bool) else v}")
    return ",".join(parts)


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
    "schedule": (("pp_schedule", lambda v, s: "1f1b", "no pipeline"),),
    "zero_sharding": (("zero_stage", lambda v, s: 0, "no data-parallel ranks to shard over"),),
    "batch": (("micro_batch", _micro_batch_dividing, "divides the sequences per replica"),),
    "microbatch_groups": (("micro_batch", _micro_batch_grouping,
                           "interleaving runs micro-batches in groups of pp"),
                          ("vpp", lambda v, s: 1, "no micro-batch count in groups of pp")),
    "recompute_chunks": (("recompute_layers", _recompute_per_chunk,
                          "--recompute-num-layers counts per model chunk"),),
}


def apply_change(base: Plan, change: dict[str, Any], specs: Specs) -> tuple[Plan, list[str]]:
    """``base`` with ``change`` applied, then made valid by moving only knobs the change did not
    name, driven by the rules (``costmodel.rules``) the changed plan breaks: each broken rule
    tries its ``REPAIRS`` in turn, keeping a move when the rule then holds. Returns the plan and
    one note per knob moved; raises :class:`PlanSpecError` when no such repair exists."""
    values = {**dataclasses.asdict(base), **change}
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
