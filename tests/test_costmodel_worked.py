"""Worked examples: numbers checked by hand in the comments."""

from __future__ import annotations

import subprocess
import sys

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, Training, estimate
from costmodel.params import active_params, model_flops_per_token, total_params
from hardware_catalog import get_gpu

GIB = 2**30


def test_llama3_8b_parameter_count(llama8b: ModelSpec) -> None:
    # attention: 4096*4096*2 (q, o) + 2*4096*1024 (k, v) = 41.9M; MLP 3*4096*14336 = 176.2M;
    # norms 8192 -> 218.1M per layer * 32 = 6.98B; embeddings 2*128256*4096 = 1.05B; + final norm
    assert total_params(llama8b) == 8_030_261_248


def test_mixtral_active_params() -> None:
    m = ModelSpec(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000,
                  moe_experts=8, moe_topk=2)
    assert total_params(m) == pytest.approx(46.7e9, rel=0.01)
    assert active_params(m) == pytest.approx(12.9e9, rel=0.01)


def test_flops_per_token_convention(llama8b: ModelSpec) -> None:
    # 6 * (N - embedding - norms) + 12 * L * h * s
    n = total_params(llama8b) - 128256 * 4096 - 4096 - 32 * 8192
    assert model_flops_per_token(llama8b, 8192) == 6 * n + 12 * 32 * 4096 * 8192


def test_weight_bytes_of_8b_on_one_gpu(h100, llama8b: ModelSpec) -> None:
    # bf16 weights: 8.03e9 * 2 B = 14.96 GiB; fp32 grads 29.9 GiB; Adam + master 12 B/param
    cluster = ClusterSpec(gpu=h100, num_gpus=1)
    est = estimate(llama8b, cluster, Plan(), training_for(seq_len=1024, global_batch=1))
    stage = est.memory.stages[0]
    assert stage.weights_bytes / GIB == pytest.approx(8_030_261_248 * 2 / GIB, rel=1e-6)
    assert stage.grads_bytes == pytest.approx(2 * stage.weights_bytes)
    assert stage.optimizer_bytes == pytest.approx(6 * stage.weights_bytes)
    assert not est.memory.fits  # 8B with Adam on one 80 GB GPU needs ~134 GiB of states


def test_zero1_shards_optimizer_by_dp(h100, llama8b: ModelSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=64)
    base = estimate(llama8b, cluster, Plan(dp=8), tr).memory.stages[0]
    z1 = estimate(llama8b, cluster, Plan(dp=8, zero_stage=1), tr).memory.stages[0]
    assert z1.optimizer_bytes == pytest.approx(base.optimizer_bytes / 8)
    assert z1.weights_bytes == base.weights_bytes


def test_invalid_plan_names_the_rule(h100, llama8b: ModelSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    with pytest.raises(SpecError, match=r"tp \* pp \* cp \* dp == num_gpus"):
        estimate(llama8b, cluster, Plan(tp=8, pp=4, dp=3),
                 training_for(seq_len=4096, global_batch=96))
    with pytest.raises(SpecError, match="heads % tp"):
        estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=48), Plan(tp=48),
                 training_for(seq_len=4096, global_batch=48))


def test_result_adds_up(h100, llama8b: ModelSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=64)
    plan = Plan(tp=4, pp=4, dp=4, vpp=2, micro_batch=1, sequence_parallel=True, zero_stage=1)
    est = estimate(llama8b, cluster, plan, training_for(seq_len=8192, global_batch=256))
    parts = (est.compute.time_s + est.comm_exposed_s + est.bubble_time_s
             + est.compute.optimizer_time_s)
    assert est.step_time_s == pytest.approx(parts, rel=1e-9)
    assert est.tokens_per_s_per_gpu == pytest.approx(256 * 8192 / est.step_time_s / 64)
    assert 0 < est.mfu <= est.hfu < 1
    d = est.to_dict()
    assert d["fits"] == est.memory.fits and d["peak_mem_gib"] > 0
    assert {s.stage for s in est.memory.stages} == {"first", "middle", "last"}


