"""What a study run found, as one document: ``result.json`` and ``tcf-search run --json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from costmodel import Plan
from search.inputs.planfile import plan_dict


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedPlan:
    rank: int
    plan: Plan
    predicted: dict[str, Any]  # metrics in report units (GiB, s, tokens/s/GPU)
    values: tuple[float, ...]  # objective values
    source: str  # "trial 17" or "exhaustive"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "plan": plan_dict(self.plan),
                "predicted": dict(self.predicted), "objective_values": list(self.values),
                "source": self.source}


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyResult:
    study: str
    model: str
    gpu: str
    num_gpus: int
    gpus_per_node: int
    objective: dict[str, Any]
    space_size: int
    valid_count: int
    feasible_count: int
    pruned_by: dict[str, int]
    rules: dict[str, str]
    near_misses: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    top: list[RankedPlan]
    trials: int
    search: dict[str, Any]
    placement: dict[str, Any]
    elapsed_s: float
    output_dir: str
    optimum: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # what the cluster's numbers rest on (search.uncertainty.calibration_status)
    calibration: dict[str, Any] = field(default_factory=dict)
    # the user's recipe beside the best (search.baseline.baseline_doc), when one is given
    baseline: dict[str, Any] | None = None
    # how surely #1 beats the others (search.uncertainty.ranking_resolution); {} without data
    ranking: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> RankedPlan | None:
        return self.top[0] if self.top else None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "study": self.study, "model": self.model,
            "cluster": {"gpu": self.gpu, "num_gpus": self.num_gpus,
                        "gpus_per_node": self.gpus_per_node},
            "objective": self.objective,
            "best": self.best.to_dict() if self.best else None,
            "top": [p.to_dict() for p in self.top],
            "feasible_count": self.feasible_count,
            "valid_count": self.valid_count,
            "space_size": self.space_size,
            "pruned_by": dict(self.pruned_by),
            "rules": dict(self.rules),
            "near_misses": list(self.near_misses),
            "trials": self.trials,
            "search": dict(self.search),
            "placement": dict(self.placement),
            "cells": list(self.cells),
            "elapsed_s": round(self.elapsed_s, 3),
            "output_dir": self.output_dir,
            "notes": list(self.notes),
            "calibration": dict(self.calibration),
        }
        if self.optimum is not None:
            doc["optimum"] = self.optimum
        if self.baseline is not None:
            doc["baseline"] = self.baseline
        if self.ranking:
            doc["ranking"] = self.ranking
        return doc
