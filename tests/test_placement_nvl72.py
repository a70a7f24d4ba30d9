"""Placement on a rack-scale NVLink domain (GB200 NVL72): the job's segment of a rack is its
domain (NVIDIA's launcher's Slurm segments), and where power-of-two groups straddle whole racks
of 72 the copy that spans most is priced (issue #34)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_helpers import training_for
from test_placement import _group, _tier

from costmodel import ClusterSpec, ModelSpec, Plan, check_plan, estimate, plan_placement

# --- a domain that is not a power of two: GB200 NVL72, 216 GPUs in three racks ----------------
# 54 four-GPU trays: Slurm segments of 18 trays (the most that divide 54 and fit a rack), so the
# job's NVLink domains are whole racks of 72, and a power-of-two plan's groups straddle them

NVL72_PLAN = Plan(tp=4, pp=2, dp=27, micro_batch=1, zero_stage=1, sequence_parallel=True)


def _nvl72(llama8b: ModelSpec):
    from hardware_catalog import get_gpu

    cluster = ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=216, gpus_per_node=4)
    tr = training_for("megatron", seq_len=4096, global_batch=216)
    check_plan(llama8b, cluster, NVL72_PLAN, tr)
    assert cluster.nvlink_domain == 72
    return cluster, tr


def test_nvl72_pipeline_hops_agree_with_the_pp_span(llama8b: ModelSpec) -> None:
    cluster, tr = _nvl72(llama8b)
    # counting: stage 0 at rank b, stage 1 at b + 108, for every b < 108: all in other racks
    assert sum((b // 72) != ((b + 108) // 72) for b in range(108)) == 108
    doc = plan_placement(llama8b, cluster, NVL72_PLAN, tr)
    assert "pp" in doc["network_groups"]
    assert [h["link"] for h in doc["pp_hops"]] == ["network"]
    assert _tier(estimate(llama8b, cluster, NVL72_PLAN, tr), "pp_activation_send_recv") == \
        "network"


def test_nvl72_dp_groups_of_the_second_stage_cross_the_racks(llama8b: ModelSpec) -> None:
    cluster, tr = _nvl72(llama8b)
    stage1 = [108 + 4 * k for k in range(27)]
    assert len({r // 72 for r in stage1}) == 2  # counting: this dp group spans two racks
    doc = plan_placement(llama8b, cluster, NVL72_PLAN, tr)
    assert _group(doc, "dp")["network"]
    assert _tier(estimate(llama8b, cluster, NVL72_PLAN, tr), "dp_grad_reduce") == "network"


@pytest.mark.parametrize(("gpus", "domain"), [
    (64, 64), (72, 72), (128, 64), (144, 72), (96, 48), (512, 64), (4, 4), (68, 68)])
def test_a_rack_scale_job_is_allocated_in_equal_segments(gpus: int, domain: int) -> None:
    """NVIDIA's launcher asks Slurm for GB200 jobs in segments of the most trays that divide
    the job's and fit the 18-tray rack (dgxc-benchmarking llmb-run _compute_segment_size): 128
    GPUs are two racks of 64, not 72 + 56; a node-scale GPU's domain stays its node."""
    from hardware_catalog import get_gpu

    nvl = ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=gpus, gpus_per_node=4)
    assert nvl.nvlink_domain == domain
    assert ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=64).nvlink_domain == 8


def test_an_ep_group_of_a_128_gpu_nvl72_job_stays_on_nvlink(llama8b: ModelSpec) -> None:
    """Grok-1's GB200 layout (TP 4, EP 8: 32 ranks) on 128 GPUs: every EP group inside one
    64-GPU segment, its all-to-all on NVLink (with 72 + 56 one group straddled the racks and
    put every exchange on the network)."""
    from hardware_catalog import get_gpu

    moe = replace(llama8b, moe_experts=8, moe_topk=2, moe_ffn_hidden=4096)
    cluster = ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=128, gpus_per_node=4)
    plan = Plan(tp=4, pp=1, dp=32, ep=8, micro_batch=1, zero_stage=1, sequence_parallel=True)
    tr = training_for("megatron", seq_len=4096, global_batch=128)
    check_plan(moe, cluster, plan, tr)
    doc = plan_placement(moe, cluster, plan, tr)
    assert not _group(doc, "ep")["network"]
    assert _tier(estimate(moe, cluster, plan, tr), "ep_token_all_to_all") == "nvlink"
