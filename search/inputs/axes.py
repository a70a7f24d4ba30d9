"""The search space's knobs as a study file writes them: ``auto``, one value or a list, each
normalised to ``auto`` or a sorted tuple so that one error line names the knob
(``search.inputs.sections.SearchSpaceSection``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from costmodel.recompute_modules import MODELLED, module_set

Auto = Literal["auto"]
# Beyond this the enumeration (divisors of the world size) would not finish: more GPUs than any
# cluster holds.
MAX_GPUS = 2**20
# Values one knob may list: the space is their product, and a heat-map cell is kept per (tp, pp)
# pair, so the work and the result file stay proportional to a request a person can read.
MAX_AXIS_VALUES = 64


def _domain(allowed: tuple[Any, ...] | None, kind: type) -> Callable[[Any], Any]:
    """A knob is ``auto``, one value or a non-empty list of values; normalised to ``auto`` or a
    sorted tuple so that one error line names the knob (pydantic would report each union arm)."""

    def check(raw: Any) -> Any:
        if raw == "auto":
            return raw
        values = raw if isinstance(raw, list) else [raw]
        if not values:
            raise ValueError("must be auto, a value or a non-empty list (got [])")
        if len(values) > MAX_AXIS_VALUES:
            raise ValueError(f"at most {MAX_AXIS_VALUES} values may be listed (got "
                             f"{len(values)}); list the ones worth searching, or use auto")
        for v in values:
            ok = type(v) is kind and (allowed is None or v in allowed)
            if kind is int and ok and allowed is None:
                ok = v > 0
            if not ok:
                rule = (f"one of {list(allowed)}" if allowed is not None
                        else "a positive integer" if kind is int else kind.__name__)
                raise ValueError(f"values must be {rule}, or auto (got {v!r})")
            if kind is int and allowed is None and v > MAX_GPUS:
                raise ValueError(f"values must be at most {MAX_GPUS} (got {v})")
        return tuple(sorted(set(values), key=lambda v: (allowed.index(v) if allowed else v)))

    return check


IntAxis = Annotated[Auto | tuple[int, ...], BeforeValidator(_domain(None, int))]
ZeroAxis = Annotated[Auto | tuple[int, ...], BeforeValidator(_domain((0, 1, 2, 3), int))]
RecomputeAxis = Annotated[Auto | tuple[str, ...],
                          BeforeValidator(_domain(("none", "selective", "full"), str))]
BoolAxis = Annotated[Auto | tuple[bool, ...], BeforeValidator(_domain((False, True), bool))]
ScheduleAxis = Annotated[Auto | tuple[str, ...], BeforeValidator(_domain(("1f1b", "gpipe"), str))]
DispatcherAxis = Annotated[Auto | tuple[str, ...],
                           BeforeValidator(_domain(("alltoall", "allgather", "flex"), str))]


def _module_sets(raw: Any) -> Any:
    """Megatron-Core's selective module sets to search: null (the training's set, no axis),
    ``auto`` or a non-empty list of sets, each a list of module names (normalised to
    ``costmodel.recompute_modules.MODELLED`` order, each set once)."""
    if raw is None or raw == "auto":
        return raw
    if not isinstance(raw, list) or not raw or not all(isinstance(m, list) for m in raw):
        raise ValueError(f"must be auto or a non-empty list of lists of module names such as "
                         f"[[core_attn], [core_attn, mlp]] (got {str(raw)[:60]!r})")
    sets = [tuple(m for m in MODELLED if m in module_set(names, "a set")) for names in raw]
    return tuple(dict.fromkeys(sets))


ModulesAxis = Annotated[Auto | tuple[tuple[str, ...], ...] | None, BeforeValidator(_module_sets)]
