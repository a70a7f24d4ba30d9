"""The loss as Megatron-Core fuses it, a study switch (``training.cross_entropy_fusion_impl``):
Transformer Engine's in-place cross-entropy ("te") keeps the logits alone where the unfused and
the native fused losses keep an fp32 softmax beside them; only Megatron-Core stacks take it, and
the Megatron-LM and Megatron-Bridge exports write what was priced, which Megatron-Core reads."""

from __future__ import annotations

import dataclasses

import pytest
from export_helpers import launcher_flags, nemo_model_config, nemo_overrides
from export_plans import plan_file
from megatron_lm import megatron_lm_reads

from costmodel import Plan, estimate
from search.inputs.specs import StudyError, build_specs
from search.inputs.study import parse_study
from tcf_search.export import render

STUDY = """
model: {preset: llama3.1-8b}
training: {seq_len: 8192, global_batch: 64, framework: %s%s}
cluster: {gpu: h100-sxm-80gb, nodes: 1}
"""
PLAN = Plan(tp=1, pp=2, dp=4, zero_stage=1, micro_batch=1, recompute="none")
GIB = 2**30


def specs_of(impl: str = "", framework: str = "megatron"):  # noqa: ANN201
    extra = f", cross_entropy_fusion_impl: {impl}" if impl else ""
    return build_specs(parse_study(STUDY % (framework, extra), name="loss"))


def last_stage(specs) -> tuple[float, float]:  # noqa: ANN001
    est = estimate(specs.model, specs.cluster, PLAN, specs.training)
    return est.memory.stages[-1].buffers_bytes, est.tokens_per_s_per_gpu


def test_te_keeps_two_bytes_a_logit_where_the_others_keep_six() -> None:
    unfused, native, te = (specs_of(i) for i in ("", "native", "te"))
    # Megatron-LM without --cross-entropy-loss-fusion runs tensor_parallel's eager fp32 ops
    assert [s.training.framework.kernels.loss_kernel for s in (unfused, native, te)] == [
        "eager_fp32", "native", "te_inplace"]
    logits = 8192 * te.model.vocab  # one micro-batch in flight on the last stage, tp 1
    (b0, t0), (b1, t1), (b2, t2) = (last_stage(s) for s in (unfused, native, te))
    assert b1 == b0  # native fusion: the same saved softmax
    assert t1 > t0  # ... in one fp32 pass each way, not the cast and five eager ops
    assert b0 - b2 == pytest.approx(logits * (6 - 2), rel=1e-9)
    assert t2 > t1  # three passes forward and two back over bf16 logits, not fp32 ones


@pytest.mark.parametrize("framework", ["torchtitan", "nanotron", "deepspeed"])
def test_only_megatron_core_stacks_take_it(framework: str) -> None:
    with pytest.raises(StudyError, match=r"^training\.cross_entropy_fusion_impl: .*"
                                         r"--cross-entropy-fusion-impl"):
        specs_of("te", framework)


def test_a_bad_value_is_named() -> None:
    with pytest.raises(Exception, match="cross_entropy_fusion_impl"):
        specs_of("apex")


def _plan(impl: str, framework: str = "megatron"):  # noqa: ANN202
    pf = plan_file("llama3.1-8b", PLAN, 8, 64, framework=framework)
    if framework == "nemo":  # the 8B recipe has no comm_overlap section: NeMo's TP overlap off
        pf = dataclasses.replace(pf, training=pf.training.with_switches(tp_comm_overlap=False))
    if not impl:
        return pf
    kernel = {"native": "native", "te": "te_inplace"}[impl]
    return dataclasses.replace(pf, training=pf.training.with_switches(loss_kernel=kernel))


@pytest.mark.parametrize("impl", ["", "native", "te"])
def test_the_megatron_export_writes_the_priced_loss_and_megatron_reads_it(impl: str) -> None:
    script = render("megatron", _plan(impl))["megatron.sh"]
    flags = launcher_flags(script, "pretrain_gpt.py")
    assert flags.get("--cross-entropy-loss-fusion", False) is bool(impl)
    assert flags.get("--cross-entropy-fusion-impl") == (impl or None)
    keys = ["cross_entropy_loss_fusion", "cross_entropy_fusion_impl"]
    read = megatron_lm_reads(script, 8, keys)  # parse_args, validate_args, the config
    assert [read[k] for k in keys] == [bool(impl), impl or "native"]


def test_a_one_pass_loss_is_launched_fused() -> None:
    """A profile that prices the loss in one fp32 pass each way (generic's "fused", as "native")
    tells Megatron-LM so, which would otherwise run its eager loss."""
    pf = _plan("", "generic")
    assert pf.training.framework.kernels.loss_kernel == "fused"
    flags = launcher_flags(render("megatron", pf)["megatron.sh"], "pretrain_gpt.py")
    assert (flags["--cross-entropy-loss-fusion"], flags["--cross-entropy-fusion-impl"]) == (
        True, "native")


@pytest.mark.parametrize("impl", ["", "te"])
def test_the_bridge_export_sets_the_provider_s_fields(impl: str) -> None:
    files = render("nemo", _plan(impl, "nemo"))
    o = nemo_overrides(files)
    if not impl:
        assert "model.cross_entropy_fusion_impl" not in o  # the recipe's own loss
        return
    cfg = nemo_model_config(files)
    assert (cfg.cross_entropy_loss_fusion, cfg.cross_entropy_fusion_impl) == (True, "te")
