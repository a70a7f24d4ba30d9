"""Plans every launcher test reads: the golden example plans and the top plans of every shipped
study, found by a short search (a few trials each), so that a new knob reaches every format."""

from __future__ import annotations

from pathlib import Path

from search.pipeline import RunOptions, run_study
from search.planfile import PlanFile, load_plan_file
from search.study import load_study

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_PLANS = sorted((ROOT / "tests" / "golden" / "export" / "plans").glob("*.yaml"))
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
TRIALS = 20  # the shipped studies' top-10 lists fill within this many trials


def study_top_plans(out: Path) -> dict[str, PlanFile]:
    """``study/rank-N`` -> plan, for every shipped study's top list."""
    plans: dict[str, PlanFile] = {}
    for path in STUDIES:
        folder = out / path.stem
        run_study(load_study(path), RunOptions(out_dir=folder, trials=TRIALS, workers=1))
        for plan in sorted((folder / "top").glob("rank-*.yaml")):
            plans[f"{path.stem}/{plan.stem}"] = load_plan_file(plan)
    return plans


def golden_plans() -> dict[str, PlanFile]:
    return {f"golden/{p.stem}": load_plan_file(p) for p in GOLDEN_PLANS}
