"""Compute: FLOPs and kernel time of one micro-batch through one layer, the LM head and the
optimizer, on one GPU.

Eager frameworks issue every kernel from Python: a layer also takes at least the host time to
issue its kernels and collectives (``host_overhead_s`` each), and the GPU starves when that is
longer than the kernels themselves (small micro-batches, wide TP).

GEMM time is a roofline with a size-dependent efficiency: a GEMM whose smallest dimension is x
reaches ``gemm_peak_fraction * x / (x + gemm_half_size)`` of peak, and never runs faster than its
operands stream from HBM. Flash attention (Dao, 2023) runs at ``attention_peak_fraction`` with
causal masking halving the work, its backward doing 2.5x the forward's FLOPs. Elementwise kernels
(norms, residual adds, RoPE, activation functions, casts) are memory bound. Every kernel also
pays ``kernel_overhead_s``. With fp8, GEMMs run at the fp8 peak and pay the casts of their inputs
and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.layout import expert_tp
from costmodel.params import attention_params
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec, Training

BF16 = 2.0
# The calibrated attention efficiency is FlashAttention-2's generation (every measured stack ran
# it); the Hopper-only generation (FlashAttention-3, cuDNN fused attention) runs 1.5-2.0x faster
# on H100 (Shah et al., 2024, "FlashAttention-3", abstract and sec. 4.1): the low end is taken.
FLASH3_OVER_FLASH2 = 1.5
FLASH3_FAMILIES = ("hopper", "blackwell")
FWD_KERNELS_PER_LAYER = 14.0  # norms, GEMMs, RoPE, attention, activation, residual adds
BWD_KERNEL_FACTOR = 2.0
# Eager PyTorch composites (no fused kernels, no torch.compile), counted op by op in HBM bytes
# per element at 2-byte activations; a fused kernel reads and writes once (4 bytes):
# RMSNorm: to fp32 (2+4), pow (4+4), mean (4), scale (4+4), back to bf16 (4+2), weight (2+2) = 36;
# complex-multiply RoPE: to fp32 complex (2+4), multiply (4+4), back to bf16 (4+2) = 20;
# SwiGLU: silu (2+2), multiply (4+2) = 10 (fused: 6). In 2-byte elements: 18, 10 and 5.
EAGER_NORM_ELEMS, EAGER_ROPE_ELEMS, EAGER_SWIGLU_ELEMS = 18.0, 10.0, 5.0
# kernels per layer forward when eager: 7 per norm, 4 per RoPE'd tensor, 2 for SwiGLU, plus the
# GEMMs, attention and residual adds
EAGER_FWD_KERNELS_PER_LAYER = 34.0


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Seconds per micro-batch per layer (dense and MoE layers) and for the LM head."""

    fwd_dense_s: np.ndarray
    fwd_moe_s: np.ndarray
    bwd_dense_s: np.ndarray
    bwd_moe_s: np.ndarray
    attention_fwd_s: np.ndarray
    gemm_fwd_dense_s: np.ndarray
    selective_extra_s: np.ndarray  # what selective recompute adds per dense layer
    selective_extra_moe_s: np.ndarray  # ... and per MoE layer
    host_fwd_dense_s: np.ndarray  # CPU time to issue one layer's forward kernels
    host_fwd_moe_s: np.ndarray
    head_fwd_s: np.ndarray
    head_bwd_s: np.ndarray
    gemm_efficiency: np.ndarray  # achieved fraction of the GEMM peak, dense layer forward
    gemm_flops_fwd_dense: np.ndarray


def _gemm_time(m: np.ndarray, n: np.ndarray, k: np.ndarray, peak: float, c: ClusterSpec,
               in_bytes: float) -> np.ndarray:
    eff = c.gpu.efficiency
    flops = 2.0 * m * n * k
    x = np.minimum(np.minimum(m, n), k)
    sat = x / (x + eff.gemm_half_size)
    compute_s = flops / (peak * eff.gemm_peak_fraction * sat)
    bytes_moved = in_bytes * (m * k + k * n) + max(in_bytes, BF16) * m * n  # fp8 writes bf16
    return np.maximum(compute_s, bytes_moved / c.gpu.hbm_bw_bytes_per_s) + eff.kernel_overhead_s


