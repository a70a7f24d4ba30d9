"""Invariants over parametrised grids of plans: what must hold whatever the calibration."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from costmodel_helpers import assert_terms_match_estimate, training_for

from costmodel import (
    ClusterSpec,
    ModelSpec,
    Plan,
    SpecError,
    estimate,
    estimate_batch,
    plans_to_arrays,
)


def _state(est) -> float:
    return est.memory.peak.model_state_bytes


@pytest.mark.parametrize("pp,zero", list(itertools.product([1, 2, 4], [0, 1, 2, 3])))
def test_more_tp_never_raises_weight_bytes(h100, llama8b, pp: int, zero: int) -> None:
    # the cost model's ordering, whether or not a framework runs ZeRO-2/3 beside a pipeline
    tr = training_for(seq_len=4096, global_batch=64).with_switches(zero_stages_pp=(0, 1, 2, 3))
    prev = float("inf")
    dp = 4  # held fixed: TP is added on top of the other degrees
    for tp in (1, 2, 4, 8):
        cluster = ClusterSpec(gpu=h100, num_gpus=tp * pp * dp)
        est = estimate(llama8b, cluster, Plan(tp=tp, pp=pp, dp=dp, zero_stage=zero), tr)
        w = max(s.weights_bytes for s in est.memory.stages)
        assert w <= prev
        prev = w


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 4), (4, 2), (8, 1)])
def test_zero_stages_order_model_states(h100, llama8b, tp: int, pp: int) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    # the cost model's ordering, whether or not a framework runs ZeRO-2/3 beside a pipeline
    tr = training_for(seq_len=4096, global_batch=128).with_switches(zero_stages_pp=(0, 1, 2, 3))
    dp = 64 // (tp * pp)
    states = [_state(estimate(llama8b, cluster, Plan(tp=tp, pp=pp, dp=dp, zero_stage=z), tr))
              for z in (0, 1, 2, 3)]
    assert states[3] <= states[2] <= states[1] <= states[0]
    assert states[3] < states[0]


@pytest.mark.parametrize("tp,mbs,sp", [(1, 1, False), (2, 2, True), (4, 1, False), (8, 4, True)])
def test_full_recompute_stores_least(h100, llama8b, tp: int, mbs: int, sp: bool) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=8192, global_batch=64)
    acts = {}
    for r in ("none", "selective", "full"):
        plan = Plan(tp=tp, dp=8 // tp, micro_batch=mbs, recompute=r,  # type: ignore[arg-type]
                    sequence_parallel=sp)
        acts[r] = estimate(llama8b, cluster, plan, tr).memory.peak.activations_bytes
    assert acts["full"] < acts["selective"] <= acts["none"]


def test_recompute_costs_compute(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64)
    times = {r: estimate(llama8b, cluster, Plan(dp=8, zero_stage=3, recompute=r), tr)
             for r in ("none", "full")}
    assert times["full"].compute.time_s > times["none"].compute.time_s
    assert times["full"].hfu > times["full"].mfu


def test_cp1_means_no_cp_traffic(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=32768, global_batch=16)
    est = estimate(llama8b, cluster, Plan(tp=8, dp=2, sequence_parallel=True), tr)
    assert not [c for c in est.collectives if c.group == "cp"]
    est_cp = estimate(llama8b, cluster, Plan(tp=8, cp=2, dp=1, sequence_parallel=True), tr)
    cp = [c for c in est_cp.collectives if c.group == "cp"]
    assert cp and cp[0].bytes > 0 and cp[0].tier == "network"


def test_time_grows_with_flops(h100) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64)
    prev = 0.0
    for layers in (8, 16, 32, 64):
        m = ModelSpec(layers=layers, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                      vocab=128256)
        t = estimate(m, cluster, Plan(dp=8, zero_stage=3), tr).step_time_s
        assert t > prev
        prev = t


def test_tp_across_nodes_uses_network(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=4096, global_batch=16)
    inside = estimate(llama8b, cluster, Plan(tp=8, dp=2, sequence_parallel=True), tr)
    across = estimate(llama8b, cluster, Plan(tp=16, dp=1, sequence_parallel=True), tr)
    tier = {c.group: c.tier for c in inside.collectives}
    assert tier["tp"] == "nvlink"
    assert {c.group: c.tier for c in across.collectives}["tp"] == "network"


def test_pipeline_bubble_shrinks_with_interleaving(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    tr = training_for(seq_len=4096, global_batch=64)
    b1 = estimate(llama8b, cluster, Plan(tp=8, pp=8, dp=1), tr).bubble_time_s
    b2 = estimate(llama8b, cluster, Plan(tp=8, pp=8, dp=1, vpp=2), tr).bubble_time_s
    assert 0 < b2 < b1
    assert estimate(llama8b, cluster, Plan(tp=8, dp=8), tr).bubble_time_s == 0


def test_first_stage_holds_most_activations_in_1f1b(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=32)
    tr = training_for(seq_len=4096, global_batch=64)
    est = estimate(llama8b, cluster, Plan(tp=4, pp=8, dp=1), tr)
    by = {s.stage: s.activations_bytes for s in est.memory.stages}
    assert by["first"] > by["middle"] > by["last"]


def test_batch_equals_scalar(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    tr = training_for(seq_len=4096, global_batch=256).with_switches(zero_stages_pp=(0, 1, 2, 3))
    plans = [Plan(tp=tp, pp=pp, dp=64 // (tp * pp), zero_stage=z, micro_batch=mb, recompute=r,
                  sequence_parallel=tp > 1, vpp=2 if pp == 4 else 1)
             for tp, pp, z, mb, r in itertools.product((1, 2, 8), (1, 4), (0, 1, 3), (1, 2),
                                                       ("none", "full"))]
    batch = estimate_batch(llama8b, cluster, tr, plans_to_arrays(plans))
    for i, plan in enumerate(plans):
        est = estimate(llama8b, cluster, plan, tr)
        assert batch["step_time_s"][i] == pytest.approx(est.step_time_s, rel=1e-9)
        assert batch["peak_mem_bytes"][i] == pytest.approx(est.memory.peak_bytes, rel=1e-9)
        assert bool(batch["fits"][i]) == est.memory.fits


@pytest.mark.parametrize("pp,recompute,r", [(1, "none", 0), (4, "none", 0), (4, "full", 0),
                                            (4, "full", 3), (2, "selective", 0)])
def test_memory_terms_match_estimate(h100, llama8b, pp: int, recompute: str, r: int) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=32)
    tr = training_for(seq_len=8192, global_batch=64)
    plan = Plan(tp=4, pp=pp, dp=32 // (4 * pp), micro_batch=1, recompute=recompute,  # type: ignore[arg-type]
                recompute_layers=r, sequence_parallel=True, zero_stage=1)
    terms = assert_terms_match_estimate(llama8b, cluster, plan, tr)
    assert np.isfinite(terms.usable_bytes)


@pytest.mark.parametrize("first,last", [(5, 0), (0, 5), (6, 10), (10, 6)])
def test_uneven_stages_hold_the_layers_they_are_given(h100, llama8b, first: int, last: int) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(pp=4, dp=2, first_stage_layers=first, last_stage_layers=last)
    est = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=64))
    by = {s.stage: s.layers for s in est.memory.stages}
    free = 4 - (first > 0) - (last > 0)
    rest = (32 - first - last) // free
    assert by["first"] == (first or rest) and by["last"] == (last or rest)
    assert by["middle"] == rest
    assert by["first"] + 2 * by["middle"] + by["last"] == 32


def test_pipeline_bubble_is_one_micro_batch_through_the_other_stages(h100, llama8b) -> None:
    # pp=2: the last stage (with the LM head) is the slowest; one micro-batch crosses the first
    # stage before it starts and after it ends, the other m - 1 follow at its pace. So the
    # bubble does not grow with m and is less than one micro-batch of the slowest stage.
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(tp=8, pp=2, sequence_parallel=True)
    few = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=4))
    many = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=16))
    assert few.bubble_time_s == pytest.approx(many.bubble_time_s)
    # the rest of the step is the 16 micro-batches at the slowest stage's pace (+ p2p, optimizer)
    assert 0 < many.bubble_time_s < (many.step_time_s - many.bubble_time_s) / 16


def test_a_short_first_stage_shortens_the_bubble(h100, llama8b) -> None:
    # 32 layers on pp=2: 16 + 16 (and the head) or 4 + 28. The bubble is the first stage's
    # micro-batch (the last is the slowest either way): a quarter of the even split's. Averaging
    # the stages instead would leave it unchanged.
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=4096, global_batch=16)
    even = estimate(llama8b, cluster, Plan(tp=8, pp=2, sequence_parallel=True), tr)
    short = estimate(llama8b, cluster, Plan(tp=8, pp=2, sequence_parallel=True,
                                            first_stage_layers=4), tr)
    assert short.bubble_time_s == pytest.approx(even.bubble_time_s / 4, rel=0.15)


def _exposed(est, name: str) -> tuple[float, float]:
    c = next(c for c in est.collectives if c.name == name)
    return c.time_s, c.exposed_s


@pytest.mark.parametrize("v", [2, 4])
def test_p2p_overlap_hides_interleaved_transfers_only(h100, llama8b, v: int) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plans = {vv: Plan(tp=8, pp=4, dp=2, vpp=vv, micro_batch=1) for vv in (1, v)}
    on = training_for(seq_len=4096, global_batch=64, overlap_p2p_comm=True)
    off = training_for(seq_len=4096, global_batch=64, overlap_p2p_comm=False)
    total, exposed = _exposed(estimate(llama8b, cluster, plans[v], on), "pp_activation_send_recv")
    assert 0 < exposed < total
    # the pipeline's first receive and last send stay on the critical path
    hops = 2 * (64 // 2) * v  # send/recv pairs per step
    assert exposed >= 2 * total / hops * 0.999
    assert _exposed(estimate(llama8b, cluster, plans[v], off), "pp_activation_send_recv") == (
        total, total)
    # without interleaving there is no next chunk to hide behind
    t1, e1 = _exposed(estimate(llama8b, cluster, plans[1], on), "pp_activation_send_recv")
    assert e1 == t1
    assert (estimate(llama8b, cluster, plans[v], on).step_time_s
            <= estimate(llama8b, cluster, plans[v], off).step_time_s)


@pytest.mark.parametrize("zero,name", [(0, "dp_grad_reduce"), (1, "dp_grad_reduce"),
                                       (1, "dp_param_all_gather")])
def test_interleaving_widens_the_dp_overlap_window(h100, llama8b, zero: int, name: str) -> None:
    """Chunks finish their backward (start their forward) one after another, so more of the
    DP traffic hides behind the other chunks' compute; nothing hides without overlap."""
    cluster = ClusterSpec(gpu=h100, num_gpus=256)
    tr = training_for(seq_len=4096, global_batch=256)
    exposed = []
    for v in (1, 2, 4):
        est = estimate(llama8b, cluster, Plan(tp=2, pp=4, dp=32, vpp=v, zero_stage=zero), tr)
        exposed.append(_exposed(est, name)[1])
    assert exposed[2] <= exposed[1] <= exposed[0]
    assert exposed[2] < exposed[0]
    serial = training_for(seq_len=4096, global_batch=256, overlap_grad_reduce=False,
                      overlap_grad_reduce_sharded=False, overlap_param_gather=False)
    est = estimate(llama8b, cluster, Plan(tp=2, pp=4, dp=32, vpp=4, zero_stage=zero), serial)
    t, e = _exposed(est, name)
    assert e == t


