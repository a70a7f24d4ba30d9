"""What the validity rules (``costmodel.rules``) read besides the plan: the model's, the run's and
the cluster's sizes, and what the framework (from its profile) or the study allows."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from costmodel.framework import FrameworkProfile
from costmodel.graphs import graph_facts
from costmodel.specs import ClusterSpec, ModelSpec, Training

__all__ = ["FRAMEWORK_FACTS", "Facts", "Switches", "facts_of", "framework_facts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Switches:
    """What the framework (or the study) allows. The defaults are what the cost model prices.

    uneven_pipeline: the first/last pipeline stages may hold other layer counts than the rest
        (Megatron-LM's ``--decoder-first/last-pipeline-num-layers``), and, with neither pinned,
        a layer count that pp does not divide goes to the first stages (nanotron); off, layers
        must split evenly. The search's study switch: the CP-SAT stage places the ends later.
    uneven_chunks: with pinned first/last stages, any split makes vpp chunks (torchtitan's
        per-stage module lists, Megatron-LM's ``--pipeline-model-parallel-layout``). Off: only
        the splits Megatron-LM's first/last stage flags or its ``account_for_*_in_pipeline_split``
        switches build (:func:`costmodel.mapping.launchable_chunks`). An even split (nothing
        pinned) needs ``layers % (pp * vpp) == 0`` either way, as
        ``--num-layers-per-virtual-pipeline-stage`` requires.
    tp_in_node: tensor parallelism stays inside one NVLink domain (a study switch).
    split_later: the first/last stage layers are chosen after the rules run (the search's
        CP-SAT stage): an interleaved layout with no split yet holds when some split Megatron-LM
        launches exists (:func:`costmodel.mapping.chunk_split_exists`, any split under
        uneven_chunks; needs uneven_pipeline).
    canonical: generate one plan of a set the cost model cannot tell apart (the search):
        ZeRO with no data-parallel rank to shard over is ZeRO-0, GPipe without a pipeline is
        1F1B. Not a validity rule: such plans run.
    recompute_per_chunk: a partial full-recompute count is per model chunk, so with vpp chunks
        per rank a stage recomputes a multiple of vpp layers (Megatron-LM's
        ``--recompute-num-layers``; a framework profile's switch, ``FrameworkProfile``).
    microbatch_groups: the interleaved schedule runs micro-batches in groups of pp, so their
        count per step is a multiple of pp (Megatron-Core's ``microbatch_group_size_per_vp_stage``
        defaults to pp; a framework profile's switch, ``FrameworkProfile``).
    moe_tp_sequence_parallel: a model with MoE layers trains with tp > 1 only under sequence
        parallelism (Megatron-Core's ``MoELayer.forward``; a framework profile's switch,
        ``FrameworkProfile``).
    """

    uneven_pipeline: bool = True
    uneven_chunks: bool = True
    tp_in_node: bool = False
    split_later: bool = False
    canonical: bool = False
    recompute_per_chunk: bool = False
    microbatch_groups: bool = False
    moe_tp_sequence_parallel: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What the rules read besides the plan."""

    layers: int
    heads: int
    kv_heads: int
    experts: int
    seq_len: int
    global_batch: int
    num_gpus: int
    nvlink_domain: int
    switches: Switches = field(default_factory=Switches)
    # what the framework runs beside MoE layers (its profile's ``moe.moe_max_zero_stage`` and
    # ``moe.moe_tensor_parallel``)
    moe_max_zero_stage: int = 3
    moe_tensor_parallel: bool = True
    moe_layers: int = 0  # the CUDA-graph rule's facts (costmodel.graphs.graph_facts)
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    moe_pad_to_capacity: bool = False
    moe_a2a_overlap: bool = False
    # multi-token prediction depths, and whether the framework builds them
    # (its profile's ``multi_token_prediction``)
    mtp_layers: int = 0
    multi_token_prediction: bool = True
    # what the framework runs at all (its profile's ``dp.zero_stages[_pp]``,
    # ``activations.recompute_modes``, ``activations.partial_recompute``, ``pp.pp_schedules``)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    zero_stages_pp: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    partial_recompute: bool = True
    pp_schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
    # what selective recompute is (``training.framework.activations.selective_recompute``;
    # "modules": Megatron-Core's
    # --recompute-modules, which a plan may name), and whether the model's attention is MLA
    selective_recompute: str = "activation"
    mla: bool = False
    # activation offloading: whether the framework offloads
    # (``training.framework.activations.cpu_offloading``) and
    # the GPU has a catalogued host link and host memory to offload to
    cpu_offloading: bool = False
    host_link: bool = False

    def values(self) -> dict[str, object]:
        """Every fact and switch by name (tuples as lists), as a rule's text quotes them."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "switches"}
        both = {**own, **{f.name: getattr(self.switches, f.name) for f in fields(Switches)}}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in both.items()}


def facts_of(model: ModelSpec, cluster: ClusterSpec, training: Training,
             switches: Switches | None = None) -> Facts:
    """The facts of a model on a cluster; the framework's own switches (``recompute_per_chunk``,
    ``microbatch_groups``, ``moe_tp_sequence_parallel``: a profile's) are the training's."""
    fw = training.framework
    switches = replace(switches or Switches(),
                       recompute_per_chunk=fw.activations.recompute_per_chunk,
                       microbatch_groups=fw.pp.microbatch_groups,
                       moe_tp_sequence_parallel=fw.moe.moe_tp_sequence_parallel)
    return Facts(layers=model.layers, heads=model.heads, kv_heads=model.kv_heads,
                 experts=model.moe_experts, seq_len=training.seq_len,
                 global_batch=training.global_batch, num_gpus=cluster.num_gpus,
                 nvlink_domain=cluster.nvlink_domain, switches=switches,
                 mtp_layers=model.mtp_layers, mla=model.mla is not None,
                 host_link=cluster.gpu.host_link_bw_bytes_per_s > 0
                 and cluster.gpu.host_memory_bytes > 0,
                 **framework_facts(training.framework),
                 **graph_facts(model, training))


# what a framework builds and implements at all, as its profile holds them (rules moe_*,
# mtp, framework_*)
FRAMEWORK_FACTS = ("moe_max_zero_stage", "moe_tensor_parallel", "multi_token_prediction",
                   "zero_stages", "zero_stages_pp", "recompute_modes", "partial_recompute",
                   "pp_schedules", "selective_recompute", "cpu_offloading")


def framework_facts(profile: FrameworkProfile) -> dict[str, Any]:
    return {name: profile.switch(name) for name in FRAMEWORK_FACTS}