def test_costmodel_is_pure() -> None:
    code = ("import sys, costmodel; "
            "bad = [m for m in ('optuna','ortools','typer','yaml','pandas','torch','logging') "
            "if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_dtensor_sequence_parallel_keeps_the_gathered_projection_inputs(h100) -> None:
    # Llama 3 70B shape, TP8 + SP, seq 8192, full recompute: only the layer being recomputed
    # holds the norm outputs, and DTensor keeps both whole (gathered) instead of 1/8 of them:
    # 2 tensors * 2 B * 8192 tokens * 8192 * (1 - 1/8) = 234,881,024 bytes more.
    model = ModelSpec(layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8,
                      vocab=128256)
    cluster = ClusterSpec(gpu=h100, num_gpus=32)
    plan = Plan(tp=8, pp=4, sequence_parallel=True, recompute="full")
    megatron = training_for(seq_len=8192, global_batch=4)
    dtensor = training_for(seq_len=8192, global_batch=4, sp_saves_gathered_input=True)
    act = [estimate(model, cluster, plan, t).memory.stages[0].activations_bytes
           for t in (megatron, dtensor)]
    assert act[1] - act[0] == pytest.approx(234_881_024)
    no_sp = Plan(tp=8, pp=4, recompute="full")  # without SP every copy is whole anyway
    assert (estimate(model, cluster, no_sp, megatron).memory.stages[0].activations_bytes
            == estimate(model, cluster, no_sp, dtensor).memory.stages[0].activations_bytes)


def test_a_cpu_rank_overlaps_nothing(h100) -> None:
    # The same numbers on a "cpu" family device: communication and host time add to the step.
    import dataclasses

    model = ModelSpec(layers=4, hidden=256, ffn_hidden=768, heads=8, kv_heads=4, vocab=4096)
    tr = training_for(seq_len=256, global_batch=16)
    gpu = ClusterSpec(gpu=h100, num_gpus=2, gpus_per_node=2)
    cpu = ClusterSpec(gpu=dataclasses.replace(h100, family="cpu"), num_gpus=2, gpus_per_node=2)
    assert cpu.gpu.synchronous and not gpu.gpu.synchronous
    for plan in (Plan(dp=2, micro_batch=4), Plan(dp=2, zero_stage=3, micro_batch=4)):
        on_gpu, on_cpu = estimate(model, gpu, plan, tr), estimate(model, cpu, plan, tr)
        assert on_gpu.comm_exposed_s < on_gpu.comm_time_s  # hidden behind backward on a GPU
        assert on_cpu.comm_exposed_s == pytest.approx(on_cpu.comm_time_s)
        # host issue time (15 us a kernel) no longer hides behind the kernels
        assert on_cpu.compute.time_s > on_gpu.compute.time_s


def test_dtensor_tp_pays_its_hosts_dispatch_per_op(h100) -> None:
    # On a synchronous (CPU) device, a TP layer's 40 forward ops each pay the measured DTensor
    # dispatch: forward, backward (2x) -> 120 ops per layer and micro-batch.
    import dataclasses

    from costmodel.specs import Efficiency

    eff = Efficiency(dtensor_op_overhead_s=1e-4)
    cpu = dataclasses.replace(h100, family="cpu", efficiency=eff)
    cluster = ClusterSpec(gpu=cpu, num_gpus=2, gpus_per_node=2)
    model = ModelSpec(layers=4, hidden=256, ffn_hidden=768, heads=8, kv_heads=4, vocab=4096)
    plain = training_for(seq_len=256, global_batch=16)
    dtensor = training_for(seq_len=256, global_batch=16, dtensor_tp=True)
    tp = Plan(tp=2, sequence_parallel=True, micro_batch=4)  # 4 micro-batches of 4 layers
    extra = (estimate(model, cluster, tp, dtensor).step_time_s
             - estimate(model, cluster, tp, plain).step_time_s)
    assert extra == pytest.approx(4 * 4 * 120 * 1e-4)
    dp = Plan(dp=2, micro_batch=4)  # no TP: no DTensor layers
    assert (estimate(model, cluster, dp, dtensor).step_time_s
            == estimate(model, cluster, dp, plain).step_time_s)


def test_vocab_parallel_embedding_and_head_collectives(h100, llama8b: ModelSpec) -> None:
    """TP8 with SP on one node, pp=1, 4 micro-batches of 1 x 4096 tokens: per micro-batch the
    embedding reduce-scatters (and all-gathers its gradient) and the head all-gathers its input
    (and reduce-scatters the gradient) 4096 x 4096 bf16 = 32 MiB, and the loss all-reduces three
    4096 x 4 B vectors; all of it exposed."""
    import numpy as np

    from costmodel import comm

    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=4)
    est = estimate(llama8b, cluster, Plan(tp=8, sequence_parallel=True), tr)
    vocab = next(c for c in est.collectives if c.name == "tp_vocab_parallel")
    link = comm.link_of(cluster)
    one = np.array([8.0])
    x = 4096 * 4096 * 2.0
    gather = float(comm.gather_time(np.array([x]), one, one, link)[0])
    small = float(comm.all_reduce_time(np.array([4096 * 4.0]), one, one, link)[0])
    assert vocab.bytes == 4 * 2 * (2 * x)  # micro-batches x sides x (forward + backward)
    assert vocab.time_s == pytest.approx(4 * (2 * 2 * gather + 3 * small), rel=1e-9)
    assert vocab.exposed_s == vocab.time_s
    assert vocab.tier == "nvlink"
    # TP1 has none; a middle stage (here the slowest, which the collectives report) holds
    # neither the embedding nor the head
    tr8 = training_for(seq_len=4096, global_batch=8)
    assert all(c.name != "tp_vocab_parallel"
               for c in estimate(llama8b, cluster, Plan(dp=8), tr8).collectives)
    three = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=24),
                     Plan(tp=8, pp=3, first_stage_layers=2, last_stage_layers=2), tr)
    assert next(c for c in three.collectives if c.name == "tp_vocab_parallel").time_s == 0


