"""How much of the Playbook's throughput scatter is the cluster, not the configuration.

    python benchmarks/bench_campaigns.py [--csv PATH]

The Playbook sweep ran in campaigns weeks apart (the Slurm job id's first four digits tell them
apart: 1343xxxx ... 1428xxxx). This prints, on the rows issue #2 scores throughput on:

* the median of measured / predicted tokens/s per campaign and GPU count;
* configurations measured more than once, and what each campaign measured;
* the pick-vs-best figure over the issue's (model, GPU count) groups, within
  (model, GPU count, campaign) groups, where every compared run saw the same cluster, and split
  by campaign: campaigns whose median measured / predicted lies within 15% of 1 against the
  rest. That split is chosen by the outcome, so it is a diagnosis, not a score;
* runs that differ only in ZeRO stage 0 / 1: measured and predicted ratio, by DP size, with
  nanotron's profile as calibrated (``sharded_grad_all_reduce`` on: its ZeRO-1 of the
  Playbook's time all-reduces its fp32 gradients after backward) and with that switch off (a
  reduce-scatter, half the bytes), same calibration.

Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tcf_search.calibration.accuracy import PICK_HEADROOM, throughput_rows  # noqa: E402
from tcf_search.calibration.dataset import (  # noqa: E402
    find_measured_csv,
    load_groups,
    predict_groups,
    with_training,
)

CONFIG = ["model_name", "num_gpus", "tp", "pp", "dp", "cp", "vpp", "zero_stage", "micro_batch",
          "global_batch", "recompute", "sequence_parallel"]
HEALTHY = 0.15  # a campaign's median measured / predicted within this of 1


def picks(rows: pd.DataFrame, keys: list[str]) -> list[float]:
    out = []
    for _, g in rows.groupby(keys):
        if len(g) < 3:
            continue
        roomy = g[g["mem_frac"] <= 1 - PICK_HEADROOM]
        pick = (roomy if len(roomy) else g)["pred"].idxmax()
        out.append(g.loc[pick, "tokens_per_sec_per_gpu"] / g["tokens_per_sec_per_gpu"].max())
    return out


def repeats(rows: pd.DataFrame) -> None:
    """The same configuration measured more than once: no model of the configuration columns
    can tell these runs apart."""
    print("\nconfigurations measured more than once (tokens/s per GPU by campaign):")
    n = 0
    for key, g in rows.groupby(CONFIG, dropna=False):
        if len(g) > 1:
            n += 1
            pairs = zip(g["campaign"], g["tokens_per_sec_per_gpu"], strict=True)
            runs = ", ".join(f"{c}: {t:,.0f}" for c, t in pairs)
            print(f"  {key[0]}, {key[1]} GPUs, tp{key[2]} pp{key[3]} dp{key[4]} "
                  f"zero{key[7]} mbs{key[8]}: {runs}")
    if not n:
        print("  none")


def zero_pairs(rows: pd.DataFrame, switched: pd.Series) -> None:
    keys = [c for c in CONFIG if c != "zero_stage"] + ["campaign"]
    cols = ["tokens_per_sec_per_gpu", "pred", "pred_switch"]
    r = rows.assign(pred_switch=switched[rows.index])
    z0 = r[r["zero_stage"].eq(0)].set_index(keys)[cols]
    z1 = r[r["zero_stage"].eq(1)].set_index(keys)[cols]
    j = pd.merge(z0, z1, left_index=True, right_index=True, suffixes=("_z0", "_z1"))
    j = j.reset_index()
    if j.empty:
        return
    measured = j["tokens_per_sec_per_gpu_z0"] / j["tokens_per_sec_per_gpu_z1"]
    models = {"model": j["pred_z0"] / j["pred_z1"],
              "switch off": j["pred_switch_z0"] / j["pred_switch_z1"]}
    j["band"] = pd.cut(j["dp"], [0, 16, 64, 1 << 20], labels=["dp<=16", "dp 32-64", "dp>=128"])
    j["healthy"] = j["campaign"].isin(rows.attrs["healthy"])
    print("\nZeRO-0 / ZeRO-1 tokens/s on runs that differ only in ZeRO stage (median ratio;"
          " right = share of pairs whose direction the model gets right)")
    print(f"{'campaigns':10} {'band':9} {'pairs':>5} {'measured':>9}"
          + "".join(f" {name:>9} {'right':>6}" for name in models))
    for (healthy, band), g in j.groupby(["healthy", "band"], observed=True):
        m = measured[g.index]
        line = f"{'healthy' if healthy else 'other':10} {band:9} {len(g):>5} {m.median():>9.2f}"
        for x in (ratio[g.index] for ratio in models.values()):
            line += f" {x.median():>9.2f} {((x > 1) == (m > 1)).mean():>6.0%}"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args()
    csv = args.csv or find_measured_csv()
    if csv is None:
        print("skipped: measured_runs.csv not found at ../shared/data/ (pass --csv)")
        return 0
    frame = pd.read_csv(csv)
    groups, _ = load_groups(frame)
    pred = predict_groups(groups, len(frame))
    frame["pred"] = pred["tokens_per_s_per_gpu"]
    frame["mem_frac"] = pred["peak_mem_bytes"] / pred["usable_bytes"]
    frame["campaign"] = frame["case_id"].str.extract(r"playbook-(\d{4})")[0]
    rows = frame[throughput_rows(frame) & frame["pred"].notna()].copy()
    rows["ratio"] = rows["tokens_per_sec_per_gpu"] / rows["pred"]
    table = rows.pivot_table(index="num_gpus", columns="campaign", values="ratio",
                             aggfunc="median")
    counts = rows.pivot_table(index="num_gpus", columns="campaign", values="ratio",
                              aggfunc="count")
    print("median measured / predicted tokens/s, by GPU count (rows) and campaign (columns);"
          " (n) = runs")
    cells = table.round(2).astype(str) + " (" + counts.fillna(0).astype(int).astype(str) + ")"
    print(cells.where(table.notna(), "").to_string())
    camp_median = rows.groupby("campaign")["ratio"].median()
    rows.attrs["healthy"] = set(camp_median[(camp_median - 1).abs() <= HEALTHY].index)
    repeats(rows)
    by_group = picks(rows, ["model_name", "num_gpus"])
    by_campaign = picks(rows, ["model_name", "num_gpus", "campaign"])
    print(f"\npick vs best over (model, GPUs) groups: mean {np.mean(by_group):.3f} over "
          f"{len(by_group)} groups (min {np.min(by_group):.2f})")
    print(f"pick vs best within (model, GPUs, campaign): mean {np.mean(by_campaign):.3f} over "
          f"{len(by_campaign)} groups (min {np.min(by_campaign):.2f})")
    healthy = rows["campaign"].isin(rows.attrs["healthy"])
    for name, part in (("healthy", rows[healthy]), ("other", rows[~healthy])):
        p = picks(part, ["model_name", "num_gpus"])
        ape = (part["pred"] / part["tokens_per_sec_per_gpu"] - 1).abs().median()
        print(f"  {name} campaigns ({', '.join(sorted(part['campaign'].unique()))}): "
              f"{len(part)} runs, tokens/s median APE {ape:.1%}, pick vs best over (model, GPUs) "
              f"groups {np.mean(p):.3f} over {len(p)} groups (min {np.min(p):.2f})")
    switched = predict_groups(with_training(groups, "nanotron", sharded_grad_all_reduce=False),
                              len(frame))["tokens_per_s_per_gpu"]
    zero_pairs(rows, pd.Series(switched, index=frame.index))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
