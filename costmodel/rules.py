"""Validity rules, written once: what divides what, and what a framework allows.

One table (:data:`RULES`): each rule has a name, the plan columns it reads, the facts it reads
(model, run and cluster sizes, framework switches), its text as a reader would write it, and a
predicate over numpy columns. The search applies the predicates to every layout at once; one
plan is a row of plain ints (:func:`plan_columns`) for ``check_plan``, ``Plan``,
explain, the exporters and the validation harness. A framework's difference is a field of
:class:`Switches`, never an ``if`` in a caller.

Validity is arithmetic, not feasibility: nothing here asks whether a plan fits in memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from costmodel.dispatch import a2a_overlap_rule, dispatch_rule, dispatched_overlap, flex_rule
from costmodel.errors import SpecError
from costmodel.graphs import graphs_allowed
from costmodel.mapping import chunk_split_exists, expert_groups, launchable_chunks, rank_split
from costmodel.plan_fields import PLAN_KEYS, RECOMPUTE_CODES, SCHEDULE_CODES
from costmodel.recompute_modules import BITS, MLA_UP_PROJ, MOE_ACT
from costmodel.rule_facts import facts_of
from costmodel.rule_table import (
    GPIPE,
    INTERLEAVED,
    OWN,
    Columns,
    Facts,
    Rule,
    Switches,
    holds_for,
    schedule_code,
)
from costmodel.specs import Plan, plan_columns

__all__ = ["RULES", "BY_NAME", "Facts", "Rule", "Switches", "facts_of", "plan_columns"]

# Plan columns the rules read: every field of costmodel.plan_fields. The first/last stage
# layers are 0 (an even split) until the search's CP-SAT stage places them.
PLAN_COLUMNS: tuple[str, ...] = PLAN_KEYS
FULL, SELECTIVE = RECOMPUTE_CODES["full"], RECOMPUTE_CODES["selective"]


def _pipeline_split(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-LM's uneven pipeline (megatron/core/transformer/transformer_config.py,
    ``__post_init__``, "Uneven PP"): pinned stages hold >= 1 layer and the rest split evenly
    over the other stages, which all hold >= 1 (or there are none and nothing is left); where
    the framework takes a per-rank layout (``uneven_chunks``: Megatron-Core's
    ``--pipeline-model-parallel-layout``), the rest may split into shares a layer apart
    (:func:`costmodel.mapping.ranks_of`)."""
    pp, first, last = c["pp"], c["first_stage_layers"], c["last_stage_layers"]
    pinned = (first > 0) | (last > 0)
    # nanotron's cost balance (pp_cost_balance) leaves the ranks past its last block empty: a
    # pp above the layers runs there (src/nanotron/models/base.py build_model)
    unpinned_ok = (((pp <= f.layers) | f.pp_cost_balance)
                   & ((f.layers % pp == 0) | f.switches.uneven_pipeline))
    _, whole = rank_split(f.layers, pp, first, last, f.switches.uneven_chunks)
    return np.where(pinned, (pp > 1) & f.switches.uneven_pipeline & whole, unpinned_ok)


def _whole_chunks(c: Columns, f: Facts) -> np.ndarray:
    """Every pipeline stage's layers make vpp chunks Megatron-LM builds with its own flags
    (:func:`costmodel.mapping.launchable_chunks`: an even split, the first/last stage flags, or
    the embedding and the loss counted as layers). ``uneven_chunks`` lifts it for a pinned
    split; ``split_later`` (the search) asks only that some such split exist."""
    pp, vpp = c["pp"], c["vpp"]
    first, last = c["first_stage_layers"], c["last_stage_layers"]
    pinned = (first > 0) | (last > 0)
    ok = launchable_chunks(f.layers, pp, vpp, first, last)
    ok = ok | (pinned & f.switches.uneven_chunks)
    later = (chunk_split_exists(f.layers, pp, vpp, f.switches.uneven_chunks)
             & f.switches.uneven_pipeline)
    ok = ok | (~pinned & f.switches.split_later & later)
    return (vpp == 1) | ((pp > 1) & ok)


