"""``tcf-search calibrate --measured FILE... -o my-cluster.yaml``: anchor the cost model on a few
measured training steps of one's own cluster.

What the runs identify, and so what is fitted (``search.inputs.links.MeasuredAnchor``):

- ``compute_scale``, always: one scale on the SKU family's fitted tensor-core fractions (GEMM at
  bf16/fp16 and fp8, attention of both generations), each kept at or under 1. It is what one
  run can tell: how fast this cluster's kernels run against the family's reference clusters
  (clocks and power caps, the library releases installed). Every other efficiency (memory-bound
  bandwidth, host and launch overheads, NVLink) stays the family's: one step time cannot tell
  them apart from the GEMMs.
- ``network_scale``, only where the runs identify it: a scale on the network's bus-bandwidth
  fraction (the family's, or the named fabric's), fitted only when the runs' sensitivities to
  it are not a multiple of their sensitivities to compute (:data:`IDENTIFIABLE`: the part of the
  network direction the compute direction does not explain moves the runs' log step times by
  at least that much per e-fold), i.e. runs that differ in how much of their step the network
  takes. Where the file also holds nccl-tests links that measured the network, they price it
  and the runs cannot move it (its sensitivity is 0): it is not fitted.

What a run says of its cluster (:func:`cluster_targets`): a single run is anchored on the share
of its log residual under the family's fit that its regime's bulk probability gives
(``search.inputs.anchor_tails``; a run far in the regime's tail of pathologies is taken near the
family's prediction and named); two or more runs as measured.

The fit: least squares on log(predicted / that tokens/s) over the runs, each run predicted
through ``tcf-search predict``'s code (:func:`tcf_search.calibration.predict.run_prediction`:
its candidate plans where a knob is empty, the fastest that fits), with a pull of each log-scale
toward 0 (the family's fit). The pull is what a run shares with a layout far from its own on
the shared rows: the layout transfer's ``far`` (``search.inputs.layout_transfer``, fitted by
``calibration.transfer_fit`` and stored in ``hardware_catalog/anchored.yaml`` by
``benchmarks/bench_anchor.py --write``; the runs' regime's own where it has one, else the one
pooled over every regime), so one run moves the scale ``far`` of the way (weight
``sqrt((1 - far) / far)``); the rest of each run's error moves the plans of its model and GPU
count by their layout distance to it (the file records the transfer and each run's layout).
:func:`pull`'s random-effects split (within / between groups) is still shown by the benchmark,
and :data:`PRIOR_WEIGHT` (``calibration.refit``'s weak pull) stands in where no file is.
Peak memory is read and shown beside the prediction, not fitted: the memory model's terms are
the framework's, not the cluster's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from costmodel.errors import SpecError
from costmodel.plans import plans_to_arrays
from costmodel.specs import MeasuredLinks
from search import load_anchored_spread
from search.inputs import (
    FEATURES,
    Case,
    CaseError,
    ClusterCalibration,
    MeasuredAnchor,
    Tail,
    Transfer,
    anchored,
    case_from_row,
    cluster_share,
    format_plan,
    layout_of,
    model_key,
    regime_of,
    transfer_for,
)
from tcf_search.calibration.predict import run_prediction
from tcf_search.calibration.training_logs import MeasuredInputError, MeasuredRun

PRIOR_WEIGHT = 0.1
BOUNDS = {"compute_scale": (0.2, 2.0), "network_scale": (0.1, 4.0)}
# the least part of the network's sensitivity the compute scale cannot mimic (norm over the
# runs of d log tokens / d log network_scale, orthogonal to d log tokens / d log compute_scale)
IDENTIFIABLE = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class AnchorFit:
    calibration: ClusterCalibration
    lines: list[str]


def _case(run: MeasuredRun) -> Case:
    try:
        return case_from_row(run.row)
    except (CaseError, SpecError, ValueError, KeyError) as exc:
        raise MeasuredInputError(f"{run.where}: {str(exc).splitlines()[0]}") from None


def _cal(base: ClusterCalibration, scales: dict[str, float]) -> ClusterCalibration:
    return replace(base, measured=MeasuredAnchor(
        compute_scale=scales.get("compute_scale", 1.0),
        network_scale=scales.get("network_scale", 1.0), runs=({"file": "-"},)))


def _tokens(cases: list[Case], cal: ClusterCalibration) -> np.ndarray:
    out = []
    for case in cases:
        got = run_prediction(replace(case, cluster=anchored(case.cluster, cal)))
        if "pred_error" in got:
            raise MeasuredInputError(str(got["pred_error"]))
        out.append(float(str(got["pred_tokens_per_sec_per_gpu"])))
    return np.asarray(out)


def pull(log_residuals: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """The random-effects split of the family's log residuals (measured over predicted) of
    groups of >= 2 runs: within a group and between the groups' offsets (moment estimates, each
    group weighing alike), and the prior weight they give (module docstring)."""
    frame = {g: log_residuals[groups == g] for g in np.unique(groups)}
    frame = {g: r for g, r in frame.items() if len(r) >= 2}
    within = float(np.mean([np.var(r, ddof=1) for r in frame.values()]))
    means = np.array([np.mean(r) for r in frame.values()])
    sizes = np.array([len(r) for r in frame.values()])
    between = max(float(np.var(means, ddof=1)) - within * float(np.mean(1.0 / sizes)), 1e-12)
    return {"within_sd": math.sqrt(within), "between_sd": math.sqrt(between),
            "prior_weight": math.sqrt(within / between), "groups": float(len(frame))}


def stored_prior_weight() -> float:
    spread = load_anchored_spread()
    return spread.prior_weight if spread is not None and spread.prior_weight > 0 \
        else PRIOR_WEIGHT


def stored_transfer() -> Transfer | None:
    spread = load_anchored_spread()
    return spread.transfer if spread is not None else None


def stored_transfers() -> dict[str, Transfer]:
    spread = load_anchored_spread()
    return dict(spread.transfers) if spread is not None else {}


def _regime(case: Case) -> str:
    return regime_of(case.cluster.gpu.family, case.training.precision, case.model.moe_experts > 0)


def stored_tails() -> dict[str, Tail]:
    spread = load_anchored_spread()
    return dict(spread.tails) if spread is not None else {}


def cluster_targets(cases: Sequence[Case], measured: np.ndarray, family: np.ndarray,
                    tails: dict[str, Tail]) -> tuple[np.ndarray, np.ndarray]:
    """What each run says of its cluster, as tokens/s, and the share of its log residual under
    the family's fit that is the cluster's (its regime's bulk probability,
    search.inputs.anchor_tails). One run cannot tell its own pathology from its cluster's
    offset: it anchors on that share (an ordinary run in full; one far in its regime's tail
    near the family's prediction). Two or more runs are taken as measured: how they differ is
    what tells compute from network, and one run's pathology from the others' agreement is the
    user's to judge (each run's share is still shown)."""
    r = np.log(measured / family)
    shares = np.array([cluster_share(tails, _regime(c), float(x))
                       for c, x in zip(cases, r, strict=True)])
    applied = shares if len(cases) == 1 else np.ones_like(shares)
    return family * np.exp(applied * r), shares


def fit(runs: Sequence[MeasuredRun], base: ClusterCalibration | None = None,
        files: Sequence[str] = (), today: str | None = None,
        prior_weight: float | None = None, transfer: Transfer | None = None,
        tails: dict[str, Tail] | None = None,
        transfers: Mapping[str, Transfer] | None = None) -> AnchorFit:
    """The scales ``runs`` identify (module docstring), on top of ``base`` (a calibration
    whose nccl-tests links the runs are priced on; None: the family's); ``transfer``: how far a
    run's residual carries to other layouts, pooled over the regimes, and ``transfers`` each
    regime's own (default: the stored ones; the runs' regime's own where it has one, else the
    pooled: ``search.inputs.layout_transfer.transfer_for``; its ``far`` sets the pull, and the
    file records it for the study's plans);
    ``prior_weight``: the pull toward the family's fit where no transfer is given (default:
    the stored one, :func:`stored_prior_weight`); ``tails``: each regime's bulk and tail of
    residuals, which say how much of a run's error is its cluster's (default: the stored ones,
    :func:`cluster_targets`)."""
    if not runs:
        raise MeasuredInputError("calibrate --measured: no measured run was given")
    cases = [_case(r) for r in runs]
    transfer, scope = _choose_transfer(cases, transfer, transfers, prior_weight)
    w = (transfer.prior_weight if transfer is not None
         else stored_prior_weight() if prior_weight is None else prior_weight)
    gpus = sorted({c.cluster.gpu.id for c in cases})
    if len(gpus) > 1:
        raise MeasuredInputError(f"{runs[0].where}: the runs are on {', '.join(gpus)}: one "
                                 f"calibration file is one cluster's; calibrate each apart")
    for run, case in zip(runs, cases, strict=True):
        got = run_prediction(case)
        if "pred_error" in got:
            raise MeasuredInputError(f"{run.where}: {got['pred_error']}")
    base = base or ClusterCalibration(links=MeasuredLinks())
    measured = np.array([r.tokens_per_sec_per_gpu for r in runs])
    family = _tokens(cases, _cal(base, {}))
    cluster, shares = cluster_targets(cases, measured, family,
                                      stored_tails() if tails is None else tails)

    def residuals(theta: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        scales = dict(zip(names, np.exp(theta).tolist(), strict=True))
        pred = _tokens(cases, _cal(base, scales))
        return np.concatenate([np.log(pred / cluster), w * theta])

    names: tuple[str, ...] = ("compute_scale",)
    why = _network_identified(cases, base, len(runs))
    if why is None:
        names = ("compute_scale", "network_scale")
    lo = np.log([BOUNDS[k][0] for k in names])
    hi = np.log([BOUNDS[k][1] for k in names])
    sol = least_squares(residuals, np.zeros(len(names)), bounds=(lo, hi), diff_step=1e-3,
                        args=(names,), x_scale=1.0)
    scales = dict(zip(names, np.exp(sol.x).tolist(), strict=True))
    after = _tokens(cases, _cal(base, scales))
    rows = [_run_record(run, case, measured[i], family[i], after[i], cluster[i], shares[i])
            for i, (run, case) in enumerate(zip(runs, cases, strict=True))]
    anchor = MeasuredAnchor(compute_scale=round(scales["compute_scale"], 6),
                            network_scale=round(scales.get("network_scale", 1.0), 6),
                            fitted=names, runs=tuple(rows), transfer=transfer)
    cal = replace(base, measured=anchor, measured_files=tuple(dict.fromkeys(files)),
                  date=today or date.today().isoformat(),
                  device=base.device or cases[0].cluster.gpu.id)
    lines = [_run_line(run, r) for run, r in zip(runs, rows, strict=True)]
    family_name = cases[0].cluster.gpu.family
    lines.append(f"fitted compute_scale {scales['compute_scale']:.3f}: the {family_name} family's "
                 f"GEMM and attention fractions x that, on {len(runs)} run"
                 f"{'s' if len(runs) != 1 else ''}")
    lines.append(f"fitted network_scale {scales['network_scale']:.3f}: the network's bus "
                 f"bandwidth fraction x that" if "network_scale" in scales
                 else f"network: not fitted ({why}); the family's stays")
    lines.append("kept from the family's fit (the runs cannot tell them from the GEMMs): "
                 "memory-bound bandwidth, kernel and collective overheads, NVLink"
                 + ("" if base.files else ", the network's ring-step latency"))
    errs = (np.abs(family / measured - 1), np.abs(after / measured - 1))
    lines.append(f"pull toward the family's fit: weight {w:.2f} on each log-scale (one run "
                 f"moves a scale {100 / (1 + w * w):.0f}% of the way to its own fit)")
    if transfer is not None:
        lines.append(_transfer_line(transfer, scope))
    lines.append(f"tokens/s error on these runs: median {100 * np.median(errs[0]):.1f}% with "
                 f"the family's fit, {100 * np.median(errs[1]):.1f}% anchored (in-sample: "
                 f"benchmarks/bench_anchor.py measures it on runs the anchor did not see)")
    return AnchorFit(calibration=cal, lines=lines)


def _transfer_line(transfer: Transfer, scope: str) -> str:
    return (f"the rest of each run's error carries to a plan of its model and GPU count by "
            f"layout distance d ({scope}): correlation {transfer.far:.2f} + ({transfer.near:.2f}"
            f" - {transfer.far:.2f}) exp(-d / {transfer.decay:.2f}) (d: doublings of a degree, "
            f"micro-batch, sequence or batch, and switches of ZeRO stage, recompute, sequence "
            f"parallel)")


def _choose_transfer(cases: list[Case], transfer: Transfer | None,
                     transfers: Mapping[str, Transfer] | None,
                     prior_weight: float | None) -> tuple[Transfer | None, str]:
    """The transfer :func:`fit` uses (its docstring) and whose fit it is."""
    if transfer is None and prior_weight is not None:
        return None, ""
    if transfer is None:  # the stored fits, each regime's where the caller names none
        transfer, transfers = stored_transfer(), stored_transfers() if transfers is None \
            else transfers
    pooled, by_regime = transfer, transfers or {}
    chosen = transfer_for(pooled, by_regime, map(_regime, cases))
    if chosen is not None and chosen is not pooled:
        return chosen, f"the {_regime(cases[0])} regime's own fit"
    return chosen, "fitted over every regime"


def _network_identified(cases: list[Case], base: ClusterCalibration, n: int) -> str | None:
    """None where the runs identify the network scale, else why they do not."""
    if n < 2:
        return "one run identifies one scale"
    step = 0.05
    at = np.log(_tokens(cases, _cal(base, {})))
    d_compute = (np.log(_tokens(cases, _cal(base, {"compute_scale": math.exp(step)}))) - at) / step
    d_network = (np.log(_tokens(cases, _cal(base, {"network_scale": math.exp(step)}))) - at) / step
    if not np.any(d_network):
        return ("the network does not move these runs' predictions (single-node runs, or its "
                "bandwidth measured by the file's nccl-tests)")
    unit = d_compute / max(float(np.linalg.norm(d_compute)), 1e-12)
    alone = float(np.linalg.norm(d_network - unit * float(unit @ d_network)))
    if alone < IDENTIFIABLE:
        return (f"the runs' network shares differ too little to tell it from compute: "
                f"{alone:.3f} < {IDENTIFIABLE} of log step time per e-fold")
    return None


def _run_record(run: MeasuredRun, case: Case, measured: float, family: float,
                anchored_tokens: float, cluster: float, share: float) -> dict[str, Any]:
    return {"file": run.where.rsplit("/", 1)[-1], "model_name": case.model.name,
            "model": model_key(case.model), "gpu": case.cluster.gpu.id,
            "num_gpus": case.cluster.num_gpus, "plan": format_plan(case.plan),
            "measured_tokens_per_s": round(float(measured), 3),
            "family_tokens_per_s": round(float(family), 3),
            "anchored_tokens_per_s": round(float(anchored_tokens), 3),
            "cluster_tokens_per_s": round(float(cluster), 3),
            "cluster_share": round(float(share), 4),
            "layout": dict(zip(FEATURES, layout_of(
                plans_to_arrays([case.plan]), case.training.seq_len,
                case.training.global_batch)[0].round(6).tolist(), strict=True))}


def _run_line(run: MeasuredRun, r: dict[str, Any]) -> str:
    m, f, a = (r["measured_tokens_per_s"], r["family_tokens_per_s"],
               r["anchored_tokens_per_s"])
    line = (f"{r['file']}: {r['model_name']} on {r['num_gpus']} {r['gpu']}, {r['plan']}: "
            f"measured {m:,.0f} tokens/s/GPU; the family's fit {f:,.0f} ({100 * (f / m - 1):+.1f}%)"
            f", anchored {a:,.0f} ({100 * (a / m - 1):+.1f}%)")
    if not math.isnan(run.peak_mem_gib):
        line += f"; peak memory {run.peak_mem_gib:.1f} GiB measured (not fitted)"
    share = float(r.get("cluster_share", 1.0))
    if share < 0.5:
        taken = float(r.get("cluster_tokens_per_s", m))
        line += (f"; far in its regime's tail of residuals (P {share:.2f} that the error is the "
                 f"cluster's, not the run's): "
                 + (f"anchored as {taken:,.0f} tokens/s/GPU" if abs(taken / m - 1) > 1e-6
                    else "taken as measured beside the other runs")
                 + ", check the run")
    return line
