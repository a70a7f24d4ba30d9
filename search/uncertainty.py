"""How far off a prediction may be: an interval on tokens/s and a probability of running out of
memory, from the cost model's held-out residuals (``hardware_catalog/uncertainty.yaml``, written
by ``python -m tcf_search.calibration.fit --write``), and what the calibration of a cluster
rests on (fitted, or borrowed from another SKU family).

A regime is SKU family / precision / dense or MoE / scale (up to 64 GPUs or more), and first of
all the framework stack whose runs the residuals come from (``residual_stack``: Megatron-Core's
profiles are one stack, ``megatron-core:hopper/bf16/dense``): how far off the model is depends
on whose code ran, a sweep of a research framework on a busy cluster or a vendor's tuned recipe,
and a plan is judged by the runs of its own stack where they bound it. Its tokens/s quantiles are
finite-sample bounds for a row of a new sweep group (``tcf_search.calibration.uncertainty``);
where a regime has too few groups for a bound at the levels asked (an infinite quantile), the
next coarser one answers (the stack's coarser regimes, then every stack's), and the answer says
so ("borrowed from hopper/bf16").

What no residual covers widens the interval: a term of the cost model no measured row validates,
where a plan uses it (:func:`prior_spread`). The plan is re-priced with that term at the ends of
its plausible range (``hardware_catalog/prior_ranges.yaml``, cited; for a family borrowing
another's fit, every fitted family's efficiency; for a fabric with no rows, the family's fitted
network fraction), and its interval's bounds move by the tokens/s ratios found, its P(OOM) by the
peak memory's. A plan that uses no such term keeps its residual interval exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import yaml

from costmodel.specs import ClusterSpec, ModelSpec, Training
from hardware_catalog import CATALOG_DIR
from hardware_catalog.catalog import MATMUL_SCALED, lender_of
from hardware_catalog.fabrics import load_fabrics
from hardware_catalog.frameworks import is_megatron_core, resolve_framework
from search.anchored_interval import AnchoredSpread
from search.inputs.sections import LEVELS

UNCERTAINTY_FILE = CATALOG_DIR / "uncertainty.yaml"
INTERVAL = (0.1, 0.9)  # the 80% interval shown
# the regime of every MoE model: bounds from the MoE groups the MoE fit leaves out, one at a time
# (tcf_search.calibration.uncertainty.moe_table), where the held-out split has few MoE groups
MOE_KEY = "moe"
SMALL_SCALE_GPUS = 64


def scale_of(num_gpus: int) -> str:
    return "small" if int(num_gpus) <= SMALL_SCALE_GPUS else "large"


def residual_stack(framework: str) -> str:
    """The stack a framework's residuals are pooled by: Megatron-Core's profiles (generic is
    Megatron-LM-like) are one, every other profile its own; "" where none is named."""
    if not framework:
        return ""
    return "megatron-core" if is_megatron_core(framework) else resolve_framework(framework)


def regime_keys(family: str, precision: str, kind: str, scale: str,
                stack: str = "") -> list[str]:
    """The regime and every coarser one it falls back to, finest first: the stack's own
    (``stack:family/...``), then every stack's. A MoE plan meets the MoE residuals (``MOE_KEY``:
    every family's and stack's) before any regime that pools it with dense models."""
    kinded = [f"{family}/{precision}/{kind}/{scale}", f"{family}/{precision}/{kind}"]
    unkinded = [f"{family}/{precision}", family]

    def own(keys: list[str]) -> list[str]:
        return [f"{stack}:{key}" for key in keys] if stack else []

    if kind == "moe":
        return [*own(kinded), *kinded, MOE_KEY, *own(unkinded), *unkinded, "all"]
    return [*own(kinded + unkinded), *kinded, *unkinded, "all"]


def key_regime(key: str) -> tuple[str, ...]:
    """The (family, precision, kind, scale, stack) of a finest regime key."""
    stack, _, rest = key.rpartition(":")
    return (*rest.split("/"), stack)


@dataclass(frozen=True, slots=True)
class Uncertainty:
    throughput: dict[str, dict[str, Any]]  # regime key -> {n, groups, q: bounds at LEVELS}
    memory: dict[str, Any]  # {n, groups, q}
    ranking: dict[str, Any] = field(default_factory=dict)  # {gap_edges, p_right, pairs, groups}

    def quantiles(self, family: str, precision: str, kind: str, scale: str, stack: str = "",
                  *, at: tuple[float, ...] = INTERVAL) -> tuple[list[float], str]:
        """Quantiles of log(measured / predicted tokens/s) of the finest regime whose groups bound
        the levels ``at`` (finite there), and the regime key they are of."""
        for key in regime_keys(family, precision, kind, scale, stack):
            entry = self.throughput.get(key)
            if entry and np.all(np.isfinite(np.interp(at, LEVELS, entry["q"]))):
                return list(entry["q"]), key
        return [0.0] * len(LEVELS), ""


@lru_cache(maxsize=1)
def load_uncertainty() -> Uncertainty:
    doc = yaml.safe_load(UNCERTAINTY_FILE.read_text()) if UNCERTAINTY_FILE.exists() else {}
    doc = doc or {}
    return Uncertainty(throughput=doc.get("throughput") or {}, memory=doc.get("memory") or {},
                       ranking=doc.get("ranking") or {})


def plan_regime(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                framework: str = "") -> tuple[str, ...]:
    kind = "moe" if model.moe_experts > 0 else "dense"
    return (cluster.gpu.family, tr.precision, kind, scale_of(cluster.num_gpus),
            residual_stack(framework))


def p_oom(peak_bytes: np.ndarray | float, usable_bytes: np.ndarray | float,
          unc: Uncertainty | None = None) -> np.ndarray:
    """Probability that the true peak exceeds usable memory: the share of the memory residuals
    log(measured / predicted) above log(usable / predicted), each sweep group weighing alike."""
    unc = unc or load_uncertainty()
    peak = np.asarray(peak_bytes, dtype=float)
    margin = np.log(np.asarray(usable_bytes, dtype=float) / np.maximum(peak, 1.0))
    q = unc.memory.get("q")
    if not q:
        return np.where(margin < 0, 1.0, 0.0)
    levels = np.concatenate([[0.0], LEVELS, [1.0]])
    # beyond the outer quantiles the tails are extended by the 5-95% spread
    spread = q[-1] - q[0]
    grid = np.concatenate([[q[0] - spread], q, [q[-1] + spread]])
    return 1.0 - np.interp(margin, grid, levels)


def interval(tokens: float, regime: tuple[str, ...], lo: float = INTERVAL[0],
             hi: float = INTERVAL[1], unc: Uncertainty | None = None,
             widen: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float, str]:
    """The [lo, hi] quantile interval of tokens/s around a prediction, and the regime it is
    taken from; ``widen``: the tokens/s ratios the plan's unvalidated terms reach at their
    pessimistic and optimistic ends (:func:`prior_spread`), applied to the bounds below and
    above the median."""
    unc = unc or load_uncertainty()
    q, key = unc.quantiles(*regime, at=(lo, hi))
    a, b = np.exp(np.interp([lo, hi], LEVELS, q))
    return float(tokens * a * _side(lo, widen)), float(tokens * b * _side(hi, widen)), key


def _side(level: float, widen: tuple[float, float]) -> float:
    """The widening of a bound at quantile ``level``: the pessimistic ratio below the median,
    the optimistic one above it."""
    return widen[0] if level < 0.5 else widen[1] if level > 0.5 else 1.0


def uncertainty_metrics(m: dict[str, Any], regime: tuple[str, ...],
                        risk: float | None = None,
                        rests_on: list[dict[str, Any]] | None = None,
                        anchor: AnchoredSpread | None = None) -> dict[str, Any]:
    """The interval, P(OOM) and (with ``risk``) the tokens/s at that quantile, for a plan's
    report-unit metrics ``m``; ``rests_on``: the plan's unvalidated terms
    (:meth:`PriorSpread.of`), which widen the interval and P(OOM) and are named beside them;
    ``anchor``: the anchored spread, for a study its calibration's measured runs checked
    (``search.anchored_interval``), in place of the regime's residuals."""
    rests_on = rests_on or []
    widen = (float(np.prod([t["tokens_per_s_ratio"][0] for t in rests_on])),
             float(np.prod([t["tokens_per_s_ratio"][1] for t in rests_on])))
    peak = m["peak_mem_gib"] * float(np.prod([t["peak_mem_ratio"] for t in rests_on]))
    if anchor is not None:
        lo, hi = anchor.interval(m["tokens_per_s_per_gpu"], *INTERVAL)
        lo, hi, key = lo * widen[0], hi * widen[1], anchor.label
    else:
        lo, hi, key = interval(m["tokens_per_s_per_gpu"], regime, widen=widen)
    out: dict[str, Any] = {
        "tokens_per_s_interval": [lo, hi], "interval_level": INTERVAL[1] - INTERVAL[0],
        "interval_regime": key,
        "p_oom": float(p_oom(peak, m["usable_mem_gib"])),
    }
    exact = regime_keys(*regime)[0]
    if anchor is not None:
        out["interval_note"] = anchor.basis
    elif key == MOE_KEY:
        out["interval_note"] = "residuals of the MoE model x GPU groups left out of the MoE fit"
    elif key != exact:
        out["interval_note"] = f"residuals borrowed from {key or 'nothing (no data)'}"
    if rests_on:
        out["interval_rests_on"] = rests_on
        out["interval_flags"] = [t["flag"] for t in rests_on]
    if risk is not None:
        out["tokens_per_s_at_risk"] = (
            anchor.interval(m["tokens_per_s_per_gpu"], risk, risk)[0] * _side(risk, widen)
            if anchor is not None else
            interval(m["tokens_per_s_per_gpu"], regime, risk, risk, widen=widen)[0])
    return out