def _schedule(c: Columns, f: Facts) -> np.ndarray:
    s, vpp, pp = c["pp_schedule"], c["vpp"], c["pp"]
    gpipe_ok = (vpp == 1) & ((pp > 1) | (not f.switches.canonical))
    return ((s != INTERLEAVED) | (vpp > 1)) & ((s != GPIPE) | gpipe_ok)


def _expert_tp(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-Core's MoE parallel folding (megatron/core/parallel_state.py,
    ``initialize_model_parallel``: the expert rank generator orders expert-TP, EP and expert-DP
    over each pipeline stage's ranks, so ``expert_tensor_parallel_size *
    expert_model_parallel_size`` must divide them)."""
    etp, ep, moe = c["expert_tp"], c["ep"], f.experts > 0
    stage = c["tp"] * c["cp"] * c["dp"]
    fills = moe & (stage % (ep * np.maximum(etp, 1)) == 0)
    # a given expert TP equal to the derived one is the same plan, written 0
    derived = expert_groups(c["tp"], c["cp"], c["dp"], ep, 0)[2]
    canonical = (not f.switches.canonical) | (etp != derived)
    return (etp == 0) | (fills & canonical)


def _zero_shards(c: Columns, f: Facts) -> np.ndarray:
    """ZeRO with no rank to shard over is ZeRO-0; the experts shard over their expert-DP
    replicas, which folding can give a plan with dp * cp == 1."""
    edp = expert_groups(c["tp"], c["cp"], c["dp"], c["ep"], c["expert_tp"])[1]
    shards = (c["dp"] * c["cp"] > 1) | ((f.experts > 0) & (edp > 1))
    return (c["zero_stage"] == 0) | shards | (not f.switches.canonical)


def _recompute_chunks(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-LM's full recompute counts layers per model chunk: each chunk is its own
    TransformerBlock, whose ``_checkpointed_forward`` (megatron/core/transformer/
    transformer_block.py, method "block") recomputes its first ``recompute_num_layers`` of
    ``len(self.layers)``, and one ``--recompute-num-layers`` serves every chunk. With vpp chunks
    a stage recomputes vpp times that count: a per-stage count that vpp does not divide cannot
    be asked for (Megatron has no assert for it: the flag takes per-chunk counts only). All of a
    stage's layers (recompute_layers 0, or >= the stage's) is the "uniform" method."""
    vpp, r = c["vpp"], c["recompute_layers"]
    whole = _recomputes_all(c, f) | (r % np.maximum(vpp, 1) == 0)
    return (c["recompute"] != FULL) | (vpp == 1) | whole | (not f.switches.recompute_per_chunk)