def test_fp8_keeps_the_cast_gemm_inputs(h100, llama8b: ModelSpec) -> None:
    """One micro-batch of 4096 tokens, TP1: in fp8 the two norm outputs (4096 each) and the
    SwiGLU product (14336) are kept as 1-byte casts, while the attention output (32 heads x 128)
    is kept twice, in bf16 by the attention kernel and as the out projection's fp8 cast (3 bytes
    for bf16's shared 2): (2*4096 + 14336 - 4096) * 4096 tokens = 76 MB less per layer than
    bf16. torchao's float8 (the torchtitan profile) keeps the bf16 inputs."""
    cluster = ClusterSpec(gpu=h100, num_gpus=1)
    plan = Plan(micro_batch=1)
    acts = {}
    for prec, keeps in (("bf16", True), ("fp8", True), ("fp8", False)):
        tr = training_for(seq_len=4096, global_batch=1, precision=prec,
                          fp8_saves_cast_inputs=keeps)
        est = estimate(llama8b, cluster, plan, tr)
        acts[prec, keeps] = est.memory.stages[0].activations_bytes
    # per layer, over the 32 stored layers and the one being worked on in backward
    saved = (2 * 4096 + 14336 - 4096) * 4096 * 33
    act_f = training_for(seq_len=4096, global_batch=1).framework.memory_model.activation_factor
    assert acts["bf16", True] - acts["fp8", True] == pytest.approx(act_f * saved, rel=1e-9)
    assert acts["fp8", False] == acts["bf16", True]


