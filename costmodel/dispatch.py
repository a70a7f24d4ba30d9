"""A plan's MoE dispatch, per row: the dispatcher and the EP all-to-all overlap the plan names
(plan fields ``moe_dispatcher``, ``moe_a2a_overlap``), or the training's where it names none
(its framework profile's, or the study's ``training:`` switches)."""

from __future__ import annotations

import numpy as np

from costmodel.plan_fields import MOE_DISPATCHERS
from costmodel.plans import PlanArrays
from costmodel.specs import Training

CODES = {name: i for i, name in enumerate(MOE_DISPATCHERS)}  # "" (the training's) is 0
ALLTOALL, ALLGATHER, FLEX = CODES["alltoall"], CODES["allgather"], CODES["flex"]
OVERLAP_ON = 2  # MOE_OVERLAPS: "", "off", "on"


def dispatcher(tr: Training, p: PlanArrays) -> np.ndarray:
    """Each plan's dispatcher code (ALLTOALL, ALLGATHER or FLEX)."""
    own = CODES[tr.framework.moe.moe_dispatcher]
    return np.where(p.moe_dispatcher == 0, own, p.moe_dispatcher)


def a2a_overlap(tr: Training, p: PlanArrays) -> np.ndarray:
    """Whether each plan overlaps its EP all-to-all with another micro-batch's compute."""
    return np.where(p.moe_a2a_overlap == 0, tr.framework.moe.moe_a2a_overlap,
                    p.moe_a2a_overlap == OVERLAP_ON)