def gap_bin(gaps: np.ndarray | float, edges: list[float] | tuple[float, ...]) -> np.ndarray:
    """The ranking bin of each |log predicted gap|: from each edge to the next, the last to
    infinity (``tcf_search.calibration.ranking`` builds the table by it, ``p_best_faster`` reads
    it)."""
    return np.searchsorted(np.asarray(edges), np.abs(gaps), side="right") - 1


def p_best_faster(best_tokens: float, other_tokens: float,
                  unc: Uncertainty | None = None) -> float | None:
    """Probability that the plan predicted at ``best_tokens`` tokens/s really runs faster than
    one of the same study predicted at ``other_tokens``: the share of held-out pairs of runs
    with this predicted gap that the model ordered right (``tcf_search.calibration.ranking``);
    None without that data."""
    r = (unc or load_uncertainty()).ranking
    if not r.get("p_right") or best_tokens <= 0 or other_tokens <= 0:
        return None
    gap = float(np.log(best_tokens / other_tokens))
    p = float(r["p_right"][max(int(gap_bin(gap, r["gap_edges"])), 0)])
    return p if gap >= 0 else 1.0 - p


def ranking_resolution(tokens: list[float], unc: Uncertainty | None = None) -> dict[str, Any]:
    """For a ranked list's predicted tokens/s: each later plan's predicted gap to the first and
    the probability that the first really runs faster (``p_best_faster``)."""
    unc = unc or load_uncertainty()
    r = unc.ranking
    rows = []
    for rank, tok in enumerate(tokens[1:], start=2):
        p = p_best_faster(tokens[0], tok, unc)
        if p is not None:
            rows.append({"rank": rank, "tokens_per_s_gap": tokens[0] / tok - 1.0,
                         "p_best_faster": p})
    if not rows:
        return {}
    return {"vs_best": rows, "pairs": int(sum(r.get("pairs", []))),
            "groups_per_bin": list(r.get("groups", [])),
            "basis": "held-out pairs of measured runs of one model on one cluster, binned by "
                     "their predicted gap: the share the model ordered right"}


