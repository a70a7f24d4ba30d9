"""Checks the profile's groups share: a switch among its choices, a set within what exists."""

from __future__ import annotations

from costmodel.errors import SpecError
from costmodel.plan_fields import PLAN_FIELDS, PP_SCHEDULES, RECOMPUTE_MODES

# what the framework may run is a subset of what a plan may ask (costmodel/plan_fields.py)
ZERO_STAGES = next(f.choices for f in PLAN_FIELDS if f.name == "zero_stage")

__all__ = ["PP_SCHEDULES", "RECOMPUTE_MODES", "ZERO_STAGES", "as_subset", "check_choices"]


def check_choices(**values_and_choices: tuple[object, tuple[object, ...]]) -> None:
    for name, (value, choices) in values_and_choices.items():
        if value not in choices:
            raise SpecError(f"training.{name} must be one of {sorted(map(str, choices))}, "
                            f"but got {value!r}")


def as_subset(owner: object, name: str, known: tuple[object, ...]) -> None:
    """``owner.name`` as a tuple (a YAML list arrives as a list), a non-empty subset of
    ``known``."""
    value = tuple(getattr(owner, name))
    object.__setattr__(owner, name, value)
    if not value or not set(value) <= set(known):
        raise SpecError(f"training.{name} must be a non-empty subset of {list(known)}, "
                        f"but got {list(value)!r}")
