"""What ``report`` reads from a result folder, as a typed schema: each field's type and range.

A result folder may come from someone else, so nothing in it is trusted: ``result.json`` and the
rows of ``trials.csv`` are validated here before the report draws or writes anything, and a
broken field is one line, ``result.json: top[0].rank: must be a positive integer (got 'x')``.
Only the fields the report reads are declared (others are ignored, so a newer result still
loads); the report reads them through these types, never the raw document. Ranges are those a
run can write (``search.output``, ``search.result``): degrees up to the study limit of GPUs,
finite figures, probabilities in [0, 1], names short enough to draw.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, model_validator

from search.inputs import MAX_GPUS

FIGURE_LIMIT = 1e15  # GiB, seconds, tokens/s: far beyond any run, far below overflow when summed
MAX_NAME_CHARS = 1000  # a name drawn in a figure (a rule, a sampler, a metric)
# (tp, pp) values of the heat map: a knob lists at most 64 values, auto pp at most 128 divisors
MAX_GRID_VALUES = 128

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 60, 60, 4, 4, 2


def short(value: Any) -> str:
    """A bounded ``repr`` for a one-line message: one line and a few dozen characters whatever
    the value (a megabyte of text or a deeply nested list costs no more than a short one)."""
    return _REPR.repr(value)


def _whole(lo: int, hi: int | None, rule: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not int or value < lo or (hi is not None and value > hi):
            raise ValueError(rule)
        return value
    return check


def _number(lo: float, hi: float, rule: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(rule)
        if isinstance(value, int) and not lo <= value <= hi:  # before float(): 10**400
            raise ValueError(rule)
        number = float(value)
        if not lo <= number <= hi:  # nan compares false
            raise ValueError(rule)
        return number
    return check


def _text(max_chars: int | None, rule: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if type(value) is not str or (max_chars is not None and len(value) > max_chars):
            raise ValueError(rule)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no page can hold it
            raise ValueError(f"{rule}, valid Unicode") from None
        return value
    return check


def _choice(*values: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in values or type(value) is not str:
            raise ValueError(f"must be one of {', '.join(values)}")
        return value
    return check


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError("must be true or false")
    return value


Count = Annotated[int, PlainValidator(_whole(0, None, "must be a non-negative integer"))]
Positive = Annotated[int, PlainValidator(_whole(1, None, "must be a positive integer"))]
Degree = Annotated[int, PlainValidator(_whole(
    1, MAX_GPUS, f"must be a parallel degree, an integer from 1 to {MAX_GPUS}"))]
ZeroStage = Annotated[int, PlainValidator(_whole(0, 3, "must be 0, 1, 2 or 3"))]
Quantity = Annotated[float, PlainValidator(_number(
    0.0, FIGURE_LIMIT, f"must be a number from 0 to {FIGURE_LIMIT:g}"))]
Signed = Annotated[float, PlainValidator(_number(
    -FIGURE_LIMIT, FIGURE_LIMIT, f"must be a number from {-FIGURE_LIMIT:g} to {FIGURE_LIMIT:g}"))]
Share = Annotated[float, PlainValidator(_number(0.0, 1.0, "must be a number from 0 to 1"))]
Name = Annotated[str, PlainValidator(_text(
    MAX_NAME_CHARS, f"must be text of at most {MAX_NAME_CHARS:,} characters"))]
Text = Annotated[str, PlainValidator(_text(None, "must be text"))]
Flag = Annotated[bool, PlainValidator(_bool)]


class _Doc(BaseModel):
    # fields the report does not read are ignored: a newer result.json still loads
    model_config = ConfigDict(extra="ignore", frozen=True)


class PlanRow(_Doc):
    """A ranked plan's knobs, as the table and the figure labels show them."""

    tp: Degree
    pp: Degree
    dp: Degree
    cp: Degree
    ep: Degree
    vpp: Degree
    zero_stage: ZeroStage
    micro_batch: Positive
    recompute: Annotated[str, PlainValidator(_choice("none", "selective", "full"))]
    sequence_parallel: Flag


class RestsOn(_Doc):
    """A term no measured row validates that widened a plan's interval
    (``search.priors.PriorSpread.of``)."""

    flag: Name
    term: Text
    basis: Text
    mark: Name = ""  # its letter beside the interval (search.priors.MARKS)


class Predicted(_Doc):
    """A ranked plan's predicted figures (``search.result.RankedPlan.predicted``)."""

    tokens_per_s_per_gpu: Quantity
    mfu: Quantity
    step_time_s: Quantity
    peak_mem_gib: Quantity
    usable_mem_gib: Signed  # below 0 where the framework's reserve exceeds the GPU's memory
    dominant_challenge: Name
    network_groups: Name = ""  # the groups that cross the network, e.g. "dp,pp"
    tokens_per_s_interval: tuple[Quantity, Quantity] | None = None
    p_oom: Share | None = None
    interval_rests_on: tuple[RestsOn, ...] = ()
    mem_weights_gib: Quantity = 0.0
    mem_grads_gib: Quantity = 0.0
    mem_optimizer_gib: Quantity = 0.0
    mem_activations_gib: Quantity = 0.0
    mem_buffers_gib: Quantity = 0.0
    time_compute_s: Quantity = 0.0
    time_comm_exposed_s: Quantity = 0.0
    time_bubble_s: Quantity = 0.0
    time_optimizer_s: Quantity = 0.0


