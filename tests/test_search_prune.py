"""Memory first: the CP-SAT placement stage agrees with brute force over every placement.

A small space on a GPU with little memory makes every part matter: layouts that fit evenly,
layouts that fit only with uneven first/last stages or with some layers recomputed, and layouts
that cannot fit at all.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import cache

import numpy as np
import pytest

import costmodel
from costmodel import Plan, estimate, estimate_batch, plans_to_arrays, rules
from search import prune
from search.inputs.specs import Specs, build_specs
from search.inputs.study import parse_study
from search.misses import nearest_misses
from search.placement import Placement, Subproblem, solve_many, stages_of
from search.prune import MemoryStage, memory_stage, plan_arrays, solve_placement
from search.space import AXES, build_space, enumerate_layouts, plan_from_row
from search.stage_memory import stage_bytes, stage_terms

GIB = 2**30
STUDY = """
model:
  architecture: {layers: 7, hidden: 512, ffn_hidden: 1536, heads: 8, kv_heads: 4, vocab: 32000}
training: {seq_len: 4096, global_batch: 32}
cluster:
  gpu: h100-sxm-80gb
  gpus: 16
  gpus_per_node: 8
  overrides: {hbm_bytes: 3.6e+9, memory_reserve_bytes: 1.0e+8}
search_space:
  tp: [1, 2]
  pp: [1, 2, 3, 4]
  cp: 1
  vpp: [1, 2]
  zero_stage: [0, 3]
  micro_batch: [1, 2, 4]
  recompute: auto
  sequence_parallel: false
