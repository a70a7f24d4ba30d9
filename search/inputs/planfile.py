"""The plan file: one plan with everything needed to run it, as YAML.

A study writes its best plan as ``best_plan.yaml`` and its top plans as ``top/rank-<N>.yaml`` in the
output folder; ``export`` and ``validate`` read them. Keys are the dataclass fields of
``costmodel.specs`` so the file round-trips exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from costmodel.errors import TcfError
from costmodel.framework import GROUPS, SWITCH_GROUP, FrameworkProfile
from costmodel.layer_style import MoeRouter, RopeScaling
from costmodel.mla import MlaSpec
from costmodel.plan_fields import PLAN_FIELDS
from costmodel.specs import WORKLOAD_FIELDS, MemoryModel, ModelSpec, Plan, Training
from hardware_catalog.frameworks import framework_profile
from search.inputs.files import MIB, InputError, read_input
from search.inputs.yamlinput import YamlInputError, load_yaml, shown

FORMAT_VERSION = 1


class PlanFileError(TcfError):
    """A plan file is malformed; the message names the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFile:
    study: str
    model: ModelSpec
    gpu: str  # hardware catalog id
    num_gpus: int
    gpus_per_node: int
    training: Training
    fabric: str = ""  # hardware_catalog/fabrics.yaml id; "" = not given
    # the study's own fabric topology (None: the fabric's)
    rail_group_nodes: int | None = None
    oversubscription: float | None = None
    plan: Plan
    rank: int = 1
    predicted: dict[str, Any] = field(default_factory=dict)
    framework: str = ""  # the study's training.framework; "" in files written before it
    calibration: str = ""  # the cluster calibration file its study was anchored on ("": none)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "study": self.study,
            "rank": self.rank,
            "cluster": {"gpu": self.gpu, "num_gpus": self.num_gpus,
                        "gpus_per_node": self.gpus_per_node,
                        **({"fabric": self.fabric} if self.fabric else {}),
                        **({"rail_group_nodes": self.rail_group_nodes}
                           if self.rail_group_nodes is not None else {}),
                        **({"oversubscription": self.oversubscription}
                           if self.oversubscription is not None else {}),
                        **({"calibration": self.calibration} if self.calibration else {})},
            "model": dataclasses.asdict(self.model),
            **({"framework": self.framework} if self.framework else {}),
            "training": self.training.to_dict(),
            "plan": plan_dict(self.plan),
            "predicted": dict(self.predicted),
        }


def plan_dict(plan: Plan) -> dict[str, Any]:
    """A plan's fields (``costmodel.plan_fields``), a set of names as a list; a field whose
    empty value stands for the training's (the selective modules, the MoE dispatch) only where
    the plan names its own, so a file without them reads as before."""
    out: dict[str, Any] = {}
    for f in PLAN_FIELDS:
        value = getattr(plan, f.name)
        if f.type is tuple:
            if value:
                out[f.name] = list(value)
        elif value != "" or "" not in f.choices:
            out[f.name] = value
    return out


def dump_plan_file(pf: PlanFile) -> str:
    return yaml.safe_dump(pf.to_dict(), sort_keys=False)