def layer_times(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                p: PlanArrays) -> LayerTimes:
    mdl, gpu, eff = model, cluster.gpu, cluster.gpu.efficiency
    h, f, a, g, d = mdl.hidden, mdl.ffn_hidden, mdl.heads, mdl.kv_heads, mdl.d_head
    s, V = float(tr.seq_len), float(mdl.vocab)
    tp, cp = p.tp.astype(float), p.cp.astype(float)
    M = p.micro_batch * s / cp  # tokens per micro-batch on this GPU
    fp8 = tr.precision == "fp8"
    peak = gpu.peak_flops(tr.precision)
    act = tr.activation_dtype_bytes
    in_bytes = 1.0 if fp8 else act
    hbm = gpu.hbm_bw_bytes_per_s * eff.memory_bw_fraction
    sp = p.sequence_parallel.astype(bool)

    # Overlapping TP communication with the GEMMs (Transformer Engine's userbuffers ring
    # exchange, PyTorch's async TP) runs each TP GEMM as tp pieces of M / tp rows, one per step
    # of the all-gather or reduce-scatter ring: smaller GEMMs, one launch each
    pieces = np.where(sp & (tp > 1) & tr.tp_comm_overlap & (not gpu.synchronous), tp, 1.0)

    def gemm(n: np.ndarray | float, k: np.ndarray | float, split: bool = False) -> np.ndarray:
        n_arr, k_arr = np.broadcast_to(n, M.shape), np.broadcast_to(k, M.shape)
        if split:
            t = pieces * _gemm_time(M / pieces, n_arr, k_arr, peak, cluster, in_bytes)
        else:
            t = _gemm_time(M, n_arr, k_arr, peak, cluster, in_bytes)
        if fp8:  # quantize the input and the weight (read bf16, write fp8; Transformer Engine
            # casts weights every micro-batch) plus the amax reductions that pick the scales
            t = t + 3.0 * (M * k_arr + k_arr * n_arr) / hbm + 2.0 * eff.kernel_overhead_s
        return t

    qkv = gemm((a + 2 * g) * d / tp, float(h), split=True)
    out = gemm(float(h), a * d / tp, split=True)
    n_up = 2.0 * f if mdl.ffn_type == "swiglu" else float(f)
    mlp = gemm(n_up / tp, float(h), split=True) + gemm(float(h), f / tp, split=True)
    gemm_fwd_dense = qkv + out + mlp
    gemm_flops_dense = 2.0 * M * (attention_params(mdl) + (n_up + f) * h) / tp
    gemm_eff = gemm_flops_dense / gemm_fwd_dense / peak

    if tr.flash_attention:
        attn_flops_fwd = 4.0 * M * (s / 2.0) * a * d / tp  # causal: half the keys on average
        attn_eff = eff.attention_peak_fraction
        if tr.attention_kernel == "flash3" and gpu.family in FLASH3_FAMILIES:
            attn_eff = min(attn_eff * FLASH3_OVER_FLASH2, 1.0)
        attention_fwd = attn_flops_fwd / (gpu.peak_flops_bf16 * attn_eff)
    else:  # two batched GEMMs over all s x s scores, and the scores through softmax in HBM
        attn_flops_fwd = 4.0 * M * s * a * d / tp
        attention_fwd = (attn_flops_fwd / (gpu.peak_flops_bf16 * eff.gemm_peak_fraction)
                         + 4.0 * act * M * s * a / tp / hbm)

    # elementwise traffic per token, in elements: two norms (read+write) and two residual adds
    # (2 reads + 1 write) act on the full width unless sequence parallel shards them; RoPE and the
    # activation function act on TP-sharded tensors.
    gated = mdl.ffn_type == "swiglu"
    if tr.fused_elementwise:
        norm_elems, rope_elems, act_per_f = 2.0, 2.0, 3.0 if gated else 2.0
        kernels_fwd = FWD_KERNELS_PER_LAYER
    else:  # eager composites: several passes each (see EAGER_*)
        norm_elems, rope_elems = EAGER_NORM_ELEMS, EAGER_ROPE_ELEMS
        act_per_f = EAGER_SWIGLU_ELEMS if gated else 2.0
        kernels_fwd = EAGER_FWD_KERNELS_PER_LAYER
    replicated = (2.0 * norm_elems + 6.0) * h / np.where(sp, tp, 1.0)
    act_elems = act_per_f * f
    sharded = (rope_elems * (a + g) * d + act_elems) / tp
    elem_fwd = M * (replicated + sharded) * act / hbm
    overhead_fwd = kernels_fwd * eff.kernel_overhead_s
    fwd_dense = gemm_fwd_dense + attention_fwd + elem_fwd + overhead_fwd
    bwd_dense = (2.0 * gemm_fwd_dense + 2.5 * attention_fwd + 2.0 * elem_fwd
                 + BWD_KERNEL_FACTOR * overhead_fwd)

    if mdl.is_moe:
        fe, topk, E = mdl.expert_ffn_hidden, mdl.moe_topk, mdl.moe_experts
        n_up_e = 2.0 * fe if mdl.ffn_type == "swiglu" else float(fe)
        # a rank's experts process the routed copies of all M tokens of its TP group (gathered
        # over the expert-TP ranks) with 1/tp of each expert when the experts are
        # tensor-parallel (etp = tp), or of its own M / tp sequence shard with whole experts
        # when EP folds over the TP ranks (etp = 1): the same FLOPs, other GEMM shapes
        etp = expert_tp(p).astype(float)
        own = etp / tp  # share of the micro-batch's tokens this rank's experts process
        tokens_per_expert = M * own * topk * p.ep / E
        m_e = np.maximum(tokens_per_expert, 1.0)
        expert_one = (_gemm_time(m_e, n_up_e / etp, np.broadcast_to(float(h), M.shape), peak,
                                 cluster, in_bytes)
                      + _gemm_time(m_e, np.broadcast_to(float(h), M.shape), fe / etp, peak,
                                   cluster, in_bytes))
        experts_local = E / p.ep
        routed = expert_one * experts_local
        shared = mdl.moe_shared_experts * (gemm(n_up_e / tp, float(h)) + gemm(float(h), fe / tp))
        router = gemm(float(E), float(h))
        # permute/unpermute copies of the routed tokens, and the combine
        permute = 4.0 * M * own * topk * h * act / hbm
        moe_mlp = routed + shared + router + permute
        gemm_fwd_moe = qkv + out + moe_mlp
        elem_moe = M * (replicated + (rope_elems * (a + g) * d + topk * (act_elems / f) * fe) / tp)
        elem_moe = elem_moe * act / hbm
        kernels = 2.0  # router, permute, grouped GEMMs, unpermute, combine on top of attention
        fwd_moe = gemm_fwd_moe + attention_fwd + elem_moe + overhead_fwd * kernels
        bwd_moe = (2.0 * gemm_fwd_moe + 2.5 * attention_fwd + 2.0 * elem_moe
                   + BWD_KERNEL_FACTOR * overhead_fwd * kernels)
    else:
        kernels = 1.0
        fwd_moe, bwd_moe = fwd_dense, bwd_dense

    if tr.selective_recompute == "every_other_mm":
        # op-level selective checkpointing (torchtitan's "op" policy): every elementwise op and
        # every second GEMM of the layer is recomputed (K of q/k/v, the output projection, and
        # the MLP's up-gate (SwiGLU) or down projection (GELU))
        attn_second = gemm(g * d / tp, float(h), split=True) + out
        second_mms = attn_second + (gemm(f / tp, float(h), split=True) if gated
                                    else gemm(float(h), f / tp, split=True))
        selective_extra = elem_fwd + second_mms + overhead_fwd
        if mdl.is_moe:  # grouped expert GEMMs are not on the policy's save list: all of them,
            # and the permutes, run again; the shared experts alternate like a dense MLP
            shared_second = mdl.moe_shared_experts * (
                gemm(fe / tp, float(h)) if gated else gemm(float(h), fe / tp))
            selective_extra_moe = (elem_moe + attn_second + shared_second + routed + permute
                                   + overhead_fwd * kernels)
        else:
            selective_extra_moe = selective_extra
    else:  # the activation function alone (and attention's scores without flash attention)
        selective_extra = M * (act_elems / tp) * act / hbm + eff.kernel_overhead_s
        selective_extra_moe = selective_extra
        if mdl.is_moe:  # the experts' activation: top-k copies of each token, expert width
            selective_extra_moe = (M * mdl.moe_topk * (act_elems / f) * mdl.expert_ffn_hidden
                                   / tp * act / hbm + eff.kernel_overhead_s)

    head = gemm(V / tp, float(h))
    loss_elems = M * V / tp  # logits -> fp32 softmax -> loss, and its gradient
    loss_s = loss_elems * (act + 4.0 + 4.0) / hbm
    return LayerTimes(
        fwd_dense_s=fwd_dense, fwd_moe_s=fwd_moe, bwd_dense_s=bwd_dense, bwd_moe_s=bwd_moe,
        attention_fwd_s=attention_fwd, gemm_fwd_dense_s=gemm_fwd_dense,
        selective_extra_s=selective_extra, selective_extra_moe_s=selective_extra_moe,
        host_fwd_dense_s=np.full_like(M, kernels_fwd * tr.host_overhead_s),
        host_fwd_moe_s=np.full_like(M, kernels_fwd * kernels * tr.host_overhead_s),
        head_fwd_s=head + loss_s,
        head_bwd_s=2.0 * head + loss_s, gemm_efficiency=gemm_eff,
        gemm_flops_fwd_dense=gemm_flops_dense,
    )


def optimizer_time(params_local: np.ndarray, shard: np.ndarray, cluster: ClusterSpec,
                   tr: Training) -> np.ndarray:
    """Adam over this GPU's shard: reads grad, master, m, v; writes master, m, v, weights."""
    eff = cluster.gpu.efficiency
    bytes_per_param = 4.0 + 3 * 8.0 + BF16 if tr.optimizer == "adam" else 4.0 + 8.0 + BF16
    hbm = cluster.gpu.hbm_bw_bytes_per_s * eff.memory_bw_fraction
    return params_local / shard * bytes_per_param / hbm + 20 * eff.kernel_overhead_s
