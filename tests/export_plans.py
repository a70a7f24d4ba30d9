"""Plans every launcher test reads: the golden example plans and the top plans of every shipped
study, found by a short search (a few trials each), so that a new knob reaches every format; and
the named plans the tests read back field by field (a 70B, DeepSeek-V3, Llama 3.1 70B)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from costmodel import Plan
from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.presets import get_preset
from search.inputs.specs import training_spec
from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "golden" / "export" / "plans"
GOLDEN_PLANS = sorted(PLANS.glob("*.yaml"))
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
TRIALS = 20  # the shipped studies' top-10 lists fill within this many trials
GPU = "h100-sxm-80gb"


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


def seventy_b(*, plain: bool = False) -> PlanFile:
    """The 70B golden plan with selective recompute; ``plain``: even 1F1B stages, no recompute,
    for launchers without interleaving or pinned stage sizes."""
    pf = load_plan_file(PLANS / "dense70b.yaml")
    plan = dataclasses.replace(pf.plan, recompute="selective")
    if plain:
        plan = dataclasses.replace(plan, vpp=1, pp_schedule="1f1b", first_stage_layers=0,
                                   last_stage_layers=0, recompute="none")
    return dataclasses.replace(pf, plan=plan)


def plan_file(model: str, plan: Plan, gpus: int, batch: int, seq: int = 4096,
              framework: str = "megatron") -> PlanFile:
    training = training_spec(framework=framework, precision="bf16", seq_len=seq,
                             global_batch=batch)
    return PlanFile(study=f"{model}-check", model=get_preset(model), gpu=GPU, num_gpus=gpus,
                    gpus_per_node=8, training=training, plan=plan)


def deepseek() -> PlanFile:
    """DeepSeek-V3 on 2,048 GPUs: TP 8 with sequence parallelism, EP 64 over the data ranks."""
    plan = Plan(tp=8, pp=1, dp=256, ep=64, zero_stage=1, sequence_parallel=True,
                recompute="full")
    return plan_file("deepseek-v3", plan, 2048, 15360)


def llama31(pp: int = 4) -> PlanFile:
    plan = Plan(tp=8, pp=pp, dp=64 // pp, zero_stage=1, sequence_parallel=True,
                recompute="selective")
    return plan_file("llama3.1-70b", plan, 512, 512, seq=8192)
