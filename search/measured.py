"""Rows in the schema of ``measured_runs.csv`` (see ../shared/data/README.md) as cost-model
inputs. Only configuration columns are read; an empty knob cell means *not given*."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from costmodel.errors import TcfError
from costmodel.specs import ClusterSpec, ModelSpec, Plan, Training
from hardware_catalog import CatalogError, get_gpu
from hardware_catalog.frameworks import resolve_framework, row_defaults
from search.specs import cluster_spec, training_spec

__all__ = ["Case", "CaseError", "case_from_row"]

KNOBS: tuple[str, ...] = ("micro_batch", "recompute", "zero_stage", "vpp", "sequence_parallel")
# The schema gives the interconnect only inside `notes` ("gpu as published: A100 80GB (1600Gbps
# RoCE)"); words there that name a fabric of hardware_catalog/fabrics.yaml. Selene is NVIDIA's
# DGX SuperPOD on HDR InfiniBand (Narayanan et al., SC21, sec. 5.1). A `fabric` column wins.
FABRIC_WORDS: tuple[tuple[str, str], ...] = (("roce", "roce"), ("infiniband", "infiniband"),
                                             ("selene", "infiniband"))



class CaseError(TcfError):
    """A row cannot be turned into a plan; the message names the column."""


@dataclass(frozen=True, slots=True)
class Case:
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan  # knobs not given hold their defaults
    training: Training
    given: frozenset[str]  # knob columns that were given
    framework: str = ""


def _cell(row: Mapping[str, object], key: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).strip()


def _int(row: Mapping[str, object], key: str, default: int | None = None) -> int:
    s = _cell(row, key)
    if not s:
        if default is None:
            raise CaseError(f"{key}: required, but the cell is empty")
        return default
    try:
        f = float(s)
    except ValueError:
        raise CaseError(f"{key}: must be a whole number, but got {s!r}") from None
    if not f.is_integer():
        raise CaseError(f"{key}: must be a whole number, but got {s!r}")
    return int(f)


def _bool(row: Mapping[str, object], key: str, default: bool = False) -> bool:
    s = _cell(row, key).lower()
    if not s:
        return default
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise CaseError(f"{key}: must be true or false, but got {s!r}")


def row_fabric(row: Mapping[str, object]) -> str:
    """The row's fabric id: its `fabric` cell, else one named in the published hardware string
    of `notes`, else "" (unknown: the GPU family's calibrated network efficiency applies)."""
    given = _cell(row, "fabric").lower()
    if given:
        return given
    notes = _cell(row, "notes").lower()
    hardware = notes.partition("gpu as published:")[2].partition(";")[0]
    return next((fid for word, fid in FABRIC_WORDS if word in hardware), "")


def case_from_row(row: Mapping[str, object]) -> Case:
    model = ModelSpec(
        name=_cell(row, "model_name") or "model",
        layers=_int(row, "layers"), hidden=_int(row, "hidden"),
        ffn_hidden=_int(row, "ffn_hidden"), heads=_int(row, "heads"),
        kv_heads=_int(row, "kv_heads", _int(row, "heads")), vocab=_int(row, "vocab"),
        ffn_type=(_cell(row, "ffn_type") or "swiglu"),  # type: ignore[arg-type]
        tied_embeddings=_bool(row, "tied_embeddings"),
        moe_experts=_int(row, "moe_experts", 0), moe_topk=_int(row, "moe_topk", 0),
        moe_ffn_hidden=_int(row, "moe_ffn_hidden", 0),
        moe_shared_experts=_int(row, "moe_shared_experts", 0),
    )
    gpu = get_gpu(_cell(row, "gpu"))
    try:
        cluster = cluster_spec(gpu, _int(row, "num_gpus"), _int(row, "gpus_per_node", 8),
                               row_fabric(row))
    except CatalogError as e:
        raise CaseError(f"fabric: {e}") from None
    framework = resolve_framework(_cell(row, "framework"), _cell(row, "source"))
    defaults = row_defaults(framework)  # what the framework's recipes run where a cell is empty
    zero_default = int(defaults.pop("zero_stage", 0))  # type: ignore[call-overload]
    training = training_spec(framework=framework, precision=_cell(row, "precision") or "bf16",
                             seq_len=_int(row, "seq_len"), global_batch=_int(row, "global_batch"),
                             compile=_bool(row, "compile"), switches=defaults)
    given = frozenset(k for k in KNOBS if _cell(row, k))
    tp = _int(row, "tp", 1)
    recompute = _cell(row, "recompute") or "none"
    sp_default = tp > 1
    plan = Plan(
        tp=tp, pp=_int(row, "pp", 1), dp=_int(row, "dp", 1), cp=_int(row, "cp", 1),
        ep=_int(row, "ep", 1), vpp=_int(row, "vpp", 1),
        zero_stage=_int(row, "zero_stage", zero_default),
        micro_batch=_int(row, "micro_batch", 1),
        recompute=recompute,  # type: ignore[arg-type]
        sequence_parallel=_bool(row, "sequence_parallel", sp_default) and tp > 1,
    )
    return Case(model=model, cluster=cluster, plan=plan, training=training, given=given,
                framework=framework)


def with_training(case: Case, **changes: object) -> Case:
    return replace(case, training=replace(case.training, **changes))  # type: ignore[arg-type]