def _fabric_not_given(cluster: ClusterSpec) -> str:
    """How a cluster that names no fabric is priced: as its family's measured cluster."""
    eff, family = cluster.gpu.efficiency, cluster.gpu.family
    step = (f"{eff.network_step_latency_s * 1e6:.0f} us a ring step"
            if eff.network_step_latency_s > 0 else "the GPU's NCCL ring step")
    figures = f"{eff.network_bw_fraction:.3g} of the NIC's line rate, {step}"
    if eff.network_fabric:
        return (f"none given: priced as the {family} family's measured cluster, on "
                f"{eff.network_fabric}: {figures}; name cluster.fabric for yours")
    return f"none given: the {family} family's network fraction and ring step ({figures})"


def calibration_status(cluster: ClusterSpec) -> dict[str, Any]:
    """What the cluster's numbers rest on: the SKU family's efficiency (fitted on measured runs,
    or borrowed from another family, unvalidated) and the fabric's network fraction."""
    eff, family = cluster.gpu.efficiency, cluster.gpu.family
    src = eff.source
    borrowed = lender_of(eff)
    partly = "borrowed from hopper, unvalidated" in src  # GEMM terms fitted, the rest not
    validated = src.startswith("fitted") and not borrowed and not partly
    fabric = cluster.fabric
    fabrics = load_fabrics() if fabric else {}
    fab_src = str(fabrics[fabric].source) if fabric in fabrics else _fabric_not_given(cluster)
    if borrowed:
        line = f"{family} efficiency borrowed from {borrowed}, unvalidated"
        if MATMUL_SCALED in src:
            line += f" (its matmul-bound fractions at {cluster.gpu.id}'s measured matmul ceiling)"
    elif partly:
        line = f"{family} GEMM terms fitted; other terms borrowed from hopper, unvalidated"
    elif validated:
        line = f"{family} efficiency fitted on measured runs"
    else:
        line = f"{family} efficiency is a prior, unvalidated"
    # activation offloading's copies: a prior fraction of the catalogued host link, no run
    host = (f"{eff.host_link_bw_fraction:g} of the host link's line rate, a prior, unvalidated "
            "(no measured run offloads)" if cluster.gpu.host_link_bw_bytes_per_s else None)
    text = f"calibration: {line}; fabric: {fabric or 'not given'} ({fab_src})"
    links = cluster.links
    anchored = None
    if links is not None:
        figures = {k: getattr(links, k) for k in (
            "nvlink_bw_bytes_per_s", "network_bw_bytes_per_s", "nvlink_step_latency_s",
            "network_step_latency_s", "p2p_network_bw_bytes_per_s")}
        anchored = {"source": links.source, "links": figures,
                    "all_to_all_bw_ratio": eff.all_to_all_bw_ratio}
        # the measured links replace the family's and the fabric's network figures
        text = (f"calibration: {line}; links {links.source} (NVLink "
                f"{_gbps(links.nvlink_bw_bytes_per_s)}, network "
                f"{_gbps(links.network_bw_bytes_per_s)} bus bandwidth per GPU)")
        if not any(figures.values()):  # measured steps only: no nccl-tests
            text = f"calibration: {line}; {links.source}"
    return {"family": family, "efficiency_source": src, "borrowed_from": borrowed or None,
            "validated": validated, "partly": partly, "fabric": fabric or None,
            "fabric_source": fab_src,
            "host_link_source": host, "anchored": anchored, "line": text}


def _gbps(bw: float) -> str:
    return f"{bw / 1e9:.1f} GB/s" if bw > 0 else "the family's"
