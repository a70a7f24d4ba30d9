"""MoE invariants: the grouped expert GEMMs, load imbalance, the dispatchers and their
placement, the permute/unpermute copies and the MoE calibration stage's bookkeeping."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, Training, estimate
from costmodel.kernels import kernels_of
from costmodel.moe import (
    expert_bias,
    expert_bias_ops,
    grouped_expert_time,
    permute_elements,
    tokens_per_expert,
)
from costmodel.parallel.expert import groups_hit
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec
from hardware_catalog import get_fabric

# fine-grained experts (Qwen3-30B-A3B's shape): 128 experts of width 768, top-8
FINE = ModelSpec(layers=8, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=4, head_dim=128,
                 vocab=32000, moe_experts=128, moe_topk=8, moe_ffn_hidden=768)


def _a2a(est: object) -> object:
    return next(c for c in est.collectives  # type: ignore[attr-defined]
                if c.name.startswith("ep_token"))


def _expert_flops_per_s(gpu: GpuSpec, micro_batch: int, precision: str = "bf16") -> float:
    cluster = ClusterSpec(gpu=gpu, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64, precision=precision)  # type: ignore[arg-type]
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8, micro_batch=micro_batch)]))
    kn = kernels_of(cluster, tr, p)
    m = tokens_per_expert(FINE, p, kn)
    local = FINE.moe_experts / 8
    flops = 2.0 * m * local * 3 * FINE.hidden * FINE.expert_ffn_hidden
    return float((flops / grouped_expert_time(FINE, tr, p, kn))[0])


def test_grouped_gemm_efficiency_rises_with_tokens_per_expert(h100: GpuSpec) -> None:
    """Each expert's weights are read whatever its tokens: few tokens per expert run far below
    peak (memory bound), more tokens approach the GEMM fraction, never past it."""
    rates = [_expert_flops_per_s(h100, mb) for mb in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(rates, rates[1:], strict=False))
    peak = h100.peak_flops_bf16 * h100.efficiency.gemm_peak_fraction
    assert rates[-1] <= peak
    # one token per expert is memory bound: a tiny share of the peak
    tiny = replace(FINE, moe_experts=32768 // 8 * 8, moe_topk=1)
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=512, global_batch=8)
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    kn = kernels_of(cluster, tr, p)
    m = tokens_per_expert(tiny, p, kn)
    flops = 2.0 * m * tiny.moe_experts / 8 * 3 * tiny.hidden * tiny.expert_ffn_hidden
    assert float((flops / grouped_expert_time(tiny, tr, p, kn))[0]) < 0.05 * peak


def test_fp8_expert_gemms_pay_their_input_casts(h100: GpuSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8, micro_batch=2)]))
    tr = training_for(seq_len=4096, global_batch=64, precision="fp8")
    dear = replace(h100, efficiency=replace(h100.efficiency, fp8_cast_bytes_per_element=12.0))
    cheap = replace(h100, efficiency=replace(h100.efficiency, fp8_cast_bytes_per_element=3.0))
    times = [grouped_expert_time(FINE, tr, p, kernels_of(replace(cluster, gpu=g), tr, p))[0]
             for g in (cheap, dear)]
    assert times[0] < times[1]


def test_expert_biases_pay_megatron_cores_eager_fc2_bias_add(h100: GpuSpec) -> None:
    """With biases on the experts (gpt-oss) fc2's bias is added eagerly, local expert by local
    expert (experts.py TEGroupedMLP._apply_bias): 6 passes over the busiest rank's routed copies
    forward and 8 backward, 2 and 4 launches a local expert; fc1's rides in its GEMM."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64)
    plan = Plan(dp=8, ep=8)
    p = as_plan_arrays(plans_to_arrays([plan]))
    kn = kernels_of(cluster, tr, p)
    biased = replace(FINE, bias="all")
    fwd, bwd = expert_bias(biased, tr, p, kn)
    ops = expert_bias_ops(biased, p)[0]
    local = FINE.moe_experts // 8  # 16 local experts, each 4,096 x 8 / 128 x 8 copies
    copies = 4096 * FINE.moe_topk * tr.framework.moe.moe_load_imbalance
    pass_s = copies * FINE.hidden * 2.0 / kn.hbm
    launch = h100.efficiency.kernel_overhead_s
    assert fwd[0] == pytest.approx(6 * pass_s + (2 * local + 3) * launch)
    assert bwd[0] == pytest.approx(8 * pass_s + (4 * local + 2) * launch)
    assert ops[0] == 2 * local + 3
    assert not np.any(np.concatenate([*expert_bias(FINE, tr, p, kn), *expert_bias_ops(FINE, p)]))
    # the step pays it in every MoE layer's forward and backward, beside the other biases
    extra = (estimate(biased, cluster, plan, tr).step_time_s
             - estimate(FINE, cluster, plan, tr).step_time_s)
    assert extra >= (fwd[0] + bwd[0]) * FINE.layers * 64 // 8


