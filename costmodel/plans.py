"""Plans as columns: the cost model evaluates many plans at once with numpy broadcasting.

Every formula in this package takes a :class:`PlanArrays` whose fields are equal-length arrays,
so the scalar :func:`costmodel.estimate` and the vectorised :func:`costmodel.estimate_batch` run
the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.plan_fields import PLAN_FIELDS, PLAN_KEYS
from costmodel.specs import Plan

__all__ = ["PLAN_KEYS", "PlanArrays", "as_plan_arrays", "plans_to_arrays"]

# the columns a caller must give; the rest default to their row's default (costmodel.plan_fields)
REQUIRED: tuple[str, ...] = ("tp", "pp", "dp", "micro_batch")


@dataclass(frozen=True, slots=True)
class PlanArrays:
    """One column per row of :data:`costmodel.plan_fields.PLAN_FIELDS`, in its order, each
    holding the field's code (:meth:`~costmodel.plan_fields.PlanField.code`)."""

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
    moe_dispatcher: np.ndarray  # 0 the training's, 1 alltoall, 2 allgather, 3 flex
    moe_a2a_overlap: np.ndarray  # 0 the training's, 1 off, 2 on

    def __len__(self) -> int:
        return int(self.tp.shape[0])


def as_plan_arrays(columns: Mapping[str, object]) -> PlanArrays:
    """Columns (any array-likes, missing optional keys default) to :class:`PlanArrays`."""
    missing = [k for k in REQUIRED if k not in columns]
    if missing:
        raise KeyError(f"plan columns missing: {', '.join(missing)}")
    n = int(np.asarray(columns["tp"]).reshape(-1).shape[0])
    out: dict[str, np.ndarray] = {}
    for f in PLAN_FIELDS:
        raw = columns.get(f.name, f.code(f.default))
        arr = np.asarray(raw).astype(np.int64).reshape(-1)
        out[f.name] = np.broadcast_to(arr, (n,)) if arr.shape[0] == 1 else arr
    return PlanArrays(**out)


def plans_to_arrays(plans: Sequence[Plan]) -> dict[str, np.ndarray]:
    """Plans to the column dict that :func:`costmodel.estimate_batch` takes."""
    cols: dict[str, np.ndarray] = {}
    for f in PLAN_FIELDS:
        # the schedule as it runs: interleaved iff vpp > 1 (Plan.schedule)
        attr = "schedule" if f.name == "pp_schedule" else f.name
        cols[f.name] = np.asarray([f.code(getattr(p, attr)) for p in plans], dtype=np.int64)
    return cols
