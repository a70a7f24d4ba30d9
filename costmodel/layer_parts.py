"""A layer's parts as the compute model times them: the memory-bound kernels (elementwise) and
the dense layer's GEMMs and attention. ``costmodel.compute`` builds them; the MoE layer
(``costmodel.moe``) and selective recompute (``costmodel.selective``) read them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FWD_KERNELS_PER_LAYER = 14.0  # norms, GEMMs, RoPE, attention, activation, residual adds
# of which Megatron-Core's TransformerLayer._forward_attention issues 8 (input norm, QKV GEMM,
# the q/k/v split, RoPE on q and k, attention, output GEMM, bias-dropout-add) and _forward_mlp
# the other 6 (norm, fc1, activation, fc2, bias-dropout-add by name: the total predates the
# split): a CUDA graph's "attn" and "mlp" scopes (costmodel.graphs); eager composites alike
ATTN_FWD_KERNELS = 8.0


@dataclass(frozen=True, slots=True)
class _Elementwise:
    """A layer's memory-bound kernels: their forward time and the per-token element counts the
    MoE layer reuses."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    replicated: np.ndarray  # elements per token of the norms and residual adds (QK-norm's too)
    rope_elems: float
    act_elems: float  # the activation function's elements per token, dense MLP width
    kernels_fwd: float  # kernels per layer forward
    overhead_fwd_s: float  # their launch cost
    qk_norm_kernels_fwd: float = 0.0  # of kernels_fwd, QK-norm's (attention block's own)

    @property
    def attn_kernels_fwd(self) -> float:
        """The attention block's share of them."""
        base = self.kernels_fwd - self.qk_norm_kernels_fwd
        return base * ATTN_FWD_KERNELS / FWD_KERNELS_PER_LAYER + self.qk_norm_kernels_fwd


@dataclass(frozen=True, slots=True)
class _DenseLayer:
    qkv_s: np.ndarray
    out_s: np.ndarray
    gemm_s: np.ndarray
    wgrad_attn_s: np.ndarray  # the attention projections' weight gradients, whole GEMMs
    gemm_flops: np.ndarray
    attention_s: np.ndarray
    elem: _Elementwise
    fwd_s: np.ndarray
    bwd_s: np.ndarray
