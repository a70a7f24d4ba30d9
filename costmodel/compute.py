"""Compute: kernel time of one micro-batch through one layer and the LM head on one GPU, and
the FLOPs a GPU runs per step.

Eager frameworks issue every kernel from Python: a layer also takes at least the host time to
issue its kernels and collectives (``kernels.host_op_s`` each: the framework's ``host_overhead_s``
times the host CPU's ``host_issue_factor``), and the GPU starves when that is
longer than the kernels themselves (small micro-batches, wide TP).

GEMM time is a roofline with a size-dependent efficiency: a GEMM whose smallest dimension is x
reaches ``gemm_peak_fraction * x / (x + gemm_half_size)`` of peak, and never runs faster than its
operands stream from HBM. Flash attention (Dao, 2023) runs at ``attention_peak_fraction`` with
causal masking halving the work, its backward doing 2.5x the forward's FLOPs. Elementwise kernels
(norms, residual adds, RoPE, activation functions, casts) are memory bound. Every kernel also
pays ``kernel_overhead_s``. With fp8, GEMMs run at ``fp8_gemm_peak_fraction`` of the fp8 peak
and pay the quantisation of their inputs (and of their weights where the framework does not cache
the weights' fp8 copies between micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.attention import causal_keys, qk_dim, qkv_params, v_dim
from costmodel.attention import rope_elems as rope_width
from costmodel.graphs import DENSE_SEGMENTS, host_ops
from costmodel.kernels import Kernels, attention_bwd_factor, fwd_bwd, kernels_of
from costmodel.layer_parts import (
    FWD_KERNELS_PER_LAYER,
    _DenseLayer,
    _Elementwise,
)
from costmodel.mapping import StageLayers
from costmodel.moe import moe_layer
from costmodel.params import attention_params
from costmodel.plans import PlanArrays
from costmodel.recompute import (
    every_other_gemm_flops_per_token,
    module_flops_per_token,
    recomputed_layers,
)
from costmodel.recompute_modules import MODELLED, chosen
from costmodel.selective import selective_extra
from costmodel.specs import ClusterSpec, ModelSpec, Training

# FlashAttention-2's generation runs at ``attention_peak_fraction``; the Hopper-and-later one
# (FlashAttention-3, cuDNN fused attention; 1.5-2.0x faster on H100: Shah et al., 2024,
# "FlashAttention-3", abstract and sec. 4.1) at ``flash3_attention_peak_fraction``, each fitted on
# the runs that used it (the Playbook's nanotron; NeMo's DGX Cloud tables)
FLASH3_FAMILIES = ("hopper", "blackwell", "blackwell-ultra")
# Eager PyTorch composites (no fused kernels, no torch.compile), counted op by op in HBM bytes
# per element at 2-byte activations; a fused kernel reads and writes once (4 bytes):
# RMSNorm: to fp32 (2+4), pow (4+4), mean (4), scale (4+4), back to bf16 (4+2), weight (2+2) = 36;
# complex-multiply RoPE: to fp32 complex (2+4), multiply (4+4), back to bf16 (4+2) = 20;
# SwiGLU: silu (2+2), multiply (4+2) = 10 (fused: 6). In 2-byte elements: 18, 10 and 5.
EAGER_NORM_ELEMS, EAGER_ROPE_ELEMS, EAGER_SWIGLU_ELEMS = 18.0, 10.0, 5.0
# A fused kernel's backward, in elements per element of its output (forward: norm 2, RoPE 2,
# SwiGLU 3 per output, GELU 2): RMSNorm reads x and dy and writes dx (3; flash-attn's Triton
# layer_norm_fn, which nanotron's TritonRMSNorm calls, and Transformer Engine's rmsnorm_bwd);
# RoPE rotates the gradient back (2; flash-attn's apply_rotary, TE's fused RoPE); SwiGLU reads
# gate, up and dy and writes dgate and dup (5; Megatron-Core's swiglu_back in
# megatron/core/fusions/fused_bias_swiglu.py); GELU reads x and dy, writes dx (3). A residual
# add's backward passes its gradient through; the one add is where the residual stream forks
# (autograd sums the branches' gradients: 2 reads, 1 write, as the forward's add).
FUSED_NORM_BWD_ELEMS, FUSED_ROPE_BWD_ELEMS = 3.0, 2.0
FUSED_SWIGLU_BWD_PER_F, FUSED_GELU_BWD_PER_F = 5.0, 3.0
# kernels per layer forward when eager: 7 per norm, 4 per RoPE'd tensor, 2 for SwiGLU, plus the
# GEMMs, attention and residual adds
EAGER_FWD_KERNELS_PER_LAYER = 34.0
EAGER_KERNELS_PER_NORM = 7.0
# The LM head's loss, in HBM bytes per logit element (forward, backward). "fused": the logits
# read once (the activation's bytes) into an fp32 softmax written once (4 + 4), and the same back.
# "eager_fp32", nanotron (src/nanotron/models/llama.py: the cast_to_fp32 block's x.float() after
# lm_head, then Loss; _ShardedCrossEntropy in src/nanotron/parallel/tensor_parallel/
# functional.py), op by op on fp32 logits: max reads 4; subtracting the max writes a new tensor
# (4 + 4); exp in place (4 + 4); sum reads 4; dividing by the sum in place (4 + 4): 32; its
# backward multiplies the saved softmax by the gradient in place (4 + 4): 8. The cast reads the
# logits and writes fp32, and its backward the reverse (act + 4 each way); without autocast the
# logits are fp32 already and x.float() copies nothing.
# "native", Megatron-Core's fused vocab-parallel cross-entropy (megatron/core/fusions/
# fused_cross_entropy.py, --cross-entropy-loss-fusion with cross_entropy_fusion_impl "native"):
# the same fp32 passes and the same saved softmax as "fused".
LOSS_FP32_BYTES = {"fused": (8.0, 8.0), "native": (8.0, 8.0), "eager_fp32": (32.0, 8.0)}
# "te_inplace", Transformer Engine's parallel cross-entropy (transformer_engine/pytorch/
# cross_entropy.py CrossEntropyFunction, v2.8; Megatron-Core language_module.py
# compute_language_model_loss with cross_entropy_fusion_impl "te"): its Triton forward reads the
# logits twice (the online max and sum, then the softmax) and writes the gradient over them,
# in fp32 registers only; its backward scales that gradient in place (read, write). Passes of
# the logits' own bytes, forward and backward; what it keeps for backward is the logits alone
# (costmodel.memory).
LOSS_LOGIT_PASSES = {"te_inplace": (3.0, 2.0)}


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Seconds per micro-batch per layer (dense and MoE layers) and for the LM head."""

    moe_fraction: float  # share of the layers that are MoE layers
    fwd_dense_s: np.ndarray
    fwd_moe_s: np.ndarray
    bwd_dense_s: np.ndarray
    bwd_moe_s: np.ndarray
    attention_fwd_s: np.ndarray
    gemm_fwd_dense_s: np.ndarray
    selective_extra_s: np.ndarray  # what selective recompute adds per dense layer
    selective_extra_moe_s: np.ndarray  # ... and per MoE layer
    selective_host_dense_s: np.ndarray  # host time to issue what selective recompute re-runs
    selective_host_moe_s: np.ndarray
    host_fwd_dense_s: np.ndarray  # CPU time to issue one layer's forward kernels
    host_fwd_moe_s: np.ndarray
    head_fwd_s: np.ndarray  # the LM head's GEMMs and its loss
    head_bwd_s: np.ndarray
    loss_s: np.ndarray  # the loss's share of head_fwd_s + head_bwd_s (the cast and softmax)
    cast_s: np.ndarray  # ... of which the fp32 cast of the logits, forward and backward
    gemm_efficiency: np.ndarray  # achieved fraction of the GEMM peak, dense layer forward
    gemm_flops_fwd_dense: np.ndarray
    shared_expert_fwd_s: np.ndarray  # a MoE layer's shared experts, forward (0 without)
    # a MoE layer's routed experts (GEMMs and activation), forward; backward twice (0 without)
    experts_fwd_s: np.ndarray

    def _average(self, dense: np.ndarray, moe: np.ndarray) -> np.ndarray:
        return (1 - self.moe_fraction) * dense + self.moe_fraction * moe

    @property
    def fwd_s(self) -> np.ndarray:
        """Forward of an average layer (dense and MoE layers mixed)."""
        return self._average(self.fwd_dense_s, self.fwd_moe_s)

    @property
    def bwd_s(self) -> np.ndarray:
        return self._average(self.bwd_dense_s, self.bwd_moe_s)

    @property
    def host_fwd_s(self) -> np.ndarray:
        return self._average(self.host_fwd_dense_s, self.host_fwd_moe_s)

    @property
    def selective_extra_avg_s(self) -> np.ndarray:
        return self._average(self.selective_extra_s, self.selective_extra_moe_s)

    @property
    def selective_host_avg_s(self) -> np.ndarray:
        return self._average(self.selective_host_dense_s, self.selective_host_moe_s)