@pytest.mark.parametrize("gpu_id,faster", [("h100-sxm-80gb", True), ("b200-180gb", True),
                                           ("a100-sxm-80gb", False), ("mi300x", False)])
def test_flash3_attention_runs_faster_only_where_it_exists(llama8b, gpu_id: str,
                                                          faster: bool) -> None:

    from hardware_catalog import get_gpu

    cluster = ClusterSpec(gpu=get_gpu(gpu_id), num_gpus=8)
    eff = cluster.gpu.efficiency
    base = training_for(seq_len=32768, global_batch=8)
    plan = Plan(dp=8)
    times = {k: estimate(llama8b, cluster, plan, base.with_switches(attention_kernel=k)).step_time_s
             for k in ("flash2", "flash3")}
    assert (times["flash3"] < times["flash2"]) == faster
    if faster:  # only attention speeds up, so the step gains less than the kernel's factor
        assert times["flash2"] / times["flash3"] < (eff.flash3_attention_peak_fraction
                                                    / eff.attention_peak_fraction)



@pytest.mark.parametrize("preset,ep,mbs,precision", [
    ("llama3-8b", 1, 2, "fp8"), ("llama3-8b", 1, 1, "bf16"),
    ("qwen3-30b-a3b", 8, 1, "fp8"), ("qwen3-30b-a3b", 8, 4, "fp8")])
