"""Optimizer-state and gradient dtypes, and ZeRO-3's gradient sync under accumulation: what each
switch must do to the memory and the traffic, and the NeMo AutoModel profile that sets them."""

from __future__ import annotations

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, Plan, SpecError, estimate
from hardware_catalog import get_gpu
from search.inputs.presets import PRESETS
from search.inputs.specs import training_spec

GIB = 2**30


def _grad_reduce(est) -> tuple[float, float]:
    row = next(c for c in est.collectives if c.name == "dp_grad_reduce")
    return row.bytes, row.time_s


@pytest.mark.parametrize("mbs", [1, 2])
def test_zero3_step_sync_holds_whole_gradients_and_reduces_once(h100, llama8b,
                                                                mbs: int) -> None:
    """With m > 1 micro-batches ZeRO-3 either reduce-scatters m times and keeps a shard, or
    (sync off until the last micro-batch) keeps whole gradients and reduce-scatters once."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plan = Plan(dp=64, micro_batch=mbs, zero_stage=3)
    each = training_for(seq_len=4096, global_batch=64 * mbs * 8)
    once = each.with_switches(zero3_grad_sync="step")
    m = each.global_batch // (64 * mbs)
    a, b = (estimate(llama8b, cluster, plan, t) for t in (each, once))
    (bytes_a, time_a), (bytes_b, time_b) = _grad_reduce(a), _grad_reduce(b)
    assert m == 8
    assert bytes_b == pytest.approx(bytes_a / m) and time_b == pytest.approx(time_a / m)
    grads_a, grads_b = (e.memory.stages[0].grads_bytes for e in (a, b))
    assert grads_b == pytest.approx(64 * grads_a)
    # the parameters are gathered in every micro-batch's forward and backward either way
    gathers = [next(c for c in e.collectives if c.name == "dp_param_all_gather") for e in (a, b)]
    assert gathers[0].bytes == pytest.approx(gathers[1].bytes)


def test_zero3_step_sync_with_one_micro_batch_changes_nothing(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    each = training_for(seq_len=4096, global_batch=64)
    a, b = (estimate(llama8b, cluster, Plan(dp=64, zero_stage=3), t)
            for t in (each, each.with_switches(zero3_grad_sync="step")))
    assert a.step_time_s == b.step_time_s and a.memory.peak_bytes == b.memory.peak_bytes


def test_gradients_reduced_in_fp32_double_the_wire_not_the_stored_shard(h100, llama8b) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    bf16 = training_for(seq_len=4096, global_batch=64, grad_dtype_bytes=2)
    fp32_wire = bf16.with_switches(grad_reduce_bytes=4)
    a, b = (estimate(llama8b, cluster, Plan(dp=64, zero_stage=1), t) for t in (bf16, fp32_wire))
    assert _grad_reduce(b)[0] == pytest.approx(2 * _grad_reduce(a)[0])
    assert b.memory.stages[0].grads_bytes == a.memory.stages[0].grads_bytes


@pytest.mark.parametrize("master", [True, False])
def test_optimizer_states_take_their_dtype(h100, llama8b, master: bool) -> None:
    """Adam's two moments at 4 or 2 bytes each, beside a 4-byte master or none."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    fp32 = training_for(seq_len=4096, global_batch=8, master_weights=master)
    bf16 = fp32.with_switches(optimizer_state_bytes=2)
    a, b = (estimate(llama8b, cluster, Plan(dp=8, zero_stage=1), t) for t in (fp32, bf16))
    opt_a, opt_b = (e.memory.stages[0].optimizer_bytes for e in (a, b))
    per_param_a = (4 if master else 0) + 8
    assert opt_b / opt_a == pytest.approx(((4 if master else 0) + 4) / per_param_a)
    assert b.compute.optimizer_time_s < a.compute.optimizer_time_s


def test_state_dtypes_are_checked() -> None:
    with pytest.raises(SpecError, match="training.optimizer_state_bytes must be one of"):
        training_for(seq_len=1024, global_batch=8, optimizer_state_bytes=8)
    with pytest.raises(SpecError, match="training.zero3_grad_sync must be one of"):
        training_for(seq_len=1024, global_batch=8, zero3_grad_sync="never")  # type: ignore[arg-type]


def test_automodel_qwen3_benchmark_recipe_fits_80gb() -> None:
    """NeMo AutoModel's Qwen3-30B-A3B benchmark (examples/benchmark/configs/
    qwen3_moe_30b_te_deepep.yaml: 8 H100 80 GB, EP8 over FSDP2 of 8, local batch 4, activation
    checkpointing) ran: with its bf16 parameters and Adam states the profile must say it fits,
    where fp32 masters and moments (mixed precision as the generic profile keeps it) would not."""
    model = PRESETS["qwen3-30b-a3b"]
    cluster = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=8, gpus_per_node=8)
    plan = Plan(dp=8, ep=8, micro_batch=4, zero_stage=3, recompute="full")
    automodel = training_spec(framework="nemo-automodel", precision="bf16", seq_len=4096,
                              global_batch=512)
    mixed = automodel.with_switches(master_weights=True, optimizer_state_bytes=4,
                                    grad_dtype_bytes=4)
    fits, over = (estimate(model, cluster, plan, t).memory for t in (automodel, mixed))
    assert fits.fits and not over.fits
    assert over.peak_bytes - fits.peak_bytes > 20 * GIB
