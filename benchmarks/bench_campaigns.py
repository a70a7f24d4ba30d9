"""How much of the Playbook's throughput scatter is the cluster, not the configuration.

    python benchmarks/bench_campaigns.py [--csv PATH]

The Playbook sweep ran in campaigns weeks apart (the Slurm job id's first four digits tell them
apart: 1343xxxx ... 1428xxxx). This prints, on the rows issue #2 scores throughput on, the
median of measured / predicted tokens/s per campaign and GPU count, and the pick-vs-best figure
twice: over the issue's (model, GPU count) groups, and within (model, GPU count, campaign)
groups, where every compared run saw the same cluster. Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tcf_search.accuracy import PICK_HEADROOM, throughput_rows  # noqa: E402
from tcf_search.dataset import find_measured_csv, load_groups, predict_groups  # noqa: E402


def picks(rows: pd.DataFrame, keys: list[str]) -> list[float]:
    out = []
    for _, g in rows.groupby(keys):
        if len(g) < 3:
            continue
        roomy = g[g["mem_frac"] <= 1 - PICK_HEADROOM]
        pick = (roomy if len(roomy) else g)["pred"].idxmax()
        out.append(g.loc[pick, "tokens_per_sec_per_gpu"] / g["tokens_per_sec_per_gpu"].max())
    return out


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
    by_group = picks(rows, ["model_name", "num_gpus"])
    by_campaign = picks(rows, ["model_name", "num_gpus", "campaign"])
    print(f"\npick vs best over (model, GPUs) groups: mean {np.mean(by_group):.3f} over "
          f"{len(by_group)} groups (min {np.min(by_group):.2f})")
    print(f"pick vs best within (model, GPUs, campaign): mean {np.mean(by_campaign):.3f} over "
          f"{len(by_campaign)} groups (min {np.min(by_campaign):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
