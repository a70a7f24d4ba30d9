"""Measured runs as batches: rows grouped by everything but the plan, so the cost model can
evaluate each group's plans in one vectorised call."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.estimate import check_plan, estimate_batch
from costmodel.plans import plans_to_arrays
from costmodel.specs import ClusterSpec, Efficiency, ModelSpec, Training
from search.inputs import CaseError, case_from_row, presumed_split

DEFAULT_CSV = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "measured_runs.csv"


def find_measured_csv() -> Path | None:
    p = DEFAULT_CSV.resolve()
    return p if p.exists() else None


def holdout(key: str, fraction: float = 0.3) -> bool:
    """Deterministic split by a stable hash of the sweep group: held out from every fit."""
    return (zlib.crc32(key.encode()) % 1000) < fraction * 1000



def group_of(frame: pd.DataFrame) -> pd.Series:
    """Each row's sweep group, (model, GPU count): the unit the hold-out split draws."""
    return frame["model_name"].astype(str) + "|" + frame["num_gpus"].astype(str)


def weigh_alike(labels: np.ndarray) -> np.ndarray:
    """1/N for each of a label's N rows, so that every label (group, source) weighs 1."""
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]

@dataclass
class Group:
    model: ModelSpec
    cluster: ClusterSpec
    training: Training
    index: np.ndarray  # row positions in the frame
    plans: dict[str, np.ndarray]
    framework: str = ""


def load_groups(frame: pd.DataFrame) -> tuple[list[Group], pd.Series]:
    """Group rows that share model, cluster and training; rows that cannot be modelled get an
    error message in the returned series (indexed like ``frame``). A split a row leaves unsaid
    is the one :func:`search.inputs.measured.presumed_split` presumes."""
    errors = pd.Series("", index=frame.index, dtype=object)
    buckets: dict[tuple, tuple[ModelSpec, ClusterSpec, Training, list[int], list, str]] = {}
    for pos, row in enumerate(frame.to_dict("records")):
        try:
            case = case_from_row(presumed_split({str(k): v for k, v in row.items()}))
            check_plan(case.model, case.cluster, case.plan, case.training)
        except (CaseError, ValueError) as e:
            errors.iloc[pos] = str(e)
            continue
        key = (case.model, case.cluster.gpu.id, case.cluster.num_gpus,
               case.cluster.gpus_per_node, case.cluster.fabric,
               case.cluster.network_bw_fraction, case.training)
        if key not in buckets:
            buckets[key] = (case.model, case.cluster, case.training, [], [], case.framework)
        buckets[key][3].append(pos)
        buckets[key][4].append(case.plan)
    groups = [Group(model=m, cluster=c, training=t, index=np.asarray(ix),
                    plans=plans_to_arrays(plans), framework=fw)
              for m, c, t, ix, plans, fw in buckets.values()]
    return groups, errors


def predict_groups(groups: list[Group], n_rows: int,
                   efficiency: dict[str, Efficiency] | None = None,
                   memory: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Evaluate every group; ``efficiency`` (by family) and ``memory`` (MemoryModel fields, on
    top of each group's own) override the calibrated values, for fitting."""
    out: dict[str, np.ndarray] = {}
    for g in groups:
        cluster, training = g.cluster, g.training
        if efficiency and cluster.gpu.family in efficiency:
            cluster = replace(cluster, gpu=replace(cluster.gpu,
                                                   efficiency=efficiency[cluster.gpu.family]))
        if memory:
            mm = replace(training.framework.memory_model, **memory)  # type: ignore[arg-type]
            training = training.with_switches(memory_model=mm)
        res = estimate_batch(g.model, cluster, training, g.plans)
        for k, v in res.items():
            if k not in out:
                out[k] = np.full(n_rows, np.nan)
            out[k][g.index] = v
    return out


def with_training(groups: list[Group], framework: str, **changes: object) -> list[Group]:
    """The groups of one framework with profile switches changed (for fitting its profile);
    ``memory_model`` may be a dict of MemoryModel fields to change."""
    def changed(t: Training) -> Training:
        ch = dict(changes)
        if isinstance(ch.get("memory_model"), dict):
            ch["memory_model"] = replace(t.framework.memory_model,
                                         **ch["memory_model"])  # type: ignore[arg-type]
        return t.with_switches(**ch)

    return [replace(g, training=changed(g.training)) if g.framework == framework else g
            for g in groups]


def split_mask(frame: pd.DataFrame) -> pd.Series:
    """True for rows held out of every fit (30% of sweep groups, by a stable hash)."""
    return group_of(frame).map(holdout).astype(bool)
