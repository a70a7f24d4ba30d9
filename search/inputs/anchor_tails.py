"""How much of one measured run's error is its cluster's, and how much the run's own.

A run's log residual under the SKU family's fit (log measured / predicted tokens/s) is, in most
runs, the cluster's offset and the model's ordinary error at that layout; in some it is a
pathology of the run (a pipeline that stalled, a straggler, an allocator thrashing near
capacity) that says nothing of the cluster: such runs measure 2-13x below the prediction, which
no cluster's offset does. On the shared rows the residuals of a regime (SKU family, precision,
dense or MoE) are two populations: a bulk of a few per cent and a heavy tail.

:class:`Tail` is one regime's two-normal mixture of zero-mean log residuals (``bulk_sd``,
``tail_sd``, the tail's weight), fitted on the shared rows by
:func:`tcf_search.calibration.transfer_fit.fit_tails` with every group weighing alike, stored in
``hardware_catalog/anchored.yaml`` beside the layout transfer. :meth:`Tail.bulk_share` is the
probability that a residual of ``r`` is of the bulk; ``calibrate --measured`` anchors a run on
that share of its residual (``r * share``: the cluster's part), so an ordinary run anchors in
full and a pathological one hardly moves the study. A regime with no fitted tail (fewer than
``MIN_REGIME_GROUPS`` groups, or no minority population of another scale than the bulk) anchors
every run in full. Only a single anchor run is shrunk: two or more are taken as measured, how
they differ being what tells compute from network (``calibration.anchor.cluster_targets``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# the fewest groups of a regime its own tail, or its own layout transfer, is fitted on (else
# the regime anchors runs in full, and on the transfer pooled over every regime)
MIN_REGIME_GROUPS = 5
# what makes the two populations a bulk and a tail of pathologies, not one spread split in two:
# the tail is the minority and of another scale than the model's ordinary error; a fit that
# does not find such a tail leaves its regime without one (every run anchored in full)
MAX_TAIL_WEIGHT = 0.5
MIN_TAIL_TO_BULK = 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Tail:
    """One regime's mixture of log residuals: a bulk and a tail, both centred on 0."""

    bulk_sd: float
    tail_sd: float
    tail_weight: float
    groups: int = 0

    def __post_init__(self) -> None:
        assert self.bulk_sd > 0 and self.tail_sd > 0 and 0.0 <= self.tail_weight < 1.0, self

    def bulk_share(self, r: float) -> float:
        """P(a residual of ``r`` is of the bulk)."""
        bulk = (1.0 - self.tail_weight) * _normal(r, self.bulk_sd)
        tail = self.tail_weight * _normal(r, self.tail_sd)
        return bulk / (bulk + tail) if bulk + tail > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"bulk_sd": round(self.bulk_sd, 5), "tail_sd": round(self.tail_sd, 5),
                "tail_weight": round(self.tail_weight, 5), "groups": self.groups}


def _normal(x: float, sd: float) -> float:
    return math.exp(-0.5 * (x / sd) ** 2) / sd


def regime_of(family: str, precision: str, moe: bool) -> str:
    """A run's regime, as the accuracy tables split (``family/precision/dense``)."""
    return f"{family}/{precision}/{'moe' if moe else 'dense'}"


def cluster_share(tails: dict[str, Tail] | None, regime: str, r: float) -> float:
    """The share of a run's log residual ``r`` that is its cluster's: the bulk's probability
    under its regime's tail, 1 where the regime has none."""
    tail = (tails or {}).get(regime)
    return 1.0 if tail is None else tail.bulk_share(r)


def tails_from(doc: Any) -> dict[str, Tail]:
    """The tails of a stored document (``anchored.yaml``'s ``tails``), {} where it has none."""
    if not isinstance(doc, dict):
        return {}
    return {str(k): Tail(bulk_sd=float(v["bulk_sd"]), tail_sd=float(v["tail_sd"]),
                         tail_weight=float(v["tail_weight"]), groups=int(v.get("groups", 0)))
            for k, v in doc.items() if isinstance(v, dict)}
