"""Inter-node fabrics: the catalog's fabrics.yaml, a cluster's network efficiency, how rows and
studies name their fabric, and Megatron's scatter/gather of pipeline activations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, comm, estimate
from costmodel.specs import GpuSpec
from hardware_catalog import UnknownFabric, get_fabric, load_fabrics
from hardware_catalog.frameworks import framework_settings
from search.inputs.measured import CaseError, case_from_row, row_fabric
from search.inputs.planfile import PlanFile, dump_plan_file, parse_plan_file
from search.inputs.specs import build_specs
from search.inputs.study import StudyError, parse_study


def _collective(est, name: str):  # noqa: ANN001, ANN202 - test helper
    return next(c for c in est.collectives if c.name == name)


def test_every_fabric_is_cited_and_physical() -> None:
    fabrics = load_fabrics()
    assert {"infiniband", "roce"} <= set(fabrics)
    for fabric in fabrics.values():
        assert 0.0 < fabric.network_bw_fraction <= 1.0, fabric.id
        assert fabric.source and fabric.description, fabric.id


def test_unknown_fabric_lists_the_valid_ids() -> None:
    with pytest.raises(UnknownFabric,
                       match="unknown fabric 'ethernet'; valid ids: efa, infiniband, roce"):
        get_fabric("ethernet")


def test_cluster_rejects_an_impossible_network_fraction(h100: GpuSpec) -> None:
    for bad in (0.0, 1.5):
        with pytest.raises(SpecError, match="cluster.network_bw_fraction must be in"):
            ClusterSpec(gpu=h100, num_gpus=16, network_bw_fraction=bad)


def test_fabric_efficiency_scales_network_collectives_only(h100: GpuSpec,
                                                           llama8b: ModelSpec) -> None:
    tr = training_for(seq_len=4096, global_batch=64)
    across = Plan(tp=8, dp=2, sequence_parallel=True)  # DP spans the two nodes, TP stays inside

    def on(fraction: float):  # noqa: ANN202 - test helper
        cluster = ClusterSpec(gpu=h100, num_gpus=16, network_bw_fraction=fraction)
        return estimate(llama8b, cluster, across, tr)

    dp = [_collective(on(f), "dp_grad_reduce").time_s for f in (0.25, 0.5, 1.0)]
    # time = bytes / (fraction * NIC) + latency: the latency cancels in differences, and the
    # bandwidth term halves with each doubling of the fraction
    assert (dp[0] - dp[1]) / (dp[1] - dp[2]) == pytest.approx(2.0)
    tp = [_collective(on(f), "tp_activation_allreduce").time_s for f in (0.25, 1.0)]
    assert tp[0] == tp[1]  # NVLink only


def test_no_fabric_keeps_the_family_calibration(h100: GpuSpec, llama8b: ModelSpec) -> None:
    tr = training_for(seq_len=4096, global_batch=64)
    plan = Plan(tp=8, dp=2, sequence_parallel=True)
    family = ClusterSpec(gpu=h100, num_gpus=16)
    same = ClusterSpec(gpu=h100, num_gpus=16,
                       network_bw_fraction=h100.efficiency.network_bw_fraction)
    assert estimate(llama8b, family, plan, tr) == estimate(llama8b, same, plan, tr)


@pytest.mark.parametrize(("row", "fabric"), [
    ({"notes": "x=1; gpu as published: A100 80GB (1600Gbps RoCE); other"}, "roce"),
    ({"notes": "gpu as published: A100 80GB SXM (Selene); sharding as published: none"},
     "infiniband"),
    ({"notes": "gpu as published: H100 80GB SXM; HFU=55%"}, ""),
    # NVIDIA DGX systems (Megatron-Bridge's and NeMo's tables): the SuperPOD's InfiniBand
    ({"notes": "gpu as published: H100 80GB SXM (DGX-H100); zero_stage=1"}, "infiniband"),
    ({"notes": "gpu as published: B200 180GB (DGX-B200); precision as published: mxfp8"},
     "infiniband"),
    ({"notes": "gpu as published: 'H100' (DGX Cloud reference cluster; H100 taken as SXM)"},
     ""),  # DGX Cloud names no fabric: the family's fitted fraction
    ({"notes": "nothing about the hardware mentions RoCE here"}, ""),  # only the hardware string
    ({"fabric": "infiniband", "notes": "gpu as published: A100 (1600Gbps RoCE)"}, "infiniband"),
    ({}, ""),
])
def test_row_fabric_reads_the_published_hardware_string(row: dict, fabric: str) -> None:
    assert row_fabric(row) == fabric


ROW = {"model_name": "m", "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8,
       "vocab": 32000, "seq_len": 2048, "gpu": "a100-sxm-80gb", "num_gpus": 16,
       "global_batch": 64, "tp": 8, "dp": 2, "framework": "megatron", "precision": "fp16"}


def test_a_row_on_a_known_fabric_gets_its_efficiency() -> None:
    case = case_from_row({**ROW, "fabric": "roce"})
    assert case.cluster.fabric == "roce"
    assert case.cluster.network_bw_fraction == get_fabric("roce").network_bw_fraction
    assert case_from_row(ROW).cluster.network_bw_fraction is None


def test_rows_that_differ_only_in_fabric_are_predicted_apart() -> None:
    """Rows are evaluated in groups sharing model, cluster and training: a fabric is part of
    the cluster, so the same plan on two fabrics must not share one group's network."""
    import pandas as pd

    from tcf_search.calibration.dataset import load_groups, predict_groups

    frame = pd.DataFrame([{**ROW, "fabric": "roce"}, {**ROW, "fabric": "infiniband"},
                          {**ROW, "fabric": "roce"}])
    groups, errors = load_groups(frame)
    assert not errors.any()
    assert sorted(g.cluster.fabric for g in groups) == ["infiniband", "roce"]
    tok = predict_groups(groups, len(frame))["tokens_per_s_per_gpu"]
    assert tok[0] == tok[2]
    assert (tok[1] > tok[0]) == (get_fabric("infiniband").network_bw_fraction
                                 > get_fabric("roce").network_bw_fraction)
    assert tok[1] != tok[0]


