"""Rows in the schema of ``measured_runs.csv`` (see ../shared/data/README.md) as cost-model
inputs. Only configuration columns are read; an empty knob cell means *not given*."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from costmodel.errors import SpecError, TcfError
from costmodel.layer_style import MoeRouter
from costmodel.mapping import counted_split
from costmodel.mla import MLA_FIELDS, MlaError, MlaSpec
from costmodel.plan_fields import PLAN_FIELDS, PLAN_KEYS, PlanField
from costmodel.specs import ClusterSpec, ModelSpec, Plan, Training
from hardware_catalog import CatalogError, get_gpu
from hardware_catalog.frameworks import (
    release_switches,
    resolve_framework,
    row_defaults,
    table_errata,
)
from search.inputs.links import ClusterCalibration, anchored
from search.inputs.specs import cluster_spec, training_spec

__all__ = ["Case", "CaseError", "case_from_row", "presumed_split", "row_plan"]

KNOBS: tuple[str, ...] = ("micro_batch", "recompute", "recompute_layers", "zero_stage", "vpp",
                          "sequence_parallel", "first_stage_layers", "last_stage_layers")
# The pipeline split: given when any of these cells is; the last two are Megatron-LM's
# account_for_embedding/loss_in_pipeline_split (costmodel.mapping.counted_split).
SPLIT_COLUMNS: tuple[str, ...] = ("first_stage_layers", "last_stage_layers",
                                  "embedding_in_pipeline_split", "loss_in_pipeline_split")
# launchers whose splits count the embedding and the loss as layers (presumed_split)
PRESUMED_SPLIT_FRAMEWORKS: tuple[str, ...] = ("megatron", "nemo")
# The schema gives the interconnect only inside `notes` ("gpu as published: A100 80GB (1600Gbps
# RoCE)"); words there that name a fabric of hardware_catalog/fabrics.yaml. Selene is NVIDIA's
# DGX SuperPOD on HDR InfiniBand (Narayanan et al., SC21, sec. 5.1). Megatron-Bridge's tables
# name NVIDIA DGX systems ("DGX-H100", "DGX-B200": docs/performance-summary.md), whose compute
# fabric is eight single-port 400 Gb/s ConnectX-7 HCAs, built by NVIDIA's DGX SuperPOD reference
# architectures as a rail-optimised NDR InfiniBand fat tree. A `fabric` column wins.
FABRIC_WORDS: tuple[tuple[str, str], ...] = (("roce", "roce"), ("infiniband", "infiniband"),
                                             ("selene", "infiniband"),
                                             ("dgx-h100", "infiniband"),
                                             ("dgx-b200", "infiniband"))
# Sources whose every row ran on one cluster whose fabric the source's own launch files give.
# The Ultra-Scale Playbook sweep (`playbook`) ran nanotron's scaling_benchmarks.py through its
# run_multinode.sh (huggingface/nanotron 67c5ebb6, 2024-12-27: results to
# benchmark/results/bench_final2.csv, the file the rows come from) on Slurm partition
# hopper-prod, hosts ip-26-0-*, storage /fsx: Amazon EC2 instances, and the launchers of that
# same partition set FI_PROVIDER=efa (examples/train_tiny_llama.sh; examples/doremi/
# train_doremi.jinja), AWS's Elastic Fabric Adapter. A fabric word in `notes` or a `fabric`
# cell wins.
SOURCE_FABRICS: dict[str, str] = {"playbook": "efa"}



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
    assumed: tuple[str, ...] = ()  # empty cells filled with the framework's own default


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


def _number(row: Mapping[str, object], key: str) -> float:
    """A number >= 0 from an optional cell (0.0 where it is empty)."""
    s = _cell(row, key)
    try:
        f = float(s) if s else 0.0
    except ValueError:
        raise CaseError(f"{key}: must be a number >= 0, but got {s!r}") from None
    if not f >= 0:
        raise CaseError(f"{key}: must be a number >= 0, but got {s!r}")
    return f


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
    of `notes`, else its source's cluster's (SOURCE_FABRICS), else "" (unknown: priced as the
    GPU family's measured cluster)."""
    given = _cell(row, "fabric").lower()
    if given:
        return given
    notes = _cell(row, "notes").lower()
    hardware = notes.partition("gpu as published:")[2].partition(";")[0]
    named = next((fid for word, fid in FABRIC_WORDS if word in hardware), "")
    return named or SOURCE_FABRICS.get(_cell(row, "source").lower(), "")


