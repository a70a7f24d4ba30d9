"""CUDA graphs (costmodel/graphs.py) and the host's operations per MoE layer (costmodel/moe.py):
a captured scope costs the host one launch and leaves the GPU's work as it was; a host-bound plan
speeds up with graphs, a GPU-bound one does not; the rules refuse what Megatron-Core refuses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, Training, estimate
from costmodel.compute import layer_times
from costmodel.graphs import GRAPH_LAUNCH_OPS, captured_segments, graphs_allowed, host_ops
from costmodel.kernels import kernels_of
from costmodel.moe import (
    AUX_LOSS_OPS,
    FUSED_AUX_LOSS_OPS,
    FUSED_TOPK_OPS,
    ROUTER_GATING_OPS,
    TOPK_OPS,
    host_segments,
    router_ops,
)
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec

# fine-grained experts (Qwen3-30B-A3B's shape): 128 experts of width 768, top-8
FINE = ModelSpec(layers=8, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=4, head_dim=128,
                 vocab=32000, moe_experts=128, moe_topk=8, moe_ffn_hidden=768)
DENSE = replace(FINE, moe_experts=0, moe_topk=0, moe_ffn_hidden=0)
EAGER = training_for(seq_len=4096, global_batch=64, moe_permute_fusion=True)
ROUTER = EAGER.with_switches(cuda_graph_impl="transformer_engine",
                 cuda_graph_scope=("moe_router", "moe_preprocess"))
PADDED = EAGER.with_switches(moe_pad_to_capacity=True)
WHOLE = PADDED.with_switches(cuda_graph_impl="local", cuda_graph_scope=())
MOE_SCOPE = PADDED.with_switches(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe",))


def _layers(model: ModelSpec, tr: Training, gpu: GpuSpec, micro_batch: int = 1,
            ep: int = 8) -> object:
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=ep, micro_batch=micro_batch)]))
    return layer_times(model, ClusterSpec(gpu=gpu, num_gpus=8), tr, p)


@pytest.mark.parametrize("eager,graphed", [
    (EAGER, ROUTER), (PADDED, WHOLE), (PADDED, MOE_SCOPE),
    (EAGER, EAGER.with_switches(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))),
])
def test_a_captured_scope_cuts_the_host_time_and_keeps_the_gpu_time(
        h100: GpuSpec, eager: Training, graphed: Training) -> None:
    a, b = _layers(FINE, eager, h100), _layers(FINE, graphed, h100)
    assert b.host_fwd_moe_s[0] < a.host_fwd_moe_s[0]  # type: ignore[attr-defined]
    for name in ("fwd_moe_s", "bwd_moe_s", "fwd_dense_s", "bwd_dense_s"):
        assert getattr(b, name)[0] == pytest.approx(getattr(a, name)[0], rel=1e-12)


def test_dense_layers_captured_whole_cost_one_launch(h100: GpuSpec) -> None:
    # 14 kernels a layer forward eagerly; the whole layer is one graph launch; attention alone
    # leaves the MLP's 6 and one launch
    whole = EAGER.with_switches(cuda_graph_impl="local", cuda_graph_scope=())
    attn = EAGER.with_switches(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    host = EAGER.framework.kernels.host_overhead_s
    assert _layers(DENSE, EAGER, h100).host_fwd_dense_s[0] == pytest.approx(14 * host)
    assert _layers(DENSE, whole, h100).host_fwd_dense_s[0] == pytest.approx(host)
    assert _layers(DENSE, attn, h100).host_fwd_dense_s[0] == pytest.approx(7 * host)


def _tokens_per_s(gpu: GpuSpec, tr: Training, micro_batch: int) -> float:
    plan = Plan(dp=8, ep=8, micro_batch=micro_batch)
    return estimate(FINE, ClusterSpec(gpu=gpu, num_gpus=8), plan,
                    replace(tr, seq_len=1024, global_batch=256)).tokens_per_s_per_gpu


def test_graphs_speed_up_a_host_bound_plan_and_not_a_gpu_bound_one(h100: GpuSpec) -> None:
    # a micro-batch of one 1k sequence: the host's ~80 ops a MoE layer (16 local experts) take
    # longer than the kernels; sixteen of them: the kernels take longer than their issue
    small = _tokens_per_s(h100, WHOLE, 1) / _tokens_per_s(h100, PADDED, 1)
    large = _tokens_per_s(h100, WHOLE, 16) / _tokens_per_s(h100, PADDED, 16)
    assert small > 1.05
    assert large == pytest.approx(1.0, abs=0.005)


@pytest.mark.parametrize("ep", [8, 4, 2, 1])
def test_more_local_experts_more_host_ops_unless_the_moe_scope_holds_them(h100: GpuSpec,
                                                                         ep: int) -> None:
    fewer = _layers(FINE, PADDED, h100, ep=ep * 2 if ep < 8 else 16)
    more = _layers(FINE, PADDED, h100, ep=ep)
    assert more.host_fwd_moe_s[0] > fewer.host_fwd_moe_s[0]  # type: ignore[attr-defined]
    a = _layers(FINE, MOE_SCOPE, h100, ep=ep * 2 if ep < 8 else 16)
    b = _layers(FINE, MOE_SCOPE, h100, ep=ep)
    assert b.host_fwd_moe_s[0] == a.host_fwd_moe_s[0]  # type: ignore[attr-defined]


def test_the_moe_layers_operations_by_segment(h100: GpuSpec) -> None:
    """Qwen3-30B-A3B's MoE layer at EP 8, fused permutes, bf16, dropless: 16 local experts, two
    grouped GEMMs each."""
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    kn = kernels_of(ClusterSpec(gpu=h100, num_gpus=8), EAGER, p)
    seg = {k: float(v[0]) for k, v in host_segments(FINE, EAGER, p, kn, 8.0).items()}
    # router: norm 1 + gating 1 + top-k 9 + aux loss 14; preprocess: counts 7 + permute 1
    assert seg["router"] == 1 + ROUTER_GATING_OPS + TOPK_OPS + AUX_LOSS_OPS == 25
    assert seg["preprocess"] == 8
    # device-to-host 7, all-to-alls 3, sort 2, 16 x 2 GEMMs + 3; unpermute 1 + add 1
    assert seg["experts"] == 7 + 3 + 2 + 32 + 3
    assert seg["postprocess"] == 2
    assert router_ops(EAGER.with_switches(moe_router_fusion=True)) == (
        ROUTER_GATING_OPS + FUSED_TOPK_OPS + FUSED_AUX_LOSS_OPS) < router_ops(EAGER)
    # the transformer_engine router graph: router and preprocess, one launch for both
    ops = host_segments(FINE, EAGER, p, kn, 8.0)
    order = ("attn", "router", "preprocess", "experts", "postprocess")
    graphed = float(host_ops(ops, order, "transformer_engine",
                             ("moe_router", "moe_preprocess"))[0])
    assert graphed == 8 + GRAPH_LAUNCH_OPS + 47 + 2
    # the local impl also captures the postprocess: a second launch in place of its 2 ops
    local = float(host_ops(ops, order, "local", ("moe_router", "moe_preprocess"))[0])
    assert local == graphed - 2 + GRAPH_LAUNCH_OPS


def test_fp8_quantises_each_experts_split(h100: GpuSpec) -> None:
    """Transformer Engine's GroupedLinear quantises each expert's split (tex.split_quantize), and
    the experts pad their tokens and probabilities per expert and unpad: 2 x 16 + 3 more."""
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, ep=8)]))
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    fp8 = replace(EAGER, precision="fp8")
    bf16_ops = host_segments(FINE, EAGER, p, kernels_of(cluster, EAGER, p), 8.0)["experts"]
    fp8_ops = host_segments(FINE, fp8, p, kernels_of(cluster, fp8, p), 8.0)["experts"]
    assert float(fp8_ops[0] - bf16_ops[0]) == 2 * 16 + 3


def test_what_each_scope_captures_of_a_moe_layer() -> None:
    assert captured_segments("none", (), True) == frozenset()
    assert captured_segments("local", (), True) == {"attn", "router", "preprocess", "experts",
                                                    "postprocess"}
    assert captured_segments("local", ("moe_router",), True) == {"router", "postprocess"}
    assert captured_segments("transformer_engine", ("attn", "moe_router", "moe_preprocess"),
                             True) == {"attn", "router", "preprocess"}
    assert captured_segments("transformer_engine", ("mlp",), False) == {"mlp"}


@pytest.mark.parametrize("impl,scope", [
    ("transformer_engine", ("full_iteration",)),  # full_iteration needs the local impl
    ("transformer_engine", ("moe", "moe_router")),
    ("transformer_engine", ("moe_preprocess",)),
    ("transformer_engine", ("experts",)),
    ("cudagraph", ()),
])
def test_training_refuses_what_transformer_config_refuses_whatever_the_model(
        impl: str, scope: tuple[str, ...]) -> None:
    with pytest.raises(SpecError, match="cuda_graph"):
        training_for(seq_len=128, global_batch=8, cuda_graph_impl=impl,  # type: ignore[arg-type]
                 cuda_graph_scope=scope)


def test_full_is_the_whole_layer_and_local_captures_router_and_preprocess_together() -> None:
    def scope(impl: str, given: object) -> tuple[str, ...]:
        tr = training_for(seq_len=8, global_batch=8, cuda_graph_impl=impl, cuda_graph_scope=given)
        return tr.framework.kernels.cuda_graph_scope

    assert scope("local", ("full",)) == ()
    assert scope("local", ("moe_router",)) == ("moe_router", "moe_preprocess")
    assert scope("transformer_engine", "attn,moe_router") == ("attn", "moe_router")


FULL, NOT_FULL = np.asarray([True]), np.asarray([False])


@pytest.mark.parametrize("recompute,impl,scope,moe_layers,pad,a2a,ok", [
    # full recompute only under a full-iteration graph
    (FULL, "transformer_engine", ("attn",), 0, False, False, False),
    (FULL, "local", ("full_iteration",), 0, False, False, True),
    (NOT_FULL, "transformer_engine", ("attn",), 0, False, False, True),
    # the moe scopes need MoE layers; mlp a dense layer
    (NOT_FULL, "transformer_engine", ("moe_router",), 0, False, False, False),
    (NOT_FULL, "transformer_engine", ("mlp",), 8, True, False, False),
    (NOT_FULL, "transformer_engine", ("mlp",), 6, True, False, True),
    # static shapes: moe, the whole layer and the full iteration need padding to capacity
    (NOT_FULL, "transformer_engine", ("moe",), 8, False, False, False),
    (NOT_FULL, "transformer_engine", ("moe",), 8, True, False, True),
    (NOT_FULL, "local", (), 8, False, False, False),
    (NOT_FULL, "local", (), 8, True, False, True),
    (NOT_FULL, "transformer_engine", ("moe_router", "moe_preprocess"), 8, False, False, True),
    # the EP all-to-all overlap: transformer_engine without moe or mlp
    (NOT_FULL, "local", ("attn",), 8, False, True, False),
    (NOT_FULL, "transformer_engine", ("moe",), 8, True, True, False),
    (NOT_FULL, "transformer_engine", ("attn", "moe_router"), 8, False, True, True),
    (FULL, "none", (), 8, False, True, True),
])
def test_the_graph_rule_refuses_what_megatron_core_refuses(
        recompute: np.ndarray, impl: str, scope: tuple[str, ...], moe_layers: int, pad: bool,
        a2a: bool, ok: bool) -> None:
    assert bool(graphs_allowed(recompute, impl, scope, moe_layers, 8, pad, a2a)[0]) is ok


def test_check_plan_names_the_graph_rule(h100: GpuSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    with pytest.raises(SpecError, match="cuda_graphs: "):
        estimate(FINE, cluster, Plan(dp=8, ep=8), EAGER.with_switches(cuda_graph_impl="local"))
    with pytest.raises(SpecError, match="cuda_graphs: "):
        estimate(FINE, cluster, Plan(dp=8, ep=8, recompute="full"), ROUTER)
    selective = Plan(dp=8, ep=8, recompute="selective")
    assert estimate(FINE, cluster, selective, ROUTER).tokens_per_s_per_gpu > 0


def test_the_megatron_and_nemo_exports_write_the_graphs() -> None:
    from pathlib import Path

    from search.inputs.planfile import load_plan_file
    from tcf_search.export import ExportOptions, render

    pf = load_plan_file(Path(__file__).parent / "golden" / "export" / "plans" / "moe_ep.yaml")
    eager = "\n".join(render("megatron", pf).values())
    assert "--cuda-graph" not in eager and "capacity" not in eager
    graphed = replace(pf, training=pf.training.with_switches(cuda_graph_impl="transformer_engine",
                                           cuda_graph_scope=("attn", "moe_router",
                                                             "moe_preprocess")))
    text = "\n".join(render("megatron", graphed).values())
    assert "--cuda-graph-impl transformer_engine" in text
    assert "--cuda-graph-scope attn moe_router moe_preprocess" in text
    nemo = "\n".join(render("nemo", graphed,
                            ExportOptions(nemo_recipe="qwen3_30b_a3b_pretrain_config")).values())
    assert "model.cuda_graph_impl=transformer_engine" in nemo
    assert "model.cuda_graph_scope=[attn,moe_router,moe_preprocess]" in nemo
    padded = replace(pf, training=pf.training.with_switches(cuda_graph_impl="transformer_engine",
                                          cuda_graph_scope=("moe",), moe_pad_to_capacity=True))
    text = "\n".join(render("megatron", padded).values())
    assert "--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity" in text


@pytest.mark.parametrize("framework", ["megatron", "nemo", "", "torchtitan", "nanotron"])
def test_every_profile_runs_eagerly_by_default(framework: str) -> None:
    """TransformerConfig.cuda_graph_impl defaults to "none" (core_v0.16.0); the others have no
    such switch."""
    from search.inputs.specs import training_spec

    tr = training_spec(framework=framework, precision="bf16", seq_len=128, global_batch=8)
    kernels = tr.framework.kernels
    assert (kernels.cuda_graph_impl, kernels.cuda_graph_scope,
            tr.framework.moe.moe_router_fusion) == ("none", (), False)


def test_a_plan_file_keeps_the_graphs() -> None:
    from pathlib import Path

    from search.inputs.planfile import dump_plan_file, load_plan_file, parse_plan_file

    pf = load_plan_file(Path(__file__).parent / "golden" / "export" / "plans" / "moe_ep.yaml")
    graphed = replace(pf, training=pf.training.with_switches(cuda_graph_impl="transformer_engine",
                                           cuda_graph_scope=("moe_router", "moe_preprocess")))
    back = parse_plan_file(dump_plan_file(graphed))
    assert back.training == graphed.training
