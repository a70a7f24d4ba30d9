"""PyTorch's caching allocator with expandable segments (``training.expandable_segments``,
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): no fragmentation reserved beyond the
allocated bytes (``costmodel.memory.allocator_fraction``), a prior the interval re-prices at the
fitted fragmentation, the switch the launchers that run it carry (torchtitan's run_train.sh,
Megatron-Bridge's DeepSeek-V3 performance script), and the exports writing what was priced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from costmodel import Plan, estimate
from costmodel.memory import allocator_fraction
from hardware_catalog.frameworks import memory_model
from search.baseline import parse_baseline
from search.inputs.planfile import PlanFile
from search.inputs.specs import build_specs
from search.inputs.study import load_study, parse_study
from search.priors import plan_rests_on
from tcf_search.export import render

ROOT = Path(__file__).resolve().parents[1]
STUDY = """
model: {{preset: llama3-8b}}
training: {{seq_len: 4096, global_batch: 64, framework: {framework}{extra}}}
cluster: {{gpu: h100-sxm-80gb, gpus: 16}}
"""
PLAN = Plan(tp=2, pp=2, dp=4, micro_batch=1, zero_stage=1, sequence_parallel=True)


def specs_of(framework: str = "megatron", extra: str = ""):  # noqa: ANN201
    return build_specs(parse_study(STUDY.format(framework=framework, extra=extra), name="alloc"))


def test_expandable_segments_reserve_no_fragmentation_beyond_the_allocated_bytes() -> None:
    plain, grown = specs_of(), specs_of(extra=", expandable_segments: true")
    assert allocator_fraction(plain.training) > 0 and allocator_fraction(grown.training) == 0
    a, b = (estimate(s.model, s.cluster, PLAN, s.training).memory.stages[0] for s in (plain, grown))
    volatile = a.activations_bytes + a.buffers_bytes
    # the default allocator's fitted fragmentation of the volatile bytes, and nothing else
    assert a.overhead_bytes - b.overhead_bytes == pytest.approx(
        allocator_fraction(plain.training) * volatile, rel=0.02)
    assert a.activations_bytes == b.activations_bytes


def test_the_prior_is_re_priced_at_the_fitted_fragmentation() -> None:
    grown = specs_of(extra=", expandable_segments: true")
    terms = {t["flag"]: t for t in plan_rests_on(grown.model, grown.cluster, grown.training,
                                                  PLAN)}
    assert terms["allocator prior"]["mark"] == "a"
    assert terms["allocator prior"]["peak_mem_ratio"] > 1.05  # what the default would reserve
    # a stack on the default allocator, at its fitted fragmentation: nothing to re-price
    plain = specs_of("deepspeed")
    assert allocator_fraction(plain.training) == memory_model().allocator_fraction
    assert "allocator prior" not in {t["flag"] for t in plan_rests_on(
        plain.model, plain.cluster, plain.training, PLAN)}


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "deepspeed"])
def test_any_stack_takes_the_switch_and_its_export_sets_the_allocator(framework: str) -> None:
    """The allocator is PyTorch's, under every stack: the launch script exports the variable
    where the plan was priced with it, and only there."""
    # ZeRO-3 (FSDP) over 16 ranks: a plan every one of these stacks launches
    plan = dataclasses.replace(PLAN, tp=1, pp=1, dp=16, zero_stage=3, sequence_parallel=False)
    for on in (True, False):
        s = specs_of(framework, f", expandable_segments: {str(on).lower()}")
        assert s.training.framework.kernels.expandable_segments is on
        pf = PlanFile(study="alloc", model=s.model, gpu=s.cluster.gpu.id, num_gpus=16,
                      gpus_per_node=8, training=s.training, plan=plan)
        files = render(framework, pf)
        script = next(text for name, text in files.items() if name.endswith(".sh"))
        assert ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in script) is on, framework


def test_the_profiles_say_who_runs_it() -> None:
    # torchtitan's launcher exports it (run_llama_train.sh at 9dec370; run_train.sh since);
    # Megatron-LM and nanotron leave PyTorch's default
    assert specs_of("torchtitan").training.framework.kernels.expandable_segments
    for framework in ("megatron", "nanotron", "nemo"):
        assert not specs_of(framework).training.framework.kernels.expandable_segments


def test_deepseek_v3_b200_recipe_fits_as_it_ran() -> None:
    """Issue #36: Megatron-Bridge's 26.04.01 DGX-B200 DeepSeek-V3 recipe ran on 180 GB B200s
    with the allocator's segments expandable (scripts/performance/perf_plugins.py, v0.4.2); the
    default allocator's fitted fragmentation puts it over (the most Megatron-Core's launched
    runs leave room for, its profile's, would not: a bound, and the release mapped them)."""
    study = load_study(ROOT / "studies" / "deepseek-v3-b200x256.yaml")
    specs = build_specs(study)
    assert specs.training.framework.kernels.expandable_segments
    plan = parse_baseline(study.baseline, specs)
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    assert e.memory.fits
    fitted = dataclasses.replace(specs.training.framework.memory_model,
                                 allocator_fraction=memory_model().allocator_fraction)
    default = specs.training.with_switches(expandable_segments=False, memory_model=fitted)
    assert not estimate(specs.model, specs.cluster, plan, default).memory.fits


@pytest.mark.parametrize("framework", ["llm-foundry", "megatron", "nemo", "megatron-sc21"])
def test_a_bound_its_launched_runs_set_is_a_prior_re_priced_at_the_fitted_fragmentation(
        framework: str) -> None:
    # no row of these stacks reports memory: their fragmentation is the most their launched
    # runs leave room for (calibration.memory_fit.launched_bounds), below the default's, flagged
    s = specs_of(framework)
    assert 0 < allocator_fraction(s.training) < memory_model().allocator_fraction
    assert not s.training.framework.kernels.expandable_segments
    fsdp = dataclasses.replace(PLAN, tp=1, pp=1, dp=16, zero_stage=3, sequence_parallel=False)
    terms = {t["flag"]: t for t in plan_rests_on(s.model, s.cluster, s.training, fsdp)}
    assert "bounded by the runs it launched" in terms["allocator prior"]["term"]
    assert terms["allocator prior"]["peak_mem_ratio"] > 1.05
