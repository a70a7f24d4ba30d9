"""Does anchoring a study on one measured run of its cluster lower the error on the others?

    python benchmarks/bench_anchor.py [--csv PATH] [--anchors K] [--json] [--write]

Issue #37's check, on ../shared/data/measured_runs.csv, leave-one-in. The rows that ran (status
ok, with a tokens/s) are grouped by (source, model, GPU, cluster), where a cluster is what the
CSV can say of one: the GPU SKU, the GPUs per node and the job's GPU count (the schema names no
machine; a source's runs at one GPU count ran on one allocation of one cluster, while another
count of the same sweep may not have). In every group of >= 2 runs, each of K runs (default 3,
evenly spread in file order) is in turn the ONE anchor: it goes through what ``tcf-search
calibrate --measured runs.csv -o my-cluster.yaml`` runs (the run's row in a CSV file, read,
fitted, written and read back), and the group's other runs are predicted through ``tcf-search
predict --calibration my-cluster.yaml``'s code, and without it (the family's fit alone).

Prints per source the median absolute percentage error of tokens/s per GPU before and after,
the number of groups and of held-out predictions, and the 80% interval's coverage of the
anchored predictions: two-fold over the groups (a stable hash splits them in two halves; each
half's 10% and 90% quantiles of log(measured / anchored predicted), each group weighing alike,
bound the other half's predictions), so the coverage is not measured on the residuals that made
the interval. ``--write`` stores the quantiles over every group as
``hardware_catalog/anchored.yaml``: the spread ``search.anchored_interval`` narrows an anchored
study's interval to.

Bars (issue #37): the error falls on every source with >= 3 groups, and the coverage is 75-85%.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.plans import plans_to_arrays  # noqa: E402
from search.anchored_interval import ANCHORED_FILE, local_of  # noqa: E402
from search.inputs import (  # noqa: E402
    FEATURES,
    LEVELS,
    MIN_REGIME_GROUPS,
    CaseError,
    Tail,
    Transfer,
    calibration_yaml,
    case_from_row,
    layout_of,
    load_calibration,
    regime_of,
)
from tcf_search.calibration.anchor import fit, pull  # noqa: E402
from tcf_search.calibration.dataset import find_measured_csv  # noqa: E402
from tcf_search.calibration.predict import predict_frame  # noqa: E402
from tcf_search.calibration.training_logs import (  # noqa: E402
    MeasuredInputError,
    read_measured,
)
from tcf_search.calibration.transfer_fit import (  # noqa: E402
    fit_regime_transfers,
    fit_tails,
    fit_transfer,
)

GROUP = ("source", "model_name", "gpu", "gpus_per_node", "num_gpus")
COVERAGE_BAR = (0.75, 0.85)
MIN_GROUPS = 3


def ran(frame: pd.DataFrame) -> pd.DataFrame:
    tokens = pd.to_numeric(frame["tokens_per_sec_per_gpu"], errors="coerce")
    return frame[frame["status"].eq("ok") & tokens.gt(0)]


def anchor_on(row: pd.DataFrame, folder: Path, transfer: Transfer,
              tails: dict[str, Tail], transfers: dict[str, Transfer]) -> object:
    """The calibration ``calibrate --measured`` writes for one run's row, read back."""
    src, out = folder / "anchor.csv", folder / "my-cluster.yaml"
    row.to_csv(src, index=False)
    result = fit(read_measured([src]), files=[src.name], transfer=transfer, tails=tails,
                 transfers=transfers)
    out.write_text(calibration_yaml(result.calibration, []))
    return load_calibration(out)


def fold_of(group: str) -> int:
    return zlib.crc32(group.encode()) % 2


def layout_row(row: pd.Series) -> tuple[np.ndarray, str]:
    """A CSV row's layout coordinates (``layout_of``; NaN where it is not a case) and regime
    (``search.inputs.regime_of``, as ``calibrate --measured`` reads it)."""
    try:
        case = case_from_row({k: str(v) for k, v in row.items()})
    except (CaseError, ValueError, KeyError):
        return np.full(len(FEATURES), np.nan), ""
    return (layout_of(plans_to_arrays([case.plan]), case.training.seq_len,
                      case.training.global_batch)[0],
            regime_of(case.cluster.gpu.family, case.training.precision,
                      case.model.moe_experts > 0))


