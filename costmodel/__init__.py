"""A pure analytical model of one distributed-training step, judged on the three challenges.

Nothing here reads files, logs, or imports optuna, ortools, typer, yaml or pandas.
"""

from costmodel.errors import TcfError
from costmodel.estimate import (
    check_plan,
    estimate,
    estimate_batch,
    peak_memory_batch,
    plan_placement,
)
from costmodel.placement import mask_groups
from costmodel.plan_fields import PLAN_FIELDS, PlanField
from costmodel.plans import PLAN_KEYS, plans_to_arrays
from costmodel.result import (
    Collective,
    ComputeEstimate,
    MemoryEstimate,
    StageMemory,
    StepEstimate,
)
from costmodel.specs import (
    ClusterSpec,
    Efficiency,
    GpuSpec,
    MeasuredLinks,
    MemoryModel,
    ModelSpec,
    Plan,
    SpecError,
    Training,
)
from costmodel.terms import MemoryTerms, memory_terms, memory_terms_batch

__all__ = [
    "PLAN_FIELDS", "PLAN_KEYS", "ClusterSpec", "Collective", "ComputeEstimate", "Efficiency",
    "GpuSpec", "MeasuredLinks", "MemoryEstimate", "MemoryModel", "MemoryTerms", "ModelSpec",
    "Plan", "PlanField",
    "SpecError", "StageMemory", "StepEstimate", "TcfError", "Training", "check_plan", "estimate",
    "estimate_batch", "mask_groups", "memory_terms", "memory_terms_batch", "peak_memory_batch",
    "plan_placement", "plans_to_arrays",
]
