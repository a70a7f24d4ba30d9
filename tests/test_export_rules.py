"""Each launcher's rules: the checks named in the issue refuse the plans that break them, with a
reason quoting the values; accepted plans stay accepted; every reason template formats."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from costmodel_helpers import training_for

from costmodel.specs import Plan
from search.inputs.planfile import PlanFile, load_plan_file
from tcf_search.export import ExportError, ExportOptions, ExportRefused, render
from tcf_search.export.rules import RULES
from tcf_search.export.view import LaunchView, facts_of, virtual_stage_layers

PLANS = Path(__file__).parent / "golden" / "export" / "plans"


def example(name: str) -> PlanFile:
    return load_plan_file(PLANS / f"{name}.yaml")


def with_plan(pf: PlanFile, **changes: Any) -> PlanFile:
    return dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, **changes))


def with_training(pf: PlanFile, **changes: Any) -> PlanFile:
    return dataclasses.replace(pf, training=dataclasses.replace(pf.training, **changes))


def with_model(pf: PlanFile, **changes: Any) -> PlanFile:
    return dataclasses.replace(pf, model=dataclasses.replace(pf.model, **changes))


def refusal(fmt: str, pf: PlanFile, options: ExportOptions | None = None) -> str:
    with pytest.raises(ExportRefused) as info:
        render(fmt, pf, options)
    assert info.value.format == fmt and info.value.reasons
    return str(info.value)


@pytest.mark.parametrize("fmt", sorted(RULES))
def test_every_reason_template_formats(fmt: str) -> None:
    f = facts_of(example("dense70b"), ExportOptions(), "megatron")
    for rule in RULES[fmt]:
        text = rule.describe(f)
        assert "{" not in text and text, rule
        assert rule.source


def test_deepspeed_pipeline_engine_rejects_zero2_and_zero3() -> None:
    pf = example("pp8b")  # tp4 pp2 dp2, accepted by DeepSpeed at ZeRO-1
    render("deepspeed", pf)
    for stage in (2, 3):
        assert "zero_stages_pp=[0, 1]" in refusal("deepspeed", with_plan(pf, zero_stage=stage))


def test_megatron_context_parallel_needs_seq_divisible_by_2cp() -> None:
    pf = with_plan(example("fsdp8b"), dp=32, cp=2, zero_stage=1, micro_batch=1)
    render("megatron", pf)
    text = refusal("megatron", with_training(pf, seq_len=4098))
    assert "cp_seq: seq_len % (2 * cp) == 0" in text and "cp=2, seq_len=4098" in text


def test_megatron_experts_must_divide_by_ep() -> None:
    pf = example("moe_ep")
    assert "ep_experts: " in refusal("megatron", with_model(pf, moe_experts=12))


def test_megatron_expert_parallel_folds_over_tp_or_is_refused() -> None:
    pf = with_plan(example("moe_ep"), dp=4, tp=16)  # 64 GPUs, dp*cp=4 < ep=8: EP folds over TP
    pf = with_model(pf, heads=32, kv_heads=16)
    script = render("megatron", pf)["megatron.sh"]
    assert "--expert-model-parallel-size 8" in script
    assert "--expert-tensor-parallel-size 1" in script
    carved = render("megatron", example("moe_ep"))["megatron.sh"]  # dp=32: expert TP = TP
    assert "--expert-tensor-parallel-size" not in carved
    odd = with_model(with_plan(example("moe_ep"), ep=16), moe_experts=16)
    odd = with_plan(odd, tp=1, dp=8, pp=8, sequence_parallel=False)  # tp*dp*cp = 8 < ep
    assert "ep_experts: " in refusal("megatron", odd)


def test_megatron_query_groups_and_tp_must_divide_one_way() -> None:
    pf = with_model(example("pp8b"), heads=24, kv_heads=3)  # tp=4: 3 % 4 and 4 % 3 both fail
    text = refusal("megatron", pf)
    assert "tp_heads: " in text and "kv_heads=3" in text
    render("megatron", with_model(example("pp8b"), heads=32, kv_heads=2))  # tp % kv == 0: fine


def test_megatron_torch_fsdp2_needs_pp1_and_ep1() -> None:
    torch_fsdp = ExportOptions(fsdp_impl="torch")
    render("megatron", example("fsdp8b"), torch_fsdp)
    pp = with_plan(example("pp8b"), zero_stage=3)
    assert "not supported with pipeline parallelism" in refusal("megatron", pp, torch_fsdp)
    ep = with_plan(example("moe_ep"), zero_stage=3)
    assert "not supported with expert parallelism" in refusal("megatron", ep, torch_fsdp)
    # Megatron-FSDP (the default) has no pipeline axis in megatron-core 0.16 either: the
    # profile's zero_stages_pp (test_launcher_support)
    assert "framework_zero: " in refusal("megatron", pp)


def test_megatron_has_no_gpipe_and_moe_tp_needs_sequence_parallel() -> None:
    # the table's rule, read from Megatron's profile (pp_schedules: 1F1B and interleaved)
    gpipe = with_plan(example("pp8b"), pp_schedule="gpipe")
    assert "framework_schedule: " in refusal("megatron", gpipe)
    assert "pp_schedules=['1f1b', 'interleaved']" in refusal("megatron", gpipe)
    no_sp = with_plan(example("moe_ep"), sequence_parallel=False)
    assert no_sp.plan.tp > 1 and no_sp.model.moe_experts > 0
    # the table's rule, read from the launchers' profiles: Megatron-Core's MoELayer refuses it
    for fmt in ("megatron", "nemo"):
        assert "moe_tp_sp: " in refusal(fmt, no_sp), fmt
    # torchtitan (its router reshards) and DeepSpeed (drop_tokens) run MoE under TP without it
    for fmt in ("torchtitan", "deepspeed"):
        try:
            render(fmt, no_sp)
        except ExportRefused as exc:
            assert "moe_tp_sp: " not in str(exc), fmt


def test_megatron_uneven_stages_must_split_and_chunks_need_a_layout() -> None:
    pf = example("dense70b")  # 18 | 22 | 22 | 18 with vpp 2
    odd = with_plan(pf, first_stage_layers=17, last_stage_layers=19)
    assert "--pipeline-model-parallel-layout" in render("megatron", odd)["megatron.sh"]
    assert "vpp_layers: " in refusal("deepspeed", odd)  # no explicit layout (its profile)
    # the middle ranks a layer apart (19 | 22 | 21 | 18): only the layout says so
    apart = render("megatron", with_plan(pf, first_stage_layers=19, vpp=1,
                                         pp_schedule="1f1b"))["megatron.sh"]
    assert "--pipeline-model-parallel-layout 'Et*19|t*22|t*21|t*18L'" in apart
    assert "--decoder-first-pipeline-num-layers" not in apart
    # a rank with no layer is no split at all
    assert "pp_layers: " in refusal("megatron", with_plan(pf, first_stage_layers=60,
                                                          last_stage_layers=19))


def test_interleaved_schedule_needs_microbatches_divisible_by_pp() -> None:
    pf = with_training(example("dense70b"), global_batch=4 * 66)  # m = 66, pp = 4
    assert "microbatch_groups: " in refusal("megatron", pf)  # the table's rule (costmodel)


def test_nanotron_zero_0_1_only_and_lightning_style_targets_have_no_pp() -> None:
    pf = example("pp8b")
    render("nanotron", pf)
    assert "zero_stages=[0, 1]" in refusal("nanotron", with_plan(pf, zero_stage=2))
    assert "no pipeline parallelism" in refusal("accelerate", pf)


def test_nanotron_0_4_has_no_recompute_but_main_has_whole_layer_recompute() -> None:
    pf = with_plan(example("pp8b"), recompute="full")
    render("nanotron", pf)
    old = ExportOptions(target_version="0.4")
    assert "0.4 has no recompute_layer" in refusal("nanotron", pf, old)


def test_torchtitan_refuses_a_moe_model_on_its_dense_llama() -> None:
    # Mixtral exported to torchtitan's Llama 3 would train a dense model under EP flags.
    pf = example("moe_ep")
    assert "folds EP" in refusal("torchtitan", pf)
    for version in ("0.3", "0.2"):
        reason = refusal("torchtitan", pf, ExportOptions(target_version=version))
        assert "Llama 3 model is dense, but the model has 8 experts" in reason


def test_common_world_size_and_batch_rules() -> None:
    pf = example("pp8b")
    bad_world = dataclasses.replace(pf, num_gpus=32)
    bad_batch = with_training(pf, global_batch=65)
    for fmt in RULES:
        assert "world_size: tp * pp * cp * dp == num_gpus" in refusal(fmt, bad_world)
        assert "batch: global_batch % (micro_batch * dp) == 0" in refusal(fmt, bad_batch)


def test_refusal_lists_every_broken_rule() -> None:
    pf = with_plan(example("pp8b"), zero_stage=2, sequence_parallel=True)
    text = refusal("deepspeed", pf)
    assert "framework_zero" in text and "sequence parallelism" in text


def test_one_end_pinned_takes_the_cost_models_other_end() -> None:
    # costmodel/mapping.py (rank_split, as Megatron-LM): the unpinned stages, the last among
    # them, share the layers the pinned first stage leaves.
    pf = with_plan(example("pp8b"), pp=4, dp=1, first_stage_layers=5)
    f: LaunchView = facts_of(pf, ExportOptions(), "megatron")
    # 32 layers: first 5, the other 27 over 3 stages, 9 each
    assert f.stage_layers == (5, 9, 9, 9) and f.first == 5 and f.last == 9
    pf = with_plan(pf, first_stage_layers=6)
    # 26 layers over 3 stages: Megatron-Core's layout takes 9, 9, 8 (the earliest one more);
    # DeepSpeed's pipeline has no per-rank layout, so the split is not whole there
    f = facts_of(pf, ExportOptions(), "megatron")
    assert f.stage_layers == (6, 9, 9, 8) and f.first == 6 and f.last == 8
    assert facts_of(pf, ExportOptions(), "deepspeed").stage_layers == ()


def test_virtual_stages_cover_every_layer_once() -> None:
    f = facts_of(example("dense70b"), ExportOptions(), "megatron")
    chunks = virtual_stage_layers(f)
    assert chunks == [9, 11, 11, 9, 9, 11, 11, 9] and sum(chunks) == 80


def test_plan_validity_is_still_the_specs_job() -> None:
    with pytest.raises(ValueError):
        Plan(tp=1, sequence_parallel=True)
    with pytest.raises(ValueError):
        training_for(seq_len=0, global_batch=1)


def test_target_version_names_one_release_or_one_per_format() -> None:
    pf = example("pp8b")
    both = ExportOptions(target_version="torchtitan=0.2, megatron=0.16")
    assert "torchtitan 0.2 always applies sequence parallelism" in refusal("torchtitan", pf, both)
    assert "# megatron 0.16 launch" in render("megatron", pf, both)["megatron.sh"]
    assert "# nemo 0.3 launch" in render("nemo", pf, both)["nemo.sh"]  # not named: default
    for bad in ("0.15", "megatron=0.15", "titan=0.2"):
        with pytest.raises(ExportError):
            render("megatron", pf, ExportOptions(target_version=bad))
