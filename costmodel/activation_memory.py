"""A layer's saved activations per micro-batch, tensor by tensor (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022, sec. 4), with flash attention (no
s^2 scores), gated MLPs, a Megatron-Core MoE layer's routing, fp8's casts and what each selective
recompute policy frees; :mod:`costmodel.memory` multiplies them by the micro-batches a stage holds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodel.attention import kv_dims, qk_dim, qkv_act_elems, score_keys, v_dim
from costmodel.mapping import expert_tp
from costmodel.plans import PlanArrays
from costmodel.recompute_modules import CORE_ATTN, LAYERNORM, MLA_UP_PROJ, MLP, MOE_ACT, chosen
from costmodel.specs import ModelSpec, Training

BF16 = 2.0


def _routed_copies(model: ModelSpec, tr: Training, p: PlanArrays, M: np.ndarray) -> np.ndarray:
    """Token copies the busiest rank's experts receive per micro-batch: top-k of each of its
    M / tp tokens, gathered over expert TP (:func:`costmodel.moe.tokens_per_expert`)."""
    return M * model.moe_topk * tr.framework.moe.moe_load_imbalance * expert_tp(p) / p.tp


def _moe_saved(model: ModelSpec, tr: Training, p: PlanArrays, M: np.ndarray,
               sp_div: np.ndarray) -> tuple[float, np.ndarray]:
    """(MLP width whose fc1 output and activation output are saved, per token and TP rank;
    bf16 bytes saved besides them) of a Megatron-Core MoE layer. Saved for backward: the
    router's fp32 logits and probabilities over tokens x experts (router.py gating,
    moe_utils.py topk_softmax_with_capacity; its bf16 input is the norm output, counted
    already); the routed copies as the grouped fc1's input (experts.py TEGroupedMLP,
    Transformer Engine's GroupedLinear saves its inputs); at the expert width the fc1 output
    and the activation's output, as a dense MLP's. Not saved: the permute and unpermute
    (moe_utils.py permute/unpermute, fused or not, keep only their index maps: index_select,
    scatter-add and the fused kernels need no input for backward, and the probabilities are
    applied in the activation, experts.py weighted_bias_swiglu, so the unpermute merges
    none), the all-to-all and its sorted chunks (the fc1 input is that tensor)."""
    h, E, fe = model.hidden, model.moe_experts, model.expert_ffn_hidden
    copies = _routed_copies(model, tr, p, M)
    router = 2.0 * 4.0 * M * E / sp_div  # fp32 logits and probabilities
    # per token and TP rank: the shared experts' width (TP-sharded) and the routed copies'
    # (each at fe / expert TP, on expert-TP times the copies)
    width = (model.moe_shared_experts + model.moe_topk * tr.framework.moe.moe_load_imbalance) * fe
    return width, router + BF16 * copies * h


def freed_by_modules(model: ModelSpec, tr: Training, p: PlanArrays, M: np.ndarray,
                     tp: np.ndarray, sp_div: np.ndarray, mlp_all: np.ndarray) -> np.ndarray:
    """What Megatron-Core's selective ``recompute_modules`` free of a layer's saved activations
    (bf16 bytes; costmodel/recompute_modules.py). core_attn keeps q, k, v and the output (the
    out-projection saves it as its input), so it frees the kernel's log-sum-exp, or without
    flash attention its scores, and under fp8 the kernel's own bf16 copy of the output (the
    projection keeps its fp8 cast); mla_up_proj discards the up-projected q, k, v attention reads
    (the latents stay); layernorm and moe_act discard outputs the next GEMM saves, which under
    fp8 keeps its own fp8 cast instead, so they free something in bf16 only; layernorm covers
    the norms Megatron-Core's Transformer Engine specs build apart from their GEMM (MLA's input
    norm, a MoE layer's pre-MLP norm; the rest are fused into linear_qkv / linear_fc1); mlp
    checkpoints a dense model's MLP whole, its input (the norm output) kept. Each plan's own set
    (its mask; 0: the training's)."""
    has, a = chosen(p.recompute_modules, tr.framework.activations.recompute_modules), model.heads
    bf16_outputs = not (tr.precision == "fp8" and tr.framework.numerics.fp8_saves_cast_inputs)
    freed = np.zeros_like(M)

    def add(name: str, term: np.ndarray) -> np.ndarray:
        return freed + np.where(has(name), term, 0.0)

    freed = add(CORE_ATTN, 4.0 * M * a / tp)
    if not bf16_outputs:  # the kernel's bf16 copy of its output, beside the fp8 cast
        freed = add(CORE_ATTN, 2.0 * M * a * v_dim(model) / tp)
    if not tr.framework.attention.flash_attention:
        freed = add(CORE_ATTN, 5.0 * M * score_keys(model, tr.seq_len) * a / tp)
    if model.mla:
        freed = add(MLA_UP_PROJ,
                    2.0 * M * (a * qk_dim(model) + model.kv_heads * kv_dims(model)) / tp)
    if bf16_outputs:
        norms = int(model.mla is not None) + int(model.is_moe)
        freed = add(LAYERNORM, norms * 2.0 * M * model.hidden / sp_div)
    if model.is_moe and bf16_outputs:
        routed = model.moe_topk * tr.framework.moe.moe_load_imbalance * model.expert_ffn_hidden
        freed = add(MOE_ACT, 2.0 * M * routed / tp)
    if not model.is_moe:
        freed = add(MLP, mlp_all)
    return freed


def activation_bytes_per_layer(model: ModelSpec, tr: Training,
                               p: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stored under the plan's recompute mode, stored when fully recomputed, all of a layer)
    for one micro-batch, before the calibrated ``activation_factor``: an average layer of the
    pattern after the leading dense layers, as ``costmodel.memory.coefficients`` counts its
    parameters (Llama 4 Maverick's MoE every other layer: half a MoE layer's and half a dense
    one's)."""
    lead = model.moe_dense_layers if model.is_moe else 0
    moe_frac = model.moe_layers / max(model.layers - lead, 1)
    if not model.is_moe or moe_frac >= 1.0:
        return _layer_bytes(model, tr, p)
    dense = replace(model, moe_experts=0, moe_topk=0, moe_shared_experts=0, moe_ffn_hidden=0,
                    moe_router=None, moe_dense_layers=0, moe_layer_freq=1)
    moe, plain = _layer_bytes(model, tr, p), _layer_bytes(dense, tr, p)
    return tuple(moe_frac * a + (1.0 - moe_frac) * b  # type: ignore[return-value]
                 for a, b in zip(moe, plain, strict=True))


def _layer_bytes(model: ModelSpec, tr: Training,
                 p: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`activation_bytes_per_layer` of a model whose layers are all alike (all MoE where
    it has experts)."""
    h, f, a = model.hidden, model.ffn_hidden, model.heads
    tp = p.tp.astype(float)
    sp_div = np.where(p.sequence_parallel > 0, tp, 1.0)
    M = p.micro_batch * tr.seq_len / p.cp  # tokens of a micro-batch on this GPU
    # norm inputs and outputs (2 per block) live outside the TP regions
    outside = 8.0 * M * h / sp_div
    if tr.framework.tp.sp_saves_gathered_input:  # the two norm outputs also kept whole, as gathered
        outside = outside + 4.0 * M * h * (1.0 - 1.0 / sp_div)
    # q, k, v as attention reads them (MLA: up-projected, and its latents), the attention
    # output, and the log-sum-exp
    attention = ((2.0 * M * qkv_act_elems(model) + 2.0 * M * a * v_dim(model)) / tp
                 + 4.0 * M * a / tp)
    if model.qk_norm:  # QK-norm keeps its input, q and k before the norm (its output is above)
        attention = attention + 2.0 * M * (a + model.kv_heads) * qk_dim(model) / tp
    # fp16 scores, fp32 softmax output (Korthikanti: 5as/h terms)
    if not tr.framework.attention.flash_attention:
        attention = attention + 5.0 * M * score_keys(model, tr.seq_len) * a / tp
    if model.is_moe:
        width, routing = _moe_saved(model, tr, p, M, sp_div)
    else:
        width, routing = float(f), np.zeros_like(M)
    gated = model.ffn_type == "swiglu"
    mlp_all = (6.0 if gated else 4.0) * M * width / tp + routing
    mlp_selective = (4.0 if gated else 2.0) * M * width / tp + routing
    fp8_inputs = tr.precision == "fp8" and tr.framework.numerics.fp8_saves_cast_inputs
    if model.is_moe and fp8_inputs:  # the routed copies kept as the expert fc1's fp8 input
        routing = routing - _routed_copies(model, tr, p, M) * model.hidden
    if fp8_inputs:
        # Transformer Engine keeps the fp8 cast of each GEMM's input for the weight gradient,
        # 1 byte instead of 2: both norm outputs (QKV and MLP-in inputs) and the MLP's inner
        # activation (down-projection input). The attention output keeps both: the attention
        # kernel (bf16) saves it for its own backward (FusedAttnFunc's q, k, v, out; transformer_
        # engine/pytorch/attention/dot_product_attention/backends.py) and the out projection its
        # fp8 cast, 3 bytes where bf16 shares one tensor of 2
        outside = outside - 2.0 * M * h / sp_div
        if tr.framework.tp.sp_saves_gathered_input:
            outside = outside - 2.0 * M * h * (1.0 - 1.0 / sp_div)
        attention = attention + M * a * v_dim(model) / tp
        mlp_all = mlp_all - M * width / tp
        mlp_selective = mlp_selective - M * width / tp
    full_layer = outside + attention + mlp_all
    if tr.framework.activations.selective_recompute == "modules":
        selective = full_layer - freed_by_modules(model, tr, p, M, tp, sp_div, mlp_all)
    elif tr.framework.activations.selective_recompute == "every_other_mm":
        # torchtitan's op-level policy keeps the layer's input, the outputs of the GEMMs it
        # does not recompute (q, v, the MLP's first and, gated, its last), attention's output
        # and log-sum-exp, and the TP reduce-scatters' outputs; the rest is recomputed
        qk, v = qk_dim(model), v_dim(model)
        saved_mm = (a * qk + model.kv_heads * v + a * v) / tp + width / tp + (h if gated else 0.0)
        rs = np.where(tp > 1, 2.0 * h / sp_div, 0.0)
        selective = 2.0 * M * (h / sp_div + saved_mm + rs) + 4.0 * M * a / tp + routing
    else:
        selective = outside + attention + mlp_selective
    stored = np.where(p.recompute == 1, selective, full_layer)
    ckpt = BF16 * M * h / sp_div
    stored = np.where(p.recompute == 2, ckpt, stored)
    wide = tr.framework.numerics.activation_dtype_bytes / BF16  # the counts above are in bf16 bytes
    return stored * wide, ckpt * wide, full_layer * wide
