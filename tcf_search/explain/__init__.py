"""``tcf-search explain`` and the plan vocabulary ``compare`` and ``report`` share."""

from tcf_search.explain.analysis import explain
from tcf_search.explain.cli import explain_cmd
from tcf_search.explain.planspec import (
    PlanSpecError,
    apply_change,
    format_plan,
    parse_assignments,
    parse_plan,
)
from tcf_search.explain.source import SourceError, Subject, resolve

__all__ = ["PlanSpecError", "SourceError", "Subject", "apply_change", "explain", "explain_cmd",
           "format_plan", "parse_assignments", "parse_plan", "resolve"]
