"""How many of the shipped studies' top plans each export format accepts, and why it refuses the
rest: ``python benchmarks/bench_export_acceptance.py [--trials N]``. The launchers' own parsers
check the accepted files in tests/test_export_roundtrip_*.py; this prints the counts."""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study
from tcf_search.export import ExportOptions, ExportRefused, render
from tcf_search.export.options import TARGETS

STUDIES = sorted((Path(__file__).resolve().parent.parent / "studies").glob("*.yaml"))
VARIANTS = [(fmt, None) for fmt in TARGETS] + [("torchtitan", "0.2"), ("nanotron", "0.4"),
                                               ("slurm", None)]


def top_plans(trials: int) -> list[PlanFile]:
    out: list[PlanFile] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in STUDIES:
            folder = Path(tmp) / path.stem
            run_study(load_study(path), RunOptions(out_dir=folder, trials=trials, workers=1))
            out += [load_plan_file(p) for p in sorted((folder / "top").glob("rank-*.yaml"))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    plans = top_plans(args.trials)
    print(f"{len(plans)} top plans of {len(STUDIES)} shipped studies\n")
    print(f"{'format':<16} {'accepted':>8} {'refused':>8}  most frequent refusal")
    for fmt, version in VARIANTS:
        reasons: collections.Counter[str] = collections.Counter()
        accepted = 0
        for pf in plans:
            try:
                render(fmt, pf, ExportOptions(target_version=version))
                accepted += 1
            except ExportRefused as e:
                reasons[e.reasons[0][:70]] += 1
        label = f"{fmt}@{version}" if version else f"{fmt}@{TARGETS.get(fmt, ('-',))[0]}"
        top = reasons.most_common(1)[0][0] if reasons else ""
        print(f"{label:<16} {accepted:>8} {len(plans) - accepted:>8}  {top}")


if __name__ == "__main__":
    main()
