"""Memory first: which valid layouts can be placed so that every pipeline stage fits, and how.

Per layout and stage, ``need[n]`` is the fewest fully recomputed layers with which the stage fits
holding n layers (``layers + 1`` if it cannot; only 0 or that under recompute other than 'full').
From it:

* the **screen** (numpy, every valid layout at once) says whether any placement fits: some
  ``n_first + (pp-2)*n_middle + n_last = layers`` within each stage's capacity;
* the **placement** (CP-SAT, one solve per distinct subproblem) decides the first/last stage
  layers and the layers recomputed per stage, the way Megatron's uneven pipeline and
  ``--recompute-num-layers`` are set by hand today (model and objective: ``search.placement``).

Layouts with identical subproblems (same shape, same ``need`` tables) share one solve.

The tables hold layouts x (layers + 1) cells per stage, and building them takes ~50 bytes a cell
at the peak: :data:`MAX_TABLE_CELLS` bounds them before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from costmodel.errors import TcfError
from costmodel.params import attention_params, dense_mlp_params, expert_params
from costmodel.result import GIB
from costmodel.rules import BY_NAME, schedule_code
from search.inputs.specs import Specs
from search.placement import (
    STAGE_NAMES,
    Placement,
    Subproblem,
    candidates,
    objective_weights,
    recompute_step,
    solve_many,
    stages_of,
)
from search.space import SearchSpace
from search.stage_memory import StageTerms, stage_terms

_EPS = 1e-9
# 2**24 cells: ~1 GiB and ~15 s to build; the largest shipped study (llama3.1-405b-h100x4096)
# needs 6.4 million, 4,096 layers on 2**20 GPUs 56 million (12 GB: a MemoryError before this)
MAX_TABLE_CELLS = 2**24


class WorkBudgetError(TcfError):
    """A study asks for more work than the search is built to do; the message says what to
    narrow."""


def check_table_budget(layouts: int, layers: int) -> None:
    """Refuse, before they are built, memory tables of over :data:`MAX_TABLE_CELLS` cells."""
    cells = layouts * (layers + 1)
    if cells > MAX_TABLE_CELLS:
        raise WorkBudgetError(
            f"search_space: {layouts:,} valid layouts x {layers + 1:,} layer counts (0 to "
            f"{layers:,} layers a stage) = {cells:,} memory-table cells, over the budget of "
            f"{MAX_TABLE_CELLS:,}; list fewer values in search_space (tp, pp, cp, ep, vpp, "
            f"micro_batch, zero_stage, recompute) or use fewer GPUs or layers")


def head_cost_units(specs: Specs) -> int:
    """The LM head's forward+backward work in quarter-layer-forward units (the placement's proxy
    for the last stage's extra time): 2*h*V FLOPs per token against a layer's
    2*params + 4*s*a*d; with multi-token prediction (costmodel.mtp) each depth adds the head
    again, one layer (12 units) and eh_proj's 2*2h*h."""
    m, s = specs.model, specs.training.seq_len
    mlp = (dense_mlp_params(m) if not m.is_moe
           else (m.moe_topk + m.moe_shared_experts) * expert_params(m))
    layer_fwd = 2.0 * (attention_params(m) + mlp) + 4.0 * s * m.heads * m.d_head
    head = 4 * 3 * (2.0 * m.hidden * m.vocab) / layer_fwd
    mtp = m.mtp_layers * (head + 12.0 + 4 * 3 * (4.0 * m.hidden * m.hidden) / layer_fwd)
    return int(round(head + mtp))


