"""Completeness of the search over the measured runs (issue #40).

    python benchmarks/bench_completeness.py [--csv PATH] [--limit N] [--sources a,b]

For every run of ../shared/data/measured_runs.csv that ran (status ok) with a stated layout, a
study is built from the row as a user would write it — its model, cluster, global batch,
sequence, precision and framework, every knob ``auto`` (context and expert parallelism
included) — and searched exhaustively. The run passes where the study's best plan is at least
the tool's own figure for the run's layout under the same study (within 1%). A run that fails
is reported with what the space lacks: the rule its layout breaks, or the knob values outside
the space's domains, or, where neither, the search itself. Rows sharing a study are searched
once. Prints the counts per source and each failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel import estimate  # noqa: E402
from costmodel.errors import TcfError  # noqa: E402
from search.inputs.measured import case_from_row, presumed_split  # noqa: E402
from search.inputs.specs import build_specs  # noqa: E402
from search.inputs.study import parse_study  # noqa: E402
from search.pipeline import RunOptions, run_study  # noqa: E402
from search.space import build_space  # noqa: E402
from tcf_search.calibration.dataset import find_measured_csv  # noqa: E402

STUDY_KEYS = ("model_name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab",
              "ffn_type", "tied_embeddings", "moe_experts", "moe_topk", "moe_ffn_hidden",
              "moe_shared_experts", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "gpu", "gpus_per_node", "num_gpus", "seq_len",
              "global_batch", "precision", "framework", "source")
# knobs of a row's plan and their search-space axis
AXIS_OF = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "vpp": "vpp",
           "zero_stage": "zero_stage", "micro_batch": "micro_batch"}


def study_text(case) -> str:
    """The study a user would write for the run: the model as an architecture, every knob auto."""
    m = case.model
    arch: dict[str, object] = {
        "layers": m.layers, "hidden": m.hidden, "ffn_hidden": m.ffn_hidden, "heads": m.heads,
        "kv_heads": m.kv_heads, "vocab": m.vocab, "ffn_type": m.ffn_type,
        "tied_embeddings": m.tied_embeddings, "bias": m.bias,
        "sliding_window": m.sliding_window, "attention_chunk": m.attention_chunk,
        "window_skip_freq": m.window_skip_freq, "attention_sinks": m.attention_sinks,
        "qk_norm": m.qk_norm}
    if m.head_dim:
        arch["head_dim"] = m.head_dim
    if m.moe_experts:
        arch["moe"] = {"experts": m.moe_experts, "topk": m.moe_topk,
                       "ffn_hidden": m.moe_ffn_hidden or m.ffn_hidden,
                       "shared_experts": m.moe_shared_experts,
                       "dense_layers": m.moe_dense_layers, "layer_freq": m.moe_layer_freq}
    if m.mla is not None:
        arch["mla"] = {k: getattr(m.mla, k) for k in m.mla.__dataclass_fields__}
    doc = {"model": {"name": m.name, "architecture": arch},
           "training": {"seq_len": case.training.seq_len,
                        "global_batch": case.training.global_batch,
                        "precision": case.training.precision, "framework": case.framework},
           "cluster": {"gpu": case.cluster.gpu.id, "gpus": case.cluster.num_gpus,
                       "gpus_per_node": case.cluster.gpus_per_node},
           "search_space": {"cp": "auto"}}
    if case.cluster.fabric:
        doc["cluster"]["fabric"] = case.cluster.fabric  # type: ignore[index]
    return yaml.safe_dump(doc, sort_keys=False)


def lacks(space, plan) -> str:
    """The knob values of ``plan`` outside the space's domains."""
    out = [f"{k}={getattr(plan, k)}" for k, axis in AXIS_OF.items()
           if axis in space.domains and getattr(plan, k) not in space.domains[axis]]
    return ", ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=0, help="studies at most (0: all)")
    ap.add_argument("--sources", default="", help="comma-separated sources (default: all)")
    args = ap.parse_args()
    csv = args.csv or find_measured_csv()
    if csv is None:
        print("skipped: measured_runs.csv not found at ../shared/data/ (pass --csv)")
        return 0
    frame = pd.read_csv(csv)
    ran = frame["status"].eq("ok") & frame["tp"].notna() & frame["pp"].notna()
    if args.sources:
        ran &= frame["source"].isin(args.sources.split(","))
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in frame.index[ran]:
        groups[tuple(str(frame.at[i, k]) for k in STUDY_KEYS if k in frame)].append(i)
    keys = list(groups)[: args.limit or None]
    passed: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    failures: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for n, key in enumerate(keys):
            rows = groups[key]
            first = presumed_split(frame.loc[rows[0]].to_dict())
            try:
                case = case_from_row(first)
                study = parse_study(study_text(case), name=f"row{n}")
                specs = build_specs(study)
                result = run_study(study, RunOptions(out_dir=Path(tmp) / f"s{n}",
                                                     exhaustive=True))
            except TcfError as e:
                for i in rows:
                    total[frame.at[i, "source"]] += 1
                    failures.append(f"{frame.at[i, 'case_id']}: no study (the row cannot say "
                                    f"its run): {e}")
                continue
            space = build_space(study, specs)
            best = (result.top[0].predicted["tokens_per_s_per_gpu"] if result.top else 0.0)
            for i in rows:
                src = frame.at[i, "source"]
                total[src] += 1
                try:
                    plan = case_from_row(presumed_split(frame.loc[i].to_dict())).plan
                    mine = estimate(specs.model, specs.cluster, plan, specs.training)
                except TcfError as e:  # a rule of the table refuses the run's layout
                    failures.append(f"{frame.at[i, 'case_id']} ({src}): the layout breaks a "
                                    f"rule: {str(e).splitlines()[0][:160]}")
                    continue
                figure = mine.tokens_per_s_per_gpu if mine.memory.fits else 0.0
                if best >= 0.99 * figure:
                    passed[src] += 1
                    continue
                room = mine.memory.usable_bytes / 2**30 - specs.headroom_gib
                peak = mine.memory.peak_bytes / 2**30
                why = lacks(space, plan) or (
                    f"none; it needs {peak:.1f} GiB, over the {room:.1f} GiB the study's memory "
                    "headroom leaves" if peak > room else "none: the search missed it")
                failures.append(f"{frame.at[i, 'case_id']} ({src}): best {best:,.0f} < "
                                f"{figure:,.0f} for its layout; outside the space: {why}")
    print(f"{len(keys)} studies from {sum(total.values())} runs that ran, "
          f"{time.perf_counter() - t0:.0f} s")
    for src in sorted(total):
        print(f"  {src:28s} {passed[src]:5d} of {total[src]:5d} pass")
    print(f"failures ({len(failures)}):")
    for line in failures:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
