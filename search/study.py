"""The study file: what to train, on what, which knobs to search and what to maximise.

A YAML document validated by a pydantic schema (unknown keys rejected). Every error becomes one
:class:`StudyError` line ``field.path: rule (got value)``. Only ``search.yamlinput.load_yaml`` (safe
tags, bounded aliases) reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, Strict, ValidationError, model_validator

from costmodel.errors import TcfError
from search.files import MIB, InputError, read_input
from search.sections import (
    MAX_GPUS,
    MAX_LAYERS,
    Architecture,
    ClusterSection,
    ExportSection,
    ModelSection,
    Moe,
    ObjectiveSection,
    SearchSection,
    SearchSpaceSection,
    TrainingSection,
    ValidationSection,
    _Section,
)
from search.yamlinput import YamlInputError, load_yaml, shown

__all__ = ["MAX_GPUS", "MAX_LAYERS", "Architecture", "ClusterSection", "ExportSection",
           "ModelSection", "Moe", "ObjectiveSection", "SearchSection", "SearchSpaceSection",
           "Study", "StudyError", "TrainingSection", "ValidationSection", "load_study",
           "parse_study"]


class StudyError(TcfError):
    """A study file breaks a rule; the message is ``field.path: rule (got value)``."""


class Study(_Section):
    name: str | None = None
    model: ModelSection
    training: TrainingSection
    cluster: ClusterSection
    search_space: SearchSpaceSection = Field(default_factory=SearchSpaceSection)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)
    search: SearchSection = Field(default_factory=SearchSection)
    export: ExportSection | None = None
    validation: ValidationSection | None = None
    # the user's current recipe, in the plan syntax of ``explain --plan`` (search.planspec),
    # shown beside the recommendation (search.baseline); ``--baseline`` overrides it
    baseline: Annotated[str, Strict()] | None = None
    _base_dir: Path = PrivateAttr(default=Path("."))

    @model_validator(mode="after")
    def _objective_inputs(self) -> Study:
        metric = self.objective.metric
        if metric in ("time_to_train", "cost") and self.training.token_budget is None:
            raise ValueError(f"objective.metric {metric} needs training.token_budget")
        if metric == "cost" and self.cluster.price_per_gpu_hour is None:
            raise ValueError("objective.metric cost needs cluster.price_per_gpu_hour")
        return self

    @property
    def base_dir(self) -> Path:
        """The study file's folder: ``hf_config`` paths are relative to it."""
        return self._base_dir

    @property
    def study_name(self) -> str:
        return self.search.study_name or self.name or "study"


# ---- loading ---------------------------------------------------------------------------------

def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys a section accepts, for an "unknown key" message."""
    cls: Any = Study
    for part in loc[:-1]:
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        cls = next((a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")),
                   None)
        if cls is None:
            return []
    return sorted(getattr(cls, "model_fields", {}))


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    path = ".".join(str(p) for p in loc) or "study"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key (valid: {', '.join(_valid_keys(loc))})"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind == "value_error":
        return f"{path}: {msg.removeprefix('Value error, ')}"
    return f"{path}: {msg} (got {shown(err.get('input'))})"


def parse_study(text: str, *, name: str = "study", base_dir: Path | str = ".") -> Study:
    """A study from YAML text. ``name`` (the file stem) is used when the study has none."""
    try:
        raw = load_yaml(text, "study")
    except YamlInputError as exc:
        raise StudyError(str(exc)) from None
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else type(raw).__name__
        raise StudyError(f"study: must be a YAML mapping (got {got})")
    try:
        study = Study.model_validate(raw)
    except ValidationError as exc:
        raise StudyError(_one_line(exc)) from None
    if study.name is None:
        study = study.model_copy(update={"name": name})
    for key, value in (("name", study.name), ("search.study_name", study.search.study_name)):
        if value is not None and not _is_unicode(value):
            raise StudyError(f"{key}: must be valid Unicode text (got {shown(value)})")
    study._base_dir = Path(base_dir)
    return study


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in YAML) no file can hold
        return False
    return "\x00" not in text


MAX_STUDY_BYTES = 4 * MIB


def load_study(path: str | Path) -> Study:
    """A study file: a regular file of at most 4 MiB (never a FIFO or a device), UTF-8 YAML."""
    p = Path(path)
    try:
        data = read_input(p, "study", MAX_STUDY_BYTES)
    except InputError as exc:
        raise StudyError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StudyError(f"study: {p} is not UTF-8 text") from None
    return parse_study(text, name=p.stem, base_dir=p.parent)