def test_a_row_on_an_unknown_fabric_is_a_row_error() -> None:
    with pytest.raises(CaseError, match="^fabric: unknown fabric 'token-ring'"):
        case_from_row({**ROW, "fabric": "token-ring"})


GOOD = """
model: {preset: llama3-8b}
training: {seq_len: 8192, global_batch: 256}
cluster: {gpu: a100-sxm-80gb, gpus: 64%s}
"""


def test_a_study_names_its_fabric_and_the_plan_file_keeps_it() -> None:
    specs = build_specs(parse_study(GOOD % ", fabric: infiniband"))
    assert specs.cluster.network_bw_fraction == get_fabric("infiniband").network_bw_fraction
    assert build_specs(parse_study(GOOD % "")).cluster.network_bw_fraction is None
    pf = PlanFile(study="s", model=specs.model, gpu="a100-sxm-80gb", num_gpus=64,
                  gpus_per_node=8, fabric="infiniband", training=specs.training,
                  plan=Plan(tp=8, dp=8))
    assert parse_plan_file(dump_plan_file(pf)).fabric == "infiniband"
    assert parse_plan_file(dump_plan_file(dataclasses.replace(pf, fabric=""))).fabric == ""


def test_a_study_with_an_unknown_fabric_names_the_field() -> None:
    with pytest.raises(StudyError, match=r"^cluster\.fabric: must be one of efa, infiniband, roce"):
        parse_study(GOOD % ", fabric: myrinet")


def test_scatter_gather_splits_cross_node_stage_activations_over_tp(h100: GpuSpec,
                                                                    llama8b: ModelSpec) -> None:
    # tp=8 fills a node, so consecutive pipeline stages sit on different nodes
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    plain = training_for(seq_len=4096, global_batch=64)
    sg = plain.with_switches(pp_scatter_gather=True)
    no_sp = Plan(tp=8, pp=2)
    p2p_plain = _collective(estimate(llama8b, cluster, no_sp, plain), "pp_activation_send_recv")
    p2p_sg = _collective(estimate(llama8b, cluster, no_sp, sg), "pp_activation_send_recv")
    assert p2p_sg.bytes == pytest.approx(p2p_plain.bytes / 8)
    # an NVLink all-gather replaces 7/8 of the NIC's bytes: each of 2 x 64 hops sends x / 8
    # across nodes, then all-gathers x over the node
    link, x, one = comm.link_of(cluster), 4096 * 4096 * 2.0, np.array([1.0])
    hop = (comm.p2p_time(np.array([x / 8]), one > 0, link)
           + comm.gather_time(np.array([x]), 8 * one, 8 * one, link))
    assert p2p_sg.time_s == pytest.approx(2 * 64 * float(hop[0]), rel=1e-9)
    assert p2p_sg.time_s < p2p_plain.time_s
    with_sp = Plan(tp=8, pp=2, sequence_parallel=True)  # already sharded: nothing changes
    assert (estimate(llama8b, cluster, with_sp, sg).step_time_s
            == estimate(llama8b, cluster, with_sp, plain).step_time_s)


def test_profile_switches_can_depend_on_precision() -> None:
    # Megatron all-reduces fp16 gradients in fp16 unless told otherwise; bf16 forces fp32
    assert framework_settings("megatron", "fp16")["grad_dtype_bytes"] == 2
    assert framework_settings("megatron", "bf16")["grad_dtype_bytes"] == 4  # the generic one
    assert not any(k.endswith("_fp16") for k in framework_settings("megatron", "fp16"))


