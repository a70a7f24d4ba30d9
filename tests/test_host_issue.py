"""The host CPU issues every framework operation at the framework's ``host_overhead_s`` times its
own ``GpuSpec.host_issue_factor`` (``costmodel.kernels.host_op_s``): 1 for an x86 DGX host,
2.75 for Grace (TransformerEngine#2053: a torch Linear forward takes 37.08 us of CPU on GB200,
13.48 on an H100 DGX)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodel import Plan, estimate, plans_to_arrays
from costmodel.compute import layer_times
from costmodel.kernels import host_op_s
from costmodel.plans import as_plan_arrays
from costmodel.specs import ClusterSpec
from hardware_catalog import get_gpu
from search.inputs.presets import get_preset
from search.inputs.specs import training_spec


def _tr():  # noqa: ANN202
    return training_spec(seq_len=4096, global_batch=64, precision="bf16", framework="megatron")


def test_grace_hosts_issue_slower_than_x86_dgx_hosts() -> None:
    assert get_gpu("h100-sxm-80gb").host_issue_factor == 1.0  # the catalog's default
    assert get_gpu("b200-180gb").host_issue_factor == 1.0  # DGX B200: Xeon hosts
    for sku in ("gb200-nvl72", "gb300-nvl72"):
        assert get_gpu(sku).host_issue_factor == pytest.approx(37.08 / 13.48, abs=0.01)
    tr = _tr()
    gb200 = ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=8, gpus_per_node=4)
    assert host_op_s(gb200, tr) == pytest.approx(2.75 * tr.framework.kernels.host_overhead_s)


def test_every_host_cost_of_a_layer_scales_with_the_factor() -> None:
    """The layer's issue time (its kernels, the MoE layer's post-sync operations) follows the
    host; the GPU's kernel time does not."""
    model, tr = get_preset("qwen3-30b-a3b"), _tr()
    p = as_plan_arrays(plans_to_arrays([Plan(tp=1, pp=1, dp=8, ep=8, zero_stage=1)]))
    gpu = get_gpu("gb200-nvl72")
    x86 = ClusterSpec(gpu=dataclasses.replace(gpu, host_issue_factor=1.0), num_gpus=8,
                      gpus_per_node=4)
    grace = dataclasses.replace(x86, gpu=gpu)
    slow, fast = layer_times(model, grace, tr, p), layer_times(model, x86, tr, p)
    for field in ("host_fwd_dense_s", "host_fwd_moe_s"):
        assert getattr(slow, field) == pytest.approx(2.75 * getattr(fast, field))
    assert np.allclose(slow.experts_fwd_s, fast.experts_fwd_s)
    # the MoE layer's forward waits on the host after each device-to-host sync
    assert (slow.fwd_moe_s > fast.fwd_moe_s).all()


def test_a_host_bound_moe_layout_is_slower_on_grace() -> None:
    model, tr = get_preset("qwen3-30b-a3b"), _tr()
    plan = Plan(tp=1, pp=1, dp=8, ep=8, zero_stage=1)
    gpu = get_gpu("gb200-nvl72")
    grace = ClusterSpec(gpu=gpu, num_gpus=8, gpus_per_node=4)
    x86 = dataclasses.replace(grace, gpu=dataclasses.replace(gpu, host_issue_factor=1.0))
    assert (estimate(model, grace, plan, tr).tokens_per_s_per_gpu
            < estimate(model, x86, plan, tr).tokens_per_s_per_gpu)


def test_the_interval_flags_the_plans_the_host_factor_moves() -> None:
    """No measured row is host-bound on a Grace host: a plan the factor slows rests on it
    (``†h``), re-priced at an x86 host's issue time; a plan it leaves alone does not."""
    from search.priors import plan_rests_on

    tr = _tr()
    grace = ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=8, gpus_per_node=4)
    moe = {t["flag"]: t for t in plan_rests_on(
        get_preset("qwen3-30b-a3b"), grace, tr, Plan(tp=1, pp=1, dp=8, ep=8, zero_stage=1))}
    assert moe["host prior"]["mark"] == "h"
    low, high = moe["host prior"]["tokens_per_s_ratio"]
    assert low == 1.0 < high  # an x86 host's issue time would be faster
    dense = plan_rests_on(get_preset("llama3-8b"), grace, tr, Plan(tp=1, pp=1, dp=8, zero_stage=1))
    assert "host prior" not in {t["flag"] for t in dense}
    x86 = ClusterSpec(gpu=get_gpu("b200-180gb"), num_gpus=8)
    assert "host prior" not in {t["flag"] for t in plan_rests_on(
        get_preset("qwen3-30b-a3b"), x86, tr, Plan(tp=1, pp=1, dp=8, ep=8, zero_stage=1))}


def test_a_host_that_issues_for_free_is_refused_by_name() -> None:
    from costmodel import SpecError

    with pytest.raises(SpecError, match=r"host_issue_factor must be a number in \(0"):
        dataclasses.replace(get_gpu("h100-sxm-80gb"), host_issue_factor=0.0)
