"""The terms of the cost model no measured row validates (activation offload's host link, the
fused MoE dispatch, a family borrowing another's fit, a fabric with no rows, the allocator's
fragmentation where a stack's own is a prior), and each plan re-priced at the ends of their
ranges: what widens its interval and P(OOM) (``search.uncertainty.uncertainty_metrics``) and
flags it in the table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from costmodel import Plan, estimate_batch, peak_memory_batch, plans_to_arrays
from costmodel.dispatch import FLEX, a2a_overlap, dispatcher
from costmodel.memory import allocator_fraction
from costmodel.plans import as_plan_arrays
from costmodel.specs import ClusterSpec, Efficiency, ModelSpec, Training
from hardware_catalog import CATALOG_DIR, load_calibration, load_prior_ranges
from hardware_catalog.catalog import load_catalog, transfer_efficiency
from hardware_catalog.fabrics import load_fabrics
from hardware_catalog.frameworks import memory_model
from search.uncertainty import calibration_status

# each term's one-letter mark beside a plan's interval in the run table (the legend names it)
MARKS = {"offload prior": "o", "flex prior": "x", "overlap prior": "v", "borrowed fit": "b",
         "fabric prior": "n", "allocator prior": "a", "host prior": "h"}
# terms whose re-pricing moves memory alone: the allocator's fragmentation, where the stack's
# allocator does not stall near capacity (memory_model.pressure_slowdown 0), so tokens/s stays
# and only the peak is recomputed (costmodel.peak_memory_batch)
MEMORY_ONLY = ("allocator prior",)


@dataclass(frozen=True, slots=True)
class PriorTerm:
    """A term of the cost model no measured row validates, and the range it is re-priced at."""

    flag: str  # its name in the table's legend, e.g. "offload prior"
    what: str  # the term, as explain says it
    basis: str  # where the range comes from (its citation)
    # a plan rests on it only where its re-pricing moves the plan's figures (known once priced)
    moved_only: bool = False


@dataclass(frozen=True, slots=True)
class PriorSpread:
    """Per unvalidated term (rows) and plan (columns): whether the plan uses it, and the
    tokens/s and peak-memory ratios its re-pricing reaches (1 where it does not use it)."""

    terms: tuple[PriorTerm, ...]
    uses: np.ndarray  # bool, terms x plans
    low: np.ndarray  # the smallest tokens/s ratio over the term's range, <= 1
    high: np.ndarray  # the largest, >= 1
    peak: np.ndarray  # the largest peak-memory ratio, >= 1

    @property
    def widen(self) -> tuple[np.ndarray, np.ndarray]:
        """Per plan, the product of its terms' pessimistic and optimistic ratios."""
        return np.prod(self.low, axis=0), np.prod(self.high, axis=0)

    def of(self, k: int) -> list[dict[str, Any]]:
        """Plan ``k``'s terms, as ``uncertainty_metrics`` takes them and ``--json`` shows."""
        return [{"flag": t.flag, "mark": MARKS[t.flag], "term": t.what, "basis": t.basis,
                 "tokens_per_s_ratio": [float(self.low[i, k]), float(self.high[i, k])],
                 "peak_mem_ratio": float(self.peak[i, k])}
                for i, t in enumerate(self.terms) if self.uses[i, k]]


def _fitted_families() -> dict[str, Efficiency]:
    """The families whose efficiency measured runs fitted (not transferred from another)."""
    return {f: eff for f, eff in load_calibration(CATALOG_DIR).items()
            if eff.source.startswith("fitted") and "transferred from" not in eff.source}


def _with_efficiency(cluster: ClusterSpec, name: str, value: float) -> ClusterSpec:
    """The cluster with one efficiency field set to ``value``."""
    eff = replace(cluster.gpu.efficiency, **{name: value})  # type: ignore[arg-type]
    return replace(cluster, gpu=replace(cluster.gpu, efficiency=eff))


Variant = tuple[ClusterSpec, Training]