Fits = dict[str, dict[str, Transfer]]


def family_pull(frame: pd.DataFrame) -> tuple[dict[str, dict[str, float]], dict[str, Transfer],
                                               dict[str, dict[str, Tail]], Fits]:
    """From the family's residuals of each half of the groups, and of all: the random-effects
    split (anchor.pull, shown), the layout transfer (pooled, and each regime's own where it has
    groups enough) and each regime's tail of residuals (transfer_fit): a group's anchor is
    fitted with the other half's, so nothing is fitted on the groups it is scored on."""
    rows = ran(frame)
    before = predict_frame(rows)
    pred = pd.to_numeric(before["pred_tokens_per_sec_per_gpu"], errors="coerce")
    r = np.log(rows["tokens_per_sec_per_gpu"].astype(float) / pred).to_numpy()
    groups = rows[list(GROUP)].astype(str).agg("|".join, axis=1).to_numpy()
    placed = [layout_row(row) for _, row in rows.iterrows()]
    layouts = np.array([lay for lay, _ in placed])
    regimes = np.array([reg for _, reg in placed])
    ok = np.isfinite(r) & np.isfinite(layouts).all(axis=1)
    folds = np.array([fold_of(g) for g in groups])
    pulls, transfers, tails, by_regime = {}, {}, {}, {}
    for f in ("all", 0, 1):
        keep = ok & (folds != f)  # fold f's anchors: the other half's
        pulls[str(f)] = pull(r[keep], groups[keep])
        transfers[str(f)], how = fit_transfer(r[keep], groups[keep], layouts[keep])
        pulls[str(f)].update({k: float(v) for k, v in how.items() if k != "loss"})
        tails[str(f)] = fit_tails(r[keep], groups[keep], regimes[keep])
        by_regime[str(f)] = fit_regime_transfers(r[keep], groups[keep], layouts[keep],
                                                 regimes[keep])
    return pulls, transfers, tails, by_regime


def leave_one_in(frame: pd.DataFrame, anchors: int, transfers: dict[str, Transfer],
                 tails: dict[str, dict[str, Tail]], by_regime: Fits) -> pd.DataFrame:
    """One row per held-out prediction: its group, anchor, measured, before and after."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, group in ran(frame).groupby(list(GROUP), sort=True):
            if len(group) < 2:
                continue
            name = "|".join(map(str, key))
            fold = str(fold_of(name))
            transfer, tail, own = transfers[fold], tails[fold], by_regime[fold]
            # anchors drawn at random (seeded by the group): the file's order is a source's
            # (the Playbook's runs sorted by throughput), so its first, middle and last runs
            # would be its extremes
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            picks = sorted(int(i) for i in rng.choice(len(group), min(anchors, len(group)),
                                                      replace=False))
            before = predict_frame(group)
            for a in picks:
                try:
                    cal = anchor_on(group.iloc[[a]], Path(tmp), transfer, tail, own)
                except MeasuredInputError as exc:
                    print(f"skipped anchor {group.iloc[a]['case_id']}: {exc}", file=sys.stderr)
                    continue
                others = group.drop(index=group.index[a])
                after = predict_frame(others, calibration=cal)  # type: ignore[arg-type]
                for idx in others.index:
                    b = pd.to_numeric(before.at[idx, "pred_tokens_per_sec_per_gpu"],
                                      errors="coerce")
                    p = pd.to_numeric(after.at[idx, "pred_tokens_per_sec_per_gpu"],
                                      errors="coerce")
                    if not (b > 0 and p > 0):
                        continue
                    rows.append({"source": key[0], "group": name,
                                 "sd": sd_at(cal, frame.loc[idx]),
                                 "anchor": group.iloc[a]["case_id"],
                                 "case_id": frame.at[idx, "case_id"],
                                 "measured": float(frame.at[idx, "tokens_per_sec_per_gpu"]),
                                 "before": float(b), "after": float(p)})
    return pd.DataFrame(rows)


def sd_at(cal: object, row: pd.Series) -> float:
    """The sd kriging leaves a row's prediction (1 where no anchor is near it)."""
    case = case_from_row({k: str(v) for k, v in row.items()})
    local = local_of(cal, case.model, case.cluster, case.training)  # type: ignore[arg-type]
    return 1.0 if local is None else float(local.shift(plans_to_arrays([case.plan]))[1][0])