def row_split(row: Mapping[str, object], layers: int, pp: int) -> tuple[int, int]:
    """The first and last pipeline ranks' layers a row gives (0 = even split). Megatron-LM
    refuses first/last stage counts together with the embedding or the loss counted as layers
    (megatron/core/transformer/transformer_config.py, ``__post_init__``); so does this."""
    first, last = _int(row, "first_stage_layers", 0), _int(row, "last_stage_layers", 0)
    emb, loss = _bool(row, "embedding_in_pipeline_split"), _bool(row, "loss_in_pipeline_split")
    if not (emb or loss):
        return first, last
    if first or last:
        raise CaseError("first_stage_layers, last_stage_layers: cannot be given with "
                        "embedding_in_pipeline_split or loss_in_pipeline_split (Megatron-LM)")
    counted = counted_split(layers, pp, emb, loss)
    if counted[0] < 0:
        units = layers + int(emb) + int(loss)
        raise CaseError(f"embedding_in_pipeline_split, loss_in_pipeline_split: {units} layers "
                        f"counting them must split evenly over pp={pp} ranks, >= 2 a rank")
    return counted


def presumed_split(row: Mapping[str, object]) -> dict[str, object]:
    """The row with the pipeline split the calibration presumes where the row leaves it unsaid
    but no even split exists: NVIDIA's Llama 3.1 405B tables (126 layers over pp x vpp = 64
    chunks) count the embedding and the loss as layers, as the measured file's README says they
    presumably do (Megatron's account_for_embedding/loss_in_pipeline_split, which MLPerf's 405B
    configs set). Only for the Megatron-Core launchers and only where that is the one counted
    split that makes the chunks; any other row is returned unchanged (``predict`` treats an
    unsaid split as a knob instead)."""
    out = dict(row)
    if any(_cell(row, k) for k in SPLIT_COLUMNS):
        return out
    try:
        layers, pp, vpp = _int(row, "layers"), _int(row, "pp", 1), _int(row, "vpp", 1)
    except CaseError:
        return out
    chunks = pp * vpp
    if (_cell(row, "framework").lower() in PRESUMED_SPLIT_FRAMEWORKS and pp > 1 and vpp > 1
            and layers % chunks and (layers + 2) % chunks == 0):
        out["embedding_in_pipeline_split"] = out["loss_in_pipeline_split"] = "true"
    return out


def row_mla(row: Mapping[str, object]) -> MlaSpec | None:
    """Multi-head latent attention from the optional columns of the same names (all of
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; q_lora_rank may be empty)."""
    if not _cell(row, "kv_lora_rank"):
        return None
    try:
        return MlaSpec(q_lora_rank=_int(row, "q_lora_rank", 0),
                       **{k: _int(row, k) for k in MLA_FIELDS if k != "q_lora_rank"})
    except MlaError as e:
        raise CaseError(str(e)) from None


def _field(row: Mapping[str, object], f: PlanField, default: object) -> object:
    """A plan field's cell as its type reads (a set of names joined by '+'), or ``default``."""
    if f.type is int:
        return _int(row, f.csv, default)  # type: ignore[arg-type]
    if f.type is bool:
        return _bool(row, f.csv, default)  # type: ignore[arg-type]
    cell = _cell(row, f.csv)
    if f.type is tuple:
        return tuple(name.strip() for name in cell.split("+")) if cell else default
    return cell or default


