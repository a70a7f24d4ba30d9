"""The search space, defined once: named axes, their domains, and the validity rules over them.

Validity is arithmetic (degrees divide GPUs, heads, layers, batch, experts). The enumerator binds
one axis at a time (a cross product with its domain) and applies each rule as soon as every axis
it reads is bound, so it never materialises the full product and it generates only valid layouts.
A layout pruned by a rule is counted once, for the first rule (in :data:`RULES` order) it breaks,
with the number of raw combinations it stood for. The same rules, evaluated on single plans, give
:func:`violations`, which the tests use to check that no plan the search emits is invalid.

Placement (first/last stage layers) and the number of fully recomputed layers are not axes: the
CP-SAT stage (``search.prune``) decides them per layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from costmodel.specs import RECOMPUTE_CODES, Plan
from search.specs import Specs
from search.study import Study

Columns = dict[str, np.ndarray]

# Binding order. tp and pp come first so that pruning can be attributed to (tp, pp) cells.
AXES: tuple[str, ...] = ("tp", "pp", "cp", "dp", "ep", "vpp", "micro_batch", "zero_stage",
                         "sequence_parallel", "recompute", "pp_schedule")
DERIVED = "dp"  # dp = num_gpus / (tp * pp * cp), restricted by its domain
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
SCHEDULE_NAMES = {0: "1f1b", 2: "gpipe"}  # interleaved is implied by vpp > 1
SCHEDULE_CODES = {v: k for k, v in SCHEDULE_NAMES.items()}


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    reads: tuple[str, ...]
    text: str  # the rule as a reader would write it
    holds: Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Domains (encoded as ints: recompute 0/1/2, sequence_parallel 0/1, pp_schedule 0/2) and
    the facts the rules read."""

    domains: dict[str, tuple[int, ...]]
    num_gpus: int
    layers: int
    heads: int
    kv_heads: int
    experts: int
    seq_len: int
    global_batch: int
    nvlink_domain: int
    uneven_pipeline: bool
    partial_recompute: bool
    tp_in_node: bool
    rules: tuple[Rule, ...] = field(default=())

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
        "vpp": (1, 2, 3, 4, 5, 6, 7, 8),
        "micro_batch": (1, 2, 4, 8),
        "zero_stage": (0, 1, 2, 3),
        "sequence_parallel": (0, 1),
        "recompute": (0, 1, 2),
        "pp_schedule": (0,),  # GPipe holds every micro-batch: never better than 1F1B here
    }


def _encode(axis: str, values: tuple[object, ...]) -> tuple[int, ...]:
    if axis == "recompute":
        return tuple(RECOMPUTE_CODES[str(v)] for v in values)
    if axis == "pp_schedule":
        return tuple(SCHEDULE_CODES[str(v)] for v in values)
    return tuple(int(v) for v in values)  # type: ignore[call-overload]


def build_space(study: Study, specs: Specs) -> SearchSpace:
    section = study.search_space
    auto = _auto_domains(specs)
    domains: dict[str, tuple[int, ...]] = {}
    for axis in AXES:
        given = getattr(section, axis)
        domains[axis] = auto[axis] if given == "auto" else tuple(sorted(_encode(axis, given)))
    m = specs.model
    space = SearchSpace(
        domains=domains, num_gpus=specs.cluster.num_gpus, layers=m.layers, heads=m.heads,
        kv_heads=m.kv_heads, experts=m.moe_experts, seq_len=specs.training.seq_len,
        global_batch=specs.training.global_batch, nvlink_domain=specs.cluster.nvlink_domain,
        uneven_pipeline=section.uneven_pipeline, partial_recompute=section.partial_recompute,
        tp_in_node=section.tp_in_node)
    return dataclasses.replace(space, rules=make_rules(space))