@pytest.mark.parametrize("framework,kernel,p2p,fp8_casts", [
    ("generic", "flash3", True, True),       # Megatron-Core + Transformer Engine defaults
    ("megatron", "flash3", True, True),      # Megatron-Core today; aliases name it too
    ("megatron-core", "flash3", True, True),
    ("nemo", "flash3", True, True),
    ("megatron-sc21", "flash3", False, True),  # SC21: no p2p overlap (and no flash attention)
    ("nanotron", "flash2", True, True),
    ("llm-foundry", "flash1", True, True),  # its tables: attn_impl triton (FA-1 port)
    ("torchtitan", "flash2", True, False),   # SDPA's flash backend; torchao float8
    ("deepspeed", "flash2", True, True),
])
def test_profiles_name_their_kernels_and_overlaps(framework: str, kernel: str, p2p: bool,
                                                  fp8_casts: bool) -> None:
    t = training_for(framework, seq_len=1024, global_batch=8).framework
    assert (t.attention.attention_kernel, t.pp.overlap_p2p_comm,
            t.numerics.fp8_saves_cast_inputs) == (kernel, p2p, fp8_casts)


def test_a_row_from_the_sc21_paper_runs_the_sc21_release() -> None:
    """The framework column says megatron; the row's source pins which Megatron-LM it was."""
    sc21 = case_from_row({**ROW, "source": "megatron-sc21"})
    today = case_from_row({**ROW, "source": "someone-else"})
    assert sc21.framework == "megatron-sc21" and today.framework == "megatron"
    old, new = sc21.training.framework, today.training.framework
    assert not old.attention.flash_attention and not old.dp.overlap_grad_reduce
    assert new.attention.flash_attention and new.dp.overlap_grad_reduce
    assert case_from_row({**ROW, "framework": "Megatron-Core"}).framework == "megatron"


def test_deepspeed_overlaps_only_at_stage_3() -> None:
    """DeepSpeed's overlap_comm defaults to true at ZeRO-3 only: at stages 0-2 the gradient
    reduce and the parameter gather are on the critical path."""
    dp = training_for("deepspeed", seq_len=1024, global_batch=8).framework.dp
    assert not (dp.overlap_grad_reduce or dp.overlap_grad_reduce_sharded
                or dp.overlap_param_gather)


def _with_step(gpu: GpuSpec, step_s: float) -> GpuSpec:
    return dataclasses.replace(gpu, efficiency=dataclasses.replace(
        gpu.efficiency, network_step_latency_s=step_s))


def test_network_step_latency_is_the_familys_where_no_fabric_is_named(h100: GpuSpec) -> None:
    """The fitted ring step goes with the fitted network fraction: both are the reference
    cluster's, used where a cluster names no fabric; a named fabric keeps NCCL's prior step, and
    0 (not fitted) means that prior everywhere."""
    gpu = _with_step(h100, 50e-6)
    assert comm.link_of(ClusterSpec(gpu=gpu, num_gpus=16)).network_latency_s == 50e-6
    named = ClusterSpec(gpu=gpu, num_gpus=16, fabric="infiniband",
                        network_bw_fraction=get_fabric("infiniband").network_bw_fraction)
    assert comm.link_of(named).network_latency_s == h100.network_latency_s
    unfitted = ClusterSpec(gpu=_with_step(h100, 0.0), num_gpus=16)
    assert comm.link_of(unfitted).network_latency_s == h100.network_latency_s


def test_a_ring_across_nodes_waits_the_step_once_per_rank(h100: GpuSpec,
                                                           llama8b: ModelSpec) -> None:
    """TP spanning nodes runs rings of tp - 1 steps in lockstep, each waiting on the network:
    a longer step costs (tp - 1) x its difference per TP collective, so TP 32 pays about twice
    what TP 16 pays (31 vs 15 steps), while a DP all-reduce's tree pays log2(dp) per bucket."""
    tr = training_for(seq_len=4096, global_batch=64)

    def tp_time(tp: int, step_s: float) -> float:
        cluster = ClusterSpec(gpu=_with_step(h100, step_s), num_gpus=tp)
        est = estimate(llama8b, cluster, Plan(tp=tp, dp=1, sequence_parallel=True), tr)
        tp_colls = [c for c in est.collectives if c.group == "tp"]
        assert tp_colls and all(c.tier == "network" for c in tp_colls)
        return sum(c.time_s for c in tp_colls)

    extra = {tp: tp_time(tp, 60e-6) - tp_time(tp, 20e-6) for tp in (16, 32)}
    assert extra[16] > 0
    # same collectives a layer, twice the ring steps less one: (31 / 15) times the extra wait
    assert extra[32] / extra[16] == pytest.approx(31 / 15, rel=1e-6)


