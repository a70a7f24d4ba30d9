"""Interleaved pipeline chunks (vpp > 1) under the Megatron profiles: partial recompute counts
per chunk (costmodel.rules ``recompute_chunks``) and micro-batches come in groups of pp
(``microbatch_groups``); the search, the placement and the export refuse with the same rule.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from costmodel_helpers import training_for
from export_helpers import launcher_flags
from export_plans import GPU, plan_file

from costmodel import Plan, SpecError, check_plan, rules
from hardware_catalog.catalog import get_gpu
from search.inputs.presets import get_preset
from search.inputs.specs import cluster_spec, training_spec
from search.placement import Subproblem, solve_many
from search.prune import solve_placement
from tcf_search.export import ExportOptions, ExportRefused, render
from tcf_search.export.view import facts_of

# --- the recompute rule (costmodel.rules recompute_chunks) ---------------------------------------

def chunked(recompute_layers: int, vpp: int = 2) -> Plan:
    return Plan(tp=8, pp=4, dp=16, vpp=vpp, zero_stage=1, sequence_parallel=True,
                recompute="full", recompute_layers=recompute_layers)


@pytest.mark.parametrize("framework", ["generic", "megatron", "nemo", "megatron-sc21"])
def test_megatron_profiles_carry_the_recompute_switch(framework: str) -> None:
    t = training_spec(framework=framework, precision="bf16", seq_len=8192, global_batch=512)
    assert t.framework.activations.recompute_per_chunk


def test_partial_recompute_under_interleaving_is_per_chunk() -> None:
    m = get_preset("llama3-70b")
    cluster = cluster_spec(get_gpu(GPU), 512, 8, "")
    megatron = training_spec(framework="megatron", precision="bf16", seq_len=8192,
                             global_batch=512)
    with pytest.raises(SpecError, match="recompute_chunks: .*recompute_layers=3, vpp=2"):
        check_plan(m, cluster, chunked(3), megatron)
    for ok in (chunked(4), chunked(0), chunked(20), chunked(3, vpp=1)):
        check_plan(m, cluster, ok, megatron)  # per chunk 2; all; the whole stage; no chunks
    check_plan(m, cluster, chunked(3), training_for(seq_len=8192, global_batch=512,
                                                    recompute_per_chunk=False))  # switch off


def test_the_export_refuses_with_the_same_rule() -> None:
    pf = plan_file("llama3-70b", chunked(3), 512, 512, seq=8192)
    f = facts_of(pf, ExportOptions(), "megatron")
    assert f.rule_facts.switches.recompute_per_chunk
    with pytest.raises(ExportRefused, match="recompute_chunks: "):
        render("megatron", pf)
    flags = launcher_flags(render("megatron", dataclasses.replace(
        pf, plan=chunked(4)))["megatron.sh"], "pretrain_gpt.py")
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == ("block", "2")
    assert rules.BY_NAME["recompute_chunks"].facts == ("recompute_per_chunk", "layers")


def test_the_placement_recomputes_multiples_of_the_chunks() -> None:
    """7 layers a stage need 3 recomputed to fit: per chunk (vpp 2) that is 4, never 3."""
    need = tuple(tuple(max(0, n - 4) for n in range(15)) for _ in range(2))
    base = Subproblem(layers=14, pp=2, full=True, shift=False, partial=True, head_units=0,
                      need=need, vpp=2)
    assert solve_placement(base).recomputed == 3  # type: ignore[union-attr]
    chunks = dataclasses.replace(base, recompute_step=2)
    placed = solve_placement(chunks)
    assert placed is not None and placed.recomputed == 4
    arrays = {s: np.asarray([need[i]]) for i, s in enumerate(("first", "last"))}
    rows, ok = solve_many(arrays, 2, np.asarray([True]), False, True, 14, 0, 2, step=2)
    assert ok[0] and rows[0][3] == 4


def test_interleaved_micro_batches_come_in_groups_of_pp() -> None:
    """Megatron-Core's interleaved schedule (groups of pp micro-batches) under the Megatron
    profiles; torch.distributed.pipelining's (torchtitan) needs no such count."""
    m, cluster = get_preset("llama3-70b"), cluster_spec(get_gpu(GPU), 512, 8, "")
    plan = Plan(tp=8, pp=4, dp=16, vpp=2, zero_stage=1, sequence_parallel=True, micro_batch=2)
    for framework, refused in (("megatron", True), ("nemo", True), ("torchtitan", False)):
        t = training_spec(framework=framework, precision="bf16", seq_len=8192, global_batch=96)
        assert (96 // (2 * 16)) % 4 == 3
        if refused:
            with pytest.raises(SpecError, match="microbatch_groups: .*pp=4, micro_batch=2"):
                check_plan(m, cluster, plan, t)
        else:
            check_plan(m, cluster, plan, t)
    pf = plan_file("llama3-70b", plan, 512, 96, seq=8192)
    with pytest.raises(ExportRefused, match="microbatch_groups: "):
        render("megatron", pf)
    assert not facts_of(pf, ExportOptions(), "torchtitan").rule_facts.switches.microbatch_groups