class Ranked(_Doc):
    rank: Positive
    plan: PlanRow
    predicted: Predicted


class Figures(_Doc):
    """One plan's figures beside the baseline (``search.baseline.figures``)."""

    tokens_per_s_per_gpu: Quantity
    step_time_s: Quantity
    mfu: Quantity
    compute_challenge_s: Quantity
    recompute_s: Quantity
    bubble_share: Share
    exposed_comm_s: Quantity
    peak_mem_gib: Quantity
    headroom_gib: Signed
    fits: Flag


class BaselinePlan(_Doc):
    tp: Degree
    pp: Degree


class Versus(_Doc):
    label: Text
    plan_text: Text
    figures: Figures


class Baseline(_Doc):
    """The user's recipe beside the best (``search.baseline.baseline_doc``)."""

    plan: BaselinePlan
    plan_text: Text
    figures: Figures
    lines: list[Text]
    versus: Versus | None = None


class Gap(_Doc):
    rank: Positive
    tokens_per_s_gap: Signed
    p_best_faster: Share


class Ranking(_Doc):
    vs_best: list[Gap] = []


class Cell(_Doc):
    """One (tp, pp) cell of the heat map."""

    tp: Degree
    pp: Degree
    valid: Count
    feasible: Count
    pruned_by: dict[Name, Count] = {}
    best_in_top: Quantity | None = None
    # the cell's own best plan, every feasible layout judged (absent in older results)
    best_tokens_per_s_per_gpu: Quantity | None = None
    best_plan: Text | None = None


class Cluster(_Doc):
    gpu: Name
    num_gpus: Degree


class Objective(_Doc):
    metric: Name
    direction: Annotated[str, PlainValidator(_choice("maximize", "minimize"))]
    memory_headroom_gib: Signed = 0.0  # a share of usable memory, which may be below 0


class Calibration(_Doc):
    line: Text | None = None


class Search(_Doc):
    sampler: Name = ""
    cost_model: Name | None = None


class Optimum(_Doc):
    value: Signed


class NearMiss(_Doc):
    reason: Text


class Result(_Doc):
    """The part of ``result.json`` (``search.result.StudyResult.to_dict``) a report reads."""

    study: Name
    model: Name
    cluster: Cluster
    objective: Objective
    space_size: Count
    valid_count: Count
    feasible_count: Count
    trials: Count
    top: list[Ranked]
    cells: list[Cell]
    pruned_by: dict[Name, Count] = {}
    near_misses: list[NearMiss] = []
    notes: list[Text] = []
    calibration: Calibration = Calibration()
    search: Search = Search()
    ranking: Ranking = Ranking()
    baseline: Baseline | None = None
    optimum: Optimum | None = None

    @model_validator(mode="after")
    def _grid_is_drawable(self) -> Result:
        for axis in ("tp", "pp"):
            values = {getattr(c, axis) for c in self.cells}
            if len(values) > MAX_GRID_VALUES:
                raise ValueError(f"cells: at most {MAX_GRID_VALUES} {axis} values, as a search "
                                 f"lists (got {len(values)})")
        return self


class TrialRow(_Doc):
    """The columns of one ``trials.csv`` row a report reads (cells already read as numbers)."""

    number: Count
    state: Name
    value_0: Signed | None = None
    tokens_per_s_per_gpu: Quantity | None = None
    peak_mem_gib: Quantity | None = None
    usable_mem_gib: Signed | None = None
    tp: Degree | None = None
    pp: Degree | None = None


TYPE_RULES = {"model_type": "must be a mapping", "dict_type": "must be a mapping",
              "list_type": "must be a list", "tuple_type": "must be a list"}


def _where(loc: tuple[int | str, ...]) -> str:
    """``top[0].rank``; a key that is not a plain name is quoted (one line, bounded)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            text += " (a key)"
        elif part.isidentifier() and len(part) <= 60:
            text += f".{part}" if text else part
        else:
            text += f"[{short(part)}]"
    return text or "document"


def one_line(exc: ValidationError) -> str:
    """The first broken field of a validation error as ``where: rule (got value)``."""
    err = exc.errors(include_url=False)[0]
    where, kind = _where(tuple(err["loc"])), err["type"]
    if kind == "value_error" and not err["loc"]:  # a rule over several fields names them
        return str(err["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return f"{where}: required key is missing"
    if kind == "value_error":
        rule = str(err["msg"]).removeprefix("Value error, ")
    else:
        rule = TYPE_RULES.get(kind, str(err["msg"]))
    return f"{where}: {rule} (got {short(err.get('input'))})"