def test_gb200_gains_on_b200_no_more_than_its_rates(preset: str, ep: int, mbs: int,
                                                    precision: str) -> None:
    """The same plan on GB200 and B200 differs only in the GPUs' rates (peaks 10/9, HBM 8/7.7;
    NVLink, NIC and, with GB200's Grace host given the B200's x86 host's issue time, every host
    term alike): GB200 is faster, by at most the largest of those ratios. A sparse peak, or a
    term that charged the two SKUs differently, would break it."""
    import dataclasses

    from hardware_catalog import get_gpu
    from search.inputs.presets import PRESETS

    gpus = {i: get_gpu(i) for i in ("b200-180gb", "gb200-nvl72")}
    gpus["gb200-nvl72"] = dataclasses.replace(
        gpus["gb200-nvl72"], host_issue_factor=gpus["b200-180gb"].host_issue_factor)
    tr = training_for(seq_len=4096, global_batch=256, precision=precision)  # type: ignore[arg-type]
    plan = Plan(dp=8, ep=ep, micro_batch=mbs)
    tok = {i: estimate(PRESETS[preset], ClusterSpec(gpu=g, num_gpus=8), plan,
                       tr).tokens_per_s_per_gpu for i, g in gpus.items()}
    b, gb = gpus["b200-180gb"], gpus["gb200-nvl72"]
    bound = max(gb.peak_flops(precision) / b.peak_flops(precision),
                gb.hbm_bw_bytes_per_s / b.hbm_bw_bytes_per_s)
    assert 1.0 < tok["gb200-nvl72"] / tok["b200-180gb"] <= bound * (1 + 1e-9)