def test_load_imbalance_slows_the_moe_layer(h100: GpuSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(dp=16, ep=16, micro_batch=1)
    even = estimate(FINE, cluster, plan, training_for(seq_len=4096, global_batch=64))
    skew = estimate(FINE, cluster, plan, training_for(seq_len=4096, global_batch=64,
                                                  moe_load_imbalance=1.4))
    assert skew.step_time_s > even.step_time_s
    assert skew.compute.time_s > even.compute.time_s
    assert _a2a(skew).time_s == pytest.approx(1.4 * _a2a(even).time_s, rel=1e-3)  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="moe_load_imbalance"):
        training_for(seq_len=4096, global_batch=64, moe_load_imbalance=0.9)


def test_all_to_all_across_nodes_is_slower_than_inside_one(h100: GpuSpec) -> None:
    """The same EP 8 group with its 8 members in one NVLink domain, or 4 in each of two (half
    the peers over the NIC): same bytes, more time, for every dispatcher."""
    from costmodel.compute import layer_times
    from costmodel.parallel.expert import expert_parallel
    from costmodel.parallel.mesh import mesh_of

    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    for dispatcher in ("alltoall", "flex"):
        tr = training_for(seq_len=4096, global_batch=64, moe_dispatcher=dispatcher)  # type: ignore[arg-type]
        g = mesh_of(cluster, tr, p)
        lt = layer_times(FINE, cluster, tr, p)
        inside = expert_parallel(FINE, cluster, tr, g, lt)
        across = expert_parallel(FINE, cluster, tr, replace(g, k_ep=g.k_ep / 2), lt)
        assert float(across.layer_fwd_s[0]) > 1.5 * float(inside.layer_fwd_s[0])
        assert float(across.token_bytes[0]) == float(inside.token_bytes[0])


def test_flex_dispatcher_sends_each_token_once_per_remote_node(h100: GpuSpec) -> None:
    """DeepEP's dispatch sends a token over the network once per destination node, the
    alltoall dispatcher once per expert copy: across nodes flex is faster; in one NVLink domain
    both exchange about the same."""
    plan = Plan(dp=32, ep=32)
    cluster = ClusterSpec(gpu=h100, num_gpus=32)
    times = {d: _a2a(estimate(FINE, cluster, plan, training_for(seq_len=4096, global_batch=64,
                                                            moe_dispatcher=d))).time_s  # type: ignore[attr-defined]
             for d in ("alltoall", "flex", "allgather")}
    assert times["flex"] < times["alltoall"]
    assert all(t > 0 for t in times.values())
    with pytest.raises(SpecError, match="moe_dispatcher"):
        training_for(seq_len=4096, global_batch=64, moe_dispatcher="ring")  # type: ignore[arg-type]


def test_flex_runs_at_its_own_kernels_bandwidth_not_nccls(h100: GpuSpec) -> None:
    """DeepEP / HybridEP run their own kernels: the flex exchange follows
    ``flex_network_bw_fraction`` of the NIC, not NCCL's fitted all-to-all ratio, which the
    alltoall dispatcher follows."""
    plan = Plan(dp=32, ep=32)

    def a2a(dispatcher: str, **eff: float) -> float:
        gpu = replace(h100, efficiency=replace(h100.efficiency, **eff))
        tr = training_for(seq_len=4096, global_batch=64, moe_dispatcher=dispatcher)  # type: ignore[arg-type]
        return float(_a2a(estimate(FINE, ClusterSpec(gpu=gpu, num_gpus=32), plan, tr)).time_s)  # type: ignore[attr-defined]

    assert a2a("flex", all_to_all_bw_ratio=0.5) == a2a("flex", all_to_all_bw_ratio=1.0)
    assert a2a("flex", flex_network_bw_fraction=0.4) > 1.5 * a2a("flex")
    assert a2a("alltoall", all_to_all_bw_ratio=0.3) > 1.5 * a2a("alltoall",
                                                                all_to_all_bw_ratio=0.6)
    assert a2a("alltoall", flex_network_bw_fraction=0.4) == a2a("alltoall")