def test_sharded_gradients_by_full_all_reduce(h100, llama8b: ModelSpec) -> None:
    """ZeRO-1 normally reduce-scatters the gradients (one pass); a framework that all-reduces
    them and keeps its shard moves twice the bytes, like ZeRO-0. ZeRO-3 is unaffected."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    off = training_for(seq_len=4096, global_batch=64, overlap_grad_reduce_sharded=False)
    on = training_for(seq_len=4096, global_batch=64, overlap_grad_reduce_sharded=False,
                  sharded_grad_all_reduce=True)

    def grad(plan: Plan, tr: Training) -> float:
        return next(c.time_s for c in estimate(llama8b, cluster, plan, tr).collectives
                    if c.name == "dp_grad_reduce")

    z1 = Plan(tp=2, dp=8, zero_stage=1)
    assert grad(z1, on) == pytest.approx(2 * grad(z1, off), rel=1e-9)
    z0 = Plan(tp=2, dp=8)
    assert grad(z0, on) == pytest.approx(grad(z0, off), rel=1e-9)
    assert grad(z0, off) == pytest.approx(grad(z1, on), rel=1e-9)
    z3 = Plan(tp=2, dp=8, zero_stage=3)
    assert grad(z3, on) == pytest.approx(grad(z3, off), rel=1e-9)


def test_dp_times_cp_gradient_group_inside_one_node(h100, llama8b: ModelSpec) -> None:
    """CP2 x DP4 on one 8-GPU node: the gradient reduce over the 8 dp x cp ranks stays on
    NVLink (its members are tp = 1 apart, not tp * cp)."""
    tr = training_for(seq_len=8192, global_batch=8)
    est = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=8), Plan(cp=2, dp=4), tr)
    grad = next(c for c in est.collectives if c.name == "dp_grad_reduce")
    assert grad.tier == "nvlink" and grad.group_size == 8
    two_nodes = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=16), Plan(cp=2, dp=8), tr)
    assert next(c for c in two_nodes.collectives if c.name == "dp_grad_reduce").tier == "network"


def test_fp8_param_gather_holds_weights_in_fp8(h100, llama8b: ModelSpec) -> None:
    """Megatron-LM's --fp8-param-gather: the fp8 weight and, on Hopper, its transpose (two bytes)
    instead of bf16 plus Transformer Engine's cached cast and its transpose (four); on Blackwell,
    whose fp8 GEMMs take any layout, one byte against three. The distributed optimizer's
    parameter all-gather moves fp8 bytes."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, zero_stage=1)
    cast = training_for(seq_len=4096, global_batch=8, precision="fp8")
    fp8 = training_for(seq_len=4096, global_batch=8, precision="fp8", fp8_param_gather=True)
    a, b = estimate(llama8b, cluster, plan, cast), estimate(llama8b, cluster, plan, fp8)
    wa, wb = a.memory.stages[0].weights_bytes, b.memory.stages[0].weights_bytes
    assert wb == pytest.approx(wa / 2)
    bf16 = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=8))
    assert wb == pytest.approx(bf16.memory.stages[0].weights_bytes)  # 2 bytes each
    blackwell = ClusterSpec(gpu=get_gpu("b200-180gb"), num_gpus=8)
    a, b = estimate(llama8b, blackwell, plan, cast), estimate(llama8b, blackwell, plan, fp8)
    assert b.memory.stages[0].weights_bytes == pytest.approx(
        a.memory.stages[0].weights_bytes / 3)

    def gather(e: object) -> float:
        return next(c.bytes for c in e.collectives if c.name == "dp_param_all_gather")  # type: ignore[attr-defined]

    assert gather(b) == pytest.approx(gather(a) / 2)
    bf16 = training_for(seq_len=4096, global_batch=8, fp8_param_gather=True)  # no effect in bf16
    assert estimate(llama8b, cluster, plan, bf16).memory.stages[0].weights_bytes == pytest.approx(
        estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=8)
                 ).memory.stages[0].weights_bytes)


