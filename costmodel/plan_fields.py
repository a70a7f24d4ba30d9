"""The fields of a plan, declared once: one row each, read by everything that spells a plan.

A row gives a field's name (:class:`costmodel.Plan`'s attribute, :class:`costmodel.plans.
PlanArrays`' column, the plan file's key and the trials.csv column), its type and default, its
key in a plan string (``"tp=8,mbs=1"``, :mod:`search.inputs.planspec`), its column in the
measured-runs CSV schema (:mod:`search.inputs.measured`), its name in the launcher view
(``tcf_search.export.view.LaunchView``) and what it means. From the rows come ``Plan``'s own
checks (:func:`check_fields`), the plans-as-columns encoding (:meth:`PlanField.code`,
:meth:`PlanField.value`), the rules' columns, the plan string's keys and parser, the plan file's
plan section, the CSV reader and the trials.csv columns; ``tests/test_plan_fields.py`` holds
every reader and writer to the table. Adding a field is a row here, its slot in ``Plan`` and
``PlanArrays`` (the test names a missing one), and its meaning in the formulas.
"""

from __future__ import annotations

import numbers
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, get_args

from costmodel.errors import SpecError, require_positive
from costmodel.recompute_modules import MODELLED

# A choice's values in code order: a column of PlanArrays holds the index.
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["1f1b", "interleaved", "gpipe"]
RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
# A plan's own MoE dispatch ("" and "": the training's dispatcher and all-to-all overlap)
MoeDispatcher = Literal["", "alltoall", "allgather", "flex"]
MoeOverlap = Literal["", "off", "on"]
MOE_DISPATCHERS: tuple[MoeDispatcher, ...] = get_args(MoeDispatcher)
MOE_OVERLAPS: tuple[MoeOverlap, ...] = get_args(MoeOverlap)
PP_SCHEDULES: tuple[PipelineSchedule, ...] = get_args(PipelineSchedule)

__all__ = ["FIELDS", "MOE_DISPATCHERS", "MOE_OVERLAPS", "PLAN_FIELDS", "PLAN_KEYS",
           "PP_SCHEDULES", "RECOMPUTE_MODES",
           "PipelineSchedule", "PlanField", "Recompute", "check_fields", "fields_doc"]


@dataclass(frozen=True, slots=True)
class PlanField:
    """One field of a plan. ``type`` says how every format spells it: ``int`` a number (a degree
    when ``minimum`` is 1, else a count from 0, or one of ``choices``), ``bool`` a flag, ``str``
    one of ``choices`` (a column holds its index), ``tuple`` a set of ``choices`` (a column holds
    a bitmask over them; 0, the empty set, stands for the training's)."""

    name: str
    type: type
    default: Any
    _: KW_ONLY
    doc: str
    key: str = ""  # in a plan string; "" = the name
    csv: str = ""  # the measured-runs CSV column; "" = the name
    export: str = ""  # LaunchView's attribute; "" = the name
    choices: tuple[Any, ...] = ()
    minimum: int = 0
    always_shown: bool = False  # written in a plan string even at its default

    def __post_init__(self) -> None:
        for attr in ("key", "csv", "export"):
            if not getattr(self, attr):
                object.__setattr__(self, attr, self.name)

    def code(self, value: Any) -> int:
        """The value as an int column holds it (:class:`costmodel.plans.PlanArrays`, the
        rules' columns): a choice's index, a set's bitmask over the choices, a flag's 0 or 1."""
        if self.type is str:
            return self.choices.index(value)
        if self.type is tuple:
            return sum(1 << self.choices.index(name) for name in set(value))
        return int(value)

    def value(self, code: Any) -> Any:
        """The value a column's code stands for (the inverse of :meth:`code`)."""
        if self.type is str:
            return self.choices[int(code)]
        if self.type is tuple:
            return tuple(name for i, name in enumerate(self.choices) if int(code) >> i & 1)
        return self.type(code)


