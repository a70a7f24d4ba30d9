"""Activation recomputation: which layers full recompute runs again, and which GEMMs the
every-other-GEMM selective policy runs again.

Full recompute (Chen et al., 2016; Megatron-LM's ``--recompute-granularity full``) stores each
recomputed layer's input and runs its forward again in backward; ``recompute_layers`` limits it to
that many layers per stage. The every-other-GEMM policy is torchtitan's op-level selective
checkpointing ("op" policy): every elementwise op and every second GEMM of a layer run again, and
the other GEMMs' and attention's outputs are saved. It is defined here once: its time
(``costmodel.compute``) and its FLOPs (:func:`every_other_gemm_flops_per_token`) both read it.
Megatron-Core's selective recompute by module (``costmodel.recompute_modules``) runs again the
FLOPs :func:`module_flops_per_token` counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.attention import qk_dim, v_dim
from costmodel.params import dense_mlp_params, mlp_matrices
from costmodel.plans import PlanArrays
from costmodel.recompute_modules import CORE_ATTN, MLA_UP_PROJ, MLP
from costmodel.specs import ModelSpec


def recomputed_layers(p: PlanArrays, n: np.ndarray) -> np.ndarray:
    """Layers of a stage holding ``n`` that full recompute runs again (0 without it)."""
    r = np.where(p.recompute_layers > 0, np.minimum(p.recompute_layers, n), n)
    return np.where(p.recompute == 2, r, 0.0)


def recomputed_share(p: PlanArrays, n: np.ndarray) -> np.ndarray:
    """The share of a stage's ``n`` layers whose forward full recompute runs twice: what a
    layer's forward collectives (TP's, the CP ring's, the EP exchange) add per step, as a share
    of one forward pass over the stage."""
    return recomputed_layers(p, n) / np.maximum(n, 1.0)


@dataclass(frozen=True, slots=True)
class Gemm:
    """A weight GEMM of one layer for one token: ``n`` outputs from ``k`` inputs, sharded by TP
    along ``n`` (column parallel) or along ``k`` (row parallel)."""

    n: int
    k: int
    column_parallel: bool

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.n * self.k


@dataclass(frozen=True, slots=True)
class EveryOtherGemm:
    """The GEMMs the every-other-GEMM policy runs again in one layer.

    Attention: the K projection and the output projection (q and v are saved); the MLP: the
    up-gate projection (SwiGLU) or the down projection (GELU); each shared expert alternates like
    a dense MLP at the expert width. The routed experts' grouped GEMMs are not on the policy's
    save list: all of them run again, and so do the token permutes.
    """

    k_projection: Gemm
    out_projection: Gemm
    mlp: Gemm
    shared_expert: Gemm

    def dense_flops_per_token(self) -> float:
        return (self.k_projection.flops_per_token + self.out_projection.flops_per_token
                + self.mlp.flops_per_token)

    def moe_flops_per_token(self, model: ModelSpec) -> float:
        routed_gemms = model.moe_topk * mlp_matrices(model)  # every GEMM of the top-k experts
        routed = routed_gemms * Gemm(model.expert_ffn_hidden, model.hidden, True).flops_per_token
        return (self.k_projection.flops_per_token + self.out_projection.flops_per_token
                + model.moe_shared_experts * self.shared_expert.flops_per_token + routed)


def every_other_gemm(model: ModelSpec) -> EveryOtherGemm:
    h, f, a, g, d = model.hidden, model.ffn_hidden, model.heads, model.kv_heads, model.d_head
    fe = model.expert_ffn_hidden
    gated = model.ffn_type == "swiglu"
    return EveryOtherGemm(
        k_projection=Gemm(g * d, h, column_parallel=True),
        out_projection=Gemm(h, a * d, column_parallel=False),
        mlp=Gemm(f, h, column_parallel=True) if gated else Gemm(h, f, column_parallel=False),
        shared_expert=(Gemm(fe, h, column_parallel=True) if gated
                       else Gemm(h, fe, column_parallel=False)),
    )


def every_other_gemm_flops_per_token(model: ModelSpec) -> float:
    """The policy's extra FLOPs per token for an average layer (dense and MoE layers mixed)."""
    policy = every_other_gemm(model)
    flops = policy.dense_flops_per_token()
    if model.is_moe:
        moe_frac = model.moe_layers / model.layers
        flops = (1 - moe_frac) * flops + moe_frac * policy.moe_flops_per_token(model)
    return flops


def module_flops_per_token(model: ModelSpec, modules: tuple[str, ...], seq_len: int
                           ) -> float:
    """The forward FLOPs Megatron-Core's selective modules run again, per token and layer, in
    the MFU's convention (attention over all s keys, as 12 L h s counts it): core_attn the
    attention's two batched GEMMs, mla_up_proj the two up projections, mlp a dense model's MLP;
    the elementwise modules (moe_act, layernorm) none."""
    a, flops = model.heads, 0.0
    if CORE_ATTN in modules:
        flops += 2.0 * a * (qk_dim(model) + v_dim(model)) * seq_len
    if MLA_UP_PROJ in modules and model.mla:
        x = model.mla
        flops += 2.0 * a * (qk_dim(model) * x.q_lora_rank
                            + (x.qk_nope_head_dim + x.v_head_dim) * x.kv_lora_rank)
    if MLP in modules and not model.is_moe:
        flops += 2.0 * float(dense_mlp_params(model))
    return flops