def _terms(model: ModelSpec, cluster: ClusterSpec, tr: Training,
           cols: Mapping[str, Any]) -> list[tuple[PriorTerm, np.ndarray, list[Variant]]]:
    """Each unvalidated term the plans ``cols`` may use: the term, which plans use it, and the
    clusters and trainings that price it at the ends of its range."""
    p = as_plan_arrays(cols)
    n = len(np.atleast_1d(p.tp))
    ranges = load_prior_ranges()
    eff = cluster.gpu.efficiency
    out: list[tuple[PriorTerm, np.ndarray, list[Variant]]] = []
    flex = (dispatcher(tr, p) == FLEX) & (p.ep > 1) & (model.moe_experts > 0)
    ranged = (
        ("host_link_bw_fraction", "offload prior",
         (p.cpu_offload_layers > 0) & (cluster.gpu.host_link_bw_bytes_per_s > 0),
         f"activation offload over the host link at {eff.host_link_bw_fraction:g} of its line "
         f"rate (no measured run offloads)"),
        ("flex_network_bw_fraction", "flex prior", flex,
         f"the fused MoE dispatch (DeepEP/HybridEP) at {eff.flex_network_bw_fraction:g} of the "
         f"NIC (a prior no measured row fits)"),
        ("flex_overlap_credit", "overlap prior", flex & a2a_overlap(tr, p),
         f"the fused MoE dispatch overlapped with the other micro-batch's compute, hiding "
         f"{eff.flex_overlap_credit:.0%} of what the combined 1F1B's windows allow (a prior no "
         f"measured row fits)"),
    )
    for field, flag, uses, what in ranged:
        rng = ranges.get(field)
        if rng is None:
            continue
        out.append((PriorTerm(flag, what, f"re-priced at {rng.low:g} and {rng.high:g}: "
                                          f"{rng.source}"),
                    np.broadcast_to(uses, (n,)),
                    [(_with_efficiency(cluster, field, v), tr) for v in (rng.low, rng.high)]))
    status = calibration_status(cluster)
    if not status["validated"] and not status["partly"]:
        fitted = _fitted_families()
        if fitted:
            out.append((PriorTerm(
                "borrowed fit", status["line"].split("; ")[0].removeprefix("calibration: "),
                f"re-priced with each fitted family's efficiency ({', '.join(sorted(fitted))}; "
                f"calibration.yaml)"), np.ones(n, dtype=bool),
                [(replace(cluster, gpu=replace(cluster.gpu, efficiency=transfer_efficiency(
                    e, family, cluster.gpu, load_catalog()))), tr)
                 for family, e in fitted.items()]))
    fabrics = load_fabrics() if cluster.fabric else {}
    fab = fabrics.get(cluster.fabric)
    if (fab is not None and cluster.links is None and not fab.source.startswith("fitted")
            and cluster.network_bw_fraction is not None):
        out.append((PriorTerm(
            "fabric prior", f"the {fab.id} fabric's network fraction "
            f"{cluster.network_bw_fraction:g}, a prior no measured row fits",
            f"re-priced at the {cluster.gpu.family} family's measured cluster's "
            f"{eff.network_bw_fraction:.3g} ({eff.network_fabric or 'calibration.yaml'})"),
            np.ones(n, dtype=bool),
            [(replace(cluster, network_bw_fraction=None), tr)]))
    out += _host_term(model, cluster, tr, cols)
    measured = memory_model().allocator_fraction
    own = allocator_fraction(tr)
    if own < measured:
        why = ("expandable segments" if tr.framework.kernels.expandable_segments
               else "the stack's own, bounded by the runs it launched")
        out.append((PriorTerm(
            "allocator prior", f"fragmentation of {own:.2g} of the volatile bytes beyond the "
            f"allocated ({why}; no measured row's memory says what this stack reserves)",
            f"re-priced at the memory model's fitted fragmentation {measured:.3g} of the "
            f"volatile bytes (the default allocator's; frameworks.yaml memory_model)"),
            np.ones(n, dtype=bool),
            [(cluster, tr.with_switches(expandable_segments=False, memory_model=replace(
                tr.framework.memory_model, allocator_fraction=measured)))]))
    return out