"""


@cache
def setup() -> tuple[Specs, MemoryStage]:
    study = parse_study(STUDY)
    specs = build_specs(study)
    space = build_space(study, specs)
    # the estimate's `fits` keeps no headroom: screen with none to compare like with like
    return specs, memory_stage(specs, space, enumerate_layouts(space).columns, headroom_gib=0.0)


def _megatron_builds(layers: int, pp: int, vpp: int, first: int, last: int) -> bool:
    """Megatron-LM's own flags, restated: each rank's layers divisible by vpp (first/last stage
    flags), or the embedding and/or the loss counted as layers: (layers + e + l) / pp = c units
    a rank, c divisible by vpp, the first rank c - e layers and the last c - l."""
    middle = (layers - first - last) // (pp - 2) if pp > 2 else first
    if first % vpp == 0 and last % vpp == 0 and (pp == 2 or middle % vpp == 0):
        return True
    for e, loss in itertools.product((0, 1), repeat=2):
        units = layers + e + loss
        c = units // pp
        if units % pp == 0 and c % vpp == 0 and (first, last) == (c - e, c - loss):
            return True
    return False


def placements(layers: int, pp: int, vpp: int, full: bool,
               any_chunks: bool = False) -> list[dict[str, int]]:
    """Every placement a Plan can express for one layout (independent of search.placement);
    with vpp chunks those Megatron's flags build, or any where the framework takes an explicit
    layout (``any_chunks``, the profile's uneven_chunks), which also lets the middle ranks hold
    shares a layer apart (ends no larger than the most loaded middle rank)."""
    def split_ok(f: int, last: int) -> bool:
        mid = layers - f - last
        if mid < pp - 2:
            return False
        most = -(-mid // (pp - 2))
        return mid % (pp - 2) == 0 or (any_chunks and f <= most and last <= most)

    splits = [(0, 0)] if layers % (pp * vpp) == 0 else []
    if pp == 2:
        splits += [(f, layers - f) for f in range(1, layers)]
    elif pp > 2:
        splits += [(f, last) for f in range(1, layers) for last in range(1, layers)
                   if split_ok(f, last)]
    if vpp > 1:
        splits = [(0, 0)] * ((0, 0) in splits) + [
            (f, last) for f, last in splits
            if f and (any_chunks or _megatron_builds(layers, pp, vpp, f, last))]
    recompute = range(0, layers + 1) if full else [0]
    return [{"first_stage_layers": f, "last_stage_layers": last, "recompute_layers": r}
            for (f, last), r in itertools.product(splits, recompute)]


def brute_force(specs: Specs, stage: MemoryStage) -> dict[int, list[Plan]]:
    """Layout index -> every plan of it that the cost model says fits."""
    rows, plans = [], []
    # the framework's own rules on the recomputed count (generic: per model chunk) and on
    # activation offloading (generic: Megatron-Core's, on a GPU with a host link)
    own = (rules.BY_NAME["recompute_chunks"], rules.BY_NAME["cpu_offload"])
    facts = rules.facts_of(specs.model, specs.cluster, specs.training, specs.switches)
    assert facts.switches.recompute_per_chunk and facts.cpu_offloading and facts.host_link
    L = specs.model.layers
    for i in range(len(stage.cols["tp"])):
        row = {a: int(stage.cols[a][i]) for a in AXES}
        for place, offloaded in itertools.product(
                placements(L, row["pp"], row["vpp"], row["recompute"] == 2,
                           specs.training.framework.pp.uneven_chunks), range(L)):
            plan = plan_from_row({**row, **place, "cpu_offload_layers": offloaded})
            if not rules.broken(plan, facts, own):
                rows.append(i)
                plans.append(plan)
    out = estimate_batch(specs.model, specs.cluster, specs.training, plans_to_arrays(plans))
    fitting: dict[int, list[Plan]] = {}
    for i, plan, fits in zip(rows, plans, out["fits"], strict=True):
        if fits:
            fitting.setdefault(i, []).append(plan)
    return fitting


def proxy_key(specs: Specs, stage: MemoryStage, plan: Plan) -> tuple[int, ...]:
    """The placement objective restated: slowest stage, recomputed layers, spread, -first,
    -the most loaded middle rank, last."""
    L, pp = specs.model.layers, plan.pp
    first = plan.first_stage_layers or L // pp
    last = plan.last_stage_layers or L // pp
    middle = -(-(L - first - last) // (pp - 2)) if pp > 2 else first
    if pp == 1:
        first = middle = last = L
    n = {"first": first, "middle": middle, "last": last}
    r = 0
    if plan.recompute == "full":
        r = plan.recompute_layers or max(n[s] for s in stages_of(pp))
    stages = stages_of(pp)
    longest = max(4 * (3 * n[s] + min(r, n[s])) + (stage.head_units if s == stages[-1] else 0)
                  for s in stages)
    spread = abs(first - middle) + abs(last - middle) if pp > 2 and plan.vpp == 1 else 0
    return longest, r, spread, -first, -middle, last


def test_screen_and_cpsat_equal_brute_force_filtering() -> None:
    specs, stage = setup()
    fitting = brute_force(specs, stage)
    n = len(stage.cols["tp"])
    cpsat = np.array([stage.place(i) is not None for i in range(n)])
    truth = np.array([i in fitting for i in range(n)])
    assert 0 < truth.sum() < n, "the space must mix layouts that fit and that do not"
    assert (stage.feasible == truth).all(), np.flatnonzero(stage.feasible != truth)
    assert (cpsat == truth).all(), np.flatnonzero(cpsat != truth)


def test_cpsat_placement_fits_and_is_optimal() -> None:
    specs, stage = setup()
    fitting = brute_force(specs, stage)
    uneven = partial = offloaded = 0
    for i, plans in fitting.items():
        placement = stage.place(i)
        assert placement is not None
        row = {a: int(stage.cols[a][i]) for a in AXES}
        row.update(placement.plan_fields(specs.model.layers, row["pp"], row["recompute"] == 2,
                                         row["vpp"]))
        row["cpu_offload_layers"] = int(stage.offloaded(np.asarray([i]))[0])
        plan = plan_from_row(row)
        assert estimate(specs.model, specs.cluster, plan, specs.training).memory.fits
        best = min(proxy_key(specs, stage, p) for p in plans)
        assert proxy_key(specs, stage, plan) == best, (plan, best)
        # the fewest layers offloaded that fit (each costs host-link time, none saves any)
        assert plan.cpu_offload_layers == min(p.cpu_offload_layers for p in plans)
        uneven += bool(plan.first_stage_layers)
        partial += bool(plan.recompute_layers)
        offloaded += bool(plan.cpu_offload_layers)
    # the space exercises what CP-SAT and the offload count decide
    assert uneven > 0 and partial > 0 and offloaded > 0


def test_layouts_that_fit_only_when_cpsat_moves_layers() -> None:
    specs, stage = setup()
    fitting = brute_force(specs, stage)
    only_uneven = [i for i, plans in fitting.items()
                   if all(p.first_stage_layers for p in plans)]
    assert only_uneven, "some layouts fit only with uneven first/last stages"
    for i in only_uneven:
        assert stage.place(i) is not None and stage.feasible[i]


def test_vectorised_twin_equals_cpsat() -> None:
    specs, stage = setup()
    index = np.flatnonzero(stage.feasible)
    rows, ok = stage.place_many(index)
    assert ok.all()
    for i, row in zip(index, rows, strict=True):
        assert stage.place(int(i)) == Placement(*(int(x) for x in row))


def test_stage_terms_equal_the_cost_models_memory_terms() -> None:
    specs, stage = setup()
    cols = plan_arrays(stage.cols)
    terms = stage_terms(specs, cols)
    for i in range(0, len(cols["tp"]), 7):
        plan = plan_from_row({a: int(stage.cols[a][i]) for a in AXES})
        ref = costmodel.memory_terms(specs.model, specs.cluster, plan, specs.training)
        one = terms.take(i)
        for s in stages_of(plan.pp):
            for n, r in ((1, 0), (3, 1), (2, 2)):
                assert float(stage_bytes(one, s, np.asarray(n), np.asarray(r))) == \
                    pytest.approx(ref.stage_bytes(s, n, r), rel=1e-12)


def test_nearest_misses_explain_in_gib() -> None:
    study = parse_study(STUDY.replace("3.6e+9", "1.0e+9"))
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    assert not stage.feasible.any()
    misses = nearest_misses(stage, specs, headroom_gib=0.0, count=3)
    assert len(misses) == 3
    ratios = [m["needs_gib"] / m["usable_gib"] for m in misses]
    assert all(r > 1 for r in ratios)
    assert misses[0]["reason"].startswith(f"needs {misses[0]['needs_gib']:.1f} GiB of ")
    assert "activations" in misses[0]["reason"]


def test_headroom_shrinks_the_feasible_set() -> None:
    study = parse_study(STUDY)
    specs = build_specs(study)
    space = build_space(study, specs)
    cols = enumerate_layouts(space).columns
    loose = memory_stage(specs, space, cols).feasible
    tight = memory_stage(specs, space, cols, headroom_gib=0.5).feasible
    assert tight.sum() < loose.sum() and not (tight & ~loose).any()


def test_the_placement_is_bounded_by_work_not_by_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A solve slowed or paused past a wall-clock limit would return no placement, and the
    search would judge its layout unplaceable on a loaded machine only: CP-SAT gets a budget of
    deterministic work (the same on every machine) and no time limit."""
    used = []

    class Recording(prune.cp_model.CpSolver):
        def solve(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            used.append((self.parameters.max_time_in_seconds,
                         self.parameters.max_deterministic_time))
            return super().solve(*args, **kwargs)

    monkeypatch.setattr(prune.cp_model, "CpSolver", Recording)
    need = tuple(tuple(max(0, n - 4) for n in range(15)) for _ in range(2))
    placed = solve_placement(Subproblem(layers=14, pp=2, full=True, shift=True, partial=True,
                                        head_units=0, need=need))
    assert placed is not None and used
    assert all(math.isinf(wall) and 0 < work < math.inf for wall, work in used)


def _subproblem(layers: int, pp: int, caps: tuple[int, ...], full: bool, head_units: int,
                any_chunks: bool) -> Subproblem:
    """A placement subproblem whose stages hold up to ``caps`` layers without recompute, one
    layer more for every two fully recomputed (a need table shaped like the memory stage's)."""
    def table(cap: int) -> tuple[int, ...]:
        return tuple(0 if n <= cap else (2 * (n - cap) if full else n + 1)
                     for n in range(layers + 1))

    return Subproblem(layers=layers, pp=pp, full=full, shift=True, partial=True,
                      head_units=head_units, need=tuple(table(c) for c in caps),
                      any_chunks=any_chunks)


def test_a_per_rank_layout_balances_80_layers_on_32_stages() -> None:
    """Issue #38: with equal middle ranks 80 layers on pp 32 split only as 10 + 30 x 2 + 10 or
    25 + 30 x 1 + 25; a launcher with a per-rank layout (Megatron-Core's
    --pipeline-model-parallel-layout) builds ranks of 3 and 2 layers."""
    sp = _subproblem(80, 32, (80, 80, 80), full=False, head_units=6, any_chunks=True)
    placed = solve_placement(sp)
    assert placed is not None
    assert (placed.n_first, placed.n_middle, placed.n_last) == (3, 3, 2)
    equal = solve_placement(dataclasses.replace(sp, any_chunks=False))
    assert equal is not None and max(equal.n_first, equal.n_last) == 10
    assert placed.plan_fields(80, 32, False) == {
        "first_stage_layers": 3, "last_stage_layers": 2, "recompute_layers": 0}


@pytest.mark.parametrize("seed", range(40))
def test_cpsat_and_its_vectorised_twin_agree_with_ranks_a_layer_apart(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(5, 23))
    pp = int(rng.integers(3, min(layers, 9) + 1))
    full = bool(rng.integers(0, 2))
    caps = tuple(int(c) for c in rng.integers(1, layers + 1, size=3))
    head = int(rng.integers(0, 9))
    sp = _subproblem(layers, pp, caps, full, head, any_chunks=True)
    placed = solve_placement(sp)
    need = {s: np.asarray([t]) for s, t in zip(stages_of(pp), sp.need, strict=True)}
    rows, ok = solve_many(need, pp, np.asarray([full]), True, True, layers, head,
                          any_chunks=True)
    assert (placed is not None) == bool(ok[0])
    if placed is not None:
        assert placed == Placement(*(int(x) for x in rows[0]))
