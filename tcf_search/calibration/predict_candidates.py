"""The plans ``tcf-search predict`` weighs for a row (:func:`candidates`): the knobs the row
gives as given, every valid value of the rest, the pipeline splits its launcher builds near the
even one, and where it leaves recompute unsaid, full recompute of part of each stage too."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np

from costmodel import rules
from costmodel.mapping import chunk_split_exists
from costmodel.specs import Plan, SpecError
from search import candidates as placement_candidates
from search.inputs import Case


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def candidates(case: Case) -> list[Plan]:
    """Every valid plan that agrees with the given knobs."""
    p, m, tr = case.plan, case.model, case.training
    given = case.given
    per_dp = tr.global_batch // p.dp if tr.global_batch % p.dp == 0 else 1
    axes: dict[str, list[Any]] = {
        "micro_batch": [p.micro_batch] if "micro_batch" in given else _divisors(per_dp, 64),
        "recompute": [p.recompute] if "recompute" in given else ["none", "selective", "full"],
        "zero_stage": [p.zero_stage] if "zero_stage" in given else [0, 1, 2, 3],
        "vpp": ([p.vpp] if "vpp" in given or p.pp == 1
                else [v for v in range(1, 9)
                      if chunk_split_exists(m.layers, p.pp, v,
                                            any_split=tr.framework.pp.uneven_chunks)]),
        "sequence_parallel": ([p.sequence_parallel] if "sequence_parallel" in given or p.tp == 1
                              else [False, True]),
    }
    # where the row leaves recompute unsaid, full recompute of part of each stage too, as a
    # user's launch takes the lightest that fits (Megatron-LM's --recompute-method block
    # --recompute-num-layers N), where the framework has it (profile switch partial_recompute)
    partial = ("recompute" not in given and "recompute_layers" not in given
               and bool(tr.framework.switch("partial_recompute")))
    layers_per_stage = -(-m.layers // max(p.pp, 1))
    per_chunk = tr.framework.activations.recompute_per_chunk
    # a framework that places its stages itself (nanotron's cost balance, the LM head counted:
    # training.framework.pp.pp_cost_balance) runs its own split where none is given
    own = "first_stage_layers" in given or tr.framework.pp.pp_cost_balance
    plans: list[Plan] = []
    for values in itertools.product(*axes.values()):
        try:
            plan = replace(p, **dict(zip(axes, values, strict=True)))  # type: ignore[arg-type]
        except (SpecError, ValueError):
            continue
        variants = [plan] + (_partial_recompute(plan, layers_per_stage, per_chunk)
                             if partial and plan.recompute == "full" else [])
        for v in variants:
            plans.extend([v] if own else _splits(v, m.layers, tr.framework.pp.uneven_chunks))
    if not plans:
        return plans
    keep = rules.valid(plans, rules.facts_of(m, case.cluster, tr))  # check_plan, on columns
    return [plan for plan, ok in zip(plans, keep, strict=True) if ok]


def _partial_recompute(plan: Plan, per_stage: int, per_chunk: bool) -> list[Plan]:
    """``plan`` recomputing 1 .. per_stage - 1 layers of each stage (0 is all of them); a
    multiple of vpp where the framework counts them per model chunk."""
    step = plan.vpp if per_chunk else 1
    out: list[Plan] = []
    for n in range(step, per_stage, step):
        try:
            out.append(replace(plan, recompute_layers=n))
        except (SpecError, ValueError):
            continue
    return out


def _splits(plan: Plan, layers: int, any_chunks: bool) -> list[Plan]:
    """The plan with each pipeline split the row's launcher builds near the even one (the even
    split first, then the first/last ranks within max(vpp, 2) layers of the middle ranks):
    Megatron's first/last stage flags, the embedding and the loss counted as layers, or, where
    the framework takes an explicit per-stage layout (``training.framework.pp.uneven_chunks``),
    any."""
    if plan.pp == 1:
        return [plan]
    reach = max(plan.vpp, 2)
    rows = placement_candidates(layers, plan.pp, True, plan.vpp, any_chunks)
    near = (np.abs(rows[:, 0] - rows[:, 1]) <= reach) & (np.abs(rows[:, 2] - rows[:, 1]) <= reach)
    out = [plan] if layers % plan.pp == 0 else []
    for nf, _nm, nl in rows[near]:
        if int(nf) == int(nl) == layers // plan.pp and layers % plan.pp == 0:
            continue
        try:
            out.append(replace(plan, first_stage_layers=int(nf), last_stage_layers=int(nl)))
        except (SpecError, ValueError):
            continue
    return out