def row_plan(row: Mapping[str, object], layers: int,
             defaults: Mapping[str, object] | None = None) -> Plan:
    """The plan a row's cells give, a cell per field of ``costmodel.plan_fields``; an empty cell
    holds ``defaults`` (what the row's framework and release ran), else the field's default.
    Sequence parallelism is on by default where tp > 1 and never at tp 1; the split is
    :func:`row_split`'s where the row gives one, else the defaults' (a release's layout)."""
    tp, pp = _int(row, "tp", 1), _int(row, "pp", 1)
    defaults = {"sequence_parallel": tp > 1, **(defaults or {})}
    first, last = (row_split(row, layers, pp) if any(_cell(row, k) for k in SPLIT_COLUMNS) else
                   (int(defaults.get("first_stage_layers", 0)),  # type: ignore[call-overload]
                    int(defaults.get("last_stage_layers", 0))))  # type: ignore[call-overload]
    split = {"first_stage_layers": first, "last_stage_layers": last}
    values = {f.name: split[f.name] if f.name in split else
              _field(row, f, defaults.get(f.name, f.default)) for f in PLAN_FIELDS}
    values["sequence_parallel"] = values["sequence_parallel"] and tp > 1
    return Plan(**values)  # type: ignore[arg-type]


# plan fields that are also a training's switches: a release's value is the training's
TRAINING_OWN = frozenset({"moe_dispatcher", "moe_a2a_overlap"})
# model fields a release's recipe builds that the row does not state: what the schema has no
# column for (Megatron-Bridge's DeepSeek-V3 recipes build one multi-token prediction layer:
# mtp_num_layers = 1) and the optional model columns (README) a row leaves empty, such as the
# head width and QK-norm of Qwen3 or gpt-oss's attention pattern; a cell the row fills wins.
# Each field is read as its type. DeepSeek-V3's leading dense layers: ``dense_layers`` (the
# optional column) and ``dense_ffn_hidden``, their MLP width, which no column carries (a MoE row's
# ffn_hidden is the expert's, the schema's convention): Bridge's DeepSeekV3ModelProvider builds
# ffn_hidden_size 18432 beside moe_ffn_hidden_size 2048. The vocabulary, where a table leaves
# it empty and its release's tokenizer gives it (NeMo's 24.07 GPT-3 rows). The router beyond
# top-k (DeepSeek-V3's group-limited one: ``moe_router``, MoeRouter's fields), which no column
# carries.
MODEL_OWN: dict[str, type] = {"mtp_layers": int, "head_dim": int, "qk_norm": bool,
                              "sliding_window": int, "window_skip_freq": int,
                              "attention_sinks": bool, "bias": str, "dense_layers": int,
                              "dense_ffn_hidden": int, "vocab": int, "swiglu_limit": float,
                              "moe_router": dict}
# the ModelSpec field a release's model field sets, where the names differ
MODEL_FIELD = {"dense_layers": "moe_dense_layers", "dense_ffn_hidden": "ffn_hidden"}


def with_release_model(model: ModelSpec, row: Mapping[str, object],
                       own: Mapping[str, Any]) -> ModelSpec:
    """``model`` with the fields its release builds that the row leaves empty (``MODEL_OWN``)
    and the dense MLP width its optional ``dense_ffn_hidden`` cell gives; a dense MLP width keeps
    the experts' own (the row's ffn_hidden, where moe_ffn_hidden is empty)."""
    given = {MODEL_FIELD.get(k, k): v for k, v in own.items() if not _cell(row, k)}
    if "moe_router" in given:
        given["moe_router"] = MoeRouter(**given["moe_router"])
    if _cell(row, "dense_ffn_hidden"):
        given["ffn_hidden"] = _int(row, "dense_ffn_hidden")
    if "ffn_hidden" in given and model.is_moe:
        given["moe_ffn_hidden"] = model.expert_ffn_hidden
    return replace(model, **given)