def test_groups_hit_is_bounded_by_groups_and_top_k() -> None:
    g = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 128.0])
    hit = groups_hit(g, 128, 8)
    assert np.all(hit <= np.minimum(g, 8.0) + 1e-9) and np.all(hit >= 1.0 - 1e-9)
    assert hit[-1] == pytest.approx(8.0)  # one expert per group: k groups
    assert hit[0] == pytest.approx(1.0)
    assert np.all(np.diff(hit) > 0)


def test_a2a_overlap_never_shows_more_than_without(h100: GpuSpec) -> None:
    plan = Plan(dp=16, ep=16)
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    base = training_for(seq_len=4096, global_batch=64)
    off = estimate(FINE, cluster, plan, base)
    on = estimate(FINE, cluster, plan, base.with_switches(moe_a2a_overlap=True))
    assert _a2a(on).time_s == pytest.approx(_a2a(off).time_s)  # type: ignore[attr-defined]
    assert _a2a(on).exposed_s < _a2a(off).exposed_s  # type: ignore[attr-defined]
    assert on.step_time_s < off.step_time_s


def test_a2a_overlap_runs_the_first_forward_and_the_last_backward_alone(h100: GpuSpec) -> None:
    """Megatron-Core's combined 1F1B pairs micro-batch i + 1's forward with i's backward: with one
    micro-batch nothing pairs and the whole exchange shows; with more, a smaller share does."""
    plan = Plan(dp=16, ep=16)
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    shares = []
    for batch in (16, 64, 256):  # 1, 4 and 16 micro-batches per rank
        base = training_for(seq_len=4096, global_batch=batch)
        off = _a2a(estimate(FINE, cluster, plan, base)).exposed_s  # type: ignore[attr-defined]
        on = _a2a(estimate(FINE, cluster, plan,  # type: ignore[attr-defined]
                           base.with_switches(moe_a2a_overlap=True))).exposed_s
        shares.append(on / off)
    assert shares[0] == pytest.approx(1.0)
    assert shares[0] > shares[1] > shares[2] >= 1 / 16


def test_unpaired_share_counts_the_interleaved_warmup(h100: GpuSpec) -> None:
    from costmodel.parallel.expert import unpaired_share
    from costmodel.parallel.mesh import mesh_of

    # pp 8, vp 4, 128 micro-batches per rank: the first rank's warm-up runs
    # (8 - 1) * 2 + (4 - 1) * 8 + 1 = 39 of its 128 * 4 = 512 forward chunk steps alone
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=4096, global_batch=256, moe_a2a_overlap=True)
    p = as_plan_arrays(plans_to_arrays([Plan(pp=8, vpp=4, dp=2, ep=2)]))
    assert float(unpaired_share(mesh_of(cluster, tr, p))[0]) == pytest.approx(39 / 512)