# --- the family's measured cluster's fabric (issue #34 item 4) -------------------------------

def test_the_playbook_rows_ran_on_efa_and_are_priced_on_its_figures() -> None:
    """The Playbook's cluster is AWS EFA by its launch files (measured.SOURCE_FABRICS): its rows
    carry that fabric's fitted fraction and ring step; a fabric word in notes or a fabric cell
    would win over the source's."""
    row = {**ROW, "source": "playbook", "gpu": "h100-sxm-80gb", "framework": "nanotron",
           "precision": "bf16"}
    efa = get_fabric("efa")
    assert efa.network_step_latency_s > 0  # fitted there, not NCCL's prior
    cluster = case_from_row(row).cluster
    assert (cluster.fabric, cluster.network_bw_fraction, cluster.network_step_latency_s) == (
        "efa", efa.network_bw_fraction, efa.network_step_latency_s)
    assert case_from_row({**row, "fabric": "infiniband"}).cluster.fabric == "infiniband"
    assert row_fabric({**row, "source": "llm-foundry"}) == ""


def test_a_cluster_naming_no_fabric_is_priced_as_its_familys_measured_one(
        h100: GpuSpec, llama8b: ModelSpec) -> None:
    """One number per fabric: the hopper family's network figures are the efa fabric's, read
    from fabrics.yaml, so naming efa or no fabric gives the same plan price, and the named
    InfiniBand prior prices the network apart from it."""
    eff = h100.efficiency
    efa = get_fabric("efa")
    assert eff.network_fabric == "efa"
    assert (eff.network_bw_fraction, eff.network_step_latency_s) == (
        efa.network_bw_fraction, efa.network_step_latency_s)
    specs = {fab: build_specs(parse_study(f"""
model: {{preset: llama3-8b}}
training: {{seq_len: 4096, global_batch: 64}}
cluster: {{gpu: h100-sxm-80gb, nodes: 4{fab}}}
""")) for fab in ("", ", fabric: efa", ", fabric: infiniband")}
    plan = Plan(tp=1, pp=2, dp=16, micro_batch=1)
    tok = {k: estimate(s.model, s.cluster, plan, s.training).tokens_per_s_per_gpu
           for k, s in specs.items()}
    assert tok[""] == tok[", fabric: efa"]
    assert tok[", fabric: infiniband"] != tok[""]
    assert comm.link_of(specs[""].cluster).network_latency_s == efa.network_step_latency_s


def test_a_family_may_not_give_its_fabrics_figures_again(tmp_path) -> None:  # noqa: ANN001
    """calibration.yaml names the fabric; giving its network fraction beside it would be a
    second copy of one number: refused, naming the field."""
    import shutil

    from hardware_catalog import CATALOG_DIR, CatalogError, load_catalog
    for name in ("fabrics.yaml", "h100-sxm-80gb.yaml"):
        shutil.copy(CATALOG_DIR / name, tmp_path / name)
    (tmp_path / "calibration.yaml").write_text(
        "hopper:\n  network_fabric: efa\n  network_bw_fraction: 0.5\n  source: test\n")
    with pytest.raises(CatalogError, match=r"hopper\.network_bw_fraction: given with "
                       r"network_fabric"):
        load_catalog(tmp_path)
    (tmp_path / "calibration.yaml").write_text(
        "hopper:\n  network_fabric: token-ring\n  source: test\n")
    with pytest.raises(CatalogError, match=r"hopper\.network_fabric: unknown fabric"):
        load_catalog(tmp_path)


def test_overriding_the_network_figures_leaves_the_measured_fabric(h100: GpuSpec) -> None:
    from hardware_catalog import with_overrides
    gpu = with_overrides(h100, {"efficiency": {"network_bw_fraction": 0.7}})
    assert (gpu.efficiency.network_fabric, gpu.efficiency.network_bw_fraction) == ("", 0.7)
    kept = with_overrides(h100, {"efficiency": {"gemm_peak_fraction": 0.7}})
    assert kept.efficiency.network_fabric == "efa"


def test_a_fabric_with_a_fitted_step_prices_its_ring_step(h100: GpuSpec) -> None:
    """A named fabric's fitted ring step is used; one without keeps the GPU's NCCL prior."""
    efa = ClusterSpec(gpu=h100, num_gpus=16, fabric="efa", network_bw_fraction=0.5,
                      network_step_latency_s=80e-6)
    assert comm.link_of(efa).network_latency_s == 80e-6
    with pytest.raises(SpecError, match="network_step_latency_s must be in"):
        ClusterSpec(gpu=h100, num_gpus=16, network_step_latency_s=0.0)
