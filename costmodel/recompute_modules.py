"""Megatron-Core's selective recompute, module by module: ``--recompute-granularity selective
--recompute-modules ...`` (TransformerConfig.recompute_modules, megatron/core/transformer/
transformer_config.py; default ``["core_attn"]``). Each named submodule of a layer runs its
forward again in backward instead of keeping what it saved. "core_attn" and "mlp" checkpoint
normally (their inputs kept); "moe_act", "layernorm" and "mla_up_proj" discard their outputs
and restore them before the backward that needs them. What each frees is priced in
``costmodel.memory``, what each runs again in ``costmodel.compute``; both read the names here.
"""

from __future__ import annotations

from collections.abc import Iterable

from costmodel.errors import SpecError

CORE_ATTN = "core_attn"  # the attention kernel: its log-sum-exp (or scores) not kept
MOE_ACT = "moe_act"  # the routed experts' activation function: its output discarded
LAYERNORM = "layernorm"  # the norms built apart from their GEMM: their outputs discarded
MLA_UP_PROJ = "mla_up_proj"  # MLA's up projections and RoPE: q, k, v discarded, latents kept
MLP = "mlp"  # a dense layer's whole MLP checkpointed: only its input kept
MODELLED = (CORE_ATTN, MOE_ACT, LAYERNORM, MLA_UP_PROJ, MLP)
# Megatron-Core's other modules, which the model does not price: recomputing a whole MoE layer
# runs its token dispatch (the EP all-to-alls) again, which the step's communication does not
# count twice
NOT_MODELLED = ("moe", "shared_experts")
MEGATRON_DEFAULT: tuple[str, ...] = (CORE_ATTN,)


def module_set(modules: Iterable[str]) -> tuple[str, ...]:
    """The modules as a tuple in the order given, each once; an unknown or unpriced one is an
    error naming the field and what it may hold."""
    if isinstance(modules, str):
        raise SpecError(f"training.recompute_modules must be a list of module names, "
                        f"but got {modules!r}")
    out: list[str] = []
    for name in modules:
        if name in NOT_MODELLED:
            raise SpecError(f"training.recompute_modules: {name!r} is Megatron-Core's but not "
                            f"priced here (its recompute runs the expert dispatch again); "
                            f"modelled: {list(MODELLED)}")
        if name not in MODELLED:
            raise SpecError(f"training.recompute_modules must hold names of {list(MODELLED)}, "
                            f"but got {name!r}")
        if name not in out:
            out.append(name)
    if not out:
        raise SpecError("training.recompute_modules must name at least one module "
                        f"of {list(MODELLED)}")
    return tuple(out)


def module_conflict(modules: tuple[str, ...], *, mla: bool, moe: bool) -> str:
    """Why Megatron-Core's TransformerConfig refuses these modules on a model ('' where it does
    not): mla_up_proj needs multi-latent attention, moe_act MoE layers (their grouped GEMM)."""
    if MLA_UP_PROJ in modules and not mla:
        return f"{MLA_UP_PROJ!r} needs multi-latent attention, which the model has not"
    if MOE_ACT in modules and not moe:
        return f"{MOE_ACT!r} needs MoE layers (their grouped GEMM), which the model has not"
    return ""