def test_an_unknown_attention_kernel_names_the_field() -> None:
    from costmodel import SpecError

    with pytest.raises(SpecError, match="training.attention_kernel must be one of"):
        training_for(seq_len=1024, global_batch=8, attention_kernel="flash9")  # type: ignore[arg-type]


def test_fp32_activations_double_the_activation_bytes(h100, llama8b) -> None:
    """A run without autocast (the CPU validation runs) moves and keeps 4-byte activations:
    TP/SP, CP and PP traffic and the stored activations double; model states do not change."""

    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plan = Plan(tp=4, pp=2, cp=2, dp=4, sequence_parallel=True)
    bf16 = training_for(seq_len=4096, global_batch=64)
    fp32 = bf16.with_switches(activation_dtype_bytes=4.0)
    a, b = estimate(llama8b, cluster, plan, bf16), estimate(llama8b, cluster, plan, fp32)
    for name in ("tp_activation_allreduce", "cp_kv_ring", "pp_activation_send_recv"):
        ca = next(c for c in a.collectives if c.name == name)
        cb = next(c for c in b.collectives if c.name == name)
        assert cb.bytes == pytest.approx(2 * ca.bytes)
    for sa, sb in zip(a.memory.stages, b.memory.stages, strict=True):
        assert sb.activations_bytes == pytest.approx(2 * sa.activations_bytes)
        assert sb.model_state_bytes == sa.model_state_bytes
    assert b.step_time_s > a.step_time_s


def test_activation_bytes_are_two_or_four() -> None:
    from costmodel import SpecError

    with pytest.raises(SpecError, match="training.activation_dtype_bytes must be 2"):
        training_for(seq_len=1024, global_batch=8, activation_dtype_bytes=3.0)


def _grad_reduce(est) -> tuple[float, float]:
    row = next(c for c in est.collectives if c.name == "dp_grad_reduce")
    return row.bytes, row.time_s


@pytest.mark.parametrize("framework", ["generic", "megatron", "torchtitan", "deepspeed",
                                       "llm-foundry"])
