"""What an interval rests on (issue #36): a plan that uses a term no measured row validates is
re-priced at the ends of the term's range and its interval widens by the tokens/s ratios found,
through the code the run table shows; a plan that uses none keeps its residual interval."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from costmodel import (
    ClusterSpec,
    Plan,
    estimate,
    estimate_batch,
    peak_memory_batch,
    plans_to_arrays,
)
from hardware_catalog import CatalogError, get_gpu, load_prior_ranges
from search.evaluate import Evaluator
from search.inputs.presets import get_preset
from search.inputs.specs import build_specs, training_spec
from search.inputs.study import parse_study
from search.output import _interval_label, prior_legend
from search.priors import plan_rests_on, prior_spread
from search.prune import memory_stage, plan_arrays
from search.space import build_space, enumerate_layouts
from search.uncertainty import interval

STUDY = """
model: {preset: llama3-70b}
training: {seq_len: 8192, global_batch: 128, precision: bf16, framework: megatron}
cluster: {gpu: h100-sxm-80gb, gpus: 64, gpus_per_node: 8}
search_space: {tp: [1], pp: [1], cp: [1], micro_batch: [1], recompute: [none],
               zero_stage: [3], cpu_offload: true}
search: {sampler: brute_force}
objective: {metric: tokens_per_s%s}
"""


def _evaluator(risk: str = "") -> Evaluator:
    study = parse_study(STUDY % risk)
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns, headroom_gib=0.0)
    return Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))


def _judged(ev: Evaluator, plan: Plan):  # type: ignore[no-untyped-def]
    s = ev.specs
    return ev._evaluation(-1, plan, estimate_batch(s.model, s.cluster, s.training,
                                                   plans_to_arrays([plan])), 0)


def test_an_offload_plan_is_wider_than_its_twin_without_offload() -> None:
    ev = _evaluator()
    best = ev.exhaustive(1).best[0]  # the run table's #1: FSDP 64 needs offload on 80 GB
    assert best.plan.cpu_offload_layers > 0
    twin = _judged(ev, replace(best.plan, cpu_offload_layers=0))
    m, t = best.metrics, twin.metrics
    width = m["tokens_per_s_interval"][1] / m["tokens_per_s_interval"][0]
    twin_width = t["tokens_per_s_interval"][1] / t["tokens_per_s_interval"][0]
    assert width > twin_width
    # both rest on Megatron-Core's fragmentation, a bound its launched runs set (†a), which
    # re-prices memory, not tokens/s; only the offload plan on the host link (†o)
    assert _interval_label(m).endswith(" †oa") and _interval_label(t).endswith(" †a")
    legend = prior_legend([m, t])
    assert [line[:2] for line in legend] == ["†o", "†a"]
    assert legend[0].startswith("†o offload prior: ") and "nvbandwidth" in legend[0]
    # the twin, resting on no term that moves tokens/s, keeps the residual interval exactly
    tok = t["tokens_per_s_per_gpu"]
    lo, hi, _ = interval(tok, ev.regime)
    assert t["tokens_per_s_interval"] == [lo, hi]
    assert [r["flag"] for r in t["interval_rests_on"]] == ["allocator prior"]
    assert t["interval_rests_on"][0]["tokens_per_s_ratio"] == [1.0, 1.0]
    # the offload plan's bounds: the residual ones times the plan re-priced at the host
    # link's cited range (the brief: widen by the resulting tokens/s ratio)
    s, rng = ev.specs, load_prior_ranges()["host_link_bw_fraction"]
    eff = s.cluster.gpu.efficiency
    at = [estimate(s.model, replace(s.cluster, gpu=replace(s.cluster.gpu, efficiency=replace(
        eff, host_link_bw_fraction=f))), best.plan, s.training).tokens_per_s_per_gpu
        / m["tokens_per_s_per_gpu"] for f in (rng.low, rng.high)]
    assert at[0] < 1.0  # a slower link shows on the step
    lo, hi, _ = interval(m["tokens_per_s_per_gpu"], ev.regime)
    assert m["tokens_per_s_interval"] == pytest.approx(
        [lo * min(at + [1.0]), hi * max(at + [1.0])], rel=1e-12)


def test_risk_ranks_by_the_widened_quantile() -> None:
    ev = _evaluator(", risk: 0.2")
    best = ev.exhaustive(1).best[0]
    m = best.metrics
    low = m["interval_rests_on"][0]["tokens_per_s_ratio"][0]
    plain, _, _ = interval(m["tokens_per_s_per_gpu"], ev.regime, 0.2, 0.2)
    assert low < 1.0 and m["tokens_per_s_at_risk"] == pytest.approx(plain * low, rel=1e-12)
    assert best.values[0] == pytest.approx(m["tokens_per_s_at_risk"] * (1 - m["p_oom"]))
    # the vectorised ranking prices every layout as the table's figure does
    cols = plans_to_arrays([best.plan])
    s = ev.specs
    out = estimate_batch(s.model, s.cluster, s.training, cols)
    assert ev._vector("tokens_per_s", out, cols)[0] == pytest.approx(best.values[0], rel=1e-9)


MODEL = get_preset("llama3-8b")
PLAN = Plan(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=1)


def _rests_on(gpu: str, fabric: str = "", fraction: float | None = None) -> list[str]:
    cluster = ClusterSpec(gpu=get_gpu(gpu), num_gpus=64, gpus_per_node=8, fabric=fabric,
                          network_bw_fraction=fraction)
    tr = training_spec(framework="megatron", precision="bf16", seq_len=8192, global_batch=128)
    return [t["flag"] for t in plan_rests_on(MODEL, cluster, tr, PLAN)
            if t["flag"] != "allocator prior"]


def test_a_borrowed_family_and_a_fabric_without_rows_are_flagged() -> None:
    # (every Megatron-Core plan also rests on its fragmentation bound: "allocator prior")
    assert _rests_on("h100-sxm-80gb") == []  # fitted family, no fabric: the fit's own cluster
    assert _rests_on("mi355x") == ["borrowed fit"]  # cdna4 borrows hopper's fit
    assert _rests_on("h100-sxm-80gb", "infiniband", 0.96) == ["fabric prior"]
    assert _rests_on("a100-sxm-80gb", "roce", 0.2837) == []  # fitted on 105 A100 runs


def test_a_prior_range_names_the_field_and_rule(tmp_path: Path) -> None:
    (tmp_path / "prior_ranges.yaml").write_text(
        "host_link_bw_fraction: {low: 0.9, high: 0.5, source: x}\n")
    with pytest.raises(CatalogError, match=r"host_link_bw_fraction: 0 <= low <= high"):
        load_prior_ranges(tmp_path)
    (tmp_path / "prior_ranges.yaml").write_text("nope: {low: 0.1, high: 0.5, source: x}\n")
    with pytest.raises(CatalogError, match="nope: unknown Efficiency field"):
        load_prior_ranges(tmp_path)


def test_every_prior_range_holds_its_prior_and_cites_a_source() -> None:
    from costmodel.specs import Efficiency
    for name, r in load_prior_ranges().items():
        assert r.low <= getattr(Efficiency(), name) <= r.high and "github.com" in r.source


def test_the_allocator_prior_re_prices_memory_alone_as_a_full_evaluation_would() -> None:
    """The fragmentation's re-pricing moves only the peak where the allocator does not stall:
    priced by the memory side alone (costmodel.peak_memory_batch), it gives what re-evaluating
    every plan gives, and every plan's peak as estimate_batch has it."""
    study = parse_study(STUDY.split("search_space:")[0] + "search_space: {cpu_offload: true}\n")
    s = build_specs(study)
    space = build_space(study, s)
    layouts = enumerate_layouts(space).columns
    feasible = np.flatnonzero(memory_stage(s, space, layouts, headroom_gib=0.0).feasible)
    assert feasible.size > 40
    pick = feasible[:: feasible.size // 40][:40]  # spread over the space
    cols = plan_arrays({k: np.asarray(v)[pick] for k, v in layouts.items()})
    assert np.array_equal(peak_memory_batch(s.model, s.cluster, s.training, cols),
                          estimate_batch(s.model, s.cluster, s.training, cols)["peak_mem_bytes"])
    fast = prior_spread(s.model, s.cluster, s.training, cols)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("search.priors.MEMORY_ONLY", ())
        full = prior_spread(s.model, s.cluster, s.training, cols)
    assert [t.flag for t in fast.terms] == [t.flag for t in full.terms]
    assert "allocator prior" in [t.flag for t in fast.terms]
    for part in ("uses", "low", "high", "peak"):
        assert np.array_equal(getattr(fast, part), getattr(full, part)), part
    assert (fast.peak.max(axis=0) > 1.0).all()


def test_a_fused_dispatch_overlapped_rests_on_the_overlap_s_credit() -> None:
    """The combined 1F1B's credit to the fused (flex) dispatch is a prior (†v): a flex plan
    that overlaps is re-priced at no credit, which is the exchange all exposed; the same plan
    not overlapped, or overlapping NCCL's all-to-all (which the Qwen3-235B H100 rows check),
    does not rest on it."""
    model = get_preset("qwen3-30b-a3b")
    cluster = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=16, gpus_per_node=8)
    tr = training_spec(framework="megatron", precision="bf16", seq_len=4096, global_batch=512)
    plan = Plan(dp=16, ep=16, micro_batch=1, zero_stage=1, moe_dispatcher="flex",
                moe_a2a_overlap="on")

    def flags(p: Plan) -> list[str]:
        return [t["flag"] for t in plan_rests_on(model, cluster, tr, p)]

    assert "overlap prior" in flags(plan)
    assert "overlap prior" not in flags(replace(plan, moe_a2a_overlap="off"))
    assert "overlap prior" not in flags(replace(plan, moe_dispatcher="alltoall"))
    term = next(t for t in plan_rests_on(model, cluster, tr, plan) if t["flag"] == "overlap prior")
    eff = cluster.gpu.efficiency

    def at(credit: float) -> float:
        c = replace(cluster, gpu=replace(cluster.gpu, efficiency=replace(
            eff, flex_overlap_credit=credit)))
        return estimate(model, c, plan, tr).tokens_per_s_per_gpu

    low, high = term["tokens_per_s_ratio"]
    assert low == pytest.approx(at(0.0) / at(1.0)) and low < 0.9 and high == 1.0
    # at no credit the exchange shows whole, as it does not overlapped (the same step but for
    # what the overlap's warm-up and the hidden traffic's SMs change)
    alone = estimate(model, cluster, replace(plan, moe_a2a_overlap="off"), tr)
    assert at(0.0) == pytest.approx(alone.tokens_per_s_per_gpu, rel=0.05)