def test_permute_fusion_moves_fewer_bytes(h100: GpuSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    tr = training_for(seq_len=4096, global_batch=64)
    kn = kernels_of(cluster, tr, p)
    unfused = permute_elements(FINE, tr, p, kn)
    fused = permute_elements(FINE, tr.with_switches(moe_permute_fusion=True), p, kn)
    assert float(fused[0]) < float(unfused[0])
    # fused: each token read once and written k times, and back; 16 local experts are sorted
    assert float(fused[0]) == pytest.approx(2 * (1 + 8) + 4 * 8)


def test_measured_moe_rows_and_bridge_recipes_run_balanced() -> None:
    """The Grok-1 rows (capacity factor 1 with padding) and Megatron-Bridge's benchmarks
    (force-balanced routing) run with imbalance 1: the model's default and the bench's."""
    import sys
    from pathlib import Path

    from search.inputs.measured import case_from_row

    row = {"model_name": "grok", "layers": "2", "hidden": "6144", "ffn_hidden": "32768",
           "heads": "48", "kv_heads": "8", "vocab": "131072", "seq_len": "4096",
           "moe_experts": "8", "moe_topk": "2", "moe_ffn_hidden": "32768",
           "gpu": "h100-sxm-80gb", "num_gpus": "8", "tp": "4", "dp": "2", "ep": "2",
           "micro_batch": "1", "global_batch": "1024", "precision": "bf16", "framework": "nemo",
           "source": "dgxc-benchmarking"}
    tr = case_from_row(row).training
    own = tr.framework.moe
    assert own.moe_load_imbalance == 1.0 and own.moe_dispatcher == "alltoall"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bridge_recipes import MOE_RECIPES, moe_switches

    for release, system in MOE_RECIPES:
        assert moe_switches(release, system, True)["moe_load_imbalance"] == 1.0


def test_bridge_regression_rows_are_bridge_moe_rows_and_marked() -> None:
    """Every row BRIDGE_REGRESSIONS names is a Megatron-Bridge MoE row and its label carries the
    mark; the other MoE rows' do not; TP overlap reaches the MoE rows only where their recipe
    runs it (25.09's Qwen3 at TP 2), never at TP 1."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bridge_recipes import DAGGER, moe_label, moe_switches, recipe_switches
    from published_runs import BRIDGE, BRIDGE_REGRESSIONS, BRIDGE_SYSTEMS

    from search.inputs.presets import PRESETS

    moe_rows = {(r[0], r[1], r[2]): r for r in BRIDGE if PRESETS[r[2]].is_moe}
    # a regression names a Megatron-Bridge MoE release (some are rows of measured_runs.csv
    # only, as 25.11's DGX-B200 Qwen3-235B)
    assert all(PRESETS[m].is_moe and s in BRIDGE_SYSTEMS for _, s, m in BRIDGE_REGRESSIONS)
    for (release, system, preset), row in moe_rows.items():
        tr = training_for(seq_len=4096, global_batch=64,
                      **moe_switches(release, system, True))  # type: ignore[arg-type]
        marked = moe_label(release, system, preset, tr).endswith(DAGGER)
        assert marked == ((release, system, preset) in BRIDGE_REGRESSIONS)
        tp = row[8]
        overlap = recipe_switches(preset, tp, (release, system)).get("tp_comm_overlap", False)
        assert overlap == (tp > 1 and (release, system, preset)
                           == ("25.09", "DGX-GB200", "qwen3-235b-a22b"))


def test_moe_stage_rewrites_only_its_part_of_the_source() -> None:
    from costmodel.specs import Efficiency
    from tcf_search.calibration.moe_fit import MOE_MARK, with_moe_source

    eff = Efficiency(source="dense fit on 845 rows")
    once = with_moe_source(eff, "fitted on 8 rows")
    twice = with_moe_source(once, "fitted on 8 rows")
    assert once == twice and once.source.count(MOE_MARK) == 1
    assert once.source.startswith("dense fit on 845 rows")


def test_moe_fit_rows_are_the_measured_moe_rows_less_the_regressions() -> None:
    """The MoE stage fits NVIDIA's DGX Cloud and Megatron-Bridge MoE rows that report tokens/s;
    a row of a release in BRIDGE_REGRESSIONS (matched by its source_detail's section and its
    model) is set apart, a dense row or another source's MoE row is not a MoE row of the fit."""
    import pandas as pd

    from tcf_search.calibration.moe_fit import (
        BRIDGE_REGRESSIONS,
        moe_group,
        moe_rows,
        regression_rows,
    )

    detail = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @067f987d "
              "section {release} {system}")

    def row(source: str, release: str, system: str, model: str, experts: float,
            tput: float = 1000.0) -> dict:
        return {"case_id": f"{source}-{release}-{system}-{model}", "source": source,
                "source_detail": detail.format(release=release, system=system),
                "model_name": model, "moe_experts": experts, "status": "ok",
                "tokens_per_sec_per_gpu": tput, "gpu": "h100-sxm-80gb"}

    frame = pd.DataFrame([
        row("megatron-bridge", "25.11", "DGX-H100", "Qwen3_30B_a3B", 128.0),  # #1998
        row("megatron-bridge", "25.11", "DGX-B200", "Qwen3_235B_a22B", 128.0),  # #1705
        row("megatron-bridge", "26.04.01", "DGX-H100", "Qwen3_30B_a3B", 128.0),
        row("megatron-bridge", "26.04.01", "DGX-H100", "LLAMA3_70B", float("nan")),
        row("dgxc-benchmarking", "", "", "Grok-1 314B (MoE)", 8.0),
        row("mcore-moe", "", "", "Mixtral 8x7B (dropless)", 8.0, float("nan")),
    ])
    assert regression_rows(frame).tolist() == [True, True, False, False, False, False]
    assert moe_rows(frame).tolist() == [False, False, True, False, True, False]
    assert ("25.11", "DGX-B200", "qwen3-235b-a22b") in BRIDGE_REGRESSIONS
    # a model's releases and variants are one hold-out group per GPU
    assert moe_group(pd.DataFrame({"model_name": ["DeepSeekV3 (w/ MTP)", "DeepSeekV3"],
                                   "gpu": ["b200-180gb"] * 2})).nunique() == 1


