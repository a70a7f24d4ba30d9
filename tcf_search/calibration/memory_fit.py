"""The memory model's fit (``python -m tcf_search.calibration.fit`` runs it first): the
allocator's and nanotron's footprint terms on the Playbook's measured peaks, the spread they
leave, and the allocator stall's one fitted number on the Playbook's throughput; with the
helpers every stage of the fit shares (which rows a fit can evaluate; parameters in [0, 1])."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, minimize_scalar

from costmodel.specs import Efficiency, MemoryModel
from search import residual_stack
from tcf_search.calibration.dataset import Group, predict_groups, with_training

GIB = 2**30
MEM_PARAMS = ("activation_factor", "logits_bytes_per_element", "allocator_fraction",
              "allocator_const_bytes")
# the framework's own footprint (nanotron profile) vs the PyTorch allocator's (every framework)
FRAMEWORK_MEM_PARAMS = ("activation_factor", "logits_bytes_per_element", "pressure_width")
MEM_BOUNDS = {"activation_factor": (0.5, 4.0), "logits_bytes_per_element": (2.0, 40.0),
              "allocator_fraction": (0.0, 1.5), "allocator_const_bytes": (0.0, 8 * GIB)}
# the stall's slowdown: a stalled step from 0.1% longer to 21 times as long
PRESSURE_BOUNDS = {"pressure_slowdown": (1e-3, 20.0)}
# fitted on throughput but belonging to the memory model (the PyTorch allocator near capacity),
# in a stage of its own (fit_pressure): where the stall starts is a prior (the reserved peak at
# usable memory: pressure_start 1.0) and its width the memory fit's residual spread
PRESSURE_PARAMS = ("pressure_slowdown",)


def covered(groups, rows: pd.Series) -> np.ndarray:
    """Positions of the selected rows that the cost model can evaluate."""
    modelled = np.concatenate([g.index for g in groups]) if groups else np.array([], int)
    return np.intersect1d(np.flatnonzero(rows.to_numpy()), modelled)


def unit(x: np.ndarray, names: tuple[str, ...], bounds: dict[str, tuple[float, float]]) -> dict:
    """Parameters live in [0, 1] (log scale between bounds) for the optimiser."""
    out = {}
    for v, n in zip(x, names, strict=True):
        lo, hi = bounds[n]
        lo = max(lo, 1e-9)
        out[n] = float(np.exp(np.log(lo) + v * (np.log(hi) - np.log(lo))))
    return out


def to_unit(vals: dict, names: tuple[str, ...],
            bounds: dict[str, tuple[float, float]]) -> np.ndarray:
    x = []
    for n in names:
        lo, hi = bounds[n]
        lo = max(lo, 1e-9)
        v = min(max(vals[n], lo), hi)
        x.append((np.log(v) - np.log(lo)) / (np.log(hi) - np.log(lo)))
    return np.asarray(x)


def fit_memory(frame: pd.DataFrame, groups: list[Group], rows: pd.Series) -> dict[str, float]:
    measured = frame["peak_mem_gib"].to_numpy() * GIB
    idx = covered(groups, rows)
    used = [g for g in groups if np.isin(g.index, idx).any()]

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict_groups(used, len(frame), None, unit(x, MEM_PARAMS, MEM_BOUNDS))
        # max_memory_reserved on rank 0: the first pipeline stage
        return np.log(pred["first_stage_mem_bytes"][idx] / measured[idx])

    x0 = to_unit(dataclasses.asdict(MemoryModel()), MEM_PARAMS, MEM_BOUNDS)
    sol = least_squares(residuals, x0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=0.05,
                        diff_step=1e-3, max_nfev=300)
    # the spread of what is left (robust: 1.4826 median absolute deviations) is the predicted
    # peak's uncertainty, which the allocator stall is charged by
    r = sol.fun
    width = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    return {**unit(sol.x, MEM_PARAMS, MEM_BOUNDS), "pressure_width": width}


def fit_pressure(frame: pd.DataFrame, groups: list[Group], rows: pd.Series,
                 effs: dict[str, Efficiency]) -> dict[str, float]:
    """nanotron's allocator stall (``pressure_slowdown``) on ``rows``, by least absolute
    deviations on log throughput: the runs past the cliff are the ones that tell it, and
    fit_efficiency's Cauchy loss treats them as outliers by design."""
    measured = frame["tokens_per_sec_per_gpu"].to_numpy()
    idx = covered(groups, rows)
    used = [g for g in groups if np.isin(g.index, idx).any()]
    lo, hi = PRESSURE_BOUNDS["pressure_slowdown"]

    def cost(u: float) -> float:
        g = with_training(used, "nanotron", memory_model={"pressure_slowdown": float(np.exp(u))})
        pred = predict_groups(g, len(frame), effs)["tokens_per_s_per_gpu"][idx]
        return float(np.abs(np.log(pred / measured[idx])).sum())

    sol = minimize_scalar(cost, bounds=(np.log(lo), np.log(hi)), method="bounded",
                          options={"xatol": 1e-3})
    return {"pressure_slowdown": float(np.exp(sol.x))}


def nanotron_memory(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k in FRAMEWORK_MEM_PARAMS + PRESSURE_PARAMS}


@dataclasses.dataclass(frozen=True)
class LaunchedBound:
    """The most fragmentation a stack's launched runs leave room for (``launched_bounds``)."""

    fraction: float  # of the volatile bytes, the least any launched run with room leaves
    row: str  # the run that sets it (its case_id)
    rows: int  # launched runs the allocator's fragmentation moves
    over: tuple[str, ...]  # runs over usable memory with no fragmentation: the count's misses


def launched_bounds(frame: pd.DataFrame, groups: list[Group],
                    rows: pd.Series) -> dict[str, LaunchedBound]:
    """Per framework stack (``search.residual_stack``) whose rows report no peak memory, the
    largest caching-allocator fragmentation under which every launched run of ``rows`` (status
    ok) still fits: (usable - peak without fragmentation) / the volatile bytes it scales. A run
    that ran had its reserved peak under usable memory, so the stack's fraction is at most that;
    a bound, not a measurement. A run over usable memory with no fragmentation at all says the
    tensor count misses there, not the allocator: it is listed, not used. Runs whose allocator
    maps expandable segments (no fragmentation priced) do not bound it."""
    launched = rows & frame["status"].eq("ok")
    measured = frame["peak_mem_gib"].notna().to_numpy()
    stacks: dict[str, list[Group]] = {}
    for g in groups:
        stacks.setdefault(residual_stack(g.framework), []).append(g)
    ids = frame["case_id"].astype(str).to_numpy()
    out = {}
    for stack, mine in sorted(stacks.items()):
        idx = covered(mine, launched)
        if not stack or idx.size == 0 or measured[np.concatenate([g.index for g in mine])].any():
            continue
        used = [g for g in mine if np.isin(g.index, idx).any()]
        bare, whole = (predict_groups(used, len(frame), None, {"allocator_fraction": f})
                       for f in (0.0, 1.0))
        volatile = whole["peak_mem_bytes"][idx] - bare["peak_mem_bytes"][idx]
        room = bare["usable_bytes"][idx] - bare["peak_mem_bytes"][idx]
        moved = volatile > 0
        if not (moved & (room > 0)).any():
            continue
        slack = np.where(moved & (room > 0), room / np.where(moved, volatile, 1.0), np.inf)
        k = int(np.argmin(slack))
        out[stack] = LaunchedBound(fraction=float(slack[k]), row=str(ids[idx][k]),
                                   rows=int(moved.sum()),
                                   over=tuple(str(i) for i in ids[idx][moved & (room <= 0)]))
    return out
