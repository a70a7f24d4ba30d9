"""A launcher rule as data (predicate, one-line reason, where the launcher checks it), and the
check that refuses an export naming every broken one (``rules`` holds the tables)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel import rules as costmodel_rules

from .options import ExportRefused
from .view import LaunchView


@dataclass(frozen=True, slots=True)
class Rule:
    holds: Callable[[LaunchView], bool]
    reason: str
    source: str

    def describe(self, f: LaunchView) -> str:
        return self.reason.format(**f.values())


@dataclass(frozen=True, slots=True)
class Shared:
    """A rule of the cost model's validity table (``costmodel.rules``), read on the plan."""

    rule: costmodel_rules.Rule
    source: str = "costmodel/rules.py (the validity table the search and predict read)"

    def holds(self, f: LaunchView) -> bool:
        return bool(np.asarray(self.rule.holds(f.plan_columns, f.rule_facts)).reshape(-1)[0])

    def describe(self, f: LaunchView) -> str:
        return self.rule.message(f.plan_columns, f.rule_facts)


AnyRule = Rule | Shared


def broken(rules: Sequence[AnyRule], f: LaunchView) -> list[str]:
    return [r.describe(f) for r in rules if not r.holds(f)]


def check(fmt: str, rules: Sequence[AnyRule], f: LaunchView) -> None:
    reasons = broken(rules, f)
    if reasons:
        raise ExportRefused(fmt, reasons)
