"""Gradient accumulation's own passes (``costmodel.optimizer.grad_accumulation_time``): a
framework's pass after every micro-batch, or autograd's in-place ``.grad`` add on all but the
first where whole gradients stay across micro-batches; none where the add is fused into the
weight-gradient GEMM (Megatron) or the gradients are reduced and freed every micro-batch."""

from __future__ import annotations

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from hardware_catalog.frameworks import framework_settings

BASE = {"seq_len": 4096, "global_batch": 64}


def _added(llama8b: ModelSpec, cluster: ClusterSpec, plan: Plan, base: dict | None = None,
           **switches: float) -> float:
    """What the switches add to the optimizer's time (the accumulation is reported there)."""
    off = estimate(llama8b, cluster, plan, training_for(**BASE, **(base or {})))
    on = estimate(llama8b, cluster, plan, training_for(**BASE, **(base or {}), **switches))
    assert on.step_time_s - off.step_time_s == pytest.approx(
        on.compute.optimizer_time_s - off.compute.optimizer_time_s, rel=1e-6, abs=1e-12)
    return on.compute.optimizer_time_s - off.compute.optimizer_time_s


def _stage_params(llama8b: ModelSpec, cluster: ClusterSpec, plan: Plan) -> float:
    """The stage's parameters, from ZeRO-1's once-a-step fp32 gradient reduce-scatter."""
    same = Plan(tp=plan.tp, pp=plan.pp, dp=plan.dp, zero_stage=1)
    e = estimate(llama8b, cluster, same, training_for(**BASE))
    return next(c for c in e.collectives if c.name == "dp_grad_reduce").bytes / 4


def test_deepspeed_runs_its_code() -> None:
    bf16, fp16 = framework_settings("deepspeed", "bf16"), framework_settings("deepspeed", "fp16")
    assert bf16["grad_accum_inplace_bytes"] == 6 and bf16["grad_accum_pass_bytes_pp"] == 20
    # FP16's optimizer accumulates by autograd: the generic "-1", no pipeline pass of its own
    assert fp16["grad_accum_pass_bytes_pp"] == -1
    megatron = framework_settings("megatron")
    assert megatron.get("grad_accum_inplace_bytes", 0) == 0  # fused into the wgrad GEMM
    assert megatron.get("grad_accum_pass_bytes", 0) == 0


@pytest.mark.parametrize("zero", [0, 1])
def test_autograd_adds_on_all_but_the_first(h100, llama8b: ModelSpec, zero: int) -> None:
    """Whole gradients kept (ZeRO-0/1): m - 1 in-place adds of 6 bytes a parameter (m = 8)."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(tp=2, dp=8, zero_stage=zero)
    hbm = h100.hbm_bw_bytes_per_s * h100.efficiency.memory_bw_fraction
    added = _added(llama8b, cluster, plan, grad_accum_inplace_bytes=6)
    assert added == pytest.approx(7 * _stage_params(llama8b, cluster, plan) * 6 / hbm, rel=1e-6)


def test_one_micro_batch_adds_nothing(h100, llama8b: ModelSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(tp=2, dp=8, zero_stage=1, micro_batch=8)
    assert _added(llama8b, cluster, plan, grad_accum_inplace_bytes=6) == 0.0


def test_gradients_freed_every_micro_batch_add_nothing(h100, llama8b: ModelSpec) -> None:
    """ZeRO-2 reducing every micro-batch (DeepSpeed's hooks) and ZeRO-3 syncing each one keep
    no whole gradient to add into; ZeRO-2 that syncs once a step does."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    for zero in (2, 3):
        assert _added(llama8b, cluster, Plan(tp=2, dp=8, zero_stage=zero),
                      grad_accum_inplace_bytes=6) == 0.0
    once = _added(llama8b, cluster, Plan(tp=2, dp=8, zero_stage=2), {"zero2_grad_sync": "step"},
                  grad_accum_inplace_bytes=6)
    assert once > 0.0


def test_a_pass_of_its_own_replaces_autograds(h100, llama8b: ModelSpec) -> None:
    """A framework's pass runs on every micro-batch and leaves autograd nothing to add; in a
    pipeline at ZeRO-0 the ``_pp`` pass (DeepSpeed's BF16_Optimizer) is the one."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    hbm = h100.hbm_bw_bytes_per_s * h100.efficiency.memory_bw_fraction
    flat = Plan(tp=2, dp=8, zero_stage=0)
    both = _added(llama8b, cluster, flat, grad_accum_pass_bytes=10, grad_accum_inplace_bytes=6)
    assert both == pytest.approx(8 * _stage_params(llama8b, cluster, flat) * 10 / hbm, rel=1e-6)
    piped = Plan(tp=2, pp=2, dp=4, zero_stage=0)  # m = 16
    pp = _added(llama8b, cluster, piped, grad_accum_pass_bytes_pp=20, grad_accum_inplace_bytes=6)
    assert pp == pytest.approx(16 * _stage_params(llama8b, cluster, piped) * 20 / hbm, rel=1e-6)
    zero1 = Plan(tp=2, pp=2, dp=4, zero_stage=1)  # the pipeline's ZeRO-1: autograd's again
    z1 = _added(llama8b, cluster, zero1, grad_accum_pass_bytes_pp=20, grad_accum_inplace_bytes=6)
    assert z1 == pytest.approx(15 * _stage_params(llama8b, cluster, zero1) * 6 / hbm, rel=1e-6)
