"""Accuracy of the calibrated cost model on ../shared/data/measured_runs.csv.

    python benchmarks/bench_accuracy.py [--csv PATH] [--json]

Prints the figures issue #2 asks for (and issue #17's: NVIDIA's DGX Cloud rows by SKU family,
precision and dense/MoE; the 80% interval's coverage), on the rows held out of the fit (30% of
the (model, GPU count) sweep groups, by a stable hash; see ``tcf_search.calibration.fit``) and
on all rows, next to the bars; and (issue #36 item 5) the signed tokens/s error by regime —
source, framework stack, precision, model size, GPU count, dense/MoE, compiled/eager, SKU family
— as the median of log(predicted / measured), so a regime the model prices too fast or too slow
shows as such (``tcf_search.calibration.accuracy.bias_by_regime``); and, model-free, how far the
Playbook sweep reproduces itself across its job batches (``batch_twins``).
Also times ``tcf-search predict`` over the whole file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tcf_search.calibration.accuracy import (  # noqa: E402
    active_params_of,
    batch_twins,
    bias_by_regime,
    predict_calibration,
    predicted_columns,
    report,
    throughput_rows,
)
from tcf_search.calibration.dataset import (  # noqa: E402
    find_measured_csv,
    load_groups,
    split_mask,
)
from tcf_search.calibration.predict import predict_csv  # noqa: E402
from tcf_search.calibration.ranking import ranking_table, two_fold_check  # noqa: E402
from tcf_search.calibration.uncertainty import (  # noqa: E402
    coverage,
    half_of,
    tput_rows,
)

BARS = {
    "oom_accuracy": (">=", 0.95), "false_fits": ("<=", 0.03), "mem_mape": ("<=", 0.12),
    "tput_median_ape": ("<=", 0.15), "spearman_median": (">=", 0.85),
    "pick_vs_best_mean": (">=", 0.95), "megatron-sc21_mape": ("<=", 0.15),
    "llm-foundry_mape": ("<=", 0.15), "dgxc_median_ape": ("<=", 0.10),
}

# issue #34: every multi-node source's tokens/s median APE
MULTINODE_BAR = ("<=", 0.10)


def _bias(cell: dict[str, float] | None) -> str:
    return "-" if cell is None else f"{cell['median_log_ratio']:+.3f} ({cell['rows']})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    csv = args.csv or find_measured_csv()
    if csv is None:
        print("skipped: measured_runs.csv not found at ../shared/data/ (pass --csv)")
        return 0
    frame = pd.read_csv(csv)
    # every figure is computed on what tcf-search predict writes for the file as a user hands
    # it (issue #36 item 1), the knobs and stage splits it chooses where a row leaves them empty
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        predicted = predict_csv(csv, Path(tmp) / "predicted.csv")
    predict_s = time.perf_counter() - t0
    pred = predicted_columns(predicted)
    groups, _ = load_groups(frame)
    held = split_mask(frame)
    out = {"held_out": report(frame, pred, held), "all": report(frame, pred),
           "predict_cli_s": predict_s, "interval_coverage": coverage(frame, pred, held),
           "ranking": ranking_table(frame, pred["tokens_per_s_per_gpu"],
                                    held & tput_rows(frame, pred)),
           "ranking_check": two_fold_check(frame, pred["tokens_per_s_per_gpu"],
                                           held & tput_rows(frame, pred), half_of(frame))}
    tok = pd.Series(pred["tokens_per_s_per_gpu"], index=frame.index)
    # the Playbook's pipelined runs before HF's PP fix are left out, as in every tokens/s figure
    timed = ~frame["source"].eq("playbook") | throughput_rows(frame)
    params = active_params_of(groups, frame.index)
    out["bias_held_out"] = bias_by_regime(frame, tok, held & timed, params)
    out["bias_all"] = bias_by_regime(frame, tok, timed, params)
    out["predict_calibration"] = predict_calibration(frame, predicted, held)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    keys = list(dict.fromkeys([*out["all"], *out["held_out"]]))
    width = max(len(k) for k in keys) + 2
    print(f"{'figure':<{width}}{'bar':>10}{'held-out':>12}{'all rows':>12}")
    for key in keys:
        bar = BARS.get(key) or (MULTINODE_BAR if key.startswith("multinode/")
                                and key.endswith("_median_ape") else None)
        bar_s = f"{bar[0]}{bar[1]:g}" if bar else ""
        h, a = out["held_out"].get(key, float("nan")), out["all"].get(key, float("nan"))
        print(f"{key:<{width}}{bar_s:>10}{h:>12.3f}{a:>12.3f}")
    cov = out["interval_coverage"]
    print(f"leave one group out, the 80% interval on tokens/s holds {cov['within']:.1%} of "
          f"{cov['rows']} held-out rows and {cov['within_groups']:.1%} of {cov['groups']} groups "
          "weighing alike (each group judged by the bounds of the other held-out groups; "
          f"{cov['borrowed']:.0%} of rows bounded by a coarser regime); by regime (rows, groups): "
          + ", ".join(f"{k} {v['within']:.0%} of {v['rows']}, {v['within_groups']:.0%} of "
                      f"{v['groups']}" for k, v in cov["by_regime"].items()))
    print("by framework stack (rows, groups; share bounded by the stack's own residuals): "
          + ", ".join(f"{k} {v['within']:.0%} of {v['rows']}, {v['within_groups']:.0%} of "
                      f"{v['groups']}; {v['own_stack_bounds']:.0%}"
                      for k, v in cov["by_stack"].items()))
    rk = out["ranking"]
    edges = [f"{e:.0%}" for e in rk["gap_edges"]]
    print("held-out pairs of one group ordered right, by predicted gap: " + ", ".join(
        f"{a}-{b} {p:.0%} ({n} pairs)" for a, b, p, n in zip(
            edges, [*edges[1:], "inf"], rk["p_right"], rk["pairs"], strict=True)))
    print("two-fold (one half's table on the other half's pairs), P given / share right by bin: "
          + ", ".join(f"{edges[c['bin']]}+ {c['p']:.0%}/{c['right']:.0%}"
                      for c in out["ranking_check"]))
    pc = out["predict_calibration"]
    print(f"tcf-search predict's 80% interval holds {pc['interval_within']:.1%} of "
          f"{pc['interval_rows']} held-out rows that ran; P(OOM) by bin (rows that ran or ran "
          "out of memory; predicted mean / measured OOM share): " + ", ".join(
              f"{b['bin']} {b['predicted']:.0%}/{b['measured_oom']:.0%} ({b['rows']} rows)"
              for b in pc["p_oom_bins"]))
    print("runs that ran, per source, as tcf-search predict prices them (predicted to fit / "
          "priced; refused: a cell the row leaves empty): " + ", ".join(
              f"{src} {c['fit']}/{c['priced']}" + (f" ({c['refused']} refused)" if c["refused"]
                                                   else "")
              for src, c in pc["launched_fit"].items()))
    print("signed tokens/s error by regime, median of log(predicted / measured) (+ = the model "
          "is too fast), held-out rows [all rows]; regimes of >= 5 rows:")
    for axis, every in out["bias_all"].items():
        held_out = out["bias_held_out"][axis]
        print(f"  {axis}: " + ", ".join(f"{k} {_bias(held_out.get(k))} [{_bias(v)}]"
                                        for k, v in every.items()))
    twins = batch_twins(frame)
    print("the Playbook's reproducibility, model-free: per job batch (job id // 1000) with runs "
          "of a layout another batch also ran (ZeRO 0 or 1), its runs' tokens/s over their "
          "twins', median [range] (runs): " + ", ".join(
              f"{b} {t['median']:.2f} [{t['min']:.2f}-{t['max']:.2f}] ({t['runs']})"
              for b, t in twins.items()))
    print(f"tcf-search predict (with knob search) over {len(frame)} rows: "
          f"{out['predict_cli_s']:.1f} s; every figure above is computed on its output")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