def _elementwise(model: ModelSpec, tr: Training, kn: Kernels) -> _Elementwise:
    """Per token, in elements: two norms (read+write) and two residual adds (2 reads + 1 write)
    act on the full width unless sequence parallel shards them; RoPE and the activation function
    act on TP-sharded tensors. QK-norm (Qwen3's q_norm and k_norm; Megatron-Core's
    q_layernorm / k_layernorm, two norm kernels, megatron/core/transformer/attention.py at
    d98e8a6) normalises every query and key head, sharded with the heads; it is counted with
    the norms (``replicated``), which the MoE layer reuses."""
    h, f = model.hidden, model.ffn_hidden
    gated = model.ffn_type == "swiglu"
    if tr.framework.kernels.fused_elementwise:
        norm_elems, rope_elems, act_per_f = 2.0, 2.0, 3.0 if gated else 2.0
        norm_bwd, rope_bwd = FUSED_NORM_BWD_ELEMS, FUSED_ROPE_BWD_ELEMS
        act_bwd_per_f = FUSED_SWIGLU_BWD_PER_F if gated else FUSED_GELU_BWD_PER_F
        kernels_fwd, kernels_per_norm = FWD_KERNELS_PER_LAYER, 1.0
    else:  # eager composites: several passes each (see EAGER_*), backward twice those
        norm_elems, rope_elems = EAGER_NORM_ELEMS, EAGER_ROPE_ELEMS
        act_per_f = EAGER_SWIGLU_ELEMS if gated else 2.0
        norm_bwd, rope_bwd, act_bwd_per_f = 2 * norm_elems, 2 * rope_elems, 2 * act_per_f
        kernels_fwd, kernels_per_norm = EAGER_FWD_KERNELS_PER_LAYER, EAGER_KERNELS_PER_NORM
    shard = np.where(kn.sp, kn.tp, 1.0)
    qk_width = (model.heads + model.kv_heads) * qk_dim(model) / kn.tp if model.qk_norm else 0.0
    qk_kernels = 2.0 * kernels_per_norm if model.qk_norm else 0.0
    # two norms, two residual adds (3 each), and QK-norm's two over the heads
    replicated = (2.0 * norm_elems + 6.0) * h / shard + norm_elems * qk_width
    act_elems = act_per_f * f
    sharded = (rope_elems * rope_width(model) + act_elems) / kn.tp
    bwd_elems = ((2.0 * norm_bwd + 6.0) * h / shard + norm_bwd * qk_width
                 + (rope_bwd * rope_width(model) + act_bwd_per_f * f) / kn.tp)
    per_elem_s = kn.tokens * kn.act / kn.hbm
    kernels_fwd += qk_kernels
    return _Elementwise(fwd_s=per_elem_s * (replicated + sharded), bwd_s=per_elem_s * bwd_elems,
                        replicated=replicated, rope_elems=rope_elems, act_elems=act_elems,
                        kernels_fwd=kernels_fwd,
                        overhead_fwd_s=kernels_fwd * kn.cluster.gpu.efficiency.kernel_overhead_s,
                        qk_norm_kernels_fwd=qk_kernels)