def test_all_to_all_time_follows_the_ratio_and_the_fabric_fraction(h100: GpuSpec) -> None:
    """NCCL's all-to-all runs at all_to_all_bw_ratio of the ring collectives' bandwidth on each
    link: across nodes its time is the network bytes over (fabric fraction x ratio x NIC line
    rate), so halving the ratio doubles the bandwidth term, and the DGX SuperPOD's InfiniBand
    (0.96) moves the same bytes faster than the family's fitted fraction where that is lower."""
    plan = Plan(dp=32, ep=32)
    tr = training_for(seq_len=4096, global_batch=64)
    fabric = get_fabric("infiniband")

    def a2a_s(ratio: float, fraction: float | None) -> float:
        gpu = replace(h100, efficiency=replace(h100.efficiency, all_to_all_bw_ratio=ratio))
        extra = {} if fraction is None else {"network_bw_fraction": fraction}
        cluster = ClusterSpec(gpu=gpu, num_gpus=32, **extra)  # type: ignore[arg-type]
        return _a2a(estimate(FINE, cluster, plan, tr)).time_s  # type: ignore[attr-defined]

    lo, hi = a2a_s(0.4, fabric.network_bw_fraction), a2a_s(0.8, fabric.network_bw_fraction)
    # EP 32 over 4 nodes: 24/32 of each rank's top-k copies cross the NIC, the bandwidth term
    # dominates, so half the ratio is about twice the time
    assert lo == pytest.approx(2.0 * hi, rel=0.05)
    if h100.efficiency.network_bw_fraction < fabric.network_bw_fraction:
        assert a2a_s(0.8, None) > hi


def test_shared_expert_overlap_hides_only_behind_shared_experts(h100: GpuSpec) -> None:
    """--moe-shared-expert-overlap runs the shared experts' MLP during the exchange: less of it
    shows with a shared expert, nothing changes without one."""
    plan = Plan(dp=16, ep=16)
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    base = training_for(seq_len=4096, global_batch=64)
    over = base.with_switches(moe_shared_expert_overlap=True)
    shared = replace(FINE, moe_shared_experts=1)
    for model, hides in ((shared, True), (FINE, False)):
        off, on = (_a2a(estimate(model, cluster, plan, t)) for t in (base, over))
        assert on.time_s == pytest.approx(off.time_s)  # type: ignore[attr-defined]
        if hides:
            assert on.exposed_s < off.exposed_s  # type: ignore[attr-defined]
        else:
            assert on.exposed_s == pytest.approx(off.exposed_s)  # type: ignore[attr-defined]


