"""Refit a few physical efficiency parameters from validation results, then re-rank.

Least squares on the log of step time (a ratio error, so a 2x miss on a fast plan weighs as
much as on a slow one), over the plans that ran, with a weak pull toward the starting values
so that fewer plans than parameters still give a well-posed fit (ridge in log-parameter space).
Levenberg-Marquardt with a numeric Jacobian; each parameter stays within physical bounds.

Fitted: ``gemm_peak_fraction`` (compute), ``kernel_overhead_s`` (per-op launch cost, which on
CPU eager PyTorch includes Python dispatch) and ``collective_overhead_s`` (fixed cost per
collective call).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import estimate
from costmodel.specs import Efficiency
from search.inputs import PlanFile, plan_file_specs
from tcf_search.calibration.device import Entry, stamp
from tcf_search.validate.agreement import plan_label, spearman
from tcf_search.validate.config import ValidationError, as_run
from tcf_search.validate.record import read_csv
from tcf_search.validate.runs import top_plan_files

FITTED = ("gemm_peak_fraction", "kernel_overhead_s", "collective_overhead_s")
BOUNDS = {"gemm_peak_fraction": (0.01, 1.0), "kernel_overhead_s": (1e-7, 1e-2),
          "collective_overhead_s": (1e-7, 1e-1)}
PRIOR_WEIGHT = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    entry: Entry
    before: dict[str, float]  # mean |log error|, spearman
    after: dict[str, float]
    ranking: list[tuple[int, str, float, float]]  # (rank, plan, predicted s, measured s)

    def describe(self) -> str:
        eff = self.entry.gpu.efficiency
        lines = [f"refit {', '.join(f'{k}={getattr(eff, k):.4g}' for k in FITTED)}",
                 f"step time: mean |log error| {self.before['mean_abs_log_error']:.3f} -> "
                 f"{self.after['mean_abs_log_error']:.3f}; Spearman "
                 f"{self.before['spearman']:.3f} -> {self.after['spearman']:.3f}",
                 "re-ranked (refit prediction, fastest first):"]
        for new_rank, (rank, plan, pred, meas) in enumerate(self.ranking, 1):
            lines.append(f"  {new_rank:>2}. study rank {rank:>2} {plan:<34} "
                         f"pred {pred:.3f} s, measured {meas:.3f} s")
        return "\n".join(lines)


def _predict(plans: list[PlanFile], entry: Entry, eff: Efficiency) -> np.ndarray:
    gpu = dataclasses.replace(entry.gpu, efficiency=eff)
    device = "cpu" if gpu.synchronous else "cuda"
    out = []
    for pf in plans:
        cluster = plan_file_specs(pf, gpu).cluster
        out.append(estimate(pf.model, cluster, pf.plan, as_run(pf.training, device))
                   .step_time_s)
    return np.asarray(out, float)


def _with(eff: Efficiency, theta: np.ndarray) -> Efficiency:
    values: dict[str, Any] = {k: float(np.clip(math.exp(t), *BOUNDS[k]))
                              for k, t in zip(FITTED, theta, strict=True)}
    return dataclasses.replace(eff, **values)


def fit_efficiency(plans: list[PlanFile], measured: np.ndarray, entry: Entry,
                   iterations: int = 30) -> Efficiency:
    eff0 = entry.gpu.efficiency
    theta0 = np.log([getattr(eff0, k) for k in FITTED])

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = _predict(plans, entry, _with(eff0, theta))
        return np.concatenate([np.log(pred) - np.log(measured),
                               PRIOR_WEIGHT * (theta - theta0)])

    theta, damping = theta0.copy(), 1e-2
    r = residuals(theta)
    for _ in range(iterations):
        jac = np.empty((r.size, theta.size))
        for j in range(theta.size):
            step = np.zeros_like(theta)
            step[j] = 1e-3
            jac[:, j] = (residuals(theta + step) - r) / 1e-3
        lhs = jac.T @ jac + damping * np.eye(theta.size)
        candidate = theta - np.linalg.solve(lhs, jac.T @ r)
        lo = np.log([BOUNDS[k][0] for k in FITTED])
        hi = np.log([BOUNDS[k][1] for k in FITTED])
        candidate = np.clip(candidate, lo, hi)
        r_new = residuals(candidate)
        if r_new @ r_new < r @ r:
            theta, r, damping = candidate, r_new, damping / 3
        else:
            damping *= 5
        if damping > 1e6:
            break
    return dataclasses.replace(_with(eff0, theta),
                               source=f"{stamp()}: refit of {', '.join(FITTED)} on "
                                      f"{len(plans)} validated plans")


def _scores(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    return {"mean_abs_log_error": float(np.mean(np.abs(np.log(pred / measured)))),
            "spearman": spearman(list(pred), list(measured))}


def refit_from_folder(folder: Path, entry: Entry) -> Fit:
    rows = [r for r in read_csv(folder) if r["outcome"] == "ok"
            and math.isfinite(float(r["measured_step_time_s"] or "nan"))]
    if not rows:
        raise ValidationError(f"--from {folder}: validation.csv has no plan that ran "
                              f"(outcome ok with a step time); run tcf-search validate first")
    by_rank = {pf.rank: pf for pf in top_plan_files(folder, 10**6)}
    plans = [by_rank[int(r["rank"])] for r in rows]
    measured = np.asarray([float(r["measured_step_time_s"]) for r in rows])
    before = _predict(plans, entry, entry.gpu.efficiency)
    eff = fit_efficiency(plans, measured, entry)
    after = _predict(plans, entry, eff)
    fitted = Entry(gpu=dataclasses.replace(entry.gpu, efficiency=eff), sources=entry.sources,
                   notes=entry.notes, measurements=entry.measurements)
    order = np.argsort(after)
    ranking = [(plans[i].rank, plan_label(plans[i].plan), float(after[i]), float(measured[i]))
               for i in order]
    return Fit(entry=fitted, before=_scores(before, measured), after=_scores(after, measured),
               ranking=ranking)
