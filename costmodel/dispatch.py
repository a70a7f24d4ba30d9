"""A plan's MoE dispatch, per row: the dispatcher and the EP all-to-all overlap the plan names
(plan fields ``moe_dispatcher``, ``moe_a2a_overlap``), or the training's where it names none
(its framework profile's, or the study's ``training:`` switches); and the validity rules'
predicates over it (``costmodel.rules``: moe_dispatch, moe_flex, moe_a2a_overlap)."""

from __future__ import annotations

import numpy as np

from costmodel.mapping import expert_groups
from costmodel.plan_fields import MOE_DISPATCHERS, MOE_OVERLAPS, RECOMPUTE_CODES
from costmodel.plans import PlanArrays
from costmodel.rule_table import Columns, Facts
from costmodel.specs import ModelSpec, Training

CODES: dict[str, int] = {name: i for i, name in enumerate(MOE_DISPATCHERS)}  # "": the training's
ALLTOALL, ALLGATHER, FLEX = CODES["alltoall"], CODES["allgather"], CODES["flex"]
OFF, ON = MOE_OVERLAPS.index("off"), MOE_OVERLAPS.index("on")
FULL = RECOMPUTE_CODES["full"]


def resolved_dispatcher(code: np.ndarray, own: str) -> np.ndarray:
    """The dispatcher code each plan runs: its own, or the training's ``own`` (code 0)."""
    return np.where(code == 0, CODES[own], code)


def resolved_overlap(code: np.ndarray, own: bool) -> np.ndarray:
    """Whether each plan overlaps its EP all-to-all: its own switch, or the training's."""
    return np.where(code == 0, own, code == ON)


def dispatcher(tr: Training, p: PlanArrays) -> np.ndarray:
    """Each plan's dispatcher code (ALLTOALL, ALLGATHER or FLEX)."""
    return resolved_dispatcher(p.moe_dispatcher, tr.framework.moe.moe_dispatcher)


def a2a_overlap(tr: Training, p: PlanArrays) -> np.ndarray:
    """Whether each plan overlaps its EP all-to-all with another micro-batch's compute."""
    return resolved_overlap(p.moe_a2a_overlap, tr.framework.moe.moe_a2a_overlap)


def warms_up_one_more(model: ModelSpec, tr: Training, p: PlanArrays) -> np.ndarray:
    """Plans whose EP all-to-all overlap runs Megatron-Core's combined 1F1B under the
    interleaved schedule, which forwards one chunk-micro-batch more in its warm-up "to ensure
    the forward and backward computations are independent in all 1f1b steps"
    (megatron/core/pipeline_parallel/schedules.py ``get_pp_rank_microbatches``, core_v0.16.1):
    each stage holds that one's activations too. Without a pipeline the combined schedule runs
    a layer's forward beside another micro-batch's backward of the mirrored layer
    (combined_1f1b.py), so what one frees the other takes: no more than one micro-batch."""
    return a2a_overlap(tr, p) & (model.moe_experts > 0) & (p.ep > 1) & (p.vpp > 1)


# ---- the rules' predicates, over the rules' columns and facts ----------------------------


def dispatched_overlap(c: Columns, f: Facts) -> np.ndarray:
    return resolved_overlap(c["moe_a2a_overlap"], f.moe_a2a_overlap)


def dispatch_rule(c: Columns, f: Facts) -> np.ndarray:
    """A plan names a dispatcher or an overlap only on a MoE model, only one the framework's
    launcher offers (its profile's ``moe_dispatchers``, ``moe_a2a_overlaps``), and in a
    canonical space only one that differs from the training's (the same plan is written "")."""
    d, o = c["moe_dispatcher"], c["moe_a2a_overlap"]
    own_d, own_o = CODES[f.moe_dispatcher], ON if f.moe_a2a_overlap else OFF
    offered_d = np.isin(d, [CODES[x] for x in f.moe_dispatchers])
    offered_o = np.isin(o, [ON if x else OFF for x in f.moe_a2a_overlaps])
    loose = not f.switches.canonical
    return (((d == 0) | ((f.experts > 0) & offered_d & ((d != own_d) | loose)))
            & ((o == 0) | ((f.experts > 0) & offered_o & ((o != own_o) | loose))))


def flex_rule(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-Core's flex dispatcher (megatron/core/transformer/moe/token_dispatcher.py
    MoEFlexTokenDispatcher, core_v0.16.0: "DeepEP dispatcher requires TPxEP > 1", its TP the
    experts'; transformer_config.py: the deepep backend, its default, refuses
    moe_pad_expert_input_to_capacity). A training whose own dispatcher is flex (NeMo
    AutoModel's DeepEP) dispatches nothing at ep x expert TP 1, so only a plan naming flex must
    have ranks to dispatch to."""
    etp = expert_groups(c["tp"], c["cp"], c["dp"], c["ep"], c["expert_tp"])[0]
    named = c["moe_dispatcher"] == FLEX
    flex = resolved_dispatcher(c["moe_dispatcher"], f.moe_dispatcher) == FLEX
    return (~named | (c["ep"] * etp > 1)) & (~flex | (not f.moe_pad_to_capacity))


def a2a_overlap_rule(c: Columns, f: Facts) -> np.ndarray:
    """Megatron-Core's --overlap-moe-expert-parallel-comm (transformer_config.py __post_init__,
    core_v0.16.0): expert parallelism, the alltoall or flex dispatcher, no full recompute, the
    interleaved schedule where pp > 1, not with --moe-shared-expert-overlap, and at most one
    MTP layer, which needs pp > 1."""
    d = resolved_dispatcher(c["moe_dispatcher"], f.moe_dispatcher)
    ok = ((c["ep"] > 1) & ((d == ALLTOALL) | (d == FLEX)) & (c["recompute"] != FULL)
          & ((c["pp"] == 1) | (c["vpp"] > 1)) & (not f.moe_shared_expert_overlap)
          & ((f.mtp_layers == 0) | ((f.mtp_layers == 1) & (c["pp"] > 1))))
    return ~dispatched_overlap(c, f) | ok