def framework_ffn_hidden(row: Mapping[str, object], framework: str) -> tuple[int, str]:
    """The row's MLP size and, where its cell is empty and the row ran Megatron-LM, what an unset
    ``--ffn-hidden-size`` gives (megatron/training/arguments.py ``validate_args``,
    core_v0.16.1: 4 x hidden, or with SwiGLU int(8 x hidden / 3 / 64) x 64), said as a note."""
    if _cell(row, "ffn_hidden") or framework != "megatron":
        return _int(row, "ffn_hidden"), ""
    h = _int(row, "hidden")
    swiglu = (_cell(row, "ffn_type") or "swiglu") == "swiglu"
    ffn = int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h
    return ffn, f"ffn_hidden={ffn} (Megatron-LM's default for an unset --ffn-hidden-size)"


def with_errata(row: Mapping[str, object]) -> tuple[Mapping[str, object], str]:
    """``row`` with the cells its published table got wrong against its release's own code
    replaced by the code's (``table_errata`` in frameworks.yaml), and a note naming each."""
    fix = table_errata(_cell(row, "source"), _cell(row, "source_detail"),
                       _cell(row, "model_name"))
    why = str(fix.pop("why", ""))
    if not fix:
        return row, ""
    said = ", ".join(f"{k}={v} (the table's {_cell(row, k).removesuffix('.0') or 'empty'})"
                     for k, v in fix.items())
    return {**row, **{k: str(v) for k, v in fix.items()}}, f"{said}: {why}"


def case_from_row(row: Mapping[str, object],
                  calibration: ClusterCalibration | None = None) -> Case:
    """A row as cost-model inputs; with ``calibration`` (``predict --calibration``), its
    cluster anchored on that cluster calibration file."""
    row, erratum = with_errata(row)
    mla = row_mla(row)
    heads = _int(row, "heads")
    framework = resolve_framework(_cell(row, "framework"), _cell(row, "source"))
    ffn_hidden, assumed = framework_ffn_hidden(row, framework)
    # the vocabulary a row leaves empty, where its release's recipe builds one (MODEL_OWN)
    built = release_switches(_cell(row, "source"), _cell(row, "source_detail"),
                             _cell(row, "model_name")).get("vocab")
    vocab = _int(row, "vocab", None if built is None else int(str(built)))
    model = ModelSpec(
        name=_cell(row, "model_name") or "model",
        layers=_int(row, "layers"), hidden=_int(row, "hidden"),
        ffn_hidden=ffn_hidden, heads=_int(row, "heads"),
        kv_heads=heads if mla else _int(row, "kv_heads", heads),
        vocab=vocab,
        ffn_type=(_cell(row, "ffn_type") or "swiglu"),  # type: ignore[arg-type]
        tied_embeddings=_bool(row, "tied_embeddings"),
        moe_experts=_int(row, "moe_experts", 0), moe_topk=_int(row, "moe_topk", 0),
        moe_ffn_hidden=_int(row, "moe_ffn_hidden", 0),
        moe_shared_experts=_int(row, "moe_shared_experts", 0),
        mla=mla, head_dim=mla.v_head_dim if mla else _int(row, "head_dim", 0),
        bias=_cell(row, "bias") or "none",  # type: ignore[arg-type]
        sliding_window=_int(row, "sliding_window", 0),
        # optional model-feature columns (README: "Optional model columns"); empty = off
        moe_dense_layers=_int(row, "dense_layers", 0),
        moe_layer_freq=_int(row, "moe_layer_freq", 1),
        attention_chunk=_int(row, "attention_chunk", 0),
        window_skip_freq=_int(row, "window_skip_freq", 0),
        attention_sinks=_bool(row, "attention_sinks"), qk_norm=_bool(row, "qk_norm"),
        swiglu_limit=_number(row, "swiglu_limit"),
    )
    gpu = get_gpu(_cell(row, "gpu"))
    try:
        cluster = cluster_spec(gpu, _int(row, "num_gpus"), _int(row, "gpus_per_node", 8),
                               row_fabric(row))
    except CatalogError as e:
        raise CaseError(f"fabric: {e}") from None
    precision = _cell(row, "precision") or "bf16"
    try:
        gpu.check_precision(precision)
    except SpecError as e:
        raise CaseError(f"precision: {str(e).removeprefix('training.precision: ')}") from None
    # what the framework's recipes, and the release the row names, ran where a cell is empty
    source, detail, name = _cell(row, "source"), _cell(row, "source_detail"), model.name
    defaults = row_defaults(framework, precision, source, detail, name)
    # a release whose recipe counts the embedding and the loss as layers (Megatron's
    # account_for_*_in_pipeline_split) splits as a row with those cells does, unless it gives one
    counted = {k: defaults.pop(k) for k in SPLIT_COLUMNS[2:] if k in defaults}
    if counted and not any(_cell(row, k) for k in SPLIT_COLUMNS):
        row = {**row, **{k: str(v).lower() for k, v in counted.items()}}
    # plan fields a framework's recipes or a row's release set (row_defaults, release_switches
    # in frameworks.yaml); the rest are Training's, the MoE dispatch too (a release's switch,
    # which a plan of its own may override)
    knobs = {k: defaults.pop(k) for k in PLAN_KEYS if k in defaults and k not in TRAINING_OWN}
    split_rule = str(defaults.pop("pp_micro_batches", ""))
    own: dict[str, Any] = {k: kind(defaults.pop(k)) for k, kind in MODEL_OWN.items()
                           if k in defaults}
    model = with_release_model(model, row, own)
    training = training_spec(framework=framework, precision=precision,
                             seq_len=_int(row, "seq_len"), global_batch=_int(row, "global_batch"),
                             compile=_bool(row, "compile"), switches=defaults)
    # a knob the row's release ran (its recompute, its split) is given as a cell is: predict
    # does not search it; the framework's row_defaults only fill the plan
    given = {k for k in KNOBS if _cell(row, k) or k in release_switches(source, detail, name)}
    if any(_cell(row, k) for k in SPLIT_COLUMNS):
        given |= {"first_stage_layers", "last_stage_layers"}
    if "recompute" in given:  # a stated mode recomputes what it says: "full" is every layer
        given.add("recompute_layers")
    plan, ran = launched_zero(row_plan(row, model.layers, knobs), training)
    plan, split = (launched_micro_batch(plan, training, split_rule) if "micro_batch" not in given
                   else (plan, ""))
    if calibration is not None:
        cluster = anchored(cluster, calibration)
    return Case(model=model, cluster=cluster, plan=plan, training=training,
                given=frozenset(given | ({"micro_batch"} if split else set())),
                framework=framework, assumed=tuple(a for a in (erratum, assumed, ran, split) if a))


