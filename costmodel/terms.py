"""Per-stage memory as linear terms in the layers a stage holds and the layers it recomputes,
for the CP-SAT stage that places layers. Exact: the terms reproduce the stage totals of
:func:`costmodel.estimate` for any placement (tested)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from costmodel.activation_memory import activation_bytes_per_layer
from costmodel.dispatch import warms_up_one_more
from costmodel.mapping import STAGES, inflight_micro_batches, micro_batches
from costmodel.memory import allocator_fraction, coefficients
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.recompute_modules import BITS, MODELLED
from costmodel.specs import ClusterSpec, ModelSpec, Plan, Training

_STATES = ("weights", "grads", "optimizer", "comm_buffer")


def memory_terms_batch(model: ModelSpec, cluster: ClusterSpec, training: Training,
                       plans: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Columns of the terms for many plans (keys: ``fixed_<stage>``, ``inflight_<stage>``,
    ``opt_fixed_<stage>``, ``state_per_layer``, ``act_per_layer``, ``ckpt_per_layer``,
    ``working``, ``opt_per_layer``, ``usable``, ``host_per_layer``).
    ``recompute_layers``, ``cpu_offload_layers`` and the stage layer counts
    of the plans are ignored: they are what the terms are linear in."""
    p = as_plan_arrays(plans)
    co = coefficients(model, cluster, training, p)
    mm = training.framework.memory_model
    frag = 1.0 + allocator_fraction(training)
    m = micro_batches(training.global_batch, p)
    one_more = warms_up_one_more(model, training, p)
    bpp, bpp_e = co.bytes_per_param, co.expert_bytes_per_param
    state_pp = sum(bpp[k] for k in _STATES)
    state_layer = (co.dense_params_per_layer * state_pp
                   + co.expert_params_per_layer * sum(bpp_e[k] for k in _STATES))
    pp1 = p.pp == 1
    untied = not model.tied_embeddings
    embed = co.embed_params
    first = embed * (1 + (pp1 & untied))
    extra = {"first": first, "middle": np.zeros_like(embed),
             "last": np.where(pp1, first, embed * ((~pp1) | untied))}
    # the head's stage: the LM head's logits and the MTP depths (costmodel.memory.stage_memory)
    ends = {"first": pp1.astype(float), "middle": np.zeros_like(embed),
            "last": np.ones_like(embed)}
    mtp_inflight = np.where(p.pp_schedule == 2, m, 1.0)
    mtp_volatile = (1.0 + model.mtp_layers) * co.logits + mtp_inflight * co.mtp_act
    # the leading dense layers sit on the first stage (costmodel.memory.leading_dense_on), taken
    # here as holding all k of them: the terms are linear in the layers a stage holds
    lead = model.moe_dense_layers if model.is_moe else 0
    lead_states = {k: lead * (co.lead_dense_params * bpp[k] + co.lead_expert_params * bpp_e[k])
                   for k in (*_STATES, "opt_buffer")}
    lead_state = {"first": sum(lead_states[k] for k in _STATES)}
    lead_opt = {"first": lead_state["first"] + lead_states["opt_buffer"]}
    out: dict[str, np.ndarray] = {}
    for st in STAGES:
        mtp_states = {k: ends[st] * (co.mtp_dense_params * bpp[k]
                                     + co.mtp_expert_params * bpp_e[k])
                      for k in (*_STATES, "opt_buffer")}
        mtp_state = sum(mtp_states[k] for k in _STATES)
        out[f"fixed_{st}"] = (extra[st] * state_pp + mtp_state + lead_state.get(st, 0.0)
                              + frag * (co.gather_buffer + ends[st] * mtp_volatile)
                              + mm.allocator_const_bytes)
        out[f"opt_fixed_{st}"] = (extra[st] * (state_pp + bpp["opt_buffer"]) + mtp_state
                                  + mtp_states["opt_buffer"] + lead_opt.get(st, 0.0)
                                  + mm.allocator_const_bytes)
        out[f"inflight_{st}"] = inflight_micro_batches(p, m, st, one_more)
    act = np.where(p.recompute == 2, co.working, co.act_per_layer)
    out.update(
        state_per_layer=state_layer,
        act_per_layer=frag * act,
        ckpt_per_layer=frag * co.ckpt_per_layer,
        working=frag * co.working,
        opt_per_layer=state_layer + (co.dense_params_per_layer * bpp["opt_buffer"]
                                     + co.expert_params_per_layer * bpp_e["opt_buffer"]),
        usable=np.full_like(state_layer, cluster.gpu.usable_bytes),
        # what one offloaded layer of a micro-batch pins in host memory (costmodel.offload)
        host_per_layer=co.act_per_layer * np.ones_like(state_layer),
    )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTerms:
    """Per-GPU bytes of a stage holding n layers, r of them fully recomputed:
    ``fixed[stage] + n*state_bytes_per_layer + inflight[stage]*((n-r)*act + r*ckpt) + working``
    at the forward/backward peak, and ``opt_fixed[stage] + n*opt_bytes_per_layer`` at the
    optimizer step. A stage fits when both are ``<= usable_bytes``. ``act_bytes_per_layer`` is
    for layers that are not fully recomputed (all activations when the plan's mode is 'full')."""

    fixed_bytes: dict[str, float]
    inflight: dict[str, float]
    state_bytes_per_layer: float
    act_bytes_per_layer: float
    ckpt_bytes_per_layer: float
    recompute_working_bytes: float
    opt_fixed_bytes: dict[str, float]
    opt_bytes_per_layer: float
    usable_bytes: float

    def stage_bytes(self, stage: str, n: int, r: int) -> float:
        fwd_bwd = (self.fixed_bytes[stage] + n * self.state_bytes_per_layer
                   + self.inflight[stage] * ((n - r) * self.act_bytes_per_layer
                                             + r * self.ckpt_bytes_per_layer)
                   + self.recompute_working_bytes)
        opt = self.opt_fixed_bytes[stage] + n * self.opt_bytes_per_layer
        return max(fwd_bwd, opt)


def memory_terms(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                 training: Training) -> MemoryTerms:
    """The terms of one plan."""
    t = {k: float(v[0]) for k, v in
         memory_terms_batch(model, cluster, training, plans_to_arrays([plan])).items()}
    return MemoryTerms(
        fixed_bytes={st: t[f"fixed_{st}"] for st in STAGES},
        inflight={st: t[f"inflight_{st}"] for st in STAGES},
        state_bytes_per_layer=t["state_per_layer"],
        act_bytes_per_layer=t["act_per_layer"],
        ckpt_bytes_per_layer=t["ckpt_per_layer"],
        recompute_working_bytes=t["working"],
        opt_fixed_bytes={st: t[f"opt_fixed_{st}"] for st in STAGES},
        opt_bytes_per_layer=t["opt_per_layer"],
        usable_bytes=t["usable"],
    )


def freeing_modules(model: ModelSpec, training: Training) -> tuple[str, ...]:
    """Megatron-Core's selective modules that free some of a layer's activations on this model
    under this training, each alone (``costmodel.activation_memory.freed_by_modules``), in
    ``MODELLED`` order: the sets worth searching are made of these."""
    one = np.ones(len(MODELLED), dtype=np.int64)
    p = as_plan_arrays({"tp": one, "pp": one, "dp": one, "micro_batch": one, "recompute": one,
                        "recompute_modules": [BITS[m] for m in MODELLED]})
    stored, _, full = activation_bytes_per_layer(model, training, p)
    return tuple(m for m, s, f in zip(MODELLED, stored, full, strict=True) if s < f)
