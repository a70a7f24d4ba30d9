"""What selective recompute re-runs in a layer's backward: the kernels' time on the GPU and the
operations the host issues again for them.

Three policies, by framework (``training.framework.activations.selective_recompute``):

* ``activation``: the activation function alone (and, without flash attention, the attention
  scores), the default;
* ``every_other_mm``: torchtitan's per-op policy (activation_checkpoint.py): the forward
  replays with every other matmul's output saved, so every elementwise kernel and the other
  matmuls (the K projection, the output projection, the MLP's second) run again;
* ``modules``: Megatron-Core's ``recompute_modules`` (``costmodel.recompute_modules``).

The host issues each re-run operation like any other of the layer: one by one where it issues
the layer's forward, and not at all where a CUDA graph captures the segment the operation sits
in, since the backward graph replays the recomputation with the rest of that segment's
backward (``costmodel.graphs``). A host-bound layer pays for recomputation in that issue time
even where its kernels are short.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from costmodel.attention import qk_dim
from costmodel.attention import rope_elems as rope_width
from costmodel.graphs import DENSE_SEGMENTS, MOE_SEGMENTS, host_ops
from costmodel.kernels import Kernels
from costmodel.moe import MoeLayer, expert_act_elems, glu_clamp_ops
from costmodel.plans import PlanArrays
from costmodel.recompute import every_other_gemm
from costmodel.recompute_modules import CORE_ATTN, LAYERNORM, MLA_UP_PROJ, MLP, MOE_ACT, chosen
from costmodel.specs import ModelSpec, Training

if TYPE_CHECKING:
    from costmodel.layer_parts import _DenseLayer

Ops = Mapping[str, np.ndarray | float]
# every_other_mm replays a layer's forward but for what torchtitan's policy saves
# (torchtitan/distributed/activation_checkpoint.py: the save list's attention kernel and every
# other matmul by its mm counter). Its Llama issues seven matmuls a layer (wq, wk, wv, wo; w1, w3,
# w2): wq, wv and the attention kernel are saved in the attention block, w1 and w2 in the MLP, so
# wk, wo and w3 run again (costmodel.recompute.every_other_gemm) with every elementwise op
EVERY_OTHER_SAVED_ATTN, EVERY_OTHER_SAVED_MLP = 3.0, 2.0
# a dense MLP checkpointed whole re-runs fc1, the activation and fc2
MLP_OPS = 3.0


@dataclass(frozen=True, slots=True)
class SelectiveExtra:
    dense_s: np.ndarray  # kernel time added to a dense layer's backward
    moe_s: np.ndarray  # ... to a MoE layer's
    host_dense_s: np.ndarray  # host time to issue a dense layer's re-run operations
    host_moe_s: np.ndarray


def _issued(ops: Ops, order: Sequence[str], tr: Training) -> np.ndarray:
    """The operations of ``ops`` (per segment) that no CUDA graph holds: what
    :func:`costmodel.graphs.host_ops` counts for them, less its graph launches."""
    full = {name: ops.get(name, 0.0) for name in order}
    none = {name: 0.0 for name in order}
    impl, scope = tr.framework.kernels.cuda_graph_impl, tr.framework.kernels.cuda_graph_scope
    return np.asarray(host_ops(full, order, impl, scope) - host_ops(none, order, impl, scope))


def _extra(tr: Training, kn: Kernels, times: tuple[np.ndarray, np.ndarray],
           ops: tuple[Ops, Ops]) -> SelectiveExtra:
    shape = kn.tokens.shape
    dense_ops, moe_ops = (_issued(ops[0], DENSE_SEGMENTS, tr), _issued(ops[1], MOE_SEGMENTS, tr))
    return SelectiveExtra(
        dense_s=np.broadcast_to(times[0], shape).astype(float),
        moe_s=np.broadcast_to(times[1], shape).astype(float),
        host_dense_s=np.broadcast_to(dense_ops * kn.host_op_s, shape).astype(float),
        host_moe_s=np.broadcast_to(moe_ops * kn.host_op_s, shape).astype(float))


def selective_extra(model: ModelSpec, tr: Training, p: PlanArrays, kn: Kernels,
                    dense: _DenseLayer, moe: MoeLayer | None) -> SelectiveExtra:
    """What selective recompute adds to a dense and to a MoE layer's backward (a model without
    MoE layers gets the dense layer's for both)."""
    elem, eff = dense.elem, kn.cluster.gpu.efficiency
    if tr.framework.activations.selective_recompute == "every_other_mm":
        policy = every_other_gemm(model)
        attn_second = kn.layer_gemm(policy.k_projection, split=True) + dense.out_s
        second_mms = attn_second + kn.layer_gemm(policy.mlp, split=True)
        extra = elem.fwd_s + second_mms + elem.overhead_fwd_s
        attn_ops = max(elem.attn_kernels_fwd - EVERY_OTHER_SAVED_ATTN, 0.0)
        mlp_ops = max(elem.kernels_fwd - elem.attn_kernels_fwd - EVERY_OTHER_SAVED_MLP, 0.0)
        dense_ops: Ops = {"attn": attn_ops, "mlp": mlp_ops}
        if moe is None:
            return _extra(tr, kn, (extra, extra), (dense_ops, dense_ops))
        shared_second = model.moe_shared_experts * kn.layer_gemm(policy.shared_expert,
                                                                  split=False)
        moe_s = (moe.elem_s + attn_second + shared_second + moe.routed_s + moe.permute_s
                 + elem.overhead_fwd_s * moe.kernels)
        # the MoE block's operations, less what a dense MLP saves
        moe_ops: Ops = {"attn": attn_ops, "experts": np.maximum(
            elem.kernels_fwd * moe.kernels - elem.attn_kernels_fwd - EVERY_OTHER_SAVED_MLP, 0.0)}
        return _extra(tr, kn, (extra, moe_s), (dense_ops, moe_ops))
    if tr.framework.activations.selective_recompute == "modules":
        has = chosen(p.recompute_modules, tr.framework.activations.recompute_modules)
        return _modules_extra(model, tr, has, kn, dense, moe)
    # the activation function alone (and attention's scores without flash attention)
    extra = kn.tokens * (elem.act_elems / kn.tp) * kn.act / kn.hbm + eff.kernel_overhead_s
    ops: tuple[Ops, Ops] = ({"mlp": 1.0}, {"experts": 1.0})
    if moe is None:
        return _extra(tr, kn, (extra, extra), ops)
    # the experts' activation: top-k copies of each token, expert width
    return _extra(tr, kn, (extra, kn.tokens * model.moe_topk * (elem.act_elems / model.ffn_hidden)
                           * model.expert_ffn_hidden / kn.tp * kn.act / kn.hbm
                           + eff.kernel_overhead_s), ops)


