"""From a trial's sample to a judged plan.

The Optuna stage searches **units**: groups of feasible layouts that share the sampled axes.

* One objective: a unit is a parallel layout (tp, pp, cp, ep; dp follows). A trial picks one and
  its remaining knobs (micro-batch, ZeRO stage, recompute, sequence parallel, virtual stages,
  schedule) are chosen exactly: every feasible member is placed by the vectorised twin of the
  placement model and judged in one ``estimate_batch`` call; the winner is then placed by CP-SAT.
* Two objectives (a Pareto front needs every knob): a unit is one layout, placed by CP-SAT.

Either way a layout whose even split fits is judged at that split too, and the placement the
(primary) objective ranks higher is kept: the placement model's proxy of a stage's work can
disagree with the step time the trial reports (:func:`placements`).

A sample that is no unit, or one already evaluated by an earlier trial, is repaired to the
nearest unit not yet evaluated (weighted distance over the axes' ordinal positions), so every
trial judges a new, valid plan that fits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel import Plan, estimate_batch, plans_to_arrays
from costmodel.rules import RULES
from search.anchored_interval import AnchoredSpread, anchor_batch, calibration_at, spread_for
from search.inputs.sections import LEVELS
from search.inputs.specs import Specs
from search.inputs.study import Study
from search.objectives import OBJECTIVES, metrics_from_batch, objective_vector
from search.placement import plan_fields
from search.priors import prior_spread
from search.prune import MemoryStage, plan_arrays
from search.space import AXES, DERIVED, SearchSpace, decode, plan_from_row
from search.storage import SearchError
from search.uncertainty import (
    interval,
    p_oom,
    plan_regime,
    uncertainty_metrics,
)

OUTER_AXES = ("tp", "pp", "cp", "ep")
# the most feasible layouts judged all at once for the heat map's cells (~1 s per 25,000)
CELL_JUDGE_MAX = 200_000
# what is decided per layout beyond the axes: the split, the layers recomputed, offloaded (the
# memory stage), and the MoE dispatch (the fastest of the space's options the rules allow)
PLACED = ("first_stage_layers", "last_stage_layers", "recompute_layers", "cpu_offload_layers",
          "moe_dispatcher", "moe_a2a_overlap")
# the rules that read the MoE dispatch, checked per option on placed plans
DISPATCH_RULES = tuple(r for r in RULES if {"moe_dispatcher", "moe_a2a_overlap"} & set(r.reads))
# How much one ordinal step along an axis costs when repairing a sample: parallel degrees first.
REPAIR_WEIGHTS = {"tp": 8, "pp": 8, "cp": 8, "ep": 8, "micro_batch": 4, "recompute": 4,
                  "vpp": 2, "zero_stage": 2, "sequence_parallel": 1, "pp_schedule": 1}


def placements(stage: MemoryStage, idx: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The placed plans the search judges for layouts ``idx`` (cost-model columns), and the
    position in ``idx`` of the layout each is of. Every layout is placed as CP-SAT places it
    (by the vectorised twin). That model weighs stages by a proxy of their work
    (``search.placement``), which the cost model can price below the even split (the LM head,
    the embedding, the chunks of interleaving), so where uneven stages are searched a layout
    whose even split fits is judged at that split too."""
    rows, ok = stage.place_many(idx)
    assert ok.all(), "the screen and the placement disagree"
    at = np.arange(len(idx))
    if stage.space.switches.uneven_pipeline:
        even, fits = stage.place_many(idx, even=True)
        rows, at = np.concatenate([rows, even[fits]]), np.concatenate([at, at[fits]])
    cols = plan_arrays({a: stage.cols[a][idx[at]] for a in AXES})
    cols.update(plan_fields(stage.space.facts.layers, cols["pp"], cols["recompute"] == 2, rows,
                            cols["vpp"]))
    cols["cpu_offload_layers"] = stage.offloaded(idx[at])
    return with_dispatch(stage.space, cols, at)


