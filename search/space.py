"""The search space, defined once: named axes, their domains, and the validity rules over them.

Validity is arithmetic (degrees divide GPUs, heads, layers, batch, experts). The enumerator binds
one axis at a time (a cross product with its domain) and applies each rule as soon as every axis
it reads is bound, so it never materialises the full product and it generates only valid layouts.
A layout pruned by a rule is counted once, for the first rule (in :data:`RULES` order) it breaks,
with the number of raw combinations it stood for. The same rules, evaluated on single plans, give
:func:`violations`, which the tests use to check that no plan the search emits is invalid.

Placement (first/last stage layers) and the number of fully recomputed layers are not axes: the
CP-SAT stage (``search.prune``) decides them per layout. ``recompute_modules`` (Megatron-Core's
selective modules, a bitmask; 0: the training's set) is an axis only where the study searches it:
otherwise its domain is (0,) and its rule, which 0 always keeps, is left out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from costmodel import rules
from costmodel.plan_fields import (
    MOE_DISPATCHERS,
    MOE_OVERLAPS,
    PLAN_FIELDS,
    RECOMPUTE_CODES,
    SCHEDULE_NAMES,
)
from costmodel.recompute_modules import mask_modules, module_mask
from costmodel.rules import Facts, Switches
from costmodel.specs import Plan, Training
from costmodel.terms import freeing_modules
from search.inputs.specs import Specs
from search.inputs.study import Study

Columns = dict[str, np.ndarray]

# Binding order. tp and pp come first so that pruning can be attributed to (tp, pp) cells.
AXES: tuple[str, ...] = ("tp", "pp", "cp", "dp", "ep", "expert_tp", "vpp", "micro_batch",
                         "zero_stage", "sequence_parallel", "recompute", "pp_schedule",
                         "recompute_modules")
DERIVED = "dp"  # dp = num_gpus / (tp * pp * cp), restricted by its domain
# the plan's own MoE dispatch (0: the training's), a training switch where the study gives it
MOE_AXES = ("moe_dispatcher", "moe_a2a_overlap")
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
# The axis holds 1f1b and gpipe (the cost model's codes); vpp > 1 makes a plan interleaved.
SCHEDULE_CODES = {"1f1b": 0, "gpipe": 2}


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    reads: tuple[str, ...]
    text: str  # the rule as a reader would write it
    holds: Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Domains (encoded as ints: recompute 0/1/2, sequence_parallel 0/1, pp_schedule 0/2), the
    facts and switches the table's rules read (``rules.Facts``, the search's switches with the
    split placed later), and the study's partial-recompute and offload switches."""

    domains: dict[str, tuple[int, ...]]
    facts: Facts
    partial_recompute: bool
    cpu_offload: bool = False  # single-stage layouts may offload activations (search.prune)
    # the MoE dispatch options (moe_dispatcher, moe_a2a_overlap codes; (0, 0) the training's)
    # each layout is judged under, the fastest the rules allow kept (search.evaluate)
    dispatch: tuple[tuple[int, int], ...] = ((0, 0),)
    rules: tuple[Rule, ...] = field(default=())

    @property
    def switches(self) -> Switches:
        return self.facts.switches

    @property
    def size(self) -> int:
        """Raw combinations of the searched axes (dp is derived, not multiplied in)."""
        return prod(len(v) for k, v in self.domains.items() if k != DERIVED)