def _modules_extra(model: ModelSpec, tr: Training, has: Callable[[str], np.ndarray],
                   kn: Kernels, dense: _DenseLayer, moe: MoeLayer | None) -> SelectiveExtra:
    """What Megatron-Core's selective ``recompute_modules`` run again in a dense and in a MoE
    layer's backward (the memory they free:
    ``costmodel.activation_memory.freed_by_modules``): core_attn
    the attention kernel's forward, mla_up_proj the two up projections and RoPE, layernorm the
    norms built apart from their GEMM (MLA's input norm; a MoE layer's pre-MLP norm), mlp a
    dense model's MLP forward, moe_act the routed experts' activation function; ``has``: whether
    each plan recomputes a module (its own set, or the training's). Their operations sit in the
    attention segment (core_attn, mla_up_proj, the input norm), the MLP's (mlp), the router's
    (a MoE layer's pre-MLP norm) and the experts' (moe_act)."""
    eff = kn.cluster.gpu.efficiency
    per_elem_s = kn.tokens * kn.act / kn.hbm
    shard = np.where(kn.sp, kn.tp, 1.0)
    norm_s = per_elem_s * 2.0 * model.hidden / shard + eff.kernel_overhead_s  # read, write
    both = np.where(has(CORE_ATTN), dense.attention_s + eff.kernel_overhead_s, 0.0)
    attn_ops = has(CORE_ATTN).astype(float)
    if model.mla:
        x, a, up = model.mla, model.heads, has(MLA_UP_PROJ)
        both = both + np.where(up, per_elem_s * dense.elem.rope_elems * rope_width(model)
                               / kn.tp, 0.0)
        both = both + np.where(up, kn.gemm(a * (x.qk_nope_head_dim + x.v_head_dim) / kn.tp,
                                           float(x.kv_lora_rank)), 0.0)
        if x.q_lora_rank:
            both = both + np.where(up, kn.gemm(a * qk_dim(model) / kn.tp,
                                               float(x.q_lora_rank)), 0.0)
        # the up projections (one or two) and RoPE
        attn_ops = attn_ops + up * (2.0 + bool(x.q_lora_rank))
    norm = has(LAYERNORM).astype(int)
    norms = int(model.mla is not None) * norm
    attn_ops = attn_ops + norms
    dense_extra = both + norms * norm_s
    dense_ops: dict[str, np.ndarray | float] = {"attn": attn_ops}
    if not model.is_moe:
        mlp_gemms = dense.gemm_s - dense.qkv_s - dense.out_s
        dense_extra = dense_extra + np.where(has(MLP), mlp_gemms, 0.0)
        dense_extra = dense_extra + np.where(has(MLP), per_elem_s * dense.elem.act_elems / kn.tp,
                                             0.0)
        dense_ops["mlp"] = has(MLP) * MLP_OPS
    if moe is None:
        return _extra(tr, kn, (dense_extra, dense_extra), (dense_ops, dense_ops))
    moe_extra = both + (norms + norm) * norm_s
    # top-k copies of each token, expert width (a clamped activation's clamps, cat and
    # offset copy run again, costmodel.moe.glu_clamp_ops; the copy's wait is priced in the
    # forward only)
    act_ops = 1.0 + glu_clamp_ops(model)
    moe_extra = moe_extra + np.where(has(MOE_ACT), (
        per_elem_s * expert_act_elems(model, tr, dense.elem.act_elems) / kn.tp
        + act_ops * eff.kernel_overhead_s), 0.0)
    moe_ops = {"attn": attn_ops, "router": norm.astype(float),
               "experts": has(MOE_ACT) * act_ops}
    return _extra(tr, kn, (dense_extra, moe_extra), (dense_ops, moe_ops))