def _attention_fwd(model: ModelSpec, tr: Training, kn: Kernels) -> np.ndarray:
    gpu, eff = kn.cluster.gpu, kn.cluster.gpu.efficiency
    a, s, M = model.heads, float(tr.seq_len), kn.tokens
    dqv = float(qk_dim(model) + v_dim(model))  # scores over d_qk, values over d_v
    if tr.framework.attention.flash_attention:
        # causal: half the keys on average, or the sliding window's
        attn_flops_fwd = 2.0 * M * causal_keys(model, tr.seq_len) * a * dqv / kn.tp
        attn_eff = eff.attention_peak_fraction
        kernel = tr.framework.attention.attention_kernel
        if kernel == "flash3" and gpu.family in FLASH3_FAMILIES:
            attn_eff = eff.flash3_attention_peak_fraction
        elif kernel == "flash1":
            attn_eff = eff.flash1_attention_peak_fraction or attn_eff
        return attn_flops_fwd / (gpu.peak_flops_bf16 * attn_eff) + _cp_split_s(model, kn)
    # two batched GEMMs over all s x s scores, and the scores through softmax in HBM
    attn_flops_fwd = 2.0 * M * s * a * dqv / kn.tp
    return (attn_flops_fwd / (gpu.peak_flops_bf16 * eff.gemm_peak_fraction)
            + 4.0 * kn.act * M * s * a / kn.tp / kn.hbm)


