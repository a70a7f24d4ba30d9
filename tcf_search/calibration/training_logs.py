"""Measured training steps, as ``tcf-search calibrate --measured FILE...`` reads them: rows in the
``measured_runs.csv`` schema (what ``tcf-search predict`` reads), or a training log with its
layout (the model, the cluster, the plan string and the batch) in a small YAML beside it
(``run.log`` -> ``run.yaml``) or given with ``--layout FILE.yaml``.

The logs, as each framework prints them (the line each parser reads; the numbers the tests write
are the tests' own):

- Megatron-LM (``megatron/training/training.py``, ``training_log``, core_v0.14.0): one line per
  logging interval, ``iteration N/ M | ... | elapsed time per iteration (ms): X | throughput per
  GPU (TFLOP/s/GPU): Y | ... | global batch size: B |``; memory from ``report_memory``
  (``megatron/training/utils.py``): ``[Rank R] (after N iterations) memory (MB) | allocated: ..
  | max allocated: .. | reserved: .. | max reserved: ..`` in MiB (bytes / 1024**2).
  Megatron-Bridge, which NeMo's Megatron-Core recipes run (``src/megatron/bridge/training/utils/
  train_utils.py``, ``training_log``, v0.6.0), prints the same iteration line, and memory as
  ``[Rank R] (after N iterations) memory (GB) | ... | peak_reserved_mem: X | ...`` in GB (bytes /
  1e9, ``report_memory`` there).
- torchtitan (``torchtitan/components/metrics.py``, ``MetricsProcessor.log``, v0.2.2): ``step: N
  loss: .. [grad_norm: ..] memory: XGiB(P%)  tps: T  tflops: F  mfu: M%``, colour codes around
  the fields; ``tps`` is tokens per second per device, ``memory`` torch's max reserved in GiB.
- Hugging Face Trainer (``src/transformers/trainer_utils.py``, ``speed_metrics``; logged at the
  end of ``Trainer.train``): ``train_samples_per_second`` and ``train_steps_per_second`` over the
  whole run (every process's samples), either as the logged dict (``{'train_runtime': ..,
  'train_samples_per_second': .., 'train_steps_per_second': .., ...}``) or as
  ``Trainer.log_metrics`` prints it (``  train_samples_per_second =   12.34``).

The step time is the median over the logged intervals after the first (warm-up: compilation,
allocator growth, the first data loads); with one interval logged, that one. tokens/s per GPU =
global batch x sequence length / step time / GPUs (Megatron, the Trainer), or torchtitan's
``tps``. A malformed file is one error naming ``file:line``.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search.inputs import MIB
from tcf_search.calibration.layouts import (
    MeasuredInputError,
    layout_beside,
    load_layout,
    read_text,
)

GIB = 2**30
# the framework profile a log's format runs where the layout names none (the HF Trainer runs on
# Accelerate's launcher; a layout may say deepspeed)
DEFAULT_FRAMEWORK = {"megatron": "megatron", "torchtitan": "torchtitan",
                     "hf-trainer": "accelerate"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_MS = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_MEM_MB = re.compile(r"memory \(MB\).*\|\s*max reserved:\s*" + _NUM)
_BRIDGE_MEM_GB = re.compile(r"memory \(GB\).*\|\s*peak_reserved_mem:\s*" + _NUM)
_TITAN_STEP = re.compile(r"\bstep:\s*(\d+)\s")
_TITAN_FIELDS = {"tps": re.compile(r"\btps:\s*" + _NUM),
                 "tflops": re.compile(r"\btflops:\s*" + _NUM),
                 "mfu": re.compile(r"\bmfu:\s*" + _NUM + "%"),
                 "memory": re.compile(r"\bmemory:\s*" + _NUM + r"\s*GiB")}
_HF_METRIC = re.compile(r"^\s*(train_(?:samples|steps)_per_second)\s*=\s*" + _NUM + r"\s*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One measured run: its configuration as a row of the measured_runs.csv schema (what
    ``tcf-search predict`` reads) and what it measured."""

    where: str  # file:line it was read from
    row: dict[str, str]
    tokens_per_sec_per_gpu: float
    peak_mem_gib: float = math.nan
    model_tflops_per_gpu: float = math.nan  # as the log printed it (its own FLOP count)
    steps: int = 0  # logged intervals the step time is the median of (0: a CSV row)
    notes: tuple[str, ...] = field(default_factory=tuple)