def test_eager_elementwise_ops_cost_more_than_fused(h100, llama8b: ModelSpec) -> None:
    """Eager RMSNorm, complex RoPE and SwiGLU pass over HBM several times each: the same plan
    takes longer, by the extra bytes at HBM speed; GEMMs and memory do not change."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, zero_stage=3, micro_batch=1)
    fused = estimate(llama8b, cluster, plan, training_for(seq_len=8192, global_batch=8))
    eager = estimate(llama8b, cluster, plan, training_for(seq_len=8192, global_batch=8,
                                                      fused_elementwise=False))
    h, f, rw = 4096, 14336, 32 * 128 + 8 * 128  # RoPE acts on q and k
    # per token and layer, elements: eager forward 2 norms x 18 + 2 adds x 3, RoPE 10, SwiGLU 5,
    # its backward twice the norms', RoPE's and SwiGLU's passes and one add per residual;
    # fused forward 2 x 2 + 6, RoPE 2, SwiGLU 3, backward kernel by kernel: 2 x 3 + 6, 2, 5
    eager_elems = ((2 * 18 + 6) * h + 10 * rw + 5 * f) + ((2 * 36 + 6) * h + 20 * rw + 10 * f)
    fused_elems = ((2 * 2 + 6) * h + 2 * rw + 3 * f) + ((2 * 3 + 6) * h + 2 * rw + 5 * f)
    bw = h100.hbm_bw_bytes_per_s * h100.efficiency.memory_bw_fraction
    # over 32 layers of 8192 tokens, 2-byte elements
    expect = 32 * 8192 * (eager_elems - fused_elems) * 2 / bw
    # and 20 more kernels per layer forward (34 instead of 14), backward twice as many
    expect += 3 * 32 * (34 - 14) * h100.efficiency.kernel_overhead_s
    gap = eager.step_time_s - fused.step_time_s
    assert gap == pytest.approx(expect, rel=1e-6)
    assert eager.memory.peak_bytes == fused.memory.peak_bytes


def test_torchtitan_selective_policy_recomputes_every_second_gemm(h100, llama8b: ModelSpec,
                                                                  ) -> None:
    """The per-op policy stores less than selective recompute of the activation function and
    recomputes the K, output and MLP-gate GEMMs: more time, counted in hardware FLOPs."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, zero_stage=3, micro_batch=1, recompute="selective")
    act = estimate(llama8b, cluster, plan, training_for(seq_len=8192, global_batch=8))
    op = estimate(llama8b, cluster, plan, training_for(seq_len=8192, global_batch=8,
                                                   selective_recompute="every_other_mm"))
    none = estimate(llama8b, cluster, replace_plan(plan, recompute="none"),
                    training_for(seq_len=8192, global_batch=8))
    full = estimate(llama8b, cluster, replace_plan(plan, recompute="full"),
                    training_for(seq_len=8192, global_batch=8))
    acts = [e.memory.stages[0].activations_bytes for e in (full, op, act, none)]
    assert acts == sorted(acts)  # full < per-op < activation-only < none
    assert none.step_time_s < act.step_time_s < op.step_time_s < full.step_time_s
    # hardware FLOPs: + 2 x (kv_dim x h + h x h + ffn x h) per token per layer
    second = 2 * 4096 * (8 * 128 + 4096 + 14336)
    extra = second * 32 * 8 * 8192 / 8  # per GPU per step
    assert (op.hfu - op.mfu) * op.step_time_s * h100.peak_flops_bf16 == pytest.approx(
        extra, rel=1e-6)
    with pytest.raises(SpecError, match="selective_recompute must be one of"):
        training_for(seq_len=8, global_batch=1, selective_recompute="most")  # type: ignore[arg-type]


def replace_plan(plan: Plan, **changes: object) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