def _cp_split_s(model: ModelSpec, kn: Kernels) -> np.ndarray:
    """What splitting attention over cp key blocks adds: under context parallelism each of the
    cp blocks is its own attention call (a launch), and every block after the first merges its
    partial output into the running one by their log-sum-exp (read both, write one). Ring and
    all-gather variants alike (Megatron-Core's / Transformer Engine's p2p ring, PyTorch's
    templated ring attention)."""
    out_bytes = kn.tokens * model.heads / kn.tp * v_dim(model) * kn.act
    merge_s = 3.0 * out_bytes / kn.hbm + kn.cluster.gpu.efficiency.kernel_overhead_s
    return (kn.cp - 1.0) * (kn.cluster.gpu.efficiency.kernel_overhead_s + merge_s)



def _dense_layer(model: ModelSpec, tr: Training, kn: Kernels) -> _DenseLayer:
    h, f, a = model.hidden, model.ffn_hidden, model.heads
    tp = kn.tp
    n_up = 2.0 * f if model.ffn_type == "swiglu" else float(f)
    attn = ((qkv_params(model) / h / tp, float(h)), (float(h), a * v_dim(model) / tp))
    mlp = ((n_up / tp, float(h)), (float(h), f / tp))
    qkv, out, up, down = (kn.gemm(n, k, split=True) for n, k in attn + mlp)
    gemm_s = qkv + out + up + down
    # the weight gradients are whole GEMMs: Transformer Engine's userbuffers split only the
    # GEMMs a ring exchange or pipelined reduce-scatter feeds or drains (the forward's and the
    # input gradients'), and overlap the weight gradients with a bulk collective instead
    # (Megatron-Bridge's TransformerLayerTPOverlapCfg: *_fprop and *_dgrad ring_exchange or
    # pipeline, *_wgrad bulk; src/megatron/bridge/training/comm_overlap.py); PyTorch's async
    # TP fuses the same all-gather -> mm and mm -> reduce-scatter pairs
    w_qkv, w_out, w_up, w_down = (kn.gemm(n, k) for n, k in attn + mlp)
    wgrad_attn = w_qkv + w_out
    wgrad = wgrad_attn + w_up + w_down
    attention_s = _attention_fwd(model, tr, kn)
    elem = _elementwise(model, tr, kn)
    fwd, bwd = fwd_bwd(gemm_s, wgrad, attention_s, elem.fwd_s, elem.overhead_fwd_s, 1.0,
                       elem_bwd_s=elem.bwd_s, attention_bwd=attention_bwd_factor(tr))
    return _DenseLayer(qkv_s=qkv, out_s=out, gemm_s=gemm_s, wgrad_attn_s=wgrad_attn,
                       gemm_flops=2.0 * kn.tokens * (attention_params(model) + (n_up + f) * h) / tp,
                       attention_s=attention_s, elem=elem, fwd_s=fwd, bwd_s=bwd)