def _number(text: str, where: str, what: str) -> float:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        raise MeasuredInputError(f"{where}: {what} must be a number, but got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise MeasuredInputError(f"{where}: {what} must be > 0, but got {text!r}")
    return value


# -- the logs --------------------------------------------------------------------------------

def detect(text: str) -> str:
    """The framework whose training log ``text`` is ("" = none of FORMATS)."""
    clean = _ANSI.sub("", text)
    if "elapsed time per iteration (ms)" in clean:
        return "megatron"
    if re.search(r"\btps:\s*[0-9]", clean) and re.search(r"\bstep:\s*\d", clean):
        return "torchtitan"
    if "train_samples_per_second" in clean or "train_steps_per_second" in clean:
        return "hf-trainer"
    return ""


@dataclass(slots=True)
class _Read:
    step_times_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)  # per GPU per second (torchtitan)
    tflops: list[float] = field(default_factory=list)
    peak_gib: float = math.nan
    samples_per_s: float = math.nan
    steps_per_s: float = math.nan


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def _megatron(lines: list[str], path: Path, row: Mapping[str, str]) -> _Read:
    out = _Read()
    batch = int(row["global_batch"])
    for i, line in enumerate(lines, start=1):
        where = f"{path}:{i}"
        if "elapsed time per iteration (ms)" in line:
            if not _MEGATRON_ITER.search(line):
                raise MeasuredInputError(f"{where}: an iteration line without 'iteration N/ M "
                                         f"|' (Megatron's training_log prints it first)")
            m = _MEGATRON_MS.search(line)
            if m is None:
                raise MeasuredInputError(f"{where}: elapsed time per iteration (ms) must be a "
                                         f"number")
            out.step_times_s.append(_number(m[1], where, "elapsed time per iteration") / 1e3)
            if t := _MEGATRON_TFLOPS.search(line):
                out.tflops.append(_number(t[1], where, "throughput per GPU"))
            if (b := _MEGATRON_BATCH.search(line)) and int(b[1]) != batch:
                raise MeasuredInputError(f"{where}: global batch size {b[1]} is not the "
                                         f"layout's global_batch {batch}")
        elif m := _MEGATRON_MEM_MB.search(line):
            out.peak_gib = _max(out.peak_gib, _number(m[1], where, "max reserved") * MIB / GIB)
        elif m := _BRIDGE_MEM_GB.search(line):
            out.peak_gib = _max(out.peak_gib, _number(m[1], where, "peak_reserved_mem")
                                * 1e9 / GIB)
    return out


def _torchtitan(lines: list[str], path: Path, row: Mapping[str, str]) -> _Read:
    out = _Read()
    for i, line in enumerate(lines, start=1):
        where = f"{path}:{i}"
        if not _TITAN_STEP.search(line) or "tps:" not in line:
            continue
        found = {k: p.search(line) for k, p in _TITAN_FIELDS.items()}
        m = found["tps"]
        if m is None:
            raise MeasuredInputError(f"{where}: tps must be a number (torchtitan prints "
                                     f"'tps: 1,234')")
        out.tokens.append(_number(m[1], where, "tps"))
        if t := found["tflops"]:
            out.tflops.append(_number(t[1], where, "tflops"))
        if mem := found["memory"]:
            out.peak_gib = _max(out.peak_gib, _number(mem[1], where, "memory"))
    return out


def _hf_trainer(lines: list[str], path: Path, row: Mapping[str, str]) -> _Read:
    out = _Read()
    for i, line in enumerate(lines, start=1):
        where = f"{path}:{i}"
        found: dict[str, Any] = {}
        stripped = line.strip()
        if stripped.startswith("{") and "train_" in stripped:
            try:
                logged = ast.literal_eval(stripped)
            except (ValueError, SyntaxError):
                raise MeasuredInputError(f"{where}: a logged metrics dict that does not parse "
                                         f"(cut short?)") from None
            if isinstance(logged, dict):
                found = logged
        elif m := _HF_METRIC.match(line):
            found = {m[1]: m[2]}
        for key, attr in (("train_samples_per_second", "samples_per_s"),
                          ("train_steps_per_second", "steps_per_s")):
            if key in found:
                setattr(out, attr, _number(str(found[key]), where, key))
    return out


PARSERS = {"megatron": _megatron, "torchtitan": _torchtitan, "hf-trainer": _hf_trainer}


def _max(a: float, b: float) -> float:
    return b if math.isnan(a) else max(a, b)