@pytest.mark.parametrize("pp,mbs", [(1, 1), (1, 2), (2, 1), (4, 2)])
def test_zero2_under_accumulation_pays_per_micro_batch_or_a_whole_buffer(
        h100, llama8b, framework: str, pp: int, mbs: int) -> None:
    """With m > 1 micro-batches ZeRO-2 either reduce-scatters m times (and keeps a gradient
    shard) or holds a whole gradient buffer (and reduces once): never the shard for one pass."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    dp = 64 // pp
    tr = training_for(framework, seq_len=4096, global_batch=dp * mbs * 8)
    m = tr.global_batch // (dp * mbs)
    plan = Plan(pp=pp, dp=dp, micro_batch=mbs, zero_stage=2)
    if 2 not in (tr.framework.dp.zero_stages_pp if pp > 1 else tr.framework.dp.zero_stages):
        with pytest.raises(SpecError, match="framework_zero"):  # DeepSpeed's pipeline engine
            estimate(llama8b, cluster, plan, tr)
        return
    # ZeRO-1, priced whether or not the framework runs it, is the yardstick
    anything = tr.with_switches(zero_stages=(0, 1, 2, 3), zero_stages_pp=(0, 1, 2, 3))
    zero1 = estimate(llama8b, cluster, dataclasses.replace(plan, zero_stage=1), anything)
    zero2 = estimate(llama8b, cluster, plan, tr)
    grads1, grads2 = (e.memory.stages[0].grads_bytes for e in (zero1, zero2))
    bytes1, time1 = _grad_reduce(zero1)
    bytes2, time2 = _grad_reduce(zero2)
    per_micro_batch = bytes2 == pytest.approx(m * bytes1) and time2 == pytest.approx(m * time1)
    whole_buffer = grads2 == pytest.approx(grads1) and bytes2 == pytest.approx(bytes1)
    assert m > 1 and per_micro_batch != whole_buffer
    if per_micro_batch:
        assert grads2 == pytest.approx(grads1 / dp)


def test_zero2_with_one_micro_batch_is_sharded_and_reduces_once(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    tr = training_for(seq_len=4096, global_batch=64, zero2_grad_sync="step")
    zero1, zero2 = (estimate(llama8b, cluster, Plan(dp=64, zero_stage=z), tr) for z in (1, 2))
    assert zero2.memory.stages[0].grads_bytes == pytest.approx(
        zero1.memory.stages[0].grads_bytes / 64)
    assert _grad_reduce(zero2) == pytest.approx(_grad_reduce(zero1))


@pytest.mark.parametrize("framework", ["generic", "torchtitan", "nanotron"])
@pytest.mark.parametrize("seq,k", [(8192, 2), (8192, 8), (32768, 4), (131072, 16)])
def test_context_parallel_never_ties_the_same_tokens_without_it(h100, llama8b, framework: str,
                                                                seq: int, k: int) -> None:
    """CP k x micro-batch k runs the tokens of micro-batch 1 without CP on each GPU: the same
    GEMMs, but attention in k blocks (k calls, k - 1 merges) and K/V exchanged besides. It is
    never free: strictly slower, whatever hides."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    tr = training_for(framework, seq_len=seq, global_batch=64 * 2)
    base = estimate(llama8b, cluster, Plan(dp=64), tr)  # ZeRO-0: every framework runs it
    with_cp = estimate(llama8b, cluster, Plan(cp=k, dp=64 // k, micro_batch=k), tr)
    assert with_cp.step_time_s > base.step_time_s
    assert with_cp.compute.time_s > base.compute.time_s


def test_each_kv_transfer_hides_only_behind_its_own_block(h100, llama8b) -> None:
    """The ring's step i sends block i while attending to it: a step whose transfer outlasts
    its block shows the difference, even where the layer's whole attention would outlast all
    cp - 1 transfers together."""
    import dataclasses

    from costmodel.compute import layer_times
    from costmodel.parallel.context import context_parallel
    from costmodel.parallel.mesh import mesh_of
    from costmodel.plans import as_plan_arrays, plans_to_arrays

    tr = training_for(seq_len=32768, global_batch=8)
    plan = Plan(cp=8, dp=1)
    arrays = as_plan_arrays(plans_to_arrays([plan]))
    shown_only_per_step = []
    # the window (block < hop <= 8/7 block) is 14% wide: steps of 8% cannot miss it, whatever
    # the calibrated attention efficiency
    for bw in np.geomspace(5e9, 450e9, 60):
        gpu = dataclasses.replace(h100, intra_node_bw_bytes_per_s=bw)
        cluster = ClusterSpec(gpu=gpu, num_gpus=8)
        g, lt = mesh_of(cluster, tr, arrays), layer_times(llama8b, cluster, tr, arrays)
        cc = context_parallel(llama8b, tr, g, lt)
        hop = float(cc.layer_s[0]) / (3 * 7)
        block = float(lt.attention_fwd_s[0]) / 8
        assert float(cc.exposed_fwd_s[0]) == pytest.approx(7 * max(hop - block, 0.0))
        whole_layer = max(7 * hop - float(lt.attention_fwd_s[0]), 0.0)
        assert float(cc.exposed_fwd_s[0]) >= whole_layer
        shown_only_per_step.append(whole_layer == 0.0 < float(cc.exposed_fwd_s[0]))
    assert any(shown_only_per_step)  # a link where only the per-step view shows the exchange
