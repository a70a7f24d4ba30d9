"""Plans written as text: ``"tp=8,pp=4,vpp=2,dp=32,mbs=1,recompute=selective,zero=1"``.

Keys are the fields of :class:`costmodel.Plan`, with the short names people type (``mbs``,
``zero``, ``sp``, ``schedule``, ``modules``: Megatron-Core's selective modules joined by '+',
``modules=core_attn+mlp``; ``offload``: layers whose activations go to host memory, Megatron-Core's
``--cpu-offloading-num-layers``). The one parser of this syntax: ``explain --plan``,
``compare --base``, a study's ``baseline:`` and ``--baseline`` all read plans through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from costmodel import Plan, SpecError, check_plan
from costmodel.errors import TcfError
from costmodel.rules import Switches
from search.specs import Specs

ALIASES: dict[str, str] = {"mbs": "micro_batch", "zero": "zero_stage", "sp": "sequence_parallel",
                           "schedule": "pp_schedule", "recompute_n": "recompute_layers",
                           "etp": "expert_tp", "modules": "recompute_modules",
                           "offload": "cpu_offload_layers"}
PLAN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Plan))
CHOICES: dict[str, tuple[str, ...]] = {"recompute": ("none", "selective", "full"),
                                       "pp_schedule": ("1f1b", "interleaved", "gpipe")}
TRUE, FALSE = ("true", "yes", "on", "1", "y"), ("false", "no", "off", "0", "n")
# The short form of a plan, in the order people read them.
SHORT = (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"),
         ("expert_tp", "etp"),
         ("micro_batch", "mbs"), ("recompute", "recompute"), ("recompute_modules", "modules"),
         ("recompute_layers", "recompute_n"), ("cpu_offload_layers", "offload"),
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
    if key == "recompute_modules":  # checked by Plan; "training": none of its own
        return () if text == "training" else tuple(name.strip() for name in text.split("+"))
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


def parse_plan(text: str, specs: Specs, switches: Switches | None = None) -> Plan:
    """A full plan from its short form; ``dp`` defaults to what fills the cluster. Checked by
    the table's rules with ``switches`` (default: the study's, the search's verdict)."""
    values = parse_assignments(text)
    if "dp" not in values:
        inner = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        n = specs.cluster.num_gpus
        if inner <= 0 or n % inner:
            raise PlanSpecError(f"plan: tp * pp * cp must divide num_gpus to derive dp, but got "
                                f"tp * pp * cp = {inner}, num_gpus={n}")
        values["dp"] = n // inner
    plan = make_plan(values)
    check(plan, specs, switches)
    return plan


def check(plan: Plan, specs: Specs, switches: Switches | None = None) -> None:
    """The table's rules with the study's switches (the verdict the search gives), or with
    ``switches`` (``Switches()``: what the cost model prices)."""
    try:
        check_plan(specs.model, specs.cluster, plan, specs.training,
                   specs.switches if switches is None else switches)
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
            shown = "+".join(v) if isinstance(v, tuple) else v
            parts.append(f"{short}={str(v).lower() if isinstance(v, bool) else shown}")
    return ",".join(parts)