def _host_term(model: ModelSpec, cluster: ClusterSpec, tr: Training,
               cols: Mapping[str, Any]) -> list[tuple[PriorTerm, np.ndarray, list[Variant]]]:
    """A host CPU slower to issue than an x86 DGX host's (``GpuSpec.host_issue_factor``): no
    measured row is host-bound on one, so the plans are re-priced at an x86 host's issue time
    (the factor's other end); those it does not move (not host-bound) do not rest on it."""
    factor = cluster.gpu.host_issue_factor
    if factor == 1.0:
        return []
    x86 = replace(cluster, gpu=replace(cluster.gpu, host_issue_factor=1.0))
    n = len(np.atleast_1d(as_plan_arrays(cols).tp))
    return [(PriorTerm(
        "host prior", f"the host CPU issuing each operation in {factor:g}x an x86 DGX host's "
        f"time ({cluster.gpu.id}'s host_issue_factor; no measured row is host-bound on it)",
        "re-priced at 1, an x86 DGX host's issue time (the factor: TransformerEngine#2053's "
        "CPU time of a torch Linear forward on Grace over an H100 DGX's)", moved_only=True),
        np.ones(n, dtype=bool), [(x86, tr)])]


def _memory_only(term: PriorTerm, tr: Training, variants: list[Variant]) -> bool:
    """Whether re-pricing ``term`` can move memory alone (``MEMORY_ONLY``, no allocator stall
    as priced or re-priced)."""
    return term.flag in MEMORY_ONLY and not any(
        t.framework.memory_model.pressure_slowdown for t in (tr, *(v[1] for v in variants)))


def prior_spread(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                 cols: Mapping[str, Any]) -> PriorSpread:
    """The unvalidated terms of the plans ``cols`` (cost-model columns), each plan that uses
    one re-priced at the ends of the term's range."""
    n = len(np.atleast_1d(as_plan_arrays(cols).tp))
    terms = [t for t in _terms(model, cluster, tr, cols) if t[1].any()]
    low, high, peak = (np.ones((len(terms), n)) for _ in range(3))
    every: dict[str, np.ndarray] | None = None  # the plans as priced, once for all-plan terms
    for i, (term, uses, variants) in enumerate(terms):
        sub = {k: np.asarray(v)[uses] if np.ndim(v) else v for k, v in cols.items()}
        if _memory_only(term, tr, variants):
            at = peak_memory_batch(model, cluster, tr, sub)
            for variant, training in variants:
                peak[i, uses] = np.maximum(peak[i, uses], peak_memory_batch(
                    model, variant, training, sub) / at)
            continue
        if uses.all():
            every = base = every or estimate_batch(model, cluster, tr, sub)
        else:
            base = estimate_batch(model, cluster, tr, sub)
        for variant, training in variants:
            alt = estimate_batch(model, variant, training, sub)
            tok = alt["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
            low[i, uses] = np.minimum(low[i, uses], tok)
            high[i, uses] = np.maximum(high[i, uses], tok)
            peak[i, uses] = np.maximum(peak[i, uses],
                                       alt["peak_mem_bytes"] / base["peak_mem_bytes"])
    uses_of = np.array([t[1] for t in terms], dtype=bool).reshape(len(terms), n)
    for i, (term, _, _) in enumerate(terms):
        if term.moved_only:
            moved = np.stack([low[i], high[i], peak[i]])
            uses_of[i] &= ~np.isclose(moved, 1.0, rtol=0.0, atol=1e-9).all(axis=0)
    return PriorSpread(terms=tuple(t[0] for t in terms), uses=uses_of, low=low, high=high,
                       peak=peak)


def plan_rests_on(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                  plan: Plan) -> list[dict[str, Any]]:
    """One plan's unvalidated terms (:func:`prior_spread`)."""
    return prior_spread(model, cluster, tr, plans_to_arrays([plan])).of(0)
