"""Activation offloading to host memory (costmodel/offload.py; rule ``cpu_offload``): what it
frees on the GPU and pins on the host, what its copies cost, where Megatron-Core allows it, and
that the search offloads the fewest layers that fit where a single stage needs it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodel import ClusterSpec, Plan, SpecError, Training, check_plan, estimate
from hardware_catalog.catalog import get_gpu
from search.evaluate import placements
from search.inputs.presets import get_preset
from search.inputs.specs import build_specs, training_spec
from search.inputs.study import parse_study
from search.prune import memory_stage
from search.space import build_space, enumerate_layouts

GIB = 2**30
MODEL = get_preset("llama3-70b")


def _setup(gpu: str = "gb200-nvl72", framework: str = "megatron", **gpu_fields: float
           ) -> tuple[ClusterSpec, Training]:
    spec = get_gpu(gpu)
    if gpu_fields:
        spec = dataclasses.replace(spec, **gpu_fields)
    cluster = ClusterSpec(gpu=spec, num_gpus=64, gpus_per_node=4)
    return cluster, training_spec(framework=framework, precision="bf16", seq_len=8192,
                                  global_batch=128)


def _plan(offloaded: int, **kw: object) -> Plan:
    fields: dict[str, object] = {"tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "zero_stage": 3,
                                 **kw}
    return Plan(cpu_offload_layers=offloaded, **fields)  # type: ignore[arg-type]


def test_offloaded_layers_leave_the_gpu_for_host_memory() -> None:
    cluster, tr = _setup()
    base = estimate(MODEL, cluster, _plan(0), tr)
    off = estimate(MODEL, cluster, _plan(20), tr)
    per_layer = off.memory.host_bytes / 20
    assert per_layer > 0 and base.memory.host_bytes == 0
    moved = base.memory.peak.activations_bytes - off.memory.peak.activations_bytes
    assert moved == pytest.approx(20 * per_layer, rel=1e-9)
    # the copies run on the copy engines: the same kernels, plus what they cannot hide
    host = [c for c in off.collectives if c.group == "host"]
    m = tr.global_batch // 64  # micro-batches a step: each goes out in the forward, back in
    assert len(host) == 1 and host[0].tier == "host"  # the backward
    assert host[0].bytes == pytest.approx(2 * m * 20 * per_layer)
    assert off.step_time_s >= base.step_time_s
    assert off.step_time_s == pytest.approx(base.step_time_s + host[0].exposed_s, rel=1e-9)


def test_a_copy_hides_behind_its_neighbour_layer_or_shows() -> None:
    """Over Grace's NVLink-C2C a layer's copy fits in the next layer's compute; over a link 100
    times slower it cannot, and the step pays the difference."""
    fast_cluster, tr = _setup()
    fast = estimate(MODEL, fast_cluster, _plan(20), tr)
    slow_cluster, _ = _setup(host_link_bw_bytes_per_s=fast_cluster.gpu.host_link_bw_bytes_per_s
                             / 100)
    slow = estimate(MODEL, slow_cluster, _plan(20), tr)
    (f,), (s,) = ([c for c in e.collectives if c.group == "host"] for e in (fast, slow))
    assert f.exposed_s < 0.2 * f.time_s
    assert s.time_s == pytest.approx(100 * f.time_s)
    assert s.exposed_s > 0.5 * s.time_s and slow.step_time_s > fast.step_time_s


def test_host_memory_bounds_what_may_be_offloaded() -> None:
    cluster, tr = _setup()
    est = estimate(MODEL, cluster, _plan(40), tr)
    assert 0 < est.memory.host_bytes <= cluster.gpu.host_memory_bytes
    small, _ = _setup(host_memory_bytes=est.memory.host_bytes / 2)
    assert not estimate(MODEL, small, _plan(40), tr).memory.fits


@pytest.mark.parametrize(("plan", "framework", "gpu"), [
    (_plan(10, pp=2, dp=32, zero_stage=1), "megatron", "gb200-nvl72"),  # no pipeline parallelism
    (_plan(10, recompute="full"), "megatron", "gb200-nvl72"),  # no recompute
    (_plan(10, recompute="selective"), "megatron", "gb200-nvl72"),
    (_plan(80), "megatron", "gb200-nvl72"),  # fewer than num_layers
    (_plan(10), "torchtitan", "gb200-nvl72"),  # a framework with no such switch
    (_plan(10), "megatron", "mi300x"),  # no catalogued host link
])
def test_rule_cpu_offload_refuses_what_megatron_core_refuses(plan: Plan, framework: str,
                                                             gpu: str) -> None:
    cluster, tr = _setup(gpu, framework)
    with pytest.raises(SpecError, match="cpu_offload: "):
        check_plan(MODEL, cluster, plan, tr)
    check_plan(MODEL, cluster, dataclasses.replace(plan, cpu_offload_layers=0), tr)


STUDY = """
model: {preset: llama3-70b}
training: {seq_len: 8192, global_batch: 128, precision: bf16, framework: megatron}
cluster: {gpu: gb200-nvl72, gpus: 64, gpus_per_node: 4}
search_space: {tp: [1], pp: [1], cp: [1], micro_batch: [1], recompute: [none],
               zero_stage: [3], cpu_offload: %s}