def _loss_s(model: ModelSpec, tr: Training, kn: Kernels
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The loss's memory-bound passes over this GPU's logits (its vocabulary shard), forward
    and backward (``LOSS_FP32_BYTES``, ``LOSS_LOGIT_PASSES``), and the eager fp32 cast's part
    of both."""
    kernel = tr.framework.kernels.loss_kernel
    per_byte_s = kn.tokens * float(model.vocab) / kn.tp / kn.hbm
    if kernel in LOSS_LOGIT_PASSES:
        reads, writes = LOSS_LOGIT_PASSES[kernel]
        return per_byte_s * reads * kn.act, per_byte_s * writes * kn.act, 0.0 * per_byte_s
    fwd, bwd = LOSS_FP32_BYTES[kernel]
    if kernel in ("fused", "native"):
        return per_byte_s * (kn.act + fwd), per_byte_s * (kn.act + bwd), 0.0 * per_byte_s
    cast = kn.act + 4.0 if kn.act < 4.0 else 0.0  # x.float(): a copy unless fp32 already
    return per_byte_s * (cast + fwd), per_byte_s * (cast + bwd), per_byte_s * 2.0 * cast


def layer_times(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                p: PlanArrays) -> LayerTimes:
    kn = kernels_of(cluster, tr, p)
    dense = _dense_layer(model, tr, kn)
    moe = moe_layer(model, tr, p, kn, dense) if model.is_moe else None
    selective = selective_extra(model, tr, p, kn, dense, moe)
    elem = dense.elem
    dense_ops = {"attn": elem.attn_kernels_fwd, "mlp": elem.kernels_fwd - elem.attn_kernels_fwd}
    dense_host = host_ops(dense_ops, DENSE_SEGMENTS, tr.framework.kernels.cuda_graph_impl,
                          tr.framework.kernels.cuda_graph_scope)
    head = kn.unquantized().gemm(model.vocab / kn.tp, float(model.hidden))  # bf16 under fp8
    loss_fwd_s, loss_bwd_s, cast_s = _loss_s(model, tr, kn)
    return LayerTimes(
        moe_fraction=model.moe_layers / model.layers,
        fwd_dense_s=dense.fwd_s, fwd_moe_s=moe.fwd_s if moe else dense.fwd_s,
        bwd_dense_s=dense.bwd_s, bwd_moe_s=moe.bwd_s if moe else dense.bwd_s,
        attention_fwd_s=dense.attention_s, gemm_fwd_dense_s=dense.gemm_s,
        selective_extra_s=selective.dense_s, selective_extra_moe_s=selective.moe_s,
        selective_host_dense_s=selective.host_dense_s, selective_host_moe_s=selective.host_moe_s,
        host_fwd_dense_s=dense_host * kn.host_op_s * np.ones_like(kn.tokens),
        host_fwd_moe_s=(moe.host_ops if moe else dense_host) * kn.host_op_s
        * np.ones_like(kn.tokens),
        head_fwd_s=head + loss_fwd_s, head_bwd_s=2.0 * head + loss_bwd_s,
        loss_s=loss_fwd_s + loss_bwd_s, cast_s=cast_s,
        gemm_efficiency=dense.gemm_flops / dense.gemm_s / kn.peak,
        gemm_flops_fwd_dense=dense.gemm_flops,
        shared_expert_fwd_s=moe.shared_s if moe else np.zeros_like(kn.tokens),
        experts_fwd_s=moe.experts_fwd_s if moe else np.zeros_like(kn.tokens),
    )


def hardware_flops(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays,
                   layers: StageLayers, model_flops: float) -> np.ndarray:
    """FLOPs one GPU runs per step: the model's, the forward again for the fully recomputed
    layers, and the every-other-GEMM policy's recomputed GEMMs."""
    rec_fraction = np.where(p.recompute == 2,
                            recomputed_layers(p, layers.largest) / layers.largest, 0.0)
    # the recomputed forward adds a third of a layer's training FLOPs (forward = 1/3 of 6N)
    flops = model_flops * (1.0 + rec_fraction / 3.0)
    if tr.framework.activations.selective_recompute == "every_other_mm":
        second: float | np.ndarray = every_other_gemm_flops_per_token(model)
    elif tr.framework.activations.selective_recompute == "modules":
        has = chosen(p.recompute_modules, tr.framework.activations.recompute_modules)
        second = sum((np.where(has(m), module_flops_per_token(model, (m,), tr.seq_len), 0.0)
                      for m in MODELLED), start=np.zeros(len(p)))
    if tr.framework.activations.selective_recompute in ("every_other_mm", "modules"):
        per_gpu = second * model.layers * tr.tokens_per_step / cluster.num_gpus
        flops = flops + np.where(p.recompute == 1, per_gpu, 0.0)
    return flops