def test_full_recompute_is_a_share_of_the_kernels_with_ep_across_nodes(h100: GpuSpec) -> None:
    """The recomputed forward re-runs its all-to-all too, but that time is communication: the
    recompute share counts kernels only, so it stays below the kernels it is a part of (at most
    the forward's, about a third of forward and backward)."""
    cluster = ClusterSpec(gpu=h100, num_gpus=64, gpus_per_node=8)
    tr = training_for(seq_len=4096, global_batch=256)
    est = estimate(FINE, cluster, Plan(dp=64, ep=64, recompute="full"), tr)
    assert _a2a(est).exposed_s > 0.5 * est.compute.time_s  # the exchange is large here
    assert 0.0 < est.compute.recompute_time_s < 0.5 * est.compute.time_s


def _moe_act_bytes(model: ModelSpec, tr: Training, plan: Plan) -> float:
    from costmodel.activation_memory import activation_bytes_per_layer

    p = as_plan_arrays(plans_to_arrays([plan]))
    return float(activation_bytes_per_layer(model, tr, p)[0][0])


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_moe_activations_grow_with_top_k_and_expert_width(precision: str) -> None:
    """As Megatron-Core saves them: each routed copy keeps its fc1 input (h), fc1 output
    (2 fe, gated) and activation output (fe); more copies or wider experts keep more."""
    tr = training_for(seq_len=4096, global_batch=64, precision=precision)  # type: ignore[arg-type]
    plan = Plan(dp=8, ep=8)
    base = _moe_act_bytes(FINE, tr, plan)
    assert _moe_act_bytes(replace(FINE, moe_topk=9), tr, plan) > base
    assert _moe_act_bytes(replace(FINE, moe_ffn_hidden=1024), tr, plan) > base
    skewed = tr.with_switches(moe_load_imbalance=1.5)  # the busiest rank keeps more copies
    assert _moe_act_bytes(FINE, skewed, plan) > base


def test_one_more_routed_copy_keeps_its_expert_tensors_once() -> None:
    """bf16, no recompute, tp 1: one more top-k copy of each of the 4,096 tokens keeps its fc1
    input 2 h = 4,096 B, fc1 output 2 x 2 fe = 3,072 B and activation output 2 fe = 1,536 B:
    8,704 B per token. The permuted tokens are not saved twice (permute and unpermute keep index
    maps only)."""
    tr = training_for(seq_len=4096, global_batch=64)
    plan = Plan(dp=8, ep=8)
    delta = _moe_act_bytes(replace(FINE, moe_topk=9), tr, plan) - _moe_act_bytes(FINE, tr, plan)
    assert delta == pytest.approx(4096 * (2 * 2048 + 6 * 768))


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_a_dispatcher_that_syncs_is_slower_by_at_least_the_sync(h100: GpuSpec,
                                                                dispatcher: str) -> None:
    """Dropless, the dispatcher waits for the token counts on the host once per MoE layer
    forward; padded to capacity it does not: the forward is slower by at least the round trip
    and the host's issue of the next kernel, the backward not at all."""
    from costmodel.compute import layer_times
    from costmodel.moe import D2H_SYNC_S, host_syncs

    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    padded = training_for(seq_len=4096, global_batch=64, moe_dispatcher=dispatcher,  # type: ignore[arg-type]
                      moe_pad_to_capacity=True)
    dropless = padded.with_switches(moe_pad_to_capacity=False)
    assert host_syncs(padded, p)[0] == 0.0 and host_syncs(dropless, p)[0] == 1.0
    fast, slow = layer_times(FINE, cluster, padded, p), layer_times(FINE, cluster, dropless, p)
    gap = float(slow.fwd_moe_s[0] - fast.fwd_moe_s[0])
    assert gap >= (D2H_SYNC_S + dropless.framework.kernels.host_overhead_s) * (1 - 1e-9)
    assert float(slow.bwd_moe_s[0]) == float(fast.bwd_moe_s[0])
    # a host slower than the expert GEMMs it issues after the sync shows in full
    slow_host = layer_times(FINE, cluster, dropless.with_switches(host_overhead_s=200e-6), p)
    slow_padded = layer_times(FINE, cluster, padded.with_switches(host_overhead_s=200e-6), p)
    local_gemms = 2 * FINE.moe_experts / 8
    assert float(slow_host.fwd_moe_s[0] - slow_padded.fwd_moe_s[0]) > 0.5 * local_gemms * 200e-6
