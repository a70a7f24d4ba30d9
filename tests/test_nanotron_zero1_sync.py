"""nanotron's gradient path as its trainer runs it (hardware_catalog/frameworks.yaml cites the
code): under ZeRO-1 one fp32 all-reduce of the whole gradient buffer, one coalesced parameter
all-gather and the host's eager loop around that gather, per DP rank and layer; and every
micro-batch's fp32 accumulation pass."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.comm import bucketed_gather_time, link_of
from costmodel.parallel.data import EAGER_OP_HOST_S
from hardware_catalog.frameworks import framework_settings

MIB = 2**20


def _dp(llama8b: ModelSpec, cluster: ClusterSpec, plan: Plan, tr: Training) -> dict:
    return {c.name: c for c in estimate(llama8b, cluster, plan, tr).collectives
            if c.name.startswith("dp_")}


def test_the_profile_runs_the_code() -> None:
    s = framework_settings("nanotron")
    assert s["sharded_grad_all_reduce"] is True and s["sharded_dp_one_call"] is True
    assert s["sharded_gather_host_ops"] == 12
    # DDP's 25 MiB buckets count bf16 gradients; the hook reduces their fp32 accumulators
    assert s["dp_bucket_bytes"] == 50 * MIB
    assert s["grad_accum_pass_bytes"] == 10
    assert s["pp_cost_balance"] is True and s["loss_kernel"] == "eager_fp32"


def test_one_call_pays_one_latency(h100, llama8b: ModelSpec) -> None:
    """The whole buffer in one call: the bucketed time with a single bucket, bandwidth alike,
    and less than in 25 MiB buckets, which pay every bucket's latency."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plan = Plan(tp=1, dp=64, zero_stage=1)
    base = dict(seq_len=4096, global_batch=64, overlap_grad_reduce_sharded=False,
                overlap_param_gather=False)
    bucketed = _dp(llama8b, cluster, plan, training_for(**base))
    one = _dp(llama8b, cluster, plan, training_for(**base, sharded_dp_one_call=True))
    grad = one["dp_grad_reduce"]
    expect = bucketed_gather_time(np.array(grad.bytes), np.array(64.0), np.array(8.0),
                                  link_of(cluster), np.inf)
    assert grad.time_s == pytest.approx(float(expect), rel=1e-9)
    for name in ("dp_grad_reduce", "dp_param_all_gather"):
        assert one[name].bytes == bucketed[name].bytes
        assert one[name].time_s < bucketed[name].time_s


def test_zero0_stays_bucketed(h100, llama8b: ModelSpec) -> None:
    """ZeRO-0 is torch DDP: bucketed whatever the ZeRO-1 switches say."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plan = Plan(tp=1, dp=64)
    off = _dp(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=64))
    on = _dp(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=64,
                                              sharded_dp_one_call=True,
                                              sharded_gather_host_ops=12))
    assert on["dp_grad_reduce"].time_s > 0.0
    assert {n: (c.time_s, c.exposed_s) for n, c in on.items()} == {
        n: (c.time_s, c.exposed_s) for n, c in off.items()}


@pytest.mark.parametrize("dp", [8, 32])
def test_gather_host_loop_grows_with_ranks_and_layers(h100, llama8b: ModelSpec, dp: int) -> None:
    """12 eager ops per DP rank per layer, exposed in full; ZeRO-3 gathers per layer unit
    (FSDP) and pays none of it."""
    cluster = ClusterSpec(gpu=h100, num_gpus=2 * dp)
    tr0 = training_for(seq_len=4096, global_batch=64, overlap_param_gather=False)
    tr12 = training_for(seq_len=4096, global_batch=64, overlap_param_gather=False,
                    sharded_gather_host_ops=12)
    z1 = Plan(tp=2, dp=dp, zero_stage=1)
    added = (_dp(llama8b, cluster, z1, tr12)["dp_param_all_gather"].exposed_s
             - _dp(llama8b, cluster, z1, tr0)["dp_param_all_gather"].exposed_s)
    assert added == pytest.approx(12 * EAGER_OP_HOST_S * dp * llama8b.layers, rel=1e-9)
    z3 = Plan(tp=2, dp=dp, zero_stage=3)
    assert (_dp(llama8b, cluster, z3, tr12)["dp_param_all_gather"].time_s
            == _dp(llama8b, cluster, z3, tr0)["dp_param_all_gather"].time_s)


def test_accumulation_pass_per_micro_batch(h100, llama8b: ModelSpec) -> None:
    """10 bytes a parameter per micro-batch over the parameters whose gradients the DP reduction
    moves (the stage's, unsharded), at the memory-bound bandwidth: m = 8 here (64 sequences over
    dp 8, micro-batch 1)."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(tp=2, dp=8, zero_stage=1)
    off = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=64))
    on = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=64,
                                                   grad_accum_pass_bytes=10))
    hbm = h100.hbm_bw_bytes_per_s * h100.efficiency.memory_bw_fraction
    grad = next(c for c in off.collectives if c.name == "dp_grad_reduce")
    params = grad.bytes / 4  # fp32 gradients, reduced once per step under ZeRO-1
    added = on.compute.optimizer_time_s - off.compute.optimizer_time_s
    assert added == pytest.approx(8 * params * 10 / hbm, rel=1e-6)
    assert on.step_time_s - off.step_time_s == pytest.approx(added, rel=1e-6)