def with_dispatch(space: SearchSpace, cols: dict[str, np.ndarray],
                  at: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each placed plan under each MoE dispatch option of the space that the rules allow it
    (``DISPATCH_RULES``; the enumeration kept a layout only if one does), and the layout of
    each row."""
    if space.dispatch == ((0, 0),):  # the training's alone: the enumeration kept it valid
        zeros = np.zeros_like(cols["tp"])
        return {**cols, "moe_dispatcher": zeros, "moe_a2a_overlap": zeros}, at
    parts, ats = [], []
    for d, o in space.dispatch:
        opt = {**cols, "moe_dispatcher": np.full_like(cols["tp"], d),
               "moe_a2a_overlap": np.full_like(cols["tp"], o)}
        ok = np.ones(len(at), dtype=bool)
        for r in DISPATCH_RULES:
            ok &= np.asarray(r.holds(opt, space.facts), dtype=bool)
        parts.append({k: v[ok] for k, v in opt.items()})
        ats.append(at[ok])
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, np.concatenate(ats)


@dataclass(frozen=True, slots=True)
class Evaluation:
    unit: int
    plan: Plan
    metrics: dict[str, Any]
    values: tuple[float, ...]  # objective values, in study direction order
    candidates: int = 1  # feasible plans the unit held (all judged, the best kept)


@dataclass(frozen=True, slots=True)
class Exhaustive:
    count: int
    values: np.ndarray  # primary objective of every feasible layout
    best: list[Evaluation]  # the top plans by the primary objective


@dataclass
class Evaluator:
    """Everything a trial needs; built once per process from the study."""

    study: Study
    specs: Specs
    stage: MemoryStage
    feasible: np.ndarray  # indices of feasible valid layouts
    members: list[np.ndarray] = field(init=False)  # per unit: feasible layout indices
    choices: dict[str, list[Any]] = field(init=False)  # searched axis -> values
    _ordinal: np.ndarray = field(init=False)  # units x searched axes
    _cache: dict[int, Evaluation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cols = self.stage.cols
        axes = OUTER_AXES if len(self.directions) == 1 else tuple(a for a in AXES if a != DERIVED)
        keys = np.stack([cols[a][self.feasible] for a in axes], axis=1).reshape(-1, len(axes))
        units, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        self.members = np.split(self.feasible[order],
                                np.cumsum(np.bincount(inverse, minlength=len(units)))[:-1])
        searched = [k for k in range(len(axes)) if len(np.unique(units[:, k])) > 1]
        self.choices = {axes[k]: [decode(axes[k], int(v)) for v in np.unique(units[:, k])]
                        for k in searched}
        self._ordinal = np.zeros((len(units), len(searched)), dtype=np.int64)
        for j, k in enumerate(searched):
            self._ordinal[:, j] = np.searchsorted(np.unique(units[:, k]), units[:, k])

    @property
    def metric_names(self) -> list[str]:
        obj = self.study.objective
        return [obj.metric] + ([obj.second] if obj.second else [])

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[name][1] for name in self.metric_names]

    @property
    def units(self) -> int:
        return len(self.members)

    def params_of(self, unit: int) -> dict[str, Any]:
        """The sampled-axis values of a unit."""
        first = int(self.members[unit][0])
        return {a: decode(a, int(self.stage.cols[a][first])) for a in self.choices}

    def nearest(self, params: dict[str, Any], seen: Collection[int] = ()) -> tuple[int, bool]:
        """The unit nearest to ``params`` among those not in ``seen`` (all, once every unit has
        been seen), and whether it differs from the sample."""
        axes = list(self.choices)
        x = np.array([self.choices[a].index(params[a]) for a in axes], dtype=float)
        w = np.array([REPAIR_WEIGHTS.get(a, 1) for a in axes], dtype=float)
        dist = np.abs(self._ordinal - x) @ w if axes else np.zeros(self.units)
        exact = int(np.argmin(dist))
        if len(seen) < self.units:
            dist[list(seen)] = np.inf
        unit = int(np.argmin(dist))
        return unit, not (unit == exact and dist[exact] == 0)

    def evaluate(self, unit: int) -> Evaluation:
        """The best plan of a unit; its placement decided by CP-SAT, or the even split where
        the objective ranks that higher (cached)."""
        if unit not in self._cache:
            idx = self.members[unit]
            cols, out = self._judge_many(idx)
            k = int(self._rank(out, cols)[0])
            best = int(idx[k])
            row = {a: int(self.stage.cols[a][best]) for a in AXES}
            placement = self.stage.place(best)
            if placement is None:  # the screen and CP-SAT disagree (a model past its range)
                shown = {a: decode(a, int(self.stage.cols[a][best])) for a in OUTER_AXES}
                raise SearchError(
                    f"search: the layer placement (CP-SAT) found no split of "
                    f"{self.specs.model.layers} layers for the layout "
                    f"{', '.join(f'{a}={v}' for a, v in shown.items())} that the memory screen "
                    f"passed; try search_space.uneven_pipeline: false and "
                    f"partial_recompute: false, or fewer layers or pp values")
            # the twin judged CP-SAT's placement, and the even split where that ranked higher
            row.update({f: int(cols[f][k]) for f in PLACED})
            plan = plan_from_row(row)
            out = self._estimate(plans_to_arrays([plan]))
            self._cache[unit] = self._evaluation(unit, plan, out, 0, candidates=len(idx))
        return self._cache[unit]

    def _judge_many(self, idx: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Place many layouts (:func:`placements`) and estimate them in one call, keeping per
        layout the placement the objective ranks higher."""
        cols, at = placements(self.stage, idx)
        out = self._estimate(cols)
        if len(at) == len(idx):
            return cols, out
        # per layout, its best placement (stable: a tie keeps the placement model's)
        order = self._rank(out, cols)
        order = order[np.argsort(at[order], kind="stable")]
        keep = order[np.searchsorted(at[order], np.arange(len(idx)))]
        return ({k: v[keep] for k, v in cols.items()},
                {k: v[keep] if np.ndim(v) and len(v) == len(at) else v for k, v in out.items()})

    def _estimate(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``estimate_batch``, moved by the calibration's anchor runs near each plan
        (``search.anchored_interval.anchor_batch``); ``anchor_sd``: the sd left per plan."""
        s = self.specs
        out = estimate_batch(s.model, s.cluster, s.training, cols)
        if not s.calibration:
            return out
        moved, _, sd = anchor_batch(calibration_at(s.calibration), s.model, s.cluster,
                                    s.training, cols, out)
        return {**moved, "anchor_sd": sd}

    @property
    def regime(self) -> tuple[str, ...]:
        return plan_regime(self.specs.model, self.specs.cluster, self.specs.training,
                           self.specs.framework)

    @property
    def anchor(self) -> AnchoredSpread | None:
        """The anchored interval's spread, where the study is what its calibration's measured
        runs checked (``search.anchored_interval``)."""
        return spread_for(self.specs.calibration, self.specs.model, self.specs.cluster)

    def _vector(self, name: str, out: dict[str, np.ndarray],
                cols: dict[str, np.ndarray]) -> np.ndarray:
        values = objective_vector(
            OBJECTIVES[name][0], out, num_gpus=self.specs.cluster.num_gpus,
            token_budget=self.study.training.token_budget,
            price_per_gpu_hour=self.study.cluster.price_per_gpu_hour,
            headroom_gib=self.specs.headroom_gib)
        risk = self.study.objective.risk
        if risk is None or name != "tokens_per_s":
            return values
        # ranked by the tokens/s reached with probability 1 - risk, times the chance it fits;
        # a plan resting on a term no measured row validates is priced at that term's range
        anchor = self.anchor
        factor = (np.exp(out.get("anchor_sd", 1.0) * np.interp(risk, LEVELS, anchor.q))
                  if anchor is not None else interval(1.0, self.regime, risk, risk)[1])
        s = self.specs
        spread = prior_spread(s.model, s.cluster, s.training, cols)
        low, high = spread.widen
        side = low if risk < 0.5 else high if risk > 0.5 else 1.0
        peak = out["peak_mem_bytes"] * np.prod(spread.peak, axis=0)
        return values * factor * side * (1.0 - p_oom(peak, out["usable_bytes"]))

    def _rank(self, out: dict[str, np.ndarray], cols: dict[str, np.ndarray]) -> np.ndarray:
        """Positions sorted best first by the primary objective, every plan that fits with the
        study's headroom before any that does not (stable: ties keep order). A unit's placements
        and MoE dispatch options differ in memory beyond what the memory screen's linear terms
        see (the fused dispatch's buffers), so its fastest option may not fit where another does:
        the trial, constrained on memory, must get the one that fits, and so must the exhaustive
        optimum it is measured against."""
        values = self._vector(self.metric_names[0], out, cols)
        over = self._vector("memory_headroom", out, cols) < 0
        order = np.argsort(-values if self.directions[0] == "maximize" else values,
                           kind="stable")
        return order[np.argsort(over[order], kind="stable")]

    def _evaluation(self, unit: int, plan: Plan, out: dict[str, np.ndarray], k: int,
                    candidates: int = 1) -> Evaluation:
        t, c = self.study.training, self.study.cluster
        m = metrics_from_batch(out, k, num_gpus=self.specs.cluster.num_gpus,
                               headroom_gib=self.specs.headroom_gib,
                               token_budget=t.token_budget, price_per_gpu_hour=c.price_per_gpu_hour)
        s = self.specs
        rests_on = prior_spread(s.model, s.cluster, s.training, plans_to_arrays([plan])).of(0)
        anchor = self.anchor
        if anchor is not None and "anchor_sd" in out:
            anchor = anchor.at(float(np.atleast_1d(out["anchor_sd"])[k]))
        m.update(uncertainty_metrics(m, self.regime, self.study.objective.risk, rests_on,
                                     anchor))
        values = tuple(float(m["tokens_per_s_at_risk"] * (1.0 - m["p_oom"])
                             if name == "tokens_per_s" and "tokens_per_s_at_risk" in m
                             else m[OBJECTIVES[name][0]]) for name in self.metric_names)
        return Evaluation(unit=unit, plan=plan, metrics=m, values=values, candidates=candidates)

    def cell_best(self) -> dict[tuple[int, int], tuple[float, Plan]]:
        """Per (tp, pp): the best plan of the cell by the primary objective, every feasible
        layout placed and judged as ``exhaustive`` does (the heat map's cells: the best plan
        there, not the best trial the sampler happened to take); its tokens/s per GPU. Empty
        past :data:`CELL_JUDGE_MAX` feasible layouts (the report then reads the trials)."""
        if not 0 < len(self.feasible) <= CELL_JUDGE_MAX:
            return {}
        cols, out = self._judge_many(self.feasible)
        tps = np.asarray(out["tokens_per_s_per_gpu"], dtype=float)
        keys = (*AXES, *PLACED)
        best: dict[tuple[int, int], tuple[float, Plan]] = {}
        seen: set[tuple[int, int]] = set()
        for k in self._rank(out, cols).tolist():  # best first: a cell's first is its best
            cell = (int(cols["tp"][k]), int(cols["pp"][k]))
            if cell not in seen:
                seen.add(cell)
                best[cell] = (float(tps[k]), plan_from_row({a: int(cols[a][k]) for a in keys}))
        return best

    def exhaustive(self, top_k: int) -> Exhaustive:
        """Every feasible layout placed (vectorised twin of the CP-SAT model) and judged."""
        cols, out = self._judge_many(self.feasible)
        order = self._rank(out, cols)
        keys = (*AXES, *PLACED)
        best = [self._evaluation(-1, plan_from_row({a: int(cols[a][k]) for a in keys}), out,
                                 int(k)) for k in order[:top_k]]
        return Exhaustive(count=len(order),
                          values=self._vector(self.metric_names[0], out, cols),
                          best=best)