def _build(cls: type, section: str, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise PlanFileError(f"{section}: must be a mapping, but got {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        valid = ", ".join(sorted(names))
        raise PlanFileError(f"{section}.{unknown[0]}: unknown key (valid: {valid})")
    for f in dataclasses.fields(cls):
        if f.name in raw:
            _check_type(f"{section}.{f.name}", str(f.type), raw[f.name])
    try:
        return cls(**raw)
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, TcfError):
            raise PlanFileError(f"{section}: {e}") from None
        raise PlanFileError(f"{section}: {str(e)[:160]}") from None


_SIMPLE = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(where: str, annotation: str, value: Any) -> None:
    """A plain field (int, float, bool, str; or None where the type allows it) holds a value of
    its type: a list or text where a number belongs would fail deep inside the cost model."""
    parts = [p.strip() for p in annotation.split("|")]
    if value is None and "None" in parts:
        return
    kinds = [k for k in parts if k != "None"]
    if len(kinds) != 1 or kinds[0] not in _SIMPLE:
        return  # a Literal, a nested dataclass: checked by the dataclass itself
    kind = kinds[0]
    ok = isinstance(value, _SIMPLE[kind]) and (kind == "bool" or not isinstance(value, bool))
    if ok and kind in ("int", "float"):
        ok = math.isfinite(value) and abs(value) < 2**53
    if not ok:
        rule = {"int": "an integer below 2**53", "float": "a finite number below 2**53",
                "bool": "true or false", "str": "text"}[kind]
        raise PlanFileError(f"{where}: must be {rule} (got {shown(value, 40)})")


def _build_model(raw: Any) -> ModelSpec:
    """The model, with its nested latent attention and RoPE scaling rebuilt as dataclasses."""
    nested = {"mla": MlaSpec, "rope_scaling": RopeScaling, "moe_router": MoeRouter}
    if isinstance(raw, dict):
        for k in nested:
            if raw.get(k) is not None and not isinstance(raw[k], dict):
                raise PlanFileError(f"model.{k}: must be a mapping of its fields or null (got "
                                    f"{shown(raw[k], 40)})")
        raw = {**raw, **{k: _build(cls, f"model.{k}", raw[k]) for k, cls in nested.items()
                         if isinstance(raw.get(k), dict)}}
    return _build(ModelSpec, "model", raw)  # type: ignore[no-any-return]


# the annotation of every key of a plan file's training section but the memory model
_TRAINING_TYPES: dict[str, str] = {
    **{f.name: str(f.type) for f in dataclasses.fields(Training) if f.name in WORKLOAD_FIELDS},
    **{f.name: str(f.type) for kind in GROUPS.values() for f in dataclasses.fields(kind)},
    **{f.name: str(f.type) for f in dataclasses.fields(FrameworkProfile)
       if f.name in SWITCH_GROUP}}


def _build_training(raw: Any, framework: str) -> Training:
    """The workload and the framework's switches as the file gives them; a switch it leaves out
    (a file written before the switch existed) is the profile's, as a study builds it
    (``hardware_catalog.frameworks.framework_profile``: the file's framework at its
    precision)."""
    if not isinstance(raw, dict):
        raise PlanFileError(f"training: must be a mapping, but got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_TRAINING_TYPES) - {"memory_model"})
    if unknown:
        valid = ", ".join(sorted({*_TRAINING_TYPES, "memory_model"}))
        raise PlanFileError(f"training.{unknown[0]}: unknown key (valid: {valid})")
    for key, value in raw.items():
        if key != "memory_model":
            _check_type(f"training.{key}", _TRAINING_TYPES[key], value)
    switches = {k: v for k, v in raw.items() if k not in WORKLOAD_FIELDS}
    if isinstance(raw.get("memory_model"), dict):
        switches["memory_model"] = _build(MemoryModel, "training.memory_model",
                                          raw["memory_model"])
    workload = {k: raw[k] for k in WORKLOAD_FIELDS if k in raw}
    try:
        profile = framework_profile(framework, str(workload.get("precision", "bf16")), switches)
        return Training(**workload, framework=profile)
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, TcfError):
            raise PlanFileError(f"training: {e}") from None
        raise PlanFileError(f"training: {str(e)[:160]}") from None


def _number(raw: dict[str, Any], key: str, where: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e30:
        raise PlanFileError(f"{where}{key}: must be a positive number (got {shown(value, 40)})")
    return float(value)


def _integer(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**53:
        raise PlanFileError(f"{where}{key}: must be a positive integer below 2**53 (got "
                            f"{shown(value, 40)})")
    return value


def parse_plan_file(text: str) -> PlanFile:
    try:
        raw = load_yaml(text, "plan file")
    except YamlInputError as e:
        raise PlanFileError(str(e)) from None
    if not isinstance(raw, dict):
        raise PlanFileError("plan file: must be a YAML mapping")
    for key in ("study", "cluster", "model", "training", "plan"):
        if key not in raw:
            raise PlanFileError(f"{key}: required key is missing")
    cluster = raw["cluster"]
    if not isinstance(cluster, dict) or not {"gpu", "num_gpus"} <= set(cluster):
        raise PlanFileError("cluster: must be a mapping with gpu and num_gpus")
    return PlanFile(
        study=str(raw["study"]),
        rank=_integer(raw, "rank", "", 1),
        gpu=str(cluster["gpu"]),
        num_gpus=_integer(cluster, "num_gpus", "cluster."),
        gpus_per_node=_integer(cluster, "gpus_per_node", "cluster.", 8),
        fabric=str(cluster.get("fabric") or ""),
        rail_group_nodes=(_integer(cluster, "rail_group_nodes", "cluster.")
                          if "rail_group_nodes" in cluster else None),
        oversubscription=(_number(cluster, "oversubscription", "cluster.")
                          if "oversubscription" in cluster else None),
        calibration=str(cluster.get("calibration") or ""),
        model=_build_model(raw["model"]),
        training=_build_training(raw["training"], str(raw.get("framework") or "")),
        plan=_build(Plan, "plan", raw["plan"]),
        predicted=dict(raw.get("predicted") or {}),
        framework=str(raw.get("framework") or ""),
    )


MAX_PLAN_FILE_BYTES = 4 * MIB


def load_plan_file(path: str | Path) -> PlanFile:
    """A plan file: a regular file of at most 4 MiB, UTF-8 YAML. A relative
    ``cluster.calibration`` is the file's own folder's (as a run writes it), read as absolute."""
    try:
        data = read_input(Path(path), "plan file", MAX_PLAN_FILE_BYTES)
        pf = parse_plan_file(data.decode("utf-8"))
    except InputError as e:
        raise PlanFileError(str(e)) from None
    except UnicodeDecodeError:
        raise PlanFileError(f"plan file: {path} is not UTF-8 text") from None
    if pf.calibration and not Path(pf.calibration).is_absolute():
        pf = dataclasses.replace(
            pf, calibration=str((Path(path).parent / pf.calibration).resolve()))
    return pf