def _divisors(n: int, cap: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _auto_domains(specs: Specs) -> dict[str, tuple[int, ...]]:
    m, c, t = specs.model, specs.cluster, specs.training
    n = c.num_gpus
    return {
        "tp": _divisors(n, 64),
        "pp": _divisors(n, min(m.layers, 128)),
        "cp": tuple(d for d in _divisors(n, 64) if t.seq_len // d >= 1024 or d == 1),
        "dp": _divisors(n, n),
        "ep": _divisors(m.moe_experts, 64) if m.is_moe else (1,),
        # Megatron-Core's folding: the experts' TP apart from the attention's (0: derived)
        "expert_tp": (0, *_divisors(n, 8)) if m.is_moe else (0,),
        "vpp": (1, 2, 3, 4, 5, 6, 7, 8),
        "micro_batch": (1, 2, 4, 8),
        "zero_stage": (0, 1, 2, 3),
        "sequence_parallel": (0, 1),
        "recompute": (0, 1, 2),
        "pp_schedule": (0,),  # GPipe holds every micro-batch: never better than 1F1B here
        # the training's set (0), and every other set of the modules that free memory here
        "recompute_modules": (0, *sorted(module_mask(s) for s in _subsets(
            freeing_modules(m, t)) if set(s) != set(t.framework.activations.recompute_modules))),
    }


def dispatch_options(study: Study, specs: Specs) -> tuple[tuple[int, int], ...]:
    """The MoE dispatch each layout is judged under (plan codes; 0 the training's): the
    searched dispatchers and overlaps (search_space.moe_dispatcher, moe_a2a_overlap: auto,
    every one the framework's launcher offers), none but the training's where the study's
    training section fixes it or the model has no MoE layers."""
    t, own = specs.training, specs.training.framework.moe
    offered = {"moe_dispatcher": own.moe_dispatchers, "moe_a2a_overlap": own.moe_a2a_overlaps}
    domains = []
    for axis in MOE_AXES:
        given = getattr(study.search_space, axis)
        if not specs.model.is_moe or getattr(study.training, axis) is not None:
            given = ()
        domains.append(_encode(axis, offered[axis] if given == "auto" else given, t))
    dispatchers, overlaps = domains
    return tuple((d, o) for d in dispatchers for o in overlaps)


def _subsets(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [s for k in range(1, len(names) + 1) for s in itertools.combinations(names, k)]


def _encode(axis: str, values: tuple[object, ...], training: Training) -> tuple[int, ...]:
    own = training.framework
    if axis == "moe_dispatcher":  # the training's own, always searched, is written 0
        return tuple(sorted({0, *(0 if v == own.moe.moe_dispatcher
                                  else MOE_DISPATCHERS.index(str(v)) for v in values)}))
    if axis == "moe_a2a_overlap":
        return tuple(sorted({0, *(0 if bool(v) == own.moe.moe_a2a_overlap
                                  else MOE_OVERLAPS.index("on" if v else "off")
                                  for v in values)}))
    training_modules = own.activations.recompute_modules
    if axis == "recompute":
        return tuple(RECOMPUTE_CODES[str(v)] for v in values)
    if axis == "pp_schedule":
        return tuple(SCHEDULE_CODES[str(v)] for v in values)
    if axis == "recompute_modules":
        # sets of names; the training's own, which plans without selective recompute carry and
        # is always searched, is written 0
        return (0, *(0 if set(m) == set(training_modules) else module_mask(m)  # type: ignore
                     for m in values))
    return tuple(int(v) for v in values)  # type: ignore[call-overload]


def build_space(study: Study, specs: Specs) -> SearchSpace:
    section = study.search_space
    auto = _auto_domains(specs)
    domains: dict[str, tuple[int, ...]] = {}
    for axis in AXES:
        given = getattr(section, axis)
        if given is None:  # recompute_modules unsearched: every plan the training's set
            given = ((),)
        domains[axis] = auto[axis] if given == "auto" else tuple(sorted(set(_encode(
            axis, given, specs.training))))
    sw = specs.switches
    facts = rules.facts_of(specs.model, specs.cluster, specs.training,
                           dataclasses.replace(sw, split_later=sw.uneven_pipeline))
    # a partial recompute count only where both the study and the framework allow one
    space = SearchSpace(domains=domains, facts=facts,
                        partial_recompute=section.partial_recompute and facts.partial_recompute,
                        cpu_offload=section.cpu_offload, dispatch=dispatch_options(study, specs))
    return dataclasses.replace(space, rules=make_rules(space))


def space_facts(s: SearchSpace) -> rules.Facts:
    """The facts the table's rules read, with the search's switches
    (``search.inputs.specs.search_switches``)."""
    return s.facts


def _on_axes(rule: rules.Rule, f: rules.Facts,
             dispatch: tuple[tuple[int, int], ...] = ((0, 0),)) -> Rule:
    """A table rule over the search's axes: the columns that are not axes (the first/last
    stage layers the CP-SAT stage places later) read 0, an even split; a layout keeps a rule on
    the MoE dispatch if one of the ``dispatch`` options it will be judged under keeps it."""
    reads = tuple(a for a in rule.reads if a in AXES)
    unplaced = [k for k in rule.reads if k not in AXES and k not in MOE_AXES]
    known = f.values()
    shown = ", ".join(f"{k}={known[k]}" for k in rule.facts)
    options = dispatch if set(rule.reads) & set(MOE_AXES) else ((0, 0),)

    def holds(c: Mapping[str, np.ndarray]) -> np.ndarray:
        zeros = np.zeros_like(c[reads[0] if reads else AXES[0]])
        ok = np.zeros(zeros.shape, dtype=bool)
        for d, o in options:
            ok |= np.asarray(rule.holds({**c, **{k: zeros for k in unplaced},
                                         "moe_dispatcher": zeros + d,
                                         "moe_a2a_overlap": zeros + o}, f), dtype=bool)
        return ok

    return Rule(rule.name, reads, f"{rule.text} ({shown})" if shown else rule.text, holds)


def make_rules(s: SearchSpace) -> tuple[Rule, ...]:
    """The table's validity rules (``costmodel.rules``) over this space, with the domain of
    the derived dp, in the order a layout is charged to them: the order ``enumerate_layouts``
    binds the axes they read (table order among rules bound together)."""
    f = space_facts(s)
    dp_ok = np.asarray(s.domains[DERIVED])
    view = [_on_axes(r, f, s.dispatch) for r in rules.RULES
            if r.name != "recompute_modules" or s.domains["recompute_modules"] != (0,)]
    at = view.index(next(r for r in view if r.name == "world_size")) + 1
    view.insert(at, Rule("dp_domain", ("dp",), f"dp in {list(s.domains[DERIVED])}",
                         lambda c: np.isin(c["dp"], dp_ok)))
    # a rule on the dispatch alone (moe_dispatch) binds with the first axis
    return tuple(sorted(view, key=lambda r: max((AXES.index(a) for a in r.reads), default=0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Layouts:
    """The valid layouts as equal-length int columns, and what each rule pruned."""

    columns: Columns
    pruned_by: dict[str, int]
    space_size: int
    cell_pruned: dict[tuple[int, int], dict[str, int]]  # (tp, pp) -> rule -> raw combinations

    def __len__(self) -> int:
        return int(self.columns["tp"].shape[0])

    def take(self, index: np.ndarray) -> Columns:
        return {k: v[index] for k, v in self.columns.items()}


def enumerate_layouts(space: SearchSpace) -> Layouts:
    cols: Columns = {}
    rows = 1
    pruned = {r.name: 0 for r in space.rules}
    cells: dict[tuple[int, int], dict[str, int]] = {}
    pending = list(space.rules)
    pp_domain = space.domains["pp"]
    for i, axis in enumerate(AXES):
        if axis == DERIVED:
            cols[axis] = space.facts.num_gpus // (cols["tp"] * cols["pp"] * cols["cp"])
        else:
            dom = np.asarray(space.domains[axis], dtype=np.int64)
            cols = {k: np.repeat(v, len(dom)) for k, v in cols.items()}
            cols[axis] = np.tile(dom, rows)
            rows *= len(dom)
        bound = set(AXES[: i + 1])
        later = prod(len(space.domains[a]) for a in AXES[i + 1:] if a != DERIVED)
        for rule in [r for r in pending if set(r.reads) <= bound]:
            pending.remove(rule)
            ok = np.asarray(rule.holds(cols), dtype=bool)
            if ok.all():
                continue
            _charge(cells, cols, ~ok, rule.name, later, pp_domain)
            pruned[rule.name] += int((~ok).sum()) * later
            cols = {k: v[ok] for k, v in cols.items()}
            rows = int(ok.sum())
    assert not pending, f"rules read unknown axes: {[r.name for r in pending]}"
    return Layouts(columns=cols, pruned_by=pruned, space_size=space.size, cell_pruned=cells)


def _charge(cells: dict[tuple[int, int], dict[str, int]], cols: Columns, bad: np.ndarray,
            rule: str, later: int, pp_domain: tuple[int, ...]) -> None:
    """Attribute pruned combinations to (tp, pp) cells for the report's heat map."""
    if "pp" in cols:
        keys, counts = np.unique(np.stack([cols["tp"][bad], cols["pp"][bad]]), axis=1,
                                 return_counts=True)
        pairs = [((int(t), int(p)), int(n) * later)
                 for (t, p), n in zip(keys.T, counts, strict=True)]
    else:  # only tp bound: every pp value stands behind each pruned row equally
        tps, counts = np.unique(cols["tp"][bad], return_counts=True)
        share = later // len(pp_domain)
        pairs = [((int(t), p), int(n) * share)
                 for t, n in zip(tps, counts, strict=True) for p in pp_domain]
    for key, n in pairs:
        cell = cells.setdefault(key, {})
        cell[rule] = cell.get(rule, 0) + n


def decode(axis: str, code: int) -> Any:
    """An encoded axis value as the study file and Plan spell it."""
    if axis == "recompute":
        return RECOMPUTE_NAMES[code]
    if axis == "pp_schedule":
        return SCHEDULE_NAMES[code]
    if axis == "sequence_parallel":
        return bool(code)
    if axis == "recompute_modules":  # one categorical value per set
        return "+".join(mask_modules(code)) or "training"
    if axis == "moe_dispatcher":
        return MOE_DISPATCHERS[code] or "training"
    if axis == "moe_a2a_overlap":
        return MOE_OVERLAPS[code] or "training"
    return int(code)


def plan_from_row(row: Mapping[str, int]) -> Plan:
    """A Plan from a layout's encoded values (``costmodel.plan_fields`` codes; a placement field
    absent holds its default), the schedule as it runs (interleaved iff vpp > 1)."""
    codes = {f.name: row.get(f.name, f.code(f.default)) for f in PLAN_FIELDS}
    codes["pp_schedule"] = int(rules.schedule_code(codes["pp_schedule"], codes["vpp"]))
    return Plan(**{f.name: f.value(codes[f.name]) for f in PLAN_FIELDS})


def plan_columns(plan: Plan) -> dict[str, int]:
    """A plan's values on the search axes, encoded like the layout columns."""
    values = {k: v for k, v in rules.plan_columns(plan).items() if k in AXES}
    values["pp_schedule"] = SCHEDULE_CODES.get(plan.pp_schedule, 0)  # interleaved: vpp > 1
    return values


def exclusions(space: SearchSpace, plan: Plan) -> list[dict[str, Any]]:
    """Why the search space does not hold ``plan``: each axis whose searched values miss its
    value, then each rule (``costmodel.rules``, with the study's search switches) it breaks.
    Empty: the space holds it."""
    values = plan_columns(plan)
    out: list[dict[str, Any]] = []
    for axis in AXES:
        if values[axis] not in space.domains[axis]:
            shown = [decode(axis, v) for v in space.domains[axis]]
            what = ("the values dp takes (num_gpus / (tp * pp * cp), restricted by "
                    "search_space.dp)" if axis == DERIVED else
                    f"the searched values of search_space.{axis}")
            value = decode(axis, values[axis])
            out.append({"kind": "axis", "name": axis, "value": value, "searched": shown,
                        "text": f"{axis}={value} is not among {what}: {shown}"})
    f = space_facts(space)  # the plan's split is its own: nothing is placed later
    f = dataclasses.replace(f, switches=dataclasses.replace(f.switches, split_later=False))
    cols = rules.plan_columns(plan)
    for r in rules.broken(plan, f):
        out.append({"kind": "rule", "name": r.name, "rule": r.text,
                    "text": f"rule {r.message(cols, f)}"})
    own = rules.plan_columns(plan)
    if (own["moe_dispatcher"], own["moe_a2a_overlap"]) not in space.dispatch:
        shown = sorted({decode(a, v) for d in space.dispatch
                        for a, v in zip(MOE_AXES, d, strict=True)})
        out.append({"kind": "switch", "name": "moe_dispatch",
                    "text": f"dispatch={plan.moe_dispatcher or 'training'}, "
                            f"a2a={plan.moe_a2a_overlap or 'training'} is not among the MoE "
                            f"dispatch the search judges (search_space.moe_dispatcher, "
                            f"moe_a2a_overlap, or the study's training section): {shown}"})
    if plan.recompute_layers and not space.partial_recompute and space.facts.partial_recompute:
        out.append({"kind": "switch", "name": "partial_recompute",
                    "text": f"search_space.partial_recompute is false, so the search recomputes "
                            f"every layer of a stage, not recompute_n={plan.recompute_layers}"})
    if plan.cpu_offload_layers and not space.cpu_offload:
        out.append({"kind": "switch", "name": "cpu_offload",
                    "text": "search_space.cpu_offload is false, so the search offloads no "
                            f"activations, not offload={plan.cpu_offload_layers}"})
    return out


def violations(space: SearchSpace, plan: Plan) -> list[str]:
    """The rules (and domains) a plan breaks, ``name: text``; empty for a plan this space can
    generate. The plan's own first/last stage layers are read, as ``check_plan`` reads them."""
    return [f"{x['name']}: {x['rule']}" if x["kind"] == "rule" else x["text"]
            for x in exclusions(space, plan)]