def weighted_quantiles(values: np.ndarray, weights: np.ndarray,
                       levels: tuple[float, ...]) -> np.ndarray:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(levels, cum, v)


def group_weights(res: pd.DataFrame) -> np.ndarray:
    """Each group weighing alike, whatever its number of runs and anchors."""
    return (1.0 / res.groupby("group")["group"].transform("size")).to_numpy()


def two_fold_coverage(res: pd.DataFrame) -> dict[str, float]:
    r = (np.log(res["measured"] / res["after"]) / res["sd"]).to_numpy()
    w = group_weights(res)
    half = res["group"].map(fold_of).to_numpy()
    inside = np.zeros(len(res), dtype=bool)
    for fold in (0, 1):
        lo, hi = weighted_quantiles(r[half != fold], w[half != fold], (0.1, 0.9))
        at = half == fold
        inside[at] = (r[at] >= lo) & (r[at] <= hi)
    return {"coverage_groups_alike": float(np.sum(w * inside) / np.sum(w)),
            "coverage_rows": float(np.mean(inside))}


def summary(res: pd.DataFrame) -> dict[str, object]:
    out: dict[str, object] = {"sources": {}}
    for source, part in res.groupby("source"):
        ape_b = np.abs(part["before"] / part["measured"] - 1)
        ape_a = np.abs(part["after"] / part["measured"] - 1)
        groups = part["group"].nunique()
        out["sources"][source] = {  # type: ignore[index]
            "groups": int(groups), "predictions": len(part),
            "median_ape_before": round(float(ape_b.median()), 4),
            "median_ape_after": round(float(ape_a.median()), 4),
            "falls": bool(ape_a.median() < ape_b.median()),
            "bar_applies": bool(groups >= MIN_GROUPS)}
    out["coverage_80"] = {k: round(v, 4) for k, v in two_fold_coverage(res).items()}
    out["groups"] = int(res["group"].nunique())
    out["predictions"] = len(res)
    cov = out["coverage_80"]["coverage_groups_alike"]  # type: ignore[index]
    out["bars_met"] = {
        "error_falls_on_every_source_with_3_groups": all(
            s["falls"] for s in out["sources"].values() if s["bar_applies"]),  # type: ignore
        "coverage_75_85": COVERAGE_BAR[0] <= cov <= COVERAGE_BAR[1]}
    return out


