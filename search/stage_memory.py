"""Per-stage memory of many layouts at once, in the linear form the placement stage reasons with.

``costmodel.memory_terms`` gives, for one plan, bytes that are linear in the layers a pipeline
stage holds (n) and the layers of it fully recomputed (r). The search needs them for tens of
thousands of layouts, so this module evaluates the same terms over columns; when the cost model
offers ``memory_terms_batch`` it is used instead, and ``tests/test_search_prune.py`` checks both
against ``costmodel.memory_terms`` plan by plan.

For stage s (first, middle, last) with n layers, r of them fully recomputed::

    fwd/bwd bytes = fixed[s] + n*state + inflight[s]*((n - r)*act + r*ckpt) + working
    optimizer     = opt_fixed[s] + n*opt_layer

and the stage fits when both are at most the usable bytes (less the study's headroom).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import costmodel
from costmodel.layout import STAGES, inflight_micro_batches, micro_batches
from costmodel.memory import coefficients
from costmodel.plans import as_plan_arrays
from search.study import Specs

Columns = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class StageTerms:
    """Arrays over layouts; dict values are keyed by stage name."""

    fixed: dict[str, np.ndarray]
    inflight: dict[str, np.ndarray]
    state: np.ndarray
    act: np.ndarray
    ckpt: np.ndarray
    working: np.ndarray
    opt_fixed: dict[str, np.ndarray]
    opt_layer: np.ndarray
    usable: float

    def take(self, i: int | np.ndarray) -> StageTerms:
        return StageTerms(
            fixed={s: v[i] for s, v in self.fixed.items()},
            inflight={s: v[i] for s, v in self.inflight.items()},
            state=self.state[i], act=self.act[i], ckpt=self.ckpt[i], working=self.working[i],
            opt_fixed={s: v[i] for s, v in self.opt_fixed.items()},
            opt_layer=self.opt_layer[i], usable=self.usable)


def stage_terms(specs: Specs, plans: Columns) -> StageTerms:
    """The terms for plan columns (``costmodel.estimate_batch`` keys)."""
    batch = getattr(costmodel, "memory_terms_batch", None)
    if batch is not None:  # the cost model's own vectorised form, once it exists
        t = batch(specs.model, specs.cluster, specs.training, plans)
        return StageTerms(fixed=t.fixed_bytes, inflight=t.inflight,
                          state=t.state_bytes_per_layer, act=t.act_bytes_per_layer,
                          ckpt=t.ckpt_bytes_per_layer, working=t.recompute_working_bytes,
                          opt_fixed=t.opt_fixed_bytes, opt_layer=t.opt_bytes_per_layer,
                          usable=float(t.usable_bytes))
    return _terms_from_coefficients(specs, plans)


def _terms_from_coefficients(specs: Specs, plans: Columns) -> StageTerms:
    # Mirrors costmodel.memory_terms term by term, over columns instead of one plan.
    model, tr = specs.model, specs.training
    p = as_plan_arrays(plans)
    co = coefficients(model, specs.cluster, tr, p)
    mm = tr.memory_model
    frag = 1.0 + mm.allocator_fraction
    m = micro_batches(tr.global_batch, p)
    bpp, bpp_e = co.bytes_per_param, co.expert_bytes_per_param
    states = ("weights", "grads", "optimizer")
    state_pp = sum(bpp[k] for k in states)
    state_layer = (co.dense_params_per_layer * state_pp
                   + co.expert_params_per_layer * sum(bpp_e[k] for k in states))
    pp1 = p.pp == 1
    tied = model.tied_embeddings
    embed = co.embed_params
    first = embed * (1 + (pp1 & (not tied)))
    last = np.where(pp1, first, embed * ((~pp1) | (not tied)))
    extra = {"first": first, "middle": np.zeros_like(embed), "last": last}
    logits = {"first": np.where(pp1, co.logits, 0.0), "middle": np.zeros_like(embed),
              "last": co.logits}
    fixed = {s: extra[s] * state_pp + frag * (co.gather_buffer + logits[s])
             + mm.allocator_const_bytes for s in STAGES}
    opt_fixed = {s: extra[s] * (state_pp + bpp["opt_buffer"]) + mm.allocator_const_bytes
                 for s in STAGES}
    opt_layer = state_layer + (co.dense_params_per_layer * bpp["opt_buffer"]
                               + co.expert_params_per_layer * bpp_e["opt_buffer"])
    act = np.where(p.recompute == 2, co.working, co.act_per_layer)
    n = len(p)

    def full(x: np.ndarray | float) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, dtype=float), (n,)).copy()

    return StageTerms(
        fixed={s: full(v) for s, v in fixed.items()},
        inflight={s: full(inflight_micro_batches(p, m, s)) for s in STAGES},
        state=full(state_layer), act=full(frag * act), ckpt=full(frag * co.ckpt_per_layer),
        working=full(frag * co.working),
        opt_fixed={s: full(v) for s, v in opt_fixed.items()},
        opt_layer=full(opt_layer), usable=float(specs.cluster.gpu.usable_bytes))


def stage_bytes(t: StageTerms, stage: str, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Peak bytes of ``stage`` holding ``n`` layers, ``r`` of them fully recomputed."""
    fwd_bwd = (t.fixed[stage] + n * t.state
               + t.inflight[stage] * ((n - r) * t.act + r * t.ckpt) + t.working)
    return np.maximum(fwd_bwd, t.opt_fixed[stage] + n * t.opt_layer)