def _recomputes_all(c: Columns, f: Facts) -> np.ndarray:
    """Full recompute of every layer of each stage: recompute_layers 0, or at least the most
    any stage holds."""
    r = c["recompute_layers"]
    split, _ = rank_split(f.layers, c["pp"], c["first_stage_layers"], c["last_stage_layers"])
    pinned = (c["first_stage_layers"] > 0) | (c["last_stage_layers"] > 0)
    most = np.where(pinned, np.maximum(np.maximum(split.first, split.middle), split.last),
                    -(-f.layers // np.maximum(c["pp"], 1)))
    return (r == 0) | (r >= most)


def _framework_recompute(c: Columns, f: Facts) -> np.ndarray:
    modes = np.isin(c["recompute"], [RECOMPUTE_CODES[m] for m in f.recompute_modes])
    return modes & ((c["recompute"] != FULL) | f.partial_recompute | _recomputes_all(c, f))


def _recompute_modules(c: Columns, f: Facts) -> np.ndarray:
    """A plan's own selective modules (``recompute_modules``, a bitmask; 0: the training's) are
    Megatron-Core's ``--recompute-modules``, read under ``--recompute-granularity selective``
    only; its TransformerConfig refuses mla_up_proj without multi-latent attention and moe_act
    without MoE layers (``costmodel.recompute_modules.module_conflict``)."""
    mask = c["recompute_modules"]
    fits = (((mask & BITS[MLA_UP_PROJ]) == 0) | f.mla) & (((mask & BITS[MOE_ACT]) == 0)
                                                          | (f.experts > 0))
    own = (c["recompute"] == SELECTIVE) & (f.selective_recompute == "modules") & fits
    return (mask == 0) | own


def _cpu_offload(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-Core's activation offloading (TransformerConfig.__post_init__, Megatron-LM
    d98e8a64dd transformer_config.py): 0 <= cpu_offloading_num_layers < num_layers, no pipeline
    parallelism, no activation recompute, and CUDA graphs only of the full iteration."""
    n = c["cpu_offload_layers"]
    graphs_ok = (f.cuda_graph_impl == "none") | ("full_iteration" in f.cuda_graph_scope)
    allowed = f.cpu_offloading & f.host_link & graphs_ok
    return (n == 0) | (allowed & (n < f.layers) & (c["pp"] == 1) & (c["recompute"] == 0))


RULES: tuple[Rule, ...] = (
    Rule("world_size", ("tp", "pp", "cp", "dp"), ("num_gpus",),
         "tp * pp * cp * dp == num_gpus",
         lambda c, f: c["tp"] * c["pp"] * c["cp"] * c["dp"] == f.num_gpus),
    # Megatron-LM: heads and query groups split whole over TP ranks, or each KV head is
    # replicated over tp / kv_heads ranks (transformer_config.py, num_query_groups)
    Rule("tp_heads", ("tp",), ("heads", "kv_heads"),
         "heads % tp == 0 and kv_heads, tp divide one another",
         lambda c, f: (f.heads % c["tp"] == 0)
         & ((f.kv_heads % c["tp"] == 0) | (c["tp"] % f.kv_heads == 0))),
    Rule("tp_in_node", ("tp",), ("tp_in_node", "nvlink_domain"),
         "not tp_in_node or nvlink_domain % tp == 0 (TP inside one NVLink domain)",
         lambda c, f: (f.nvlink_domain % c["tp"] == 0) | (not f.switches.tp_in_node)),
    Rule("pp_layers", ("pp", "first_stage_layers", "last_stage_layers"),
         ("layers", "uneven_pipeline", "uneven_chunks", "pp_cost_balance"),
         "pp <= layers (unless pp_cost_balance), layers % pp == 0 unless uneven_pipeline, and "
         "pinned first/last stages (uneven_pipeline) leave the other stages an equal whole "
         "number >= 1 of layers (shares a layer apart under uneven_chunks, a per-rank layout)",
         _pipeline_split),
    Rule("vpp_layers", ("vpp", "pp", "first_stage_layers", "last_stage_layers"),
         ("layers", "uneven_chunks"),
         "vpp == 1, or pp > 1 and the stages' layers make vpp chunks a launcher builds: layers % "
         "(pp * vpp) == 0 for an even split; for a pinned split each stage's layers % vpp == 0, "
         "or the ends one layer short of the middle's c with c % vpp == 0 (the embedding and "
         "the loss counted as layers), unless uneven_chunks",
         _whole_chunks),
    # load-balanced causal context parallelism cuts each sequence into 2 * cp chunks
    # (megatron/training/arguments.py: seq_length % (context_parallel_size * 2) == 0)
    Rule("cp_seq", ("cp",), ("seq_len",), "seq_len % (2 * cp) == 0",
         lambda c, f: (c["cp"] == 1) | (f.seq_len % (2 * c["cp"]) == 0)),
    Rule("ep_experts", ("ep", "tp", "dp", "cp"), ("experts",),
         "ep == 1, or ep divides moe_experts and tp * dp * cp (EP spans data-parallel ranks, "
         "or folds over tensor-parallel ones with expert TP 1)",
         lambda c, f: (c["ep"] == 1) | ((f.experts % c["ep"] == 0) & (f.experts > 0)
                                        & ((c["tp"] * c["dp"] * c["cp"]) % c["ep"] == 0))),
    # what a framework refuses beside MoE layers (its profile's switches)
    Rule("moe_tp", ("tp",), ("experts", "moe_tensor_parallel"),
         "experts == 0 or tp == 1 or moe_tensor_parallel (the framework runs TP with MoE layers)",
         lambda c, f: (f.experts == 0) | (c["tp"] == 1) | f.moe_tensor_parallel),
    # Megatron-Core's MoELayer.forward raises ValueError in training when the attention's TP
    # group is > 1 without sequence parallelism (megatron/core/transformer/moe/moe_layer.py,
    # core_v0.14-0.19 and main), EP or not; model_parallel_config.py __post_init__ also refuses
    # ep > 1 with tp > 1 without it (ValueError up to core_v0.14, a warning since 0.15)
    Rule("moe_tp_sp", ("tp", "sequence_parallel"), ("experts", "moe_tp_sequence_parallel"),
         "experts == 0, tp == 1 or sequence_parallel, unless not moe_tp_sequence_parallel "
         "(the framework's MoE layers train under TP only with sequence parallelism)",
         lambda c, f: (f.experts == 0) | (c["tp"] == 1) | (c["sequence_parallel"] != 0)
         | (not f.switches.moe_tp_sequence_parallel)),
    Rule("moe_dispatch", ("moe_dispatcher", "moe_a2a_overlap"),
         ("experts", "moe_dispatcher", "moe_a2a_overlap", "moe_dispatchers", "moe_a2a_overlaps",
          "canonical"),
         "moe_dispatcher and moe_a2a_overlap are the training's (\"\"), or experts > 0 and the "
         "framework's launcher offers them (in moe_dispatchers, moe_a2a_overlaps; in a canonical "
         "space other than the training's moe_dispatcher, moe_a2a_overlap)",
         dispatch_rule),
    Rule("moe_flex", ("moe_dispatcher", "ep", "expert_tp", "tp", "dp", "cp"),
         ("moe_dispatcher", "moe_pad_to_capacity"),
         "the dispatcher run (the plan's, else the training's moe_dispatcher) is not flex, or "
         "not moe_pad_to_capacity, and a plan naming flex has ep * expert TP > 1 "
         "(Megatron-Core's flex dispatcher)",
         flex_rule),
    Rule("moe_a2a_overlap", ("moe_a2a_overlap", "moe_dispatcher", "ep", "recompute", "pp",
                             "vpp"),
         ("moe_a2a_overlap", "moe_dispatcher", "moe_shared_expert_overlap", "mtp_layers"),
         "the all-to-all overlap run (the plan's, else the training's moe_a2a_overlap) is off, "
         "or ep > 1, the dispatcher run is alltoall or flex, recompute != full (2), pp == 1 or "
         "vpp > 1, not moe_shared_expert_overlap, and mtp_layers == 0 or 1 with pp > 1 "
         "(Megatron-Core's --overlap-moe-expert-parallel-comm)",
         a2a_overlap_rule),
    # megatron/core/transformer/transformer_config.py __post_init__ (core_v0.16.1): "Bias in Moe
    # is only supported when ETP==1" (gpt-oss's experts have biases)
    Rule("moe_bias", ("expert_tp", "tp", "cp", "dp", "ep"), ("expert_bias",),
         "expert TP (given, or derived: tp, or 1 where ep does not divide dp * cp) == 1, "
         "unless not expert_bias (the experts' linear layers have biases)",
         lambda c, f: (not f.expert_bias)
         | (expert_groups(c["tp"], c["cp"], c["dp"], c["ep"], c["expert_tp"])[0] == 1)),
    # megatron/core/optimizer/optimizer_config.py (core_v0.16.0): "--use-precision-aware-optimizer
    # only supported with distributed optimizer"
    Rule("precision_aware_optimizer", ("zero_stage",), ("low_precision_moments",),
         "zero_stage >= 1 (the distributed optimizer or Megatron-FSDP), unless not "
         "low_precision_moments (Adam's moments below fp32 beside fp32 master weights)",
         lambda c, f: (c["zero_stage"] >= 1) | (not f.low_precision_moments)),
    Rule("moe_zero", ("zero_stage",), ("experts", "moe_max_zero_stage"),
         "experts == 0 or zero_stage <= moe_max_zero_stage (the ZeRO stages the framework runs "
         "with MoE layers)",
         lambda c, f: (f.experts == 0) | (c["zero_stage"] <= f.moe_max_zero_stage)),
    # what the framework implements at all (its profile cites the code)
    Rule("framework_zero", ("zero_stage", "pp", "dp", "cp"), ("zero_stages", "zero_stages_pp"),
         "zero_stage in zero_stages, or in zero_stages_pp where pp > 1 (the ZeRO stages the "
         "framework implements), or 0 with no data-parallel rank to shard over (dp * cp == 1)",
         lambda c, f: np.where(c["pp"] > 1, np.isin(c["zero_stage"], f.zero_stages_pp),
                               np.isin(c["zero_stage"], f.zero_stages))
         | ((c["zero_stage"] == 0) & (c["dp"] * c["cp"] == 1))),
    Rule("framework_recompute", ("recompute", "recompute_layers", "pp", "first_stage_layers",
                                 "last_stage_layers"),
         ("recompute_modes", "partial_recompute", "layers"),
         "recompute (0 none, 1 selective, 2 full) in recompute_modes, and full recompute covers "
         "every layer of a stage "
         "(recompute_layers 0 or at least the stage's) unless partial_recompute (the "
         "recompute modes the framework implements)",
         _framework_recompute),
    Rule("framework_schedule", ("pp_schedule", "vpp", "pp"), ("pp_schedules",),
         "pp == 1, or the schedule the plan runs (interleaved 1F1B iff vpp > 1) in pp_schedules "
         "(the pipeline schedules the framework implements)",
         lambda c, f: (c["pp"] == 1) | np.isin(schedule_code(c["pp_schedule"], c["vpp"]),
                                               [SCHEDULE_CODES[s] for s in f.pp_schedules])),
    Rule("recompute_modules", ("recompute_modules", "recompute"),
         ("selective_recompute", "mla", "experts"),
         "recompute_modules is the training's set, or recompute == 1 (selective) under "
         "selective_recompute == modules (Megatron-Core's), with mla_up_proj only where mla and "
         "moe_act only where experts > 0",
         _recompute_modules),
    # a framework that builds no multi-token prediction module cannot run a model with one
    Rule("mtp", ("pp",), ("mtp_layers", "multi_token_prediction"),
         "mtp_layers == 0 or multi_token_prediction (the framework builds MTP modules)",
         lambda c, f: (c["pp"] > 0) & ((f.mtp_layers == 0) | f.multi_token_prediction)),
    Rule("expert_tp", ("expert_tp", "ep", "tp", "dp", "cp"), ("experts", "canonical"),
         "expert_tp == 0 (derived), or experts > 0 and (tp * cp * dp) % (ep * expert_tp) == 0 "
         "(the expert ranks of a stage, expert TP x EP x expert DP, fill its tp x cp x dp), and "
         "in a canonical space it differs from the derived one (tp, or 1 where ep does not "
         "divide dp * cp)",
         _expert_tp),
    Rule("batch", ("micro_batch", "dp"), ("global_batch",),
         "global_batch % (micro_batch * dp) == 0",
         lambda c, f: f.global_batch % (c["micro_batch"] * c["dp"]) == 0),
    Rule("zero_sharding", ("zero_stage", "dp", "cp", "tp", "ep", "expert_tp"),
         ("experts", "canonical"),
         "zero_stage == 0, dp * cp > 1 or the experts have expert-DP replicas (in a canonical "
         "space)",
         _zero_shards),
    *OWN,  # the rules that read the plan alone (rule_table.py: Plan checks them)
    Rule("recompute_chunks", ("recompute", "recompute_layers", "vpp", "pp",
                              "first_stage_layers", "last_stage_layers"),
         ("recompute_per_chunk", "layers"),
         "recompute != full, vpp == 1, or recompute_layers (per stage) is 0 (all), at least "
         "the stage's layers, or a multiple of vpp, unless not recompute_per_chunk (Megatron's "
         "--recompute-num-layers counts per model chunk)",
         _recompute_chunks),
    # megatron/core/pipeline_parallel/schedules.py (interleaved): groups of
    # microbatch_group_size_per_vp_stage (default pp) micro-batches; the last group is whole or
    # holds >= pp, so with the default the count is a multiple of pp
    Rule("microbatch_groups", ("vpp", "pp", "micro_batch", "dp"),
         ("global_batch", "microbatch_groups"),
         "vpp == 1 or (global_batch / (micro_batch * dp)) % pp == 0, unless not "
         "microbatch_groups (the interleaved schedule's groups of pp micro-batches)",
         lambda c, f: (c["vpp"] == 1) | (not f.switches.microbatch_groups)
         | ((f.global_batch // (c["micro_batch"] * c["dp"])) % c["pp"] == 0)),
    Rule("cuda_graphs", ("recompute", "moe_a2a_overlap"),
         ("cuda_graph_impl", "cuda_graph_scope", "moe_layers", "layers", "moe_pad_to_capacity",
          "moe_a2a_overlap"),
         "cuda_graph_impl == none, or: recompute != full unless full_iteration is in "
         "cuda_graph_scope; moe scopes only with moe_layers > 0, mlp only with moe_layers < "
         "layers; with moe_layers > 0 the whole layer (no scope), full_iteration and moe only "
         "with moe_pad_to_capacity; moe_a2a_overlap only under transformer_engine without moe "
         "or mlp (Megatron-Core's TransformerConfig; costmodel.graphs.graphs_allowed)",
         lambda c, f: graphs_allowed(c["recompute"] == FULL, f.cuda_graph_impl,
                                     f.cuda_graph_scope, f.moe_layers, f.layers,
                                     f.moe_pad_to_capacity, dispatched_overlap(c, f))),
    Rule("cpu_offload", ("cpu_offload_layers", "pp", "recompute"),
         ("cpu_offloading", "host_link", "layers", "cuda_graph_impl", "cuda_graph_scope"),
         "cpu_offload_layers == 0, or cpu_offloading (the framework offloads activations) and "
         "host_link (the GPU's host link and memory catalogued), cpu_offload_layers < layers, "
         "pp == 1, recompute == 0 (none), and cuda_graph_impl none or full_iteration in "
         "cuda_graph_scope (Megatron-Core's TransformerConfig)",
         _cpu_offload),
    Rule("schedule", ("pp_schedule", "vpp", "pp"), ("canonical",),
         "pp_schedule interleaved iff vpp > 1, and gpipe only with vpp == 1 (and pp > 1 in a "
         "canonical space)",
         _schedule),
)
BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}


def broken(plan: Plan | Mapping[str, object], f: Facts,
           rules: tuple[Rule, ...] = RULES) -> list[Rule]:
    """The rules one plan breaks, in table order."""
    cols = plan_columns(plan)
    return [r for r in rules if not holds_for(r, cols, f)]


def valid(plans: list[Plan], f: Facts) -> np.ndarray:
    """Whether each of many plans keeps every rule: the table evaluated once, on columns."""
    rows = [plan_columns(p) for p in plans]
    cols = {k: np.asarray([r[k] for r in rows], dtype=np.int64) for k in PLAN_COLUMNS}
    ok = np.ones(len(plans), dtype=bool)
    for r in RULES:
        ok &= np.asarray(r.holds(cols, f), dtype=bool)
    return ok


def check(plan: Plan, f: Facts) -> None:
    """Raise :class:`SpecError` naming the first rule the plan breaks and its values."""
    cols = plan_columns(plan)
    for r in RULES:
        if not holds_for(r, cols, f):
            raise SpecError(r.message(cols, f))


