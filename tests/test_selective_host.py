"""Selective recompute's host issue (``costmodel/selective.py``): the operations it runs again are
issued by the host like the layer's others, so a host-bound layer pays for them even where their
kernels are short; a CUDA graph that captures their segment replays them without the host."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.compute import EAGER_FWD_KERNELS_PER_LAYER, layer_times
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.selective import EVERY_OTHER_SAVED_ATTN, EVERY_OTHER_SAVED_MLP, MLP_OPS
from costmodel.specs import GpuSpec

# small enough that the host's launches pace every layer at 2 us a kernel and 80 us an op
TINY = ModelSpec(layers=4, hidden=256, ffn_hidden=1024, heads=4, kv_heads=4, vocab=1024)
MEGATRON = training_for(seq_len=512, global_batch=8, selective_recompute="modules",
                    recompute_modules=("core_attn",), host_overhead_s=80e-6)


def _step(gpu: GpuSpec, tr: Training, recompute: str, modules: tuple[str, ...] = ()) -> float:
    plan = Plan(dp=1, micro_batch=1, recompute=recompute, recompute_modules=modules)  # type: ignore[arg-type]
    return estimate(TINY, ClusterSpec(gpu=gpu, num_gpus=1), plan, tr).step_time_s


def _layers(gpu: GpuSpec, tr: Training, modules: tuple[str, ...] = ()) -> object:
    plan = Plan(dp=1, recompute="selective", recompute_modules=modules)
    p = as_plan_arrays(plans_to_arrays([plan]))
    return layer_times(TINY, ClusterSpec(gpu=gpu, num_gpus=1), tr, p)


def test_a_host_bound_layer_pays_for_what_it_recomputes(h100: GpuSpec) -> None:
    """Every module recomputed adds its issue to a host-bound step: none < core_attn <
    core_attn + mlp (before, all three predicted the same step)."""
    none = _step(h100, MEGATRON, "none")
    attn = _step(h100, MEGATRON, "selective", ("core_attn",))
    both = _step(h100, MEGATRON, "selective", ("core_attn", "mlp"))
    assert none < attn < both
    issues = TINY.layers * MEGATRON.global_batch  # every layer of every micro-batch (of one)
    # core_attn is one operation, the MLP three (fc1, activation, fc2)
    assert attn - none == pytest.approx(issues * 1 * 80e-6, rel=1e-6)
    assert both - attn == pytest.approx(issues * MLP_OPS * 80e-6, rel=1e-6)


def test_the_modules_issue_by_their_count(h100: GpuSpec) -> None:
    lt = _layers(h100, MEGATRON, ("core_attn", "mlp"))
    assert lt.selective_host_dense_s[0] == pytest.approx((1 + MLP_OPS) * 80e-6)  # type: ignore[attr-defined]


@pytest.mark.parametrize("scope,left", [((), 0.0), (("attn",), MLP_OPS), (("mlp",), 1.0)])
def test_a_captured_segment_replays_its_recompute_without_the_host(
        h100: GpuSpec, scope: tuple[str, ...], left: float) -> None:
    """The whole layer captured: nothing issued; attention captured: the MLP's three are;
    the MLP captured: core_attn's one is."""
    graphed = MEGATRON.with_switches(cuda_graph_impl="transformer_engine", cuda_graph_scope=scope)
    lt = _layers(h100, graphed, ("core_attn", "mlp"))
    assert lt.selective_host_dense_s[0] == pytest.approx(left * 80e-6)  # type: ignore[attr-defined]


def test_every_other_matmul_reissues_all_but_what_it_saves(h100: GpuSpec) -> None:
    """torchtitan's per-op policy replays the forward but the attention kernel and every other
    matmul (four of its seven): eager, the layer's 34 operations less those five."""
    tr = MEGATRON.with_switches(selective_recompute="every_other_mm", fused_elementwise=False)
    lt = _layers(h100, tr)
    ops = EAGER_FWD_KERNELS_PER_LAYER - EVERY_OTHER_SAVED_ATTN - EVERY_OTHER_SAVED_MLP
    assert ops == 29
    assert lt.selective_host_dense_s[0] == pytest.approx(ops * 80e-6)  # type: ignore[attr-defined]


def test_a_gpu_bound_layer_hides_the_issue(h100: GpuSpec) -> None:
    """At a real size the host runs ahead: the issue adds nothing the kernels do not cover."""
    big = replace(TINY, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, layers=2)
    tr = replace(MEGATRON.with_switches(host_overhead_s=15e-6), seq_len=8192)
    plan = Plan(dp=1, recompute="selective", recompute_modules=("core_attn",))
    cluster = ClusterSpec(gpu=h100, num_gpus=1)
    with_host = estimate(big, cluster, plan, tr)
    free = estimate(big, cluster, plan, tr.with_switches(host_overhead_s=0.0))
    assert np.isclose(with_host.step_time_s, free.step_time_s, rtol=1e-12)