search: {sampler: brute_force}
"""


def test_the_search_offloads_the_fewest_layers_that_fit() -> None:
    study = parse_study(STUDY % "true")
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns, headroom_gib=0.0)
    assert stage.feasible.all() and stage.offload.all()
    cols, _ = placements(stage, np.arange(len(stage.cols["tp"])))
    n = int(cols["cpu_offload_layers"][0])
    assert 0 < n < MODEL.layers
    fits = [estimate(MODEL, specs.cluster, _plan(k), specs.training).memory.fits
            for k in (n - 1, n)]
    assert fits == [False, True]
    # the study's switch off: the same layout does not fit
    off = parse_study(STUDY % "false")
    specs_off = build_specs(off)
    space_off = build_space(off, specs_off)
    none = memory_stage(specs_off, space_off, enumerate_layouts(space_off).columns,
                        headroom_gib=0.0)
    assert not none.feasible.any()


def test_a_pcie_host_link_is_shared_with_the_nic() -> None:
    """On DGX H100 the NIC's RDMA traffic crosses the GPU's own PCIe link, so the copies of a
    plan whose collectives stream over the network get less of it than on a link of their own
    (the same GPU with the share 0), and never more than the link."""
    shared, tr = _setup("h100-sxm-80gb")
    assert shared.gpu.host_link_network_share == 1
    apart, _ = _setup("h100-sxm-80gb", host_link_network_share=0.0)
    plan = _plan(10, micro_batch=1)
    (s,), (a,) = ([c for c in estimate(MODEL, cl, plan, tr).collectives if c.group == "host"]
                  for cl in (shared, apart))
    network = [c for c in estimate(MODEL, shared, plan, tr).collectives if c.tier == "network"]
    assert network and s.bytes == a.bytes
    link = shared.gpu.host_link_bw_bytes_per_s * shared.gpu.efficiency.host_link_bw_fraction
    assert a.time_s == pytest.approx(a.bytes / link)
    assert s.time_s > a.time_s and s.exposed_s >= a.exposed_s
    # GB200's NVLink-C2C is apart from the NIC's path
    assert get_gpu("gb200-nvl72").host_link_network_share == 0


def test_explain_offers_more_or_fewer_layers_offloaded() -> None:
    """explain's one-knob neighbours of an offloading plan move its count (fewer layers may not
    fit, more cost copies), and a single-stage plan without it is offered it where allowed."""
    from tcf_search.explain.neighbours import candidate_changes

    specs = build_specs(parse_study(STUDY % "true"))
    counts = [c["cpu_offload_layers"] for c in candidate_changes(_plan(22), specs)
              if "cpu_offload_layers" in c]
    assert counts == [0, 11, 44]
    assert {"cpu_offload_layers": 40} in candidate_changes(_plan(0), specs)
