"""Plans as columns: the cost model evaluates many plans at once with numpy broadcasting.

Every formula in this package takes a :class:`PlanArrays` whose fields are equal-length arrays,
so the scalar :func:`costmodel.estimate` and the vectorised :func:`costmodel.estimate_batch` run
the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from costmodel.recompute_modules import module_mask
from costmodel.specs import RECOMPUTE_CODES, SCHEDULE_CODES, Plan

PLAN_KEYS: tuple[str, ...] = (
    "tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
    "recompute_layers", "sequence_parallel", "pp_schedule", "first_stage_layers",
    "last_stage_layers", "expert_tp", "recompute_modules", "cpu_offload_layers",
)
_DEFAULTS: dict[str, int] = {"cp": 1, "ep": 1, "vpp": 1, "zero_stage": 0, "recompute": 0,
                             "recompute_layers": 0, "sequence_parallel": 0, "pp_schedule": 0,
                             "first_stage_layers": 0, "last_stage_layers": 0, "expert_tp": 0,
                             "recompute_modules": 0, "cpu_offload_layers": 0}


@dataclass(frozen=True, slots=True)
class PlanArrays:
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    vpp: np.ndarray
    zero_stage: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray  # 0 none, 1 selective, 2 full
    recompute_layers: np.ndarray
    sequence_parallel: np.ndarray  # 0/1
    pp_schedule: np.ndarray  # 0 1f1b, 1 interleaved, 2 gpipe
    first_stage_layers: np.ndarray
    last_stage_layers: np.ndarray
    expert_tp: np.ndarray  # 0: derived (costmodel.mapping.expert_tp)
    # selective modules, a bitmask over costmodel.recompute_modules.MODELLED; 0: the training's
    recompute_modules: np.ndarray
    cpu_offload_layers: np.ndarray  # layers whose activations go to host memory (pp 1 only)

    def __len__(self) -> int:
        return int(self.tp.shape[0])


def as_plan_arrays(columns: Mapping[str, object]) -> PlanArrays:
    """Columns (any array-likes, missing optional keys default) to :class:`PlanArrays`."""
    missing = [k for k in ("tp", "pp", "dp", "micro_batch") if k not in columns]
    if missing:
        raise KeyError(f"plan columns missing: {', '.join(missing)}")
    n = int(np.asarray(columns["tp"]).reshape(-1).shape[0])
    out: dict[str, np.ndarray] = {}
    for f in fields(PlanArrays):
        raw = columns.get(f.name, _DEFAULTS.get(f.name, 0))
        arr = np.asarray(raw).astype(np.int64).reshape(-1)
        out[f.name] = np.broadcast_to(arr, (n,)) if arr.shape[0] == 1 else arr
    return PlanArrays(**out)


def plans_to_arrays(plans: Sequence[Plan]) -> dict[str, np.ndarray]:
    """Plans to the column dict that :func:`costmodel.estimate_batch` takes."""
    cols: dict[str, list[int]] = {k: [] for k in PLAN_KEYS}
    for p in plans:
        for k in PLAN_KEYS:
            v = getattr(p, k)
            if k == "recompute":
                v = RECOMPUTE_CODES[v]
            elif k == "pp_schedule":
                v = SCHEDULE_CODES[p.schedule]  # interleaved iff vpp > 1
            elif k == "recompute_modules":
                v = module_mask(v)
            cols[k].append(int(v))
    return {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