def make_rules(s: SearchSpace) -> tuple[Rule, ...]:
    """The validity rules, in the order a layout is charged to them."""
    L, N = s.layers, s.num_gpus
    dp_ok = np.asarray(s.domains[DERIVED])
    rules = [
        Rule("tp_heads", ("tp",), "heads % tp == 0 and kv_heads, tp divide one another",
             lambda c: (s.heads % c["tp"] == 0)
             & ((s.kv_heads % c["tp"] == 0) | (c["tp"] % s.kv_heads == 0))),
        Rule("tp_in_node", ("tp",), f"tp divides the NVLink domain ({s.nvlink_domain} GPUs)",
             lambda c: (s.nvlink_domain % c["tp"] == 0) | (not s.tp_in_node)),
        Rule("pp_layers", ("pp",),
             "pp <= layers" + ("" if s.uneven_pipeline else " and layers % pp == 0"),
             lambda c: (c["pp"] <= L) & ((L % c["pp"] == 0) | s.uneven_pipeline)),
        Rule("cp_seq", ("cp",), "seq_len % (2 * cp) == 0",
             lambda c: (c["cp"] == 1) | (s.seq_len % (2 * c["cp"]) == 0)),
        Rule("world_size", ("tp", "pp", "cp"), f"tp * pp * cp divides num_gpus ({N})",
             lambda c: N % (c["tp"] * c["pp"] * c["cp"]) == 0),
        Rule("dp_domain", ("dp",), f"dp in {list(s.domains[DERIVED])}",
             lambda c: np.isin(c["dp"], dp_ok)),
        Rule("ep_experts", ("ep", "tp", "dp", "cp"),
             "ep divides moe_experts and tp * dp * cp (folding over TP with expert TP 1 when "
             "it does not divide dp * cp)",
             lambda c: (c["ep"] == 1) | ((s.experts % c["ep"] == 0) & (s.experts > 0)
                                         & ((c["tp"] * c["dp"] * c["cp"]) % c["ep"] == 0))),
        Rule("vpp_layers", ("vpp", "pp"), "vpp > 1 needs pp > 1 and layers % (pp * vpp) == 0",
             lambda c: (c["vpp"] == 1) | ((c["pp"] > 1) & (L % (c["pp"] * c["vpp"]) == 0))),
        Rule("batch", ("micro_batch", "dp"), "global_batch % (micro_batch * dp) == 0",
             lambda c: s.global_batch % (c["micro_batch"] * c["dp"]) == 0),
        Rule("zero_sharding", ("zero_stage", "dp", "cp"), "zero_stage > 0 needs dp * cp > 1",
             lambda c: (c["zero_stage"] == 0) | (c["dp"] * c["cp"] > 1)),
        Rule("sp_tp", ("sequence_parallel", "tp"), "sequence_parallel needs tp > 1",
             lambda c: (c["sequence_parallel"] == 0) | (c["tp"] > 1)),
        Rule("schedule", ("pp_schedule", "vpp", "pp"), "gpipe needs pp > 1 and vpp == 1",
             lambda c: (c["pp_schedule"] == 0) | ((c["vpp"] == 1) & (c["pp"] > 1))),
    ]
    return tuple(rules)


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
            cols[axis] = space.num_gpus // (cols["tp"] * cols["pp"] * cols["cp"])
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
    return int(code)


def plan_from_row(row: Mapping[str, int]) -> Plan:
    """A Plan from encoded axis values plus the placement fields (0 when absent)."""
    return Plan(
        tp=row["tp"], pp=row["pp"], dp=row["dp"], cp=row["cp"], ep=row["ep"], vpp=row["vpp"],
        zero_stage=row["zero_stage"], micro_batch=row["micro_batch"],
        recompute=decode("recompute", row["recompute"]),
        sequence_parallel=bool(row["sequence_parallel"]),
        pp_schedule=("interleaved" if row["vpp"] > 1
                     else decode("pp_schedule", row["pp_schedule"])),
        first_stage_layers=row.get("first_stage_layers", 0),
        last_stage_layers=row.get("last_stage_layers", 0),
        recompute_layers=row.get("recompute_layers", 0))


def plan_columns(plan: Plan) -> dict[str, int]:
    """A plan's values on the search axes, encoded like the layout columns."""
    return {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "dp": plan.dp, "ep": plan.ep,
            "vpp": plan.vpp, "micro_batch": plan.micro_batch, "zero_stage": plan.zero_stage,
            "sequence_parallel": int(plan.sequence_parallel),
            "recompute": RECOMPUTE_CODES[plan.recompute],
            "pp_schedule": SCHEDULE_CODES.get(plan.pp_schedule, 0)}


def violations(space: SearchSpace, plan: Plan) -> list[str]:
    """The rules (and domains) a plan breaks; empty for a plan this space can generate."""
    values = plan_columns(plan)
    broken = [f"{axis}={values[axis]} is outside its domain {list(space.domains[axis])}"
              for axis in AXES if values[axis] not in space.domains[axis]]
    if plan.world_size != space.num_gpus:
        broken.append(f"tp * pp * cp * dp == {space.num_gpus} (got {plan.world_size})")
    cols = {k: np.asarray([v]) for k, v in values.items()}
    broken += [f"{r.name}: {r.text}" for r in space.rules if not bool(r.holds(cols)[0])]
    return broken
