"""Per-stage memory of many layouts at once, in the linear form the placement stage reasons with.

``costmodel.memory_terms_batch`` gives, for many plans at once, bytes that are linear in the
layers a pipeline stage holds (n) and the layers of it fully recomputed (r).

For stage s (first, middle, last) with n layers, r of them fully recomputed::

    fwd/bwd bytes = fixed[s] + n*state + inflight[s]*((n - r)*act + r*ckpt) + working
    optimizer     = opt_fixed[s] + n*opt_layer

and the stage fits when both are at most the usable bytes (less the study's headroom). A single
stage without recompute may instead offload r layers' activations to host memory (ckpt 0 on the
GPU; ``inflight*r*host_act`` host bytes, at most ``host_usable``: costmodel.offload).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import memory_terms_batch
from search.inputs.specs import Specs
from search.placement import STAGE_NAMES as STAGES

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
    host_act: np.ndarray  # host bytes one offloaded layer of a micro-batch pins
    host_usable: float  # host memory a GPU may pin (0: none catalogued)

    def take(self, i: int | np.ndarray) -> StageTerms:
        return StageTerms(
            fixed={s: v[i] for s, v in self.fixed.items()},
            inflight={s: v[i] for s, v in self.inflight.items()},
            state=self.state[i], act=self.act[i], ckpt=self.ckpt[i], working=self.working[i],
            opt_fixed={s: v[i] for s, v in self.opt_fixed.items()},
            opt_layer=self.opt_layer[i], usable=self.usable, host_act=self.host_act[i],
            host_usable=self.host_usable)


def stage_terms(specs: Specs, plans: Columns) -> StageTerms:
    """The terms for plan columns (``costmodel.estimate_batch`` keys)."""
    t = memory_terms_batch(specs.model, specs.cluster, specs.training, plans)
    n = len(plans["tp"])

    def col(key: str) -> np.ndarray:
        return np.broadcast_to(np.asarray(t[key], dtype=float), (n,))

    return StageTerms(
        fixed={s: col(f"fixed_{s}") for s in STAGES},
        inflight={s: col(f"inflight_{s}") for s in STAGES},
        state=col("state_per_layer"), act=col("act_per_layer"), ckpt=col("ckpt_per_layer"),
        working=col("working"), opt_fixed={s: col(f"opt_fixed_{s}") for s in STAGES},
        opt_layer=col("opt_per_layer"),
        # no valid layout (a study that rules out every one) still gets an answer
        usable=float(np.asarray(t["usable"]).reshape(-1)[0]) if n else
        float(specs.cluster.gpu.usable_bytes),
        host_act=col("host_per_layer"), host_usable=float(specs.cluster.gpu.host_memory_bytes))


def stage_bytes(t: StageTerms, stage: str, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Peak bytes of ``stage`` holding ``n`` layers, ``r`` of them fully recomputed."""
    fwd_bwd = (t.fixed[stage] + n * t.state
               + t.inflight[stage] * ((n - r) * t.act + r * t.ckpt) + t.working)
    return np.maximum(fwd_bwd, t.opt_fixed[stage] + n * t.opt_layer)
