"""A training log's layout, as ``tcf-search calibrate --measured`` reads it: a small YAML beside
the log (``run.log`` -> ``run.yaml``) or given with ``--layout``, naming the model (a preset, or
the measured_runs.csv model columns), the cluster, the plan string and the batch; it becomes a
row of the measured_runs.csv schema, which ``tcf-search predict`` reads the same way.

    model: llama3-8b            # or {layers: 32, hidden: 4096, ...}
    gpu: h100-sxm-80gb
    num_gpus: 16
    gpus_per_node: 8            # optional (8); fabric: optional
    framework: megatron         # optional: the log's (megatron, torchtitan, accelerate)
    precision: bf16             # optional
    plan: "tp=2,pp=1,mbs=1,zero=1,recompute=selective"
    seq_len: 8192
    global_batch: 256           # sequences per optimizer step
    format: megatron            # optional: megatron, torchtitan or hf-trainer (else detected)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costmodel.errors import TcfError
from costmodel.plan_fields import FIELDS
from search.inputs import (
    MIB,
    PlanSpecError,
    YamlInputError,
    get_preset,
    load_yaml,
    parse_assignments,
    read_input,
)

MAX_LOG_BYTES = 256 * MIB
FORMATS = ("megatron", "torchtitan", "hf-trainer")


class MeasuredInputError(TcfError):
    """A measured-runs file, training log or layout that cannot be read; the message names the
    file and line."""


def read_text(path: Path, what: str) -> str:
    try:
        return read_input(path, what, MAX_LOG_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise MeasuredInputError(f"{path}:1: not UTF-8 text") from None
    except TcfError as exc:
        raise MeasuredInputError(f"{path}:1: {exc}") from None


LAYOUT_KEYS = ("format", "model", "gpu", "num_gpus", "gpus_per_node", "fabric", "framework",
               "precision", "plan", "seq_len", "global_batch", "name")
REQUIRED = ("model", "gpu", "num_gpus", "plan", "seq_len", "global_batch")
# the measured_runs.csv model columns a layout's model mapping may give (search.inputs.measured)
MODEL_COLUMNS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "ffn_type",
                 "tied_embeddings", "moe_experts", "moe_topk", "moe_ffn_hidden",
                 "moe_shared_experts", "head_dim", "bias", "sliding_window", "dense_layers",
                 "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim", "model_name")


def layout_row(doc: Any, where: str) -> tuple[dict[str, str], str]:
    """A layout (the parsed YAML) as a measured_runs.csv row, and the log format it names
    ("" = detect it)."""
    if not isinstance(doc, dict):
        raise MeasuredInputError(f"{where}: a layout is a mapping of {', '.join(LAYOUT_KEYS)}")
    unknown = sorted(set(doc) - set(LAYOUT_KEYS))
    if unknown:
        raise MeasuredInputError(f"{where}: unknown layout keys {unknown}; valid: "
                                 f"{', '.join(LAYOUT_KEYS)}")
    missing = [k for k in REQUIRED if doc.get(k) in (None, "")]
    if missing:
        raise MeasuredInputError(f"{where}: the layout must give {', '.join(missing)} "
                                 f"(model, cluster, plan string and batch)")
    fmt = str(doc.get("format") or "")
    if fmt and fmt not in FORMATS:
        raise MeasuredInputError(f"{where}: format must be one of {', '.join(FORMATS)}, but got "
                                 f"{fmt!r}")
    row: dict[str, str] = {}
    model = doc["model"]
    if isinstance(model, str):
        try:
            row.update(_preset_columns(model))
        except KeyError as exc:
            raise MeasuredInputError(f"{where}: model: {exc.args[0]}") from None
    elif isinstance(model, dict):
        bad = sorted(set(model) - set(MODEL_COLUMNS))
        if bad:
            raise MeasuredInputError(f"{where}: model: unknown columns {bad}; valid: "
                                     f"{', '.join(MODEL_COLUMNS)}")
        row.update({k: _cell(v) for k, v in model.items()})
    else:
        raise MeasuredInputError(f"{where}: model must be a preset name or a mapping of "
                                 f"measured_runs.csv model columns, but got {model!r}")
    try:
        plan = parse_assignments(str(doc["plan"]))
    except PlanSpecError as exc:
        raise MeasuredInputError(f"{where}: {exc}") from None
    for name, value in plan.items():
        f = FIELDS[name]
        row[f.csv] = ("+".join(value) if isinstance(value, tuple)
                      else str(value).lower() if isinstance(value, bool) else str(value))
    for key in ("gpu", "num_gpus", "gpus_per_node", "fabric", "framework", "precision",
                "seq_len", "global_batch"):
        if doc.get(key) not in (None, ""):
            row[key] = _cell(doc[key])
    if "name" in doc:
        row["model_name"] = _cell(doc["name"])
    n = _whole(row["num_gpus"], f"{where}: num_gpus")
    inner = 1
    for key in ("tp", "pp", "cp"):
        inner *= _whole(row.get(key, "1"), f"{where}: plan {key}")
    if "dp" not in row:
        if n % inner:
            raise MeasuredInputError(f"{where}: plan: tp * pp * cp must divide num_gpus to "
                                     f"derive dp, but got {inner} and num_gpus={n}")
        row["dp"] = str(n // inner)
    return row, fmt


def _cell(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _whole(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MeasuredInputError(f"{where} must be a whole number, but got {text!r}") from None


def _preset_columns(name: str) -> dict[str, str]:
    """A model preset (search.inputs.presets) as the CSV's model columns."""
    m = get_preset(name)
    row = {"model_name": m.name, "layers": m.layers, "hidden": m.hidden,
           "ffn_hidden": m.ffn_hidden, "heads": m.heads, "kv_heads": m.kv_heads,
           "vocab": m.vocab, "ffn_type": m.ffn_type, "tied_embeddings": m.tied_embeddings,
           "bias": m.bias, "head_dim": m.head_dim, "sliding_window": m.sliding_window}
    if m.moe_experts:
        row.update(moe_experts=m.moe_experts, moe_topk=m.moe_topk,
                   moe_ffn_hidden=m.moe_ffn_hidden, moe_shared_experts=m.moe_shared_experts,
                   dense_layers=m.moe_dense_layers, moe_layer_freq=m.moe_layer_freq)
    if m.mla is not None:
        row.update(q_lora_rank=m.mla.q_lora_rank, kv_lora_rank=m.mla.kv_lora_rank,
                   qk_nope_head_dim=m.mla.qk_nope_head_dim,
                   qk_rope_head_dim=m.mla.qk_rope_head_dim, v_head_dim=m.mla.v_head_dim)
    return {k: _cell(v) for k, v in row.items()}


def load_layout(path: Path) -> tuple[dict[str, str], str]:
    text = read_text(path, "layout")
    try:
        doc = load_yaml(text, str(path))
    except YamlInputError as exc:
        raise MeasuredInputError(f"{path}:1: {exc}") from None
    return layout_row(doc, f"{path}:1")


def layout_beside(log: Path) -> Path | None:
    """The layout YAML beside a log (``run.log`` -> ``run.yaml``), if there is one."""
    for candidate in (log.with_suffix(".yaml"), log.with_suffix(".yml")):
        if candidate != log and candidate.is_file():
            return candidate
    return None


