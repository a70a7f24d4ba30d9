"""What a launcher runs at all (issue #38): Megatron-FSDP beside a pipeline, FP8 on a GPU without
FP8 tensor cores, ZeRO-1 where only FSDP2 is written. Each is refused once, by the rule the
search, predict and the exports read alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from costmodel import Plan, SpecError, check_plan
from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.specs import build_specs, training_spec
from search.inputs.study import parse_study
from search.space import build_space, violations
from tcf_search.export import ExportRefused, render

PLANS = Path(__file__).parent / "golden" / "export" / "plans"
STUDY = """
model:
  architecture: {layers: 12, hidden: 256, ffn_hidden: 512, heads: 16, kv_heads: 4, vocab: 1000}
training: {framework: FRAMEWORK, seq_len: 128, global_batch: 48}
cluster: {gpu: h100-sxm-80gb, gpus: 48, gpus_per_node: 4}
search_space:
  tp: [1, 2]
  pp: [1, 2]
  micro_batch: [1, 2]
  zero_stage: [0, 1, 2, 3]
"""


def verdict(framework: str, plan: Plan) -> list[str]:
    """The rules check_plan and the search space find broken, by name (both must agree)."""
    study = parse_study(STUDY.replace("FRAMEWORK", framework), name="support")
    specs = build_specs(study)
    try:
        check_plan(specs.model, specs.cluster, plan, specs.training, specs.switches)
        checked = "ok"
    except SpecError as exc:
        checked = str(exc)
    broken = [v.split(":")[0] for v in violations(build_space(study, specs), plan)]
    assert (checked == "ok") == (not broken), (checked, broken)
    return broken


def with_plan(pf: PlanFile, **changes: Any) -> PlanFile:
    return dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, **changes))


def refusal(fmt: str, pf: PlanFile) -> str:
    with pytest.raises(ExportRefused) as info:
        render(fmt, pf)
    return str(info.value)


# -- 1. Megatron-FSDP has no pipeline axis in megatron-core 0.16 ---------------------------------

@pytest.mark.parametrize("framework", ["generic", "megatron", "nemo", "megatron-sc21"])
@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_fsdp_is_refused_beside_a_pipeline(framework: str, zero: int) -> None:
    if framework == "nemo" and zero == 2:  # NeMo's ZeRO-2 is its distributed Adam, not FSDP
        assert verdict(framework, Plan(tp=1, pp=2, dp=24, zero_stage=zero)) == []
        return
    assert verdict(framework, Plan(tp=1, pp=2, dp=24, zero_stage=zero)) == ["framework_zero"]
    # without a pipeline Megatron-FSDP runs; with one, the distributed optimizer (ZeRO-1) does
    assert verdict(framework, Plan(tp=1, pp=1, dp=48, zero_stage=zero)) == []
    assert verdict(framework, Plan(tp=1, pp=2, dp=24, zero_stage=1)) == []


def test_fsdp2_under_torch_pipelining_keeps_its_stages() -> None:
    for zero in (1, 2, 3):  # torchtitan's FSDP2 under torch.distributed.pipelining
        assert verdict("torchtitan", Plan(tp=1, pp=2, dp=24, zero_stage=zero)) == []


@pytest.mark.parametrize("fmt", ["megatron", "nemo"])
@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_exports_refuse_megatron_fsdp_with_pp(fmt: str, zero: int) -> None:
    pf = load_plan_file(PLANS / "pp8b.yaml")  # tp4 pp2 dp2 at ZeRO-1: exported
    assert "--use-distributed-optimizer" in "".join(render("megatron", pf).values())
    text = refusal(fmt, with_plan(pf, zero_stage=zero))
    assert "--use-megatron-fsdp" not in text and "pp=2" in text
    if fmt == "megatron":
        assert "framework_zero" in text and "zero_stages_pp=[0, 1]" in text
    else:  # NeMo's own refusal: the export writes Megatron-FSDP, whatever the profile allows
        assert "written as Megatron-FSDP, which runs without a pipeline only" in text
        nemo = dataclasses.replace(pf, training=training_spec(
            framework="nemo", precision=pf.training.precision, seq_len=pf.training.seq_len,
            global_batch=pf.training.global_batch))
        assert "written as Megatron-FSDP" in refusal(fmt, with_plan(nemo, zero_stage=zero))


# -- 3. FSDP2 has no optimizer-only sharding: ZeRO-1 without a pipeline is refused alike ---------

@pytest.mark.parametrize("fmt", ["accelerate", "torchtitan"])
def test_fsdp2_launchers_refuse_zero1_by_one_rule(fmt: str) -> None:
    pf = load_plan_file(PLANS / "fsdp8b.yaml")  # dp 8 at ZeRO-3: both export it
    render(fmt, pf)
    text = refusal(fmt, with_plan(pf, zero_stage=1))
    assert "framework_zero: " in text and "zero_stages=[0, 2, 3]" in text
    # ZeRO-2 is FSDP2 kept gathered to backward, which is what Accelerate writes for it
    config = render("accelerate", with_plan(pf, zero_stage=2))["accelerate.yaml"]
    assert "fsdp_reshard_after_forward: false" in config


def test_accelerate_profile_is_the_search_s_too() -> None:
    assert verdict("accelerate", Plan(tp=1, pp=1, dp=48, zero_stage=1)) == ["framework_zero"]
    assert verdict("accelerate", Plan(tp=1, pp=1, dp=48, zero_stage=2)) == []


# --- precisions a GPU offers (issue #38) -------------------------------------------------------

def test_a100_offers_no_fp8_and_hopper_does() -> None:
    from hardware_catalog import get_gpu

    assert get_gpu("a100-sxm-80gb").precisions == ("bf16", "fp16")
    assert get_gpu("a100-sxm-40gb").precisions == ("bf16", "fp16")
    for sku in ("h100-sxm-80gb", "h200-sxm-141gb", "b200-180gb", "gb200-nvl72", "l40s", "mi300x"):
        assert "fp8" in get_gpu(sku).precisions, sku


def test_fp8_on_a100_is_one_error_line(tmp_path) -> None:
    from clirunner import cli, one_line_error

    study = tmp_path / "a100fp8.yaml"
    study.write_text("model: {preset: llama3-8b}\n"
                     "training: {seq_len: 4096, global_batch: 64, precision: fp8}\n"
                     "cluster: {gpu: a100-sxm-80gb, nodes: 2}\n")
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "out"))
    one_line_error(code, err, "training.precision", "a100-sxm-80gb", "fp8", "bf16, fp16")


def test_predict_refuses_fp8_on_a100_in_pred_error(tmp_path) -> None:
    import pandas as pd

    from tcf_search.calibration.predict import predict_csv

    src = tmp_path / "rows.csv"
    src.write_text(
        "case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
        "tied_embeddings,gpu,gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,"
        "global_batch,recompute,sequence_parallel,precision,framework\n"
        "a,l,32,4096,14336,32,8,128256,4096,swiglu,false,a100-sxm-80gb,8,16,1,1,1,1,1,16,1,1,64,"
        "none,false,fp8,megatron\n")
    row = predict_csv(src, tmp_path / "out.csv").iloc[0]
    assert "precision: a100-sxm-80gb has no fp8 tensor cores" in row["pred_error"]
    assert pd.isna(row["pred_tokens_per_sec_per_gpu"])