def launched_micro_batch(plan: Plan, training: Training, rule: str) -> tuple[Plan, str]:
    """The micro-batch a launcher runs under a pipeline where the row gives none: ``rule`` "pp"
    (``row_defaults``' ``pp_micro_batches``) splits each DP rank's batch into one micro-batch
    per pipeline stage; the note says so (``pred_assumed``)."""
    per_rank, rest = divmod(training.global_batch, plan.dp)
    if rule != "pp" or plan.pp == 1 or rest or per_rank % plan.pp:
        return plan, ""
    mb = per_rank // plan.pp
    return replace(plan, micro_batch=mb), (
        f"micro_batch={mb} (this launcher splits a DP rank's batch into as many micro-batches "
        "as pipeline stages unless told)")


def launched_zero(plan: Plan, training: Training) -> tuple[Plan, str]:
    """The ZeRO stage a row's launch ran: fully sharded under a pipeline, a stack whose FSDP
    keeps parameters gathered there by default (``fsdp_pp_keeps_gathered``) ran ZeRO-1's memory
    and traffic; the note says so (``pred_assumed``)."""
    if not (plan.zero_stage == 3 and plan.pp > 1 and training.framework.dp.fsdp_pp_keeps_gathered):
        return plan, ""
    return replace(plan, zero_stage=1), (
        "zero_stage=1 (fully sharded under a pipeline, this stack's FSDP keeps parameters "
        "gathered from forward to backward and whole gradients to the last micro-batch)")


def with_training(case: Case, **changes: object) -> Case:
    """The case with some framework switches (flat names) or its memory model changed."""
    return replace(case, training=case.training.with_switches(**changes))