def need_tables(t: StageTerms, recompute: np.ndarray, layers: int, headroom_bytes: float,
                offload: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``need[stage][i, n]`` for layouts i and n = 0..layers layers on the stage: the fewest
    layers fully recomputed, or, on the layouts ``offload`` marks (rule ``cpu_offload``: one
    stage, no recompute), whose activations go to host memory (fewer than n, and what host
    memory holds). Each count is taken only on the rows of its kind (the others fit whole or
    not at all), and the layouts x layers passes reuse one buffer: on a large space the table's
    cost is its memory traffic, and fresh arrays of that size cost their page faults."""
    inf = layers + 1
    n = np.arange(layers + 1, dtype=float)[None, :]
    usable = t.usable - headroom_bytes
    full = np.flatnonzero(recompute == 2)
    off = np.flatnonzero((recompute != 2) & (False if offload is None else offload))
    over = np.empty((len(recompute), layers + 1))
    out = {}
    for s in STAGE_NAMES:
        infl = t.inflight[s]
        # bytes over the usable memory with n layers kept whole
        np.multiply(n, (t.state + infl * t.act)[:, None], out=over)
        over += t.fixed[s][:, None]
        over += t.working[:, None]
        over -= usable
        fits = over <= 0
        need = np.where(fits, np.int32(0), np.int32(inf))
        with np.errstate(divide="ignore", invalid="ignore"):
            if full.size:
                saving = (infl * (t.act - t.ckpt))[full, None]
                counted = np.ceil(np.where(saving > 0, over[full] / saving, np.inf) - _EPS)
                need[full] = _counted(fits[full], counted, n, inf)
            if off.size:
                act = t.act[off, None]
                moved = np.ceil(np.where(act > 0, over[off] / (infl[off, None] * act), np.inf)
                                - _EPS)
                host_ok = (moved < n) & (infl[off, None] * moved * t.host_act[off, None]
                                         <= t.host_usable)
                need[off] = _counted(fits[off], np.where(host_ok, moved, np.inf), n, inf)
        # the optimizer's share alone must fit too
        np.multiply(n, t.opt_layer[:, None], out=over)
        over += t.opt_fixed[s][:, None]
        np.putmask(need, over > usable, np.int32(inf))
        out[s] = need
    return out


def _counted(fits: np.ndarray, count: np.ndarray, n: np.ndarray, inf: int) -> np.ndarray:
    """A need table's rows from their counts: 0 where the layers fit whole, the count where it
    is at most the layers held, ``inf`` where not."""
    return np.where(fits, 0, np.where(count <= n, count, inf)).astype(np.int32)


def capacities(need: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Most layers each stage can hold (recomputing as many as needed); 0 if none."""
    n = np.arange(next(iter(need.values())).shape[1])[None, :]
    return {s: np.max(np.where(r <= n, n, 0), axis=1) for s, r in need.items()}


def screen(cols: dict[str, np.ndarray], cap: dict[str, np.ndarray], layers: int,
           uneven: bool, near_even: bool = False) -> np.ndarray:
    """Whether some placement fits, for every layout at once (``near_even``: the middle ranks
    may hold shares a layer apart, the ends at most the most loaded one's; search.placement)."""
    L = layers
    pp = cols["pp"]
    cf, cm, cl = cap["first"], cap["middle"], cap["last"]
    even = L // pp
    fits_even = ((L % pp == 0) & (cf >= even) & ((pp < 3) | (cm >= even))
                 & ((pp < 2) | (cl >= even)))
    mid = np.maximum(pp - 2, 1)
    lo = np.maximum(1, -((cf + cl - L) // mid))  # ceil((L - cf - cl) / (pp - 2))
    hi = np.minimum(cm, (L - 2) // mid)
    fits_uneven = np.where(
        pp == 1, cf >= L,
        np.where(pp == 2, (cf >= 1) & (cl >= 1) & (cf + cl >= L),
                 (cf >= 1) & (cl >= 1) & (lo <= hi)))
    if uneven and near_even:
        fits_uneven = fits_uneven | ((pp > 2) & _fits_near_even(cf, cm, cl, pp, L))
    # interleaved layouts: a relaxation here, made exact by the placement (memory_stage)
    return np.where(uneven, fits_uneven, fits_even)


def _fits_near_even(cf: np.ndarray, cm: np.ndarray, cl: np.ndarray, pp: np.ndarray,
                    layers: int) -> np.ndarray:
    """Some split with the middle ranks a layer apart fits: for a most loaded middle rank of c
    layers (c <= cm), ends of at most min(c, capacity) >= 1 leave the middle ranks between
    L - both ends and L - 2 layers, which must meet the open range ((pp-2)(c-1), (pp-2)c)."""
    mid = np.maximum(pp - 2, 1)
    out = np.zeros(pp.shape, dtype=bool)
    for c in range(1, layers + 1):
        lo = np.maximum(layers - np.minimum(cf, c) - np.minimum(cl, c), mid * (c - 1) + 1)
        hi = np.minimum(layers - 2, mid * c - 1)
        out |= (c <= cm) & (cf >= 1) & (cl >= 1) & (lo <= hi)
    return out


def solve_placement(sp: Subproblem) -> Placement | None:
    """The placement model in CP-SAT; None when no placement fits."""
    L, pp = sp.layers, sp.pp
    stages = stages_of(pp)
    tables = dict(zip(stages, sp.need, strict=True))
    cap = {s: max((n for n, need in enumerate(t) if need <= n), default=0)
           for s, t in tables.items()}
    if min(cap.values()) < 1:
        return None
    m = cp_model.CpModel()
    if sp.shift:
        n = {s: m.new_int_var(1, cap[s], f"n_{s}") for s in stages}
        count = {"first": 1, "middle": pp - 2, "last": 1}
        if not (sp.any_chunks and pp > 2):
            m.add(sum(count[s] * n[s] for s in stages) == L)
        near_even = sp.any_chunks and pp > 2  # middle ranks a layer apart (search.placement)
        if sp.vpp > 1 or near_even:  # the splits the launcher builds (search.placement)
            rows = candidates(L, pp, True, sp.vpp, sp.any_chunks)
            if len(rows) == 0:
                return None
            ends = [n["first"], n.get("middle", n["first"]), n.get("last", n["first"])]
            m.add_allowed_assignments(ends, [tuple(int(x) for x in r) for r in rows])
    else:  # even split only (vpp > 1, or the study keeps stages even)
        if L % pp or min(cap.values()) < L // pp:
            return None
        n = {s: m.new_constant(L // pp) for s in stages}
    n_first, n_middle = n["first"], n.get("middle", n["first"])
    # r is shared: each stage recomputes min(r, its layers), so a stage fits when r >= need.
    r = m.new_int_var(1 if sp.full else 0, L if sp.full else 0, "r")
    if sp.full and not sp.partial:
        m.add(r == L)
    elif sp.full and sp.recompute_step > 1:  # a multiple of the step, or all layers
        every = m.new_bool_var("r_all")
        k = m.new_int_var(1, L, "r_chunks")
        m.add(r == sp.recompute_step * k).only_enforce_if(every.Not())
        for s in stages:
            m.add(r >= n[s]).only_enforce_if(every)
    longest = m.new_int_var(0, 16 * L + sp.head_units, "longest")
    for s in stages:
        head = sp.head_units if s == stages[-1] else 0
        if not sp.full:
            m.add(longest >= 12 * n[s] + head)
            continue
        need = m.new_int_var(0, L, f"need_{s}")
        m.add_element(n[s], list(tables[s][: cap[s] + 1]), need)
        m.add(r >= need)
        r_s = m.new_int_var(0, L, f"r_{s}")
        m.add_min_equality(r_s, [r, n[s]])
        m.add(longest >= 4 * (3 * n[s] + r_s) + head)
    spread: list[cp_model.IntVar] = []
    if pp > 2 and sp.shift:
        for s in ("first", "last"):
            d = m.new_int_var(0, L, f"d_{s}")
            m.add_abs_equality(d, n[s] - n["middle"])
            spread.append(d)
    R, S, F, M, N = objective_weights(L)
    n_last = n.get("last", n["first"])
    m.minimize((((longest * R + r) * S + sum(spread)) * F * M
                + (L - n_first) * M + (L - n_middle)) * N + n_last)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.cp_model_probing_level = 0  # tiny models: probing costs more than it saves
    solver.parameters.symmetry_level = 0
    # CP-SAT's own SIGINT handler leaves SIGINT at SIG_DFL afterwards: Ctrl-C would kill the
    # process instead of stopping the study cleanly.
    solver.parameters.catch_sigint_signal = False
    # A budget of CP-SAT's deterministic work, not of seconds: the placement (and so the search)
    # is the same on a slow, loaded or paused machine. The shipped studies' largest solve takes
    # about 2 units (llama3.1-405b): this only stops a runaway model.
    solver.parameters.max_deterministic_time = 30.0
    if solver.solve(m) != cp_model.OPTIMAL:
        return None
    val = {s: int(solver.value(v)) for s, v in n.items()}
    return Placement(n_first=val["first"], n_middle=val.get("middle", val["first"]),
                     n_last=val.get("last", val["first"]), recomputed=int(solver.value(r)))


def plan_arrays(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layout columns as cost-model plan columns (interleaved schedule where vpp > 1)."""
    out = dict(cols)
    out["pp_schedule"] = schedule_code(cols["pp_schedule"], cols["vpp"])
    return out


@dataclass
class MemoryStage:
    """The memory-first stage over a space's valid layouts."""

    space: SearchSpace
    cols: dict[str, np.ndarray]
    terms: StageTerms
    need: dict[str, np.ndarray]
    feasible: np.ndarray  # bool per valid layout
    head_units: int
    offload: np.ndarray  # bool per valid layout: may offload activations (offload_layouts)
    _cache: dict[Subproblem, Placement | None] = field(default_factory=dict)
    solves: int = 0

    def subproblem(self, i: int) -> Subproblem:
        pp = int(self.cols["pp"][i])
        return Subproblem(
            layers=self.space.facts.layers, pp=pp, full=bool(self.cols["recompute"][i] == 2),
            shift=self.space.switches.uneven_pipeline, partial=self.space.partial_recompute,
            head_units=self.head_units,
            need=tuple(tuple(int(x) for x in self.need[s][i]) for s in stages_of(pp)),
            vpp=int(self.cols["vpp"][i]),
            recompute_step=recompute_step(int(self.cols["vpp"][i]),
                                          self.space.switches.recompute_per_chunk),
            any_chunks=self.space.switches.uneven_chunks)

    def offloaded(self, index: np.ndarray) -> np.ndarray:
        """Layers each layout offloads: the fewest that fit its single stage, 0 elsewhere."""
        L = self.space.facts.layers
        return np.where(self.offload[index], self.need["first"][index, L], 0)

    def place(self, i: int) -> Placement | None:
        """The CP-SAT placement of valid layout ``i`` (cached by subproblem)."""
        sp = self.subproblem(i)
        if sp not in self._cache:
            self.solves += 1
            self._cache[sp] = solve_placement(sp)
        return self._cache[sp]

    def place_many(self, index: np.ndarray, even: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Placements of many layouts by the vectorised twin of the CP-SAT model (bulk use:
        ``--exhaustive``). Rows ``(n_first, n_middle, n_last, r)`` and a fits flag. ``even``:
        the even split instead of the chosen one (with the fewest recomputed layers it needs)."""
        rows = np.zeros((len(index), 4), dtype=np.int64)
        ok = np.zeros(len(index), dtype=bool)
        pp, vpp = self.cols["pp"][index], self.cols["vpp"][index]
        for p, v in sorted(set(zip(pp.tolist(), vpp.tolist(), strict=True))):
            sel = (pp == p) & (vpp == v)
            idx = index[sel]
            got, fits = solve_many(
                {s: self.need[s][idx] for s in stages_of(int(p))}, int(p),
                self.cols["recompute"][idx] == 2, self.space.switches.uneven_pipeline and not even,
                self.space.partial_recompute, self.space.facts.layers, self.head_units, int(v),
                step=recompute_step(int(v), self.space.switches.recompute_per_chunk),
                any_chunks=self.space.switches.uneven_chunks)
            rows[sel], ok[sel] = got, fits
        return rows, ok


def offload_layouts(space: SearchSpace, cols: dict[str, np.ndarray]) -> np.ndarray:
    """The layouts that may offload activations: the study allows it and rule ``cpu_offload``
    holds with some layers offloaded (the count itself: ``need_tables``)."""
    if not space.cpu_offload or not len(cols["pp"]):
        return np.zeros(len(cols["pp"]), dtype=bool)
    one = {**cols, "cpu_offload_layers": np.ones_like(cols["pp"])}
    return np.asarray(BY_NAME["cpu_offload"].holds(one, space.facts), dtype=bool)


def memory_stage(specs: Specs, space: SearchSpace, cols: dict[str, np.ndarray],
                 headroom_gib: float | None = None) -> MemoryStage:
    """The memory screen; ``headroom_gib`` defaults to the study's (``specs.headroom_gib``)."""
    check_table_budget(len(cols["pp"]), space.facts.layers)
    if headroom_gib is None:
        headroom_gib = specs.headroom_gib
    terms = stage_terms(specs, plan_arrays(cols))
    offload = offload_layouts(space, cols)
    need = need_tables(terms, cols["recompute"], space.facts.layers, headroom_gib * GIB, offload)
    feasible = screen(cols, capacities(need), space.facts.layers, space.switches.uneven_pipeline,
                      space.switches.uneven_chunks)
    stage = MemoryStage(space=space, cols=cols, terms=terms, need=need, feasible=feasible,
                        head_units=head_cost_units(specs), offload=offload)
    if space.switches.uneven_pipeline:
        # interleaved and uneven: which splits Megatron builds is not a capacity bound, so
        # the screen of those layouts is the vectorised placement itself
        hard = np.flatnonzero(feasible & (cols["vpp"] > 1))
        if len(hard):
            feasible[hard] = stage.place_many(hard)[1]
    return stage
