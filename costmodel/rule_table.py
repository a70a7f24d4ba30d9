"""The rules table's machinery, below the plan: a :class:`Rule` (name, the plan columns and facts
it reads, its text, its predicate over numpy columns), what rules read besides the plan
(:class:`Facts`, :class:`Switches`; ``costmodel.rule_facts`` finds them for a model, cluster and
training), the schedule a plan runs, and
the rules that read the plan alone, which ``Plan`` checks as it is built. The table
itself, with every rule that reads facts, is :mod:`costmodel.rules`; these rows are its rows,
written here once so that ``Plan`` needs nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.plan_fields import SCHEDULE_CODES
from costmodel.recompute_modules import mask_modules

# numpy columns (the search's layouts), or one plan's plain ints: the predicates read both
Columns = Mapping[str, Any]
INTERLEAVED, GPIPE = SCHEDULE_CODES["interleaved"], SCHEDULE_CODES["gpipe"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Switches:
    """What the framework (or the study) allows. The defaults are what the cost model prices.

    uneven_pipeline: the first/last pipeline stages may hold other layer counts than the rest
        (Megatron-LM's ``--decoder-first/last-pipeline-num-layers``), and, with neither pinned,
        a layer count that pp does not divide goes to the first stages (nanotron); off, layers
        must split evenly. The search's study switch: the CP-SAT stage places the ends later.
    uneven_chunks: the launcher takes an explicit per-rank, per-chunk layout (torchtitan's
        per-stage module lists, Megatron-LM's ``--pipeline-model-parallel-layout``): with
        pinned first/last stages, any split makes vpp chunks, and the other ranks may hold
        shares a layer apart (:func:`costmodel.mapping.ranks_of`). Off: only
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
    moe_layers: int = 0  # the CUDA-graph rule's facts (costmodel.rule_facts.graph_facts)
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    moe_pad_to_capacity: bool = False
    # the training's MoE dispatch (rules moe_dispatch, moe_flex, moe_a2a_overlap, cuda_graphs),
    # and what the framework's launcher offers a plan (its profile's moe_dispatchers,
    # moe_a2a_overlaps)
    moe_dispatcher: str = "alltoall"
    moe_a2a_overlap: bool = False
    moe_shared_expert_overlap: bool = False
    moe_dispatchers: tuple[str, ...] = ()
    moe_a2a_overlaps: tuple[bool, ...] = ()
    # MoE experts with biases (bias "all" on a MoE model), which Megatron-Core trains only at
    # expert TP 1 (rule moe_bias)
    expert_bias: bool = False
    # Adam's moments below fp32 beside fp32 master weights: Megatron-Core's precision-aware
    # optimizer, which only its distributed optimizer runs (rule precision_aware_optimizer)
    low_precision_moments: bool = False
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
    # the framework places its pipeline blocks by cost itself (nanotron's build_model,
    # ``pp.pp_cost_balance``): ranks past the last block hold nothing, so pp may exceed layers
    pp_cost_balance: bool = False
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


def schedule_code(pp_schedule: ArrayLike, vpp: ArrayLike) -> np.ndarray:
    """The schedule a plan runs: interleaved 1F1B iff vpp > 1 (Narayanan et al., SC21, sec.
    2.2), else the one it names. The one place that derives it."""
    return np.where(np.asarray(vpp) > 1, INTERLEAVED, pp_schedule)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    reads: tuple[str, ...]  # plan columns
    facts: tuple[str, ...]  # Facts.values() keys, quoted when the rule breaks
    text: str  # the rule as a reader would write it
    holds: Callable[[Columns, Facts], np.ndarray]

    def message(self, cols: Columns, f: Facts, row: int = 0) -> str:
        values = [f"{k}={_shown(k, int(np.asarray(cols[k]).reshape(-1)[row]))}"
                  for k in self.reads]
        known = f.values() if self.facts else {}
        values += [f"{k}={known[k]}" for k in self.facts]
        return f"{self.name}: {self.text} must hold, but got {', '.join(values)}"


def _shown(column: str, value: int) -> str:
    """A plan column as a refusal quotes it: a module set (a bitmask here) by its names."""
    if column == "recompute_modules":
        return "+".join(mask_modules(value)) or "the training's"
    return str(value)


def holds_for(rule: Rule, cols: Columns, f: Facts) -> bool:
    """Whether one plan's columns keep ``rule``."""
    return bool(np.asarray(rule.holds(cols, f)).reshape(-1)[0])


# The rules that read nothing but the plan: Plan.__post_init__ checks them, the table
# (costmodel.rules.RULES) holds them in its order.
OWN: tuple[Rule, ...] = (
    Rule("sp_tp", ("sequence_parallel", "tp"), (), "not sequence_parallel or tp > 1",
         lambda c, f: (c["sequence_parallel"] == 0) | (c["tp"] > 1)),
)
