"""Why the layouts closest to fitting do not fit: the nearest misses, explained in GiB."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel import SpecError, estimate
from costmodel.result import GIB
from search.inputs.specs import Specs
from search.placement import STAGE_NAMES, stages_of
from search.prune import MemoryStage
from search.space import AXES, plan_from_row
from search.stage_memory import stage_bytes


def balanced(layers: int, pp: np.ndarray, vpp: np.ndarray) -> dict[str, np.ndarray]:
    """The most even placement: layers per first, middle and last stage (``vpp`` is not read:
    a miss is explained on the most even split, launchable or not)."""
    mid = layers // pp
    rest = layers - np.maximum(pp - 2, 0) * mid
    even = layers % pp == 0
    first = np.where(pp == 1, layers, np.where(even, mid, rest // 2))
    last = np.where(pp == 1, layers, np.where(even, mid, rest - rest // 2))
    return {"first": first, "middle": np.where(pp > 2, mid, first), "last": last}


def nearest_misses(stage: MemoryStage, specs: Specs, headroom_gib: float,
                   count: int = 5) -> list[dict[str, Any]]:
    """The ``count`` infeasible layouts whose balanced, most-recomputed placement overflows
    least, each with the cost model's memory breakdown of its fullest stage."""
    bad = np.flatnonzero(~stage.feasible)
    if len(bad) == 0:
        return []
    cols = {k: v[bad] for k, v in stage.cols.items()}
    t = stage.terms.take(bad)
    n = balanced(specs.model.layers, cols["pp"], cols["vpp"])
    full = cols["recompute"] == 2
    need = np.stack([np.where(_present(s, cols["pp"]),
                              stage_bytes(t, s, n[s], np.where(full, n[s], 0)), 0.0)
                     for s in STAGE_NAMES])
    ratio = need.max(axis=0) / (t.usable - headroom_gib * GIB)
    out: list[dict[str, Any]] = []
    for j in np.argsort(ratio, kind="stable"):
        if (miss := _explain(stage, specs, int(bad[j]), headroom_gib)) is not None:
            out.append(miss)
        if len(out) == count:
            break
    return out


def _present(stage: str, pp: np.ndarray) -> np.ndarray:
    return np.asarray([stage in stages_of(int(p)) for p in pp])


def _explain(stage: MemoryStage, specs: Specs, i: int, headroom_gib: float
             ) -> dict[str, Any] | None:
    """The layout's miss on its most even split, or None where no such plan is valid (its
    chunks are launchable only on a split the CP-SAT stage would have chosen)."""
    row = {a: int(stage.cols[a][i]) for a in AXES}
    L, pp = specs.model.layers, row["pp"]
    n = {k: int(v[0]) for k, v in balanced(L, np.asarray([pp]), np.asarray([row["vpp"]])).items()}
    uneven = pp > 1 and not (n["first"] == n["last"] == n["middle"] and L % pp == 0)
    est = None
    # the even split first; where its chunks are not launchable (126 layers on pp 2 with vpp 5:
    # 63 a stage), the same layers pinned, which a framework with uneven chunks builds
    for pinned in dict.fromkeys((uneven, pp > 1)):
        plan = plan_from_row({**row, "first_stage_layers": n["first"] if pinned else 0,
                              "last_stage_layers": n["last"] if pinned else 0})
        try:
            est = estimate(specs.model, specs.cluster, plan, specs.training)
            break
        except SpecError:
            continue
    if est is None:
        return None
    peak = est.memory.peak
    usable = est.memory.usable_bytes / GIB - headroom_gib
    parts = {"activations": peak.activations_bytes, "weights": peak.weights_bytes,
             "optimizer": peak.optimizer_bytes, "grads": peak.grads_bytes,
             "buffers": peak.buffers_bytes + peak.overhead_bytes}
    text = ", ".join(f"{k} {v / GIB:.1f}" for k, v in
                     sorted(parts.items(), key=lambda kv: -kv[1]))
    room = f"{usable:.1f} GiB usable" + (f" (after {headroom_gib:g} GiB headroom)"
                                          if headroom_gib else "")
    return {"plan": {k: getattr(plan, k) for k in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "vpp",
                                                  "zero_stage", "micro_batch", "recompute",
                                                  "sequence_parallel")},
            "stage": peak.stage, "needs_gib": peak.total_bytes / GIB, "usable_gib": usable,
            "reason": f"needs {peak.total_bytes / GIB:.1f} GiB of {room} on the {peak.stage} "
                      f"stage: {text}"}