def test_context_parallel_exchanges_each_tp_ranks_own_kv_heads(h100, llama8b: ModelSpec) -> None:
    """Llama 3 8B has 8 KV heads: along the CP ring a TP2 rank exchanges K and V of 4 of them,
    a TP8 rank of one, and a TP16 rank of one too (KV heads replicated), an eighth of TP1's."""
    tr = training_for(seq_len=16384, global_batch=8)

    def kv_bytes(tp: int) -> float:
        cluster = ClusterSpec(gpu=h100, num_gpus=2 * tp * 2)
        plan = Plan(tp=tp, cp=2, dp=2, sequence_parallel=tp > 1)
        return next(c.bytes for c in estimate(llama8b, cluster, plan, tr).collectives
                    if c.name == "cp_kv_ring")

    one = kv_bytes(1)
    assert kv_bytes(2) == pytest.approx(one / 2)
    assert kv_bytes(8) == pytest.approx(one / 8)
    assert kv_bytes(16) == pytest.approx(one / 8)


def test_expert_parallel_folds_over_tensor_parallel_ranks(h100) -> None:
    """Qwen3-235B-A22B's recipe, TP2 x EP32 on the 32 ranks of a pipeline stage: EP does not
    divide dp = 16, so it folds over the TP ranks and the experts run whole (expert TP 1):
    each rank holds 128 / 32 = 4 whole experts, dispatches its own half of the micro-batch's
    tokens, and each expert shard has no data-parallel replica to reduce gradients with."""
    from costmodel.params import expert_params
    from search.inputs.presets import PRESETS

    model = PRESETS["qwen3-235b-a22b"]
    cluster = ClusterSpec(gpu=h100, num_gpus=256)
    tr = training_for(seq_len=4096, global_batch=2048)
    folded = estimate(model, cluster, Plan(tp=2, pp=8, dp=16, ep=32, sequence_parallel=True),
                      tr)
    carved = estimate(model, cluster, Plan(tp=2, pp=8, dp=16, ep=8, sequence_parallel=True),
                      tr)
    layers = folded.memory.stages[0].layers
    # carved: 128 / 8 = 16 experts per rank, each half (expert TP 2): 8 experts' weights;
    # folded: 4 whole experts. The rest of the stage is the same.
    gap = carved.memory.stages[0].weights_bytes - folded.memory.stages[0].weights_bytes
    assert gap == pytest.approx(layers * (8 - 4) * expert_params(model) * 2, rel=1e-9)

    def a2a(e: object) -> object:
        return next(c for c in e.collectives if c.name == "ep_token_all_to_all")  # type: ignore[attr-defined]

    # either way a rank dispatches its own 2048-token sequence shard x top-8 x 4096 x bf16 per
    # all-to-all, four per layer (dispatch and combine, forward and backward); carved, the
    # expert-TP pair also all-gathers what it received (time on NVLink, not bytes counted here)
    per_layer = 4 * 2048 * 8 * 4096 * 2
    steps = 2048 // 16  # micro-batches per DP rank
    layers_mb = 94 / 8
    for e in (folded, carved):
        assert a2a(e).bytes == pytest.approx(steps * layers_mb * per_layer)  # type: ignore[attr-defined]
    assert a2a(folded).group_size == 32 and a2a(folded).tier == "network"  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match=r"ep_experts: .* tp \* dp \* cp .* ep=16, tp=1, dp=8"):
        estimate(model, ClusterSpec(gpu=h100, num_gpus=64), Plan(tp=1, pp=8, dp=8, ep=16), tr)