def write_spread(res: pd.DataFrame, csv: Path, pulled: dict[str, float],
                 transfer: Transfer, tails: dict[str, Tail],
                 by_regime: dict[str, Transfer]) -> Path:
    r = (np.log(res["measured"] / res["after"]) / res["sd"]).to_numpy()
    q = weighted_quantiles(r, group_weights(res), LEVELS)
    doc = {"levels": list(LEVELS), "q": [round(float(v), 5) for v in q], "n": len(res),
           "pull": {k: round(v, 4) for k, v in pulled.items()},
           "transfer": {**transfer.to_dict(), "basis": (
               f"fitted on the family's log residuals of {csv.name}'s runs (status ok), every "
               f"ordered pair of runs of one group (tcf_search.calibration.transfer_fit: "
               f"r_b = rho(d) r_a, each group in its own robust scale and weighing alike, "
               f"soft-L1 loss); {int(pulled['pairs'])} pairs of {int(pulled['groups'])} "
               f"groups. The quantiles were made with each half's anchors on the other "
               f"half's fit")},
           "transfers": {k: t.to_dict() for k, t in sorted(by_regime.items())},
           "transfers_basis": (
               f"each regime's (SKU family/precision/dense or MoE) own transfer, fitted as the "
               f"pooled one on its groups alone where it has >= {MIN_REGIME_GROUPS} groups of "
               f"two runs or more (tcf_search.calibration.transfer_fit.fit_regime_transfers); "
               f"calibrate --measured uses the runs' regime's, else the pooled one. The "
               f"quantiles were made with each half's anchors on the other half's"),
           "tails": {k: t.to_dict() for k, t in sorted(tails.items())},
           "tails_basis": (
               f"each regime's (SKU family/precision/dense or MoE) log residuals of "
               f"{csv.name}'s runs under the family's fit as two zero-mean normals, a bulk and "
               f"a tail (tcf_search.calibration.transfer_fit.fit_tails: EM, every group "
               f"weighing alike; regimes of >= 3 groups); an anchor run keeps the share of its "
               f"residual its bulk's probability gives (search.inputs.anchor_tails). The "
               f"quantiles were made with each half's anchors on the other half's tails"),
           "groups": int(res["group"].nunique()),
           "basis": (f"leave-one-in on {csv.name}: in each of {res['group'].nunique()} "
                     f"(source, model, GPU, GPUs per node, GPU count) groups, up to "
                     f"{res.groupby('group')['anchor'].nunique().max()} runs in turn the one "
                     f"anchor (calibrate --measured), the others predicted (predict "
                     f"--calibration); quantiles of log(measured / anchored predicted), each "
                     f"group weighing alike, each divided by the sd kriging leaves it (the "
                     f"transfer below). pull: the family's log residuals split within and "
                     f"between groups of >= 2 runs (tcf_search.calibration.anchor.pull); the "
                     f"quantiles were made with each half's anchors pulled by the other "
                     f"half's weight")}
    head = ("# Written by `python benchmarks/bench_anchor.py --write`; do not edit by hand.\n"
            "# The spread of tokens/s predictions anchored on one measured run of their own\n"
            "# cluster (read by search/anchored_interval.py).\n")
    ANCHORED_FILE.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=100))
    return ANCHORED_FILE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--anchors", type=int, default=3, help="anchors tried per group")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="write hardware_catalog/anchored.yaml")
    args = ap.parse_args(argv)
    csv = args.csv or find_measured_csv()
    if csv is None:
        print("skipped: measured_runs.csv not found (expected at ../shared/data/); pass --csv")
        return 0
    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    pulls, transfers, tails, by_regime = family_pull(frame)
    res = leave_one_in(frame, args.anchors, transfers, tails, by_regime)
    out = summary(res)
    out["pull"] = {k: {n: round(v, 4) for n, v in p.items()} for k, p in pulls.items()}
    out["transfer"] = {k: {n: v for n, v in t.to_dict().items() if n != "basis"}
                       for k, t in transfers.items()}
    out["tails"] = {k: {reg: t.to_dict() for reg, t in v.items()} for k, v in tails.items()}
    out["transfers"] = {k: {reg: {n: x for n, x in t.to_dict().items() if n != "basis"}
                            for reg, t in v.items()} for k, v in by_regime.items()}
    if args.write:
        out["written"] = str(write_spread(res, csv, pulls["all"], transfers["all"],
                                          tails["all"], by_regime["all"]))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'source':<20} {'groups':>6} {'preds':>6} {'before':>8} {'after':>8}  falls")
    for source, s in out["sources"].items():  # type: ignore[union-attr]
        print(f"{source:<20} {s['groups']:>6} {s['predictions']:>6} "
              f"{100 * s['median_ape_before']:>7.1f}% {100 * s['median_ape_after']:>7.1f}%  "
              f"{'yes' if s['falls'] else 'NO'}{'' if s['bar_applies'] else ' (< 3 groups)'}")
    cov = out["coverage_80"]  # type: ignore[index]
    print(f"80% interval of anchored predictions, two-fold over groups: "
          f"{100 * cov['coverage_groups_alike']:.1f}% (groups alike), "
          f"{100 * cov['coverage_rows']:.1f}% (rows); bar 75-85%")
    print("pull toward the family's fit (within / between groups' sd, weight), per half:",
          json.dumps(out["pull"]))
    print("layout transfer (far, near, decay), per half:", json.dumps(out["transfer"]))
    print("each regime's own, per half:", json.dumps(out["transfers"]))
    print("bars met:", json.dumps(out["bars_met"]))
    if args.write:
        print("wrote", out["written"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
