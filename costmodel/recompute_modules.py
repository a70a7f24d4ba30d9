"""Megatron-Core's selective recompute, module by module: ``--recompute-granularity selective
--recompute-modules ...`` (TransformerConfig.recompute_modules, megatron/core/transformer/
transformer_config.py; default ``["core_attn"]``). Each named submodule of a layer runs its
forward again in backward instead of keeping what it saved. "core_attn" and "mlp" checkpoint
normally (their inputs kept); "moe_act", "layernorm" and "mla_up_proj" discard their outputs
and restore them before the backward that needs them. What each frees is priced in
``costmodel.memory``, what each runs again in ``costmodel.compute``; both read the names here.

A plan may name its own set (``Plan.recompute_modules``; empty: the training's). The vectorised
model carries it as a bitmask over :data:`MODELLED` (:func:`module_mask`, 0: the training's), and
each formula asks :func:`chosen` whether a plan recomputes a module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

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


BITS: dict[str, int] = {name: 1 << i for i, name in enumerate(MODELLED)}


def module_set(modules: Iterable[str], where: str = "training.recompute_modules"
               ) -> tuple[str, ...]:
    """The modules as a tuple in the order given, each once; an unknown or unpriced one is an
    error naming the field (``where``) and what it may hold."""
    if isinstance(modules, str):
        raise SpecError(f"{where} must be a list of module names, but got {modules!r}")
    out: list[str] = []
    for name in modules:
        if name in NOT_MODELLED:
            raise SpecError(f"{where}: {name!r} is Megatron-Core's but not priced here (its "
                            f"recompute runs the expert dispatch again); modelled: "
                            f"{list(MODELLED)}")
        if name not in MODELLED:
            raise SpecError(f"{where} must hold names of {list(MODELLED)}, but got {name!r}")
        if name not in out:
            out.append(name)
    if not out:
        raise SpecError(f"{where} must name at least one module of {list(MODELLED)}")
    return tuple(out)


def plan_modules(modules: Iterable[str]) -> tuple[str, ...]:
    """A plan's own set (``Plan.recompute_modules``): () for the training's, else checked."""
    return module_set(modules, "plan.recompute_modules") if modules else ()


def module_mask(modules: Iterable[str]) -> int:
    """A set as its bitmask over :data:`MODELLED` (0: none given, the training's)."""
    return sum(BITS[name] for name in set(modules))


def mask_modules(mask: int) -> tuple[str, ...]:
    """A bitmask's modules, in :data:`MODELLED` order."""
    return tuple(name for name in MODELLED if mask & BITS[name])


def chosen(masks: np.ndarray, default: tuple[str, ...]) -> Callable[[str], np.ndarray]:
    """Per plan, whether it recomputes a module: its own set (a mask), or ``default`` (the
    training's) where its mask is 0."""
    masks = np.where(np.asarray(masks) == 0, module_mask(default), masks)
    return lambda name: (masks & BITS[name]) != 0


def module_conflict(modules: tuple[str, ...], *, mla: bool, moe: bool) -> str:
    """Why Megatron-Core's TransformerConfig refuses these modules on a model ('' where it does
    not): mla_up_proj needs multi-latent attention, moe_act MoE layers (their grouped GEMM)."""
    if MLA_UP_PROJ in modules and not mla:
        return f"{MLA_UP_PROJ!r} needs multi-latent attention, which the model has not"
    if MOE_ACT in modules and not moe:
        return f"{MOE_ACT!r} needs MoE layers (their grouped GEMM), which the model has not"
    return ""
