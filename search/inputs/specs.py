"""User text as cost-model inputs, resolved once: a study (``build_specs``), a plan file
(``plan_file_specs``) or a measured row (``search.inputs.measured``, through ``training_spec`` and
``cluster_spec``) becomes the model, the cluster (GPU, fabric) and the training setup with its
framework profile. Commands receive these specs; they never rebuild them."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from costmodel.layer_style import MoeRouter, RopeScaling
from costmodel.mla import MlaSpec
from costmodel.recompute_modules import module_conflict
from costmodel.rules import Switches
from costmodel.specs import ClusterSpec, GpuSpec, ModelSpec, SpecError, Training
from hardware_catalog import (
    CatalogError,
    fabric_fraction,
    fabric_step_latency,
    fabric_topology,
    get_gpu,
    with_overrides,
)
from hardware_catalog.frameworks import (
    framework_profile,
    is_megatron_core,
    megatron_core_profiles,
)
from search.inputs import links
from search.inputs.hf_config import HfConfigError, load_hf_config
from search.inputs.planfile import PlanFile, PlanFileError
from search.inputs.plausible import model_shape, override_warnings
from search.inputs.presets import get_preset
from search.inputs.study import MAX_LAYERS, ClusterSection, Study, StudyError

LOG = logging.getLogger("tcf_search")


def build_model(study: Study) -> ModelSpec:
    section = study.model
    try:
        if section.preset is not None:
            spec = get_preset(section.preset)
        elif section.hf_config is not None:
            spec = load_hf_config(study.base_dir / section.hf_config)
        else:
            arch = section.architecture
            assert arch is not None
            moe = arch.moe
            spec = ModelSpec(
                name=section.name or study.name or "model", layers=arch.layers,
                hidden=arch.hidden, ffn_hidden=arch.ffn_hidden, heads=arch.heads,
                # MLA: every head has its own up-projected key and value
                kv_heads=(arch.kv_heads if arch.kv_heads and not arch.mla else arch.heads),
                vocab=arch.vocab,
                head_dim=arch.head_dim or (arch.mla.v_head_dim if arch.mla else 0),
                ffn_type=arch.ffn_type, tied_embeddings=arch.tied_embeddings,
                norm=arch.norm, position_embedding=arch.position_embedding,
                rope_base=arch.rope_base, bias=arch.bias,
                rope_scaling=(RopeScaling(**arch.rope_scaling.model_dump())
                              if arch.rope_scaling else None),
                moe_experts=moe.experts if moe else 0, moe_topk=moe.topk if moe else 0,
                moe_ffn_hidden=moe.ffn_hidden if moe else 0,
                moe_shared_experts=moe.shared_experts if moe else 0,
                moe_dense_layers=moe.dense_layers if moe else 0,
                moe_layer_freq=moe.layer_freq if moe else 1,
                moe_router=(MoeRouter(**moe.router.model_dump()) if moe and moe.router
                            else None),
                mla=MlaSpec(**arch.mla.model_dump()) if arch.mla else None,
                sliding_window=arch.sliding_window, attention_chunk=arch.attention_chunk,
                window_skip_freq=arch.window_skip_freq, attention_sinks=arch.attention_sinks,
                qk_norm=arch.qk_norm, mtp_layers=arch.mtp_layers,
                swiglu_limit=arch.swiglu_limit)
    except HfConfigError as exc:
        raise StudyError(f"model.hf_config: {exc}") from None
    except SpecError as exc:
        raise StudyError(f"model.architecture: {exc}") from None
    if spec.layers > MAX_LAYERS:
        raise StudyError(f"model: layers <= {MAX_LAYERS} must hold (got {spec.layers})")
    if section.name and spec.name != section.name:
        spec = dataclasses.replace(spec, name=section.name)
    return spec


def build_gpu(section: ClusterSection) -> GpuSpec:
    if section.gpu_spec is not None:
        fields = {"id": section.gpu, **section.gpu_spec}
        fields.pop("efficiency", None)
        try:
            gpu = GpuSpec(**fields)
        except TypeError as exc:
            raise StudyError(f"cluster.gpu_spec: {exc} (valid: "
                             f"{', '.join(f.name for f in dataclasses.fields(GpuSpec))})") from None
        except SpecError as exc:
            raise StudyError(f"cluster.gpu_spec: {exc}") from None
        efficiency = section.gpu_spec.get("efficiency")
        overrides = {**section.overrides, **({"efficiency": efficiency} if efficiency else {})}
    else:
        try:
            gpu = get_gpu(section.gpu)
        except CatalogError as exc:
            raise StudyError(f"cluster.gpu: {exc}") from None
        overrides = dict(section.overrides)
    if not overrides:
        return gpu
    try:
        return with_overrides(gpu, overrides)
    except CatalogError as exc:
        raise StudyError(f"cluster.overrides: {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Specs:
    """What the cost model needs from a study."""

    model: ModelSpec
    cluster: ClusterSpec
    training: Training
    headroom_gib: float = 0.0  # memory kept free per GPU (objective.memory_headroom_*)
    # what the validity rules allow (costmodel.rules): the study's search switches, or, for a
    # plan file, what the cost model prices
    switches: Switches = dataclasses.field(default_factory=Switches)
    framework: str = ""  # the profile's name ("" where not recorded): its residuals' stack
    # the cluster calibration file its links were measured in ("" = none; an absolute path)
    calibration: str = ""
    # whether the study named it by a relative path: its plan files then name it relative to
    # themselves, so a result folder moved with its calibration file still finds it
    calibration_relative: bool = False


def search_switches(*, uneven_pipeline: bool, tp_in_node: bool, split_later: bool = False,
                    recompute_per_chunk: bool = False, microbatch_groups: bool = False,
                    moe_tp_sequence_parallel: bool = False,
                    uneven_chunks: bool = False) -> Switches:
    """The rules' switches in a search: the study's, the chunks the framework launches (its
    profile's ``uneven_chunks``: any split where it takes an explicit per-stage layout, else
    those Megatron-LM's first/last flags build), and one plan of each set the model cannot tell
    apart. ``split_later``: the space's own rules, before the CP-SAT stage pins the first/last
    stages (a plan, as explain reads it, has its split already)."""
    return Switches(uneven_pipeline=uneven_pipeline, uneven_chunks=uneven_chunks,
                    tp_in_node=tp_in_node,
                    split_later=split_later and uneven_pipeline, canonical=True,
                    recompute_per_chunk=recompute_per_chunk, microbatch_groups=microbatch_groups,
                    moe_tp_sequence_parallel=moe_tp_sequence_parallel)


def cluster_spec(gpu: GpuSpec, num_gpus: int, gpus_per_node: int, fabric: str,
                 rail_group_nodes: int | None = None,
                 oversubscription: float | None = None) -> ClusterSpec:
    """The cluster, with its fabric's network efficiency and topology when the fabric is named;
    a study's own rail groups and oversubscription win over the fabric's."""
    rails, over = fabric_topology(fabric)
    return ClusterSpec(gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node, fabric=fabric,
                       network_bw_fraction=fabric_fraction(fabric),
                       network_step_latency_s=fabric_step_latency(fabric),
                       rail_group_nodes=rails if rail_group_nodes is None else rail_group_nodes,
                       oversubscription=over if oversubscription is None else oversubscription)


def training_spec(*, framework: str, precision: str, seq_len: int, global_batch: int,
                  optimizer: str = "adam", compile: bool = False,
                  switches: Mapping[str, Any] | None = None) -> Training:
    """The training setup a framework runs: its profile's switches at this precision, then the
    switches given explicitly, then what ``torch.compile`` fuses. The one place a framework name
    becomes a :class:`Training` (a study, a measured row)."""
    given: dict[str, Any] = dict(switches or {})
    if compile:  # torch.compile fuses the norms, RoPE and activations a framework runs eagerly
        given["fused_elementwise"] = True
    return Training(seq_len=seq_len, global_batch=global_batch,
                    precision=precision, optimizer=optimizer,  # type: ignore[arg-type]
                    framework=framework_profile(framework, precision, given))


# Megatron-Core's MoE dispatch switches a study may give (training.<name>)
MOE_SWITCHES = ("moe_dispatcher", "moe_a2a_overlap", "moe_permute_fusion", "moe_router_fusion",
                "moe_shared_expert_overlap", "moe_pad_to_capacity")
MEGATRON_FLAGS = {"moe_dispatcher": "--moe-token-dispatcher-type",
                  "moe_a2a_overlap": "--overlap-moe-expert-parallel-comm",
                  "moe_pad_to_capacity": "--moe-pad-expert-input-to-capacity",
                  "adam_moments_in_bf16": "--use-precision-aware-optimizer",
                  "cross_entropy_fusion_impl": "--cross-entropy-fusion-impl"}
# the loss kernel a study's cross_entropy_fusion_impl runs (costmodel.framework.Kernels)
LOSS_KERNELS = {"native": "native", "te": "te_inplace"}


def build_specs(study: Study) -> Specs:
    t = study.training
    switches: dict[str, Any] = {k: getattr(t, k) for k in (
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "flash_attention",
        "fp8_param_gather", "rank_order", "expandable_segments", *MOE_SWITCHES)
        if getattr(t, k) is not None}
    if t.grad_reduce_in_bf16 is not None:
        switches["grad_dtype_bytes"] = 2 if t.grad_reduce_in_bf16 else 4
    if t.adam_moments_in_bf16 is not None:
        switches["optimizer_state_bytes"] = 2 if t.adam_moments_in_bf16 else 4
    if t.recompute_modules is not None:
        switches["recompute_modules"] = tuple(t.recompute_modules)
    if t.cross_entropy_fusion_impl is not None:
        switches["loss_kernel"] = LOSS_KERNELS[t.cross_entropy_fusion_impl]
    try:
        training = training_spec(framework=t.framework, precision=t.precision, seq_len=t.seq_len,
                                 global_batch=t.sequences, optimizer=t.optimizer,
                                 compile=bool(t.compile), switches=switches)
        cluster = cluster_spec(build_gpu(study.cluster), study.cluster.num_gpus,
                               study.cluster.gpus_per_node, study.cluster.fabric or "",
                               study.cluster.rail_group_nodes, study.cluster.oversubscription)
        calibration, relative = "", False
        if study.cluster.calibration is not None:
            calibration = str((study.base_dir / study.cluster.calibration).resolve())
            relative = not Path(study.cluster.calibration).is_absolute()
            cluster = links.anchored(cluster, _calibration(study))
        cluster.gpu.check_precision(training.precision)
    except SpecError as exc:
        raise StudyError(f"study: {exc}") from None
    model = build_model(study)
    source = next(k for k in ("preset", "architecture", "hf_config")
                  if getattr(study.model, k) is not None)
    for line in (model_shape(model, t.framework, f"model.{source}")
                 + override_warnings(study.cluster.overrides)):
        LOG.warning("warning: %s", line)
    if t.recompute_modules is not None:
        _check_modules(model, training, t.framework)
    if (searched := study.search_space.recompute_modules) is not None:
        _check_modules(model, training, t.framework, "search_space.recompute_modules",
                       () if searched == "auto" else searched)
    if t.adam_moments_in_bf16 and t.optimizer != "adam":
        raise StudyError(f"training.adam_moments_in_bf16: Megatron-Core's precision-aware "
                         f"optimizer is Adam's (optimizer_config.py), but got optimizer "
                         f"{t.optimizer!r}")
    for field in ("grad_reduce_in_bf16", "fp8_param_gather", "adam_moments_in_bf16",
                  "cross_entropy_fusion_impl", *MOE_SWITCHES):
        if getattr(t, field) is not None and not is_megatron_core(t.framework):
            raise StudyError(f"training.{field}: " + _not_megatron_core(
                MEGATRON_FLAGS.get(field, f"--{field.replace('_', '-')}"), t.framework))
    o = study.objective
    headroom = (o.memory_headroom_gib if o.memory_headroom_gib is not None
                else o.memory_headroom_fraction * cluster.gpu.usable_bytes / 2**30)
    section = study.search_space
    fw = training.framework
    return Specs(model=model, cluster=cluster, training=training,
                 headroom_gib=headroom, framework=t.framework, calibration=calibration,
                 calibration_relative=relative,
                 switches=search_switches(uneven_pipeline=section.uneven_pipeline,
                                          tp_in_node=section.tp_in_node,
                                          recompute_per_chunk=fw.activations.recompute_per_chunk,
                                          microbatch_groups=fw.pp.microbatch_groups,
                                          moe_tp_sequence_parallel=(
                                              fw.moe.moe_tp_sequence_parallel),
                                          uneven_chunks=fw.pp.uneven_chunks))


def _calibration(study: Study) -> links.ClusterCalibration:
    path = study.base_dir / str(study.cluster.calibration)
    try:
        return links.load_calibration(path)
    except links.CalibrationError as exc:
        raise StudyError(f"cluster.calibration: {exc}") from None


def anchor_specs(specs: Specs, path: Path | None) -> Specs:
    """``specs`` with the cluster priced on the calibration file ``path`` (``--calibration``, or
    a plan file's ``cluster.calibration``); unchanged when None."""
    if path is None:
        return specs
    cluster = links.anchored(specs.cluster, links.load_calibration(path))
    return dataclasses.replace(specs, cluster=cluster, calibration=str(path.resolve()),
                               calibration_relative=not path.is_absolute())


def with_calibration(study: Study, path: Path | None) -> Study:
    """``study`` anchored on the calibration file ``path`` (``--calibration``, relative to the
    working folder), in place of its own ``cluster.calibration``; unchanged when None. A
    relative path stays relative, to the study's folder as ``cluster.calibration`` is."""
    if path is None:
        return study
    named = (str(path) if path.is_absolute()
             else os.path.relpath(path.resolve(), study.base_dir.resolve()))
    cluster = study.cluster.model_copy(update={"calibration": named})
    return study.model_copy(update={"cluster": cluster})


def _not_megatron_core(flag: str, framework: str) -> str:
    return (f"Megatron-Core's switch (Megatron-LM's {flag}; the "
            f"{', '.join(megatron_core_profiles())} profiles), which the {framework!r} profile "
            "does not take")


def _check_modules(model: ModelSpec, training: Training, framework: str,
                   where: str = "training.recompute_modules",
                   sets: tuple[tuple[str, ...], ...] | None = None) -> None:
    """A study's recompute_modules (``where``; the searched ``sets``, default the training's):
    Megatron-Core's, so a profile whose selective recompute is by module, and modules
    Megatron-Core's TransformerConfig accepts on the model."""
    own = training.framework.activations
    if not is_megatron_core(framework) or own.selective_recompute != "modules":
        raise StudyError(f"{where}: " + _not_megatron_core("--recompute-modules", framework))
    for modules in (own.recompute_modules,) if sets is None else sets:
        if why := module_conflict(modules, mla=model.mla is not None, moe=model.is_moe):
            raise StudyError(f"{where}: {why}")


def plan_file_specs(pf: PlanFile, gpu: GpuSpec | None = None) -> Specs:
    """The specs a plan file records: the GPU by its catalog id (or ``gpu``, e.g. a refitted
    one), its cluster and fabric, its model and training as written."""
    if gpu is None:
        try:
            gpu = get_gpu(pf.gpu)
        except CatalogError as exc:
            raise PlanFileError(f"cluster.gpu: {exc} (a study with gpu_spec needs the study "
                                f"file: pass STUDY.yaml with --result)") from None
    try:
        cluster = cluster_spec(gpu, pf.num_gpus, pf.gpus_per_node, pf.fabric,
                               pf.rail_group_nodes, pf.oversubscription)
    except CatalogError as exc:
        raise PlanFileError(f"cluster.fabric: {exc}") from None
    try:
        gpu.check_precision(pf.training.precision)
    except SpecError as exc:
        raise PlanFileError(str(exc)) from None
    specs = Specs(model=pf.model, cluster=cluster, training=pf.training, framework=pf.framework)
    try:
        return anchor_specs(specs, Path(pf.calibration) if pf.calibration else None)
    except links.CalibrationError as exc:
        raise PlanFileError(f"cluster.calibration: {exc}") from None