# name, type, default; then the keys where they differ from the name, and the field's rule
PLAN_FIELDS: tuple[PlanField, ...] = (
    PlanField("tp", int, 1, minimum=1, always_shown=True,
              doc="Tensor-parallel degree."),
    PlanField("pp", int, 1, minimum=1, always_shown=True,
              doc="Pipeline-parallel degree (stages)."),
    PlanField("dp", int, 1, minimum=1, always_shown=True,
              doc="Data-parallel degree; tp*pp*cp*dp is the world size."),
    PlanField("cp", int, 1, minimum=1,
              doc="Context-parallel degree: each sequence split over cp ranks."),
    PlanField("ep", int, 1, minimum=1,
              doc="Expert-parallel degree, carved out of dp*cp for the expert layers (Megatron's "
                  "convention)."),
    PlanField("vpp", int, 1, minimum=1,
              doc="Model chunks per pipeline rank (virtual pipeline); > 1 runs interleaved."),
    PlanField("zero_stage", int, 0, key="zero", export="zero", choices=(0, 1, 2, 3),
              always_shown=True,
              doc="ZeRO stage over DP: 0 none, 1 optimizer states, 2 and gradients, 3 and "
                  "parameters."),
    PlanField("micro_batch", int, 1, key="mbs", minimum=1, always_shown=True,
              doc="Sequences per micro-batch per DP rank."),
    PlanField("recompute", str, "none", choices=RECOMPUTE_MODES, always_shown=True,
              doc="Activation recompute: none, selective or full."),
    PlanField("recompute_layers", int, 0, key="recompute_n",
              doc="With recompute full, the layers of each stage fully recomputed (0 = all of "
                  "them); the rest keep all activations."),
    PlanField("sequence_parallel", bool, False, key="sp", export="sp",
              doc="Megatron's sequence parallelism over the TP group."),
    PlanField("pp_schedule", str, "1f1b", key="schedule", export="schedule",
              choices=PP_SCHEDULES,
              doc="The pipeline schedule named; it runs interleaved iff vpp > 1 "
                  "(Plan.schedule)."),
    PlanField("first_stage_layers", int, 0, export="first",
              doc="Layers of the first pipeline stage (0 = an even split)."),
    PlanField("last_stage_layers", int, 0, export="last",
              doc="Layers of the last pipeline stage (0 = an even split)."),
    PlanField("expert_tp", int, 0, key="etp", export="etp",
              doc="The routed experts' tensor parallelism (Megatron-Core's "
                  "--expert-tensor-parallel-size; its MoE parallel folding carves EP x expert TP "
                  "out of a stage's tp x cp x dp ranks). 0 = derived: tp, or 1 where EP does not "
                  "divide dp x cp (costmodel.mapping.expert_tp)."),
    PlanField("recompute_modules", tuple, (), key="modules", choices=MODELLED,
              doc="Megatron-Core's selective modules for this plan (() = the training's; rule "
                  "recompute_modules)."),
    PlanField("cpu_offload_layers", int, 0, key="offload",
              doc="Layers whose activations go to host memory (Megatron-Core's "
                  "--cpu-offloading-num-layers; costmodel/offload.py)."),
    PlanField("moe_dispatcher", str, "", key="dispatch", choices=MOE_DISPATCHERS,
              doc="The MoE token dispatcher this plan runs (Megatron-Core's "
                  "--moe-token-dispatcher-type: alltoall, allgather, or flex for DeepEP / "
                  "HybridEP; \"\" = the training's; rule moe_dispatch)."),
    PlanField("moe_a2a_overlap", str, "", key="a2a", choices=MOE_OVERLAPS,
              doc="The EP all-to-all overlapped with another micro-batch's compute "
                  "(Megatron-Core's --overlap-moe-expert-parallel-comm): on or off; \"\" = the "
                  "training's (rules moe_dispatch, moe_a2a_overlap)."),
)
FIELDS: dict[str, PlanField] = {f.name: f for f in PLAN_FIELDS}
PLAN_KEYS: tuple[str, ...] = tuple(FIELDS)


# each field's own rule, by kind: a degree (a number >= 1), one of its choices, a count (>= 0)
_DEGREES = tuple(f.name for f in PLAN_FIELDS if f.minimum == 1)
_CHOSEN = tuple(f for f in PLAN_FIELDS if f.choices and f.type in (int, str))
_COUNTS = tuple(f.name for f in PLAN_FIELDS
                if f.type is int and f.minimum == 0 and not f.choices)


def check_fields(plan: Any) -> None:
    """Each field's own rule, as the table states it: the degrees first, then the choices,
    then the counts. Raises :class:`SpecError` naming the field."""
    require_positive("plan", **{name: getattr(plan, name) for name in _DEGREES})
    for f in _CHOSEN:
        if (value := getattr(plan, f.name)) in f.choices:
            continue
        if f.type is int:
            allowed = ", ".join(map(str, f.choices[:-1])) + f" or {f.choices[-1]}"
            raise SpecError(f"plan.{f.name} must be {allowed}, but got {value}")
        raise SpecError(f"plan.{f.name} must be one of {sorted(f.choices)}, but got {value!r}")
    for name in _COUNTS:
        value = getattr(plan, name)
        if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
                or not 0 <= int(value) < 2**53):
            raise SpecError(f"plan.{name} must be an integer in [0, 2**53), got {value!r}")


def fields_doc() -> str:
    """The rows as a docstring section, for ``help(Plan)``."""
    lines = ["Fields (costmodel.plan_fields; plan-string key in brackets):"]
    lines += [f"    {f.name} [{f.key}]: {f.doc}" for f in PLAN_FIELDS]
    return "\n".join(lines)


# a plan's choices as the search's integer columns encode them (PlanField.code)
RECOMPUTE_CODES: dict[str, int] = {name: i for i, name in enumerate(RECOMPUTE_MODES)}
SCHEDULE_CODES: dict[str, int] = {name: i for i, name in enumerate(PP_SCHEDULES)}
SCHEDULE_NAMES: dict[int, PipelineSchedule] = dict(enumerate(PP_SCHEDULES))