def read_log(path: Path, layout: tuple[dict[str, str], str]) -> MeasuredRun:
    """One training log with its layout (a row and a format, :func:`layout_row`)."""
    row, fmt = layout
    text = read_text(path, "training log")
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    fmt = fmt or detect(text)
    if not fmt:
        raise MeasuredInputError(f"{path}:1: not a training log this reads: no Megatron "
                                 f"'elapsed time per iteration (ms)', torchtitan 'step: .. tps:' "
                                 f"or HF Trainer 'train_samples_per_second' line")
    row = {"framework": DEFAULT_FRAMEWORK[fmt], "precision": "bf16", **row,
           "source": f"measured:{path.name}"}
    got = PARSERS[fmt](lines, path, row)
    end = f"{path}:{max(len(lines), 1)}"
    seq, batch, gpus = int(row["seq_len"]), int(row["global_batch"]), int(row["num_gpus"])
    steps = 0
    if fmt == "torchtitan":
        if not got.tokens:
            raise MeasuredInputError(f"{end}: no 'step: N ... tps: T' line: the run logged no "
                                     f"step (cut short?)")
        tokens, steps = _median_after_first(got.tokens), len(got.tokens)
    elif fmt == "megatron":
        if not got.step_times_s:
            raise MeasuredInputError(f"{end}: no 'elapsed time per iteration (ms)' line: the "
                                     f"run logged no iteration (cut short?)")
        step, steps = _median_after_first(got.step_times_s), len(got.step_times_s)
        tokens = batch * seq / step / gpus
    else:
        if math.isnan(got.samples_per_s) and math.isnan(got.steps_per_s):
            raise MeasuredInputError(f"{end}: no train_samples_per_second or "
                                     f"train_steps_per_second (Trainer.train logs them at its "
                                     f"end: cut short?)")
        samples = (got.samples_per_s if not math.isnan(got.samples_per_s)
                   else got.steps_per_s * batch)
        tokens, steps = samples * seq / gpus, 1
    tflops = _median_after_first(got.tflops) if got.tflops else math.nan
    return MeasuredRun(where=f"{path}:1", row=row, tokens_per_sec_per_gpu=tokens,
                       peak_mem_gib=got.peak_gib, model_tflops_per_gpu=tflops, steps=steps,
                       notes=(f"{fmt} log, median of {steps} logged interval"
                              f"{'s' if steps != 1 else ''}"
                              + (" after the first" if steps > 1 and fmt != "hf-trainer" else ""),))


def read_csv_runs(path: Path) -> list[MeasuredRun]:
    """The rows of a measured_runs.csv-schema file that ran (status ok or empty) with a
    tokens_per_sec_per_gpu."""
    import csv
    import io

    text = read_text(path, "measured runs CSV")
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in ("layers", "hidden", "gpu", "num_gpus", "tokens_per_sec_per_gpu")
               if c not in header]
    if missing:
        raise MeasuredInputError(f"{path}:1: the header lacks {', '.join(missing)} (the "
                                 f"measured_runs.csv schema)")
    runs = []
    for i, raw in enumerate(reader, start=2):
        if None in raw:
            raise MeasuredInputError(f"{path}:{i}: more cells than the header has columns")
        row = {k: (v or "").strip() for k, v in raw.items()}
        if row.get("status", "ok") not in ("", "ok"):
            continue  # an oom or failed run measured no step
        where = f"{path}:{i}"
        tokens = _number(row["tokens_per_sec_per_gpu"], where, "tokens_per_sec_per_gpu")
        peak = (_number(row["peak_mem_gib"], where, "peak_mem_gib")
                if row.get("peak_mem_gib") else math.nan)
        runs.append(MeasuredRun(where=where, row=row, tokens_per_sec_per_gpu=tokens,
                                peak_mem_gib=peak))
    if not runs:
        raise MeasuredInputError(f"{path}:{max(reader.line_num, 1)}: no row that ran (status "
                                 f"ok) with a tokens_per_sec_per_gpu")
    return runs


def read_measured(paths: Sequence[Path], layout: Path | None = None) -> list[MeasuredRun]:
    """Every measured run of ``paths``: CSV files (``.csv``) as rows, other files as training
    logs, each with the layout beside it or ``layout``."""
    runs: list[MeasuredRun] = []
    given = load_layout(layout) if layout is not None else None
    for path in paths:
        if path.suffix.lower() == ".csv":
            runs.extend(read_csv_runs(path))
            continue
        beside = layout_beside(path)
        found = load_layout(beside) if beside is not None else given
        if found is None:
            raise MeasuredInputError(f"{path}:1: a training log needs its layout: "
                                     f"{path.with_suffix('.yaml').name} beside it or --layout "
                                     f"FILE.yaml (model, gpu, num_gpus, plan, seq_len, "
                                     f"global_batch)")
        runs.append(read_log(path, found))
    return runs
