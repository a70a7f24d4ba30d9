"""Compute-communication contention and TP-overlapped GEMM splits: hidden communication is
never free, and Transformer Engine splits only the GEMMs its ring exchange feeds or drains."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.compute import kernels_of, layer_times
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec


def _free_links(gpu: GpuSpec) -> GpuSpec:
    """The same GPU with links a million times faster: its communication costs ~nothing."""
    return replace(gpu, intra_node_bw_bytes_per_s=gpu.intra_node_bw_bytes_per_s * 1e6,
                   network_bw_bytes_per_s=gpu.network_bw_bytes_per_s * 1e6,
                   intra_node_latency_s=1e-12, network_latency_s=1e-12,
                   efficiency=replace(gpu.efficiency, collective_overhead_s=1e-12))


def _no_contention(gpu: GpuSpec) -> GpuSpec:
    return replace(gpu, efficiency=replace(gpu.efficiency, comm_sm_share=0.0))


@pytest.mark.parametrize("zero,mbs", [(0, 1), (1, 2), (2, 1), (3, 1), (3, 2)])
def test_hidden_communication_is_never_free(h100, llama8b: ModelSpec, zero: int,
                                            mbs: int) -> None:
    """An FSDP/ZeRO plan on one node whose gradient and parameter traffic hides behind compute
    is strictly slower than the same plan with (almost) no communication, by the hidden time
    times the SM share its NCCL kernels hold (and without contention the hiding is free)."""
    tr = training_for(seq_len=4096, global_batch=64)
    plan = Plan(dp=8, micro_batch=mbs, zero_stage=zero)
    real = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=8), plan, tr)
    free = estimate(llama8b, ClusterSpec(gpu=_free_links(h100), num_gpus=8), plan, tr)
    hidden = sum(c.time_s - c.exposed_s for c in real.collectives)
    exposed = sum(c.exposed_s for c in real.collectives)
    assert hidden > 0.0
    assert real.step_time_s > free.step_time_s
    share = h100.efficiency.comm_sm_share
    assert real.compute.contention_time_s == pytest.approx(
        share * min(hidden, real.compute.time_s - real.compute.contention_time_s), rel=1e-6)
    assert real.step_time_s == pytest.approx(
        free.step_time_s + exposed + real.compute.contention_time_s, rel=1e-3)
    quiet = estimate(llama8b, ClusterSpec(gpu=_no_contention(h100), num_gpus=8), plan, tr)
    assert quiet.compute.contention_time_s == 0.0
    assert quiet.step_time_s < real.step_time_s


@pytest.mark.parametrize("share", [0.05, 0.12, 0.3])
def test_contention_grows_with_the_share_and_never_exceeds_it(h100, llama8b: ModelSpec,
                                                              share: float) -> None:
    """The slowdown is at most share x compute, and a larger share slows more."""
    tr = training_for(seq_len=4096, global_batch=64)
    plan = Plan(dp=8, micro_batch=1, zero_stage=3)

    def run(s: float):
        gpu = replace(h100, efficiency=replace(h100.efficiency, comm_sm_share=s))
        return estimate(llama8b, ClusterSpec(gpu=gpu, num_gpus=8), plan, tr)

    est, more = run(share), run(min(2 * share, 0.9))
    kernels = est.compute.time_s - est.compute.contention_time_s
    assert 0.0 < est.compute.contention_time_s <= share * kernels + 1e-12
    assert more.step_time_s > est.step_time_s


def test_tensor_parallel_traffic_holds_no_nccl_sms(h100, llama8b: ModelSpec) -> None:
    """TP overlap moves its data through userbuffers / symmetric memory by copy engine, and
    unoverlapped TP traffic hides behind nothing: a TP-only plan pays no contention."""
    tr = training_for(seq_len=4096, global_batch=8, tp_comm_overlap=True)
    plan = Plan(tp=8, micro_batch=1, sequence_parallel=True)
    est = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=8), plan, tr)
    assert est.compute.contention_time_s == 0.0


def _layer(h100, model: ModelSpec, tr: Training, plan: Plan):
    p = as_plan_arrays(plans_to_arrays([plan]))
    return layer_times(model, ClusterSpec(gpu=h100, num_gpus=plan.tp), tr, p), kernels_of(
        ClusterSpec(gpu=h100, num_gpus=plan.tp), tr, p)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_overlap_splits_forward_and_input_gradients_not_weight_gradients(
        h100, llama8b: ModelSpec, tp: int) -> None:
    """Under overlapped TP the backward runs the input gradients split like the forward and
    the weight gradients whole (Transformer Engine's userbuffers: *_fprop/*_dgrad ring exchange,
    *_wgrad bulk): backward GEMMs = split + whole, less than twice the split time. Without
    overlap they are twice the whole GEMMs, and nothing else in the layer changes."""
    plan = Plan(tp=tp, micro_batch=1, sequence_parallel=True)
    plain, kn_plain = _layer(h100, llama8b, training_for(seq_len=4096, global_batch=8), plan)
    over, kn_over = _layer(h100, llama8b, training_for(seq_len=4096, global_batch=8,
                                                    tp_comm_overlap=True), plan)
    assert np.allclose(kn_plain.pieces, 1.0) and np.allclose(kn_over.pieces, tp)
    whole, split = plain.gemm_fwd_dense_s, over.gemm_fwd_dense_s
    assert np.all(split > whole)  # tp pieces of M / tp rows are less efficient GEMMs
    rest = plain.bwd_dense_s - 2.0 * whole  # attention, elementwise, launches
    assert np.allclose(over.bwd_dense_s, rest + split + whole, rtol=1e-12)
    assert np.all(over.bwd_dense_s < rest + 2.0 * split)
    assert np.allclose(over.fwd_dense_s - split, plain.fwd_dense_s - whole, rtol=1e-12)
