"""Plans written as text: ``"tp=8,pp=4,vpp=2,dp=32,mbs=1,recompute=selective,zero=1"``.

Keys are the fields of :class:`costmodel.Plan`, or the short names people type (``mbs``,
``zero``, ``sp``, ``schedule``, ``modules``: Megatron-Core's selective modules joined by '+',
``modules=core_attn+mlp``; ``offload``: layers whose activations go to host memory, Megatron-Core's
``--cpu-offloading-num-layers``): each row's ``key`` in ``costmodel.plan_fields``, whose type
says how its value is read. The one parser of this syntax: ``explain --plan``,
``compare --base``, a study's ``baseline:`` and ``--baseline`` all read plans through it.
"""

from __future__ import annotations

from typing import Any

from costmodel import Plan, SpecError, Training, check_plan
from costmodel.errors import TcfError
from costmodel.plan_fields import FIELDS, PLAN_FIELDS
from costmodel.rules import Switches
from search.inputs.specs import Specs

# The keys and values come from the table of plan fields (costmodel.plan_fields).
ALIASES: dict[str, str] = {f.key: f.name for f in PLAN_FIELDS if f.key != f.name}
CHOICES: dict[str, tuple[str, ...]] = {f.name: f.choices for f in PLAN_FIELDS if f.type is str}
TRUE, FALSE = ("true", "yes", "on", "1", "y"), ("false", "no", "off", "0", "n")
# The short form of a plan, in the order people read them (a field not named here comes last).
READING_ORDER = ("tp", "pp", "vpp", "dp", "cp", "ep", "expert_tp", "micro_batch", "recompute",
                 "recompute_modules", "recompute_layers", "cpu_offload_layers", "zero_stage",
                 "sequence_parallel", "pp_schedule", "first_stage_layers", "last_stage_layers")
SHORT: tuple[tuple[str, str], ...] = tuple(
    (name, FIELDS[name].key)
    for name in (*READING_ORDER, *(n for n in FIELDS if n not in READING_ORDER)))


class PlanSpecError(TcfError):
    """A plan written as ``key=value,...`` is malformed; the message names the key and value."""


def _value(key: str, raw: str) -> Any:
    text, kind = raw.strip().lower(), FIELDS[key].type
    if kind is str:
        if text == "training" and "" in FIELDS[key].choices:  # a MoE dispatch: the training's
            return ""
        if text not in CHOICES[key]:
            shown = [c or "training" for c in CHOICES[key]]
            raise PlanSpecError(f"plan: {key} must be one of {', '.join(shown)}, "
                                f"but got {raw!r}")
        return text
    if kind is bool:
        if text not in TRUE + FALSE:
            raise PlanSpecError(f"plan: {key} must be true or false, but got {raw!r}")
        return text in TRUE
    if kind is tuple:  # checked by Plan; "training": none of its own
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
        if name not in FIELDS:
            valid = sorted({*FIELDS, *ALIASES})
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
    plan = make_plan(own_dispatch_unsaid(values, specs.training))
    check(plan, specs, switches)
    return plan


def own_dispatch_unsaid(values: dict[str, Any], training: Training) -> dict[str, Any]:
    """The values with a MoE dispatch the training runs anyway written as none of the plan's
    own (``a2a=off`` under a training without the overlap is that training's plan, which a
    canonical space holds once)."""
    own = training.framework.moe
    out = dict(values)
    if out.get("moe_dispatcher") == own.moe_dispatcher:
        out["moe_dispatcher"] = ""
    if out.get("moe_a2a_overlap") == ("on" if own.moe_a2a_overlap else "off"):
        out["moe_a2a_overlap"] = ""
    return out


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
    parts = []
    for name, short in SHORT:
        v, f = getattr(plan, name), FIELDS[name]
        if f.always_shown or v != f.default:
            shown = "+".join(v) if isinstance(v, tuple) else v
            parts.append(f"{short}={str(v).lower() if isinstance(v, bool) else shown}")
    return ",".join(parts)