def test_torchtitan_selective_policy_recomputes_all_routed_expert_gemms(h100) -> None:
    """Grouped expert GEMMs are not on the per-op policy's save list, so a MoE layer recomputes
    all of them (and K, the output projection); a dense layer only every second GEMM."""
    moe = ModelSpec(layers=8, hidden=2048, ffn_hidden=768, heads=16, kv_heads=4, vocab=32000,
                    moe_experts=64, moe_topk=4, moe_ffn_hidden=768)
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, zero_stage=3, micro_batch=1, recompute="selective")
    tr = training_for(seq_len=4096, global_batch=8)
    act = estimate(moe, cluster, plan, tr)
    op = estimate(moe, cluster, plan, training_for(seq_len=4096, global_batch=8,
                                             selective_recompute="every_other_mm"))
    # hardware FLOPs per token per layer: K and output projections, and 3 GEMMs x top-4 experts
    second = 2 * 2048 * (4 * 128 + 16 * 128) + 2 * 2048 * 768 * 3 * 4
    extra = second * 8 * 8 * 4096 / 8
    assert (op.hfu - op.mfu) * op.step_time_s * h100.peak_flops_bf16 == pytest.approx(
        extra, rel=1e-6)
    # the recomputed expert GEMMs cost time at least their FLOPs at the dense peak
    routed = 2 * 2048 * 768 * 3 * 4 * 8 * 4096  # per GPU: its 4096 tokens, 8 layers
    assert op.step_time_s - act.step_time_s > routed / h100.peak_flops_bf16


def test_pp_tp_step_overhead_only_when_stages_talk_over_the_network(h100,
                                                                    llama8b: ModelSpec) -> None:
    """nanotron's PP engine waits per TP ring step only when its p2p crosses nodes: tp4 x pp2 in
    one node pays nothing extra; tp8 x pp2 on two nodes pays 2 calls x 7 steps per layer."""
    tr = training_for(seq_len=4096, global_batch=64)
    slow = training_for(seq_len=4096, global_batch=64, pp_tp_step_overhead_s=1e-3)
    one_node = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(tp=4, pp=2, micro_batch=1)
    assert estimate(llama8b, one_node, plan, slow).step_time_s == pytest.approx(
        estimate(llama8b, one_node, plan, tr).step_time_s, rel=1e-12)
    two_nodes = ClusterSpec(gpu=h100, num_gpus=16)
    plan = Plan(tp=8, pp=2, micro_batch=1)
    assert (estimate(llama8b, two_nodes, plan, slow).step_time_s
            > 1.5 * estimate(llama8b, two_nodes, plan, tr).step_time_s)


def test_tp_comm_overlap_runs_each_tp_gemm_in_tp_pieces(h100, llama8b: ModelSpec) -> None:
    """Overlapped TP communication splits each TP GEMM into tp pieces of M / tp rows: the same
    FLOPs in smaller, less efficient GEMMs; nothing changes without TP."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=4096, global_batch=8)
    ov = training_for(seq_len=4096, global_batch=8, tp_comm_overlap=True)
    tp8 = Plan(tp=8, micro_batch=1, sequence_parallel=True)
    plain, split = estimate(llama8b, cluster, tp8, tr), estimate(llama8b, cluster, tp8, ov)
    assert split.compute.time_s > plain.compute.time_s
    assert split.compute.model_flops == plain.compute.model_flops
    dp8 = Plan(dp=8, micro_batch=1)
    assert estimate(llama8b, cluster, dp8, ov).step_time_s == pytest.approx(
        estimate(llama8b, cluster, dp8, tr).step_time_s, rel=1e-12)


def test_mfu_divides_by_the_dense_bf16_peak_at_every_precision(h100, llama8b) -> None:
    """One convention: an fp8 plan's MFU is over H100's 989.4 TFLOP/s dense bf16 peak, like a
    bf16 plan's; over fp8's own 1,978.9 TFLOP/s it is half that, the second, labelled figure."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(dp=8, zero_stage=1)
    for precision in ("bf16", "fp8"):
        est = estimate(llama8b, cluster, plan, training_for(seq_len=4096, global_batch=32,
                                                        precision=precision))
        by_hand = est.compute.model_flops / est.step_time_s / 989.4e12
        assert est.mfu == pytest.approx(by_hand)
        own_peak = 1978.9e12 if precision == "fp8" else 989.4e12
        own = est.compute.model_flops / est.step_time_s / own_peak
        assert est.mfu_precision_peak == pytest.approx(own)
        assert est.to_dict()["mfu_precision_peak"] == pytest.approx(own)
