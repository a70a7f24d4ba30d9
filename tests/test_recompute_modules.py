"""Megatron-Core's selective recompute by module (--recompute-modules; costmodel/
recompute_modules.py): what each module frees of a layer's saved activations and what it runs
again, the Megatron profiles' default (core_attn, which with fused attention frees only the
log-sum-exp), a study's switch, and the exports that carry it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from costmodel_helpers import training_for
from export_helpers import flag_values, nemo_model_config
from typer.testing import CliRunner

from costmodel import ClusterSpec, Plan, SpecError, Training, estimate
from costmodel.activation_memory import activation_bytes_per_layer
from costmodel.attention import kv_dims, qk_dim
from costmodel.compute import layer_times
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec, ModelSpec
from search.inputs.planfile import PlanFile
from search.inputs.presets import get_preset
from search.inputs.specs import build_specs, training_spec
from search.inputs.study import StudyError, parse_study
from tcf_search.explain import explain_cmd
from tcf_search.export import render

SEQ, MB = 4096, 1


def _stored(model: ModelSpec, tr: Training, plan: Plan) -> tuple[float, float]:
    """(stored under the plan's recompute mode, all of a layer), bf16 bytes, one micro-batch."""
    p = as_plan_arrays(plans_to_arrays([plan]))
    stored, _, full = activation_bytes_per_layer(model, tr, p)
    return float(stored[0]), float(full[0])


def _megatron(precision: str = "bf16", global_batch: int = 64, **switches: object) -> Training:
    return training_spec(framework="megatron", precision=precision, seq_len=SEQ,
                         global_batch=global_batch, switches=switches)


def test_megatron_selective_is_core_attn_by_default() -> None:
    """Megatron-Core recomputes ["core_attn"] unless told (TransformerConfig.recompute_modules);
    the profiles say so, and torchtitan keeps its own per-op policy."""
    tr = _megatron()
    own = tr.framework.activations
    assert (own.selective_recompute, own.recompute_modules) == ("modules", ("core_attn",))
    titan = training_spec(framework="torchtitan", precision="bf16", seq_len=SEQ, global_batch=64)
    assert titan.framework.activations.selective_recompute == "every_other_mm"


def test_core_attn_frees_only_the_log_sum_exp_under_fused_attention(llama8b: ModelSpec) -> None:
    """The out projection keeps the attention output as its input, so checkpointing the kernel
    frees its fp32 log-sum-exp (4 bytes a head and token) and nothing else; without flash
    attention it frees the scores too (Korthikanti et al.'s selective recompute)."""
    plan = Plan(tp=4, dp=2, sequence_parallel=True, recompute="selective")
    tr = _megatron()
    stored, full = _stored(llama8b, tr, plan)
    assert full - stored == pytest.approx(4.0 * SEQ * llama8b.heads / 4)
    eager = tr.with_switches(flash_attention=False)
    stored_e, full_e = _stored(llama8b, eager, plan)
    assert full_e - stored_e > 100 * (full - stored)
    # under fp8 the kernel's own bf16 copy of its output goes too (the projection keeps its
    # fp8 cast)
    stored_8, full_8 = _stored(llama8b, _megatron(precision="fp8"), plan)
    assert full_8 - stored_8 == pytest.approx(
        (4.0 + 2.0 * llama8b.d_head) * SEQ * llama8b.heads / 4)


def test_core_attn_runs_the_attention_forward_again(llama8b: ModelSpec,
                                                     cluster64: ClusterSpec) -> None:
    tr = _megatron()
    p = as_plan_arrays(plans_to_arrays([Plan(tp=4, dp=16, sequence_parallel=True,
                                             recompute="selective")]))
    times = layer_times(llama8b, cluster64, tr, p)
    kernel = cluster64.gpu.efficiency.kernel_overhead_s
    assert times.selective_extra_s[0] == pytest.approx(times.attention_fwd_s[0] + kernel)
    # HFU counts it: 2 s a (d_qk + d_v) FLOPs a token and layer, over all s keys as MFU does
    none, sel = (estimate(llama8b, cluster64, Plan(tp=4, dp=16, sequence_parallel=True,
                                                   recompute=r), tr) for r in ("none", "selective"))
    extra = (sel.compute.hardware_flops - none.compute.hardware_flops) * cluster64.num_gpus
    per_token = 2.0 * llama8b.heads * 2 * llama8b.d_head * SEQ * llama8b.layers
    assert extra == pytest.approx(per_token * tr.tokens_per_step)


def test_each_module_frees_what_it_discards() -> None:
    """mla_up_proj frees the up-projected q, k, v attention reads (the latents stay); moe_act
    and layernorm free bf16 outputs the next GEMM saves, which under fp8 keeps its own cast, so
    they free nothing there; mlp frees a dense model's whole MLP."""
    ds = get_preset("deepseek-v3")
    plan = Plan(tp=2, pp=8, dp=8, ep=8, sequence_parallel=True, recompute="selective")
    tp = 2.0

    def freed(modules: tuple[str, ...], precision: str = "bf16") -> float:
        stored, full = _stored(ds, _megatron(recompute_modules=modules, precision=precision),
                               plan)
        return full - stored

    lse = 4.0 * SEQ * ds.heads / tp
    up = 2.0 * SEQ * (ds.heads * qk_dim(ds) + ds.kv_heads * kv_dims(ds)) / tp
    assert freed(("core_attn", "mla_up_proj")) == pytest.approx(lse + up)
    routed = ds.moe_topk * ds.expert_ffn_hidden
    assert freed(("moe_act",)) - freed(("core_attn",)) == pytest.approx(
        2.0 * SEQ * routed / tp - lse)
    assert freed(("moe_act",), "fp8") == 0.0
    # MLA's input norm and the MoE layer's pre-MLP norm: two norms built apart from a GEMM
    assert freed(("layernorm",)) == pytest.approx(2 * 2.0 * SEQ * ds.hidden / tp)
    assert freed(("layernorm",), "fp8") == 0.0
    assert freed(("mlp",)) == 0.0  # every layer counted as MoE here: no dense MLP to free
    dense = get_preset("llama3-8b")
    stored, full = _stored(dense, _megatron(recompute_modules=("mlp",)),
                           Plan(tp=1, dp=8, recompute="selective"))
    assert full - stored == pytest.approx(6.0 * SEQ * dense.ffn_hidden)


def test_more_modules_never_cost_memory_or_save_time(h100: GpuSpec) -> None:
    ds = get_preset("deepseek-v3")
    cluster = ClusterSpec(gpu=h100, num_gpus=1024)
    # Megatron-Bridge's H100 layout (7 / 8 / 6 layers on the first / middle / last rank)
    plan = Plan(tp=2, pp=8, dp=64, ep=64, vpp=4, sequence_parallel=True, recompute="selective",
                first_stage_layers=7, last_stage_layers=6)
    ests = [estimate(ds, cluster, plan, _megatron(recompute_modules=m, global_batch=8192))
            for m in (("core_attn",), ("core_attn", "mla_up_proj"),
                      ("core_attn", "mla_up_proj", "moe_act", "layernorm"))]
    peaks = [e.memory.peak_bytes for e in ests]
    steps = [e.compute.recompute_time_s for e in ests]
    assert peaks[0] > peaks[1] > peaks[2]
    assert steps[0] < steps[1] < steps[2]


@pytest.mark.parametrize(("modules", "match"), [
    (("bogus",), "recompute_modules must hold names of"),
    (("moe",), "'moe' is Megatron-Core's but not priced here"),
    ((), "must name at least one module"),
    ("core_attn", "must be a list of module names"),
])
def test_bad_modules_are_refused_naming_the_field(modules: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        training_for(seq_len=8, global_batch=1, recompute_modules=modules)  # type: ignore[arg-type]


def test_modules_keep_their_order_once_each() -> None:
    tr = training_for(seq_len=8, global_batch=1, recompute_modules=("moe_act", "core_attn",
                                                                "moe_act"))
    assert tr.framework.activations.recompute_modules == ("moe_act", "core_attn")


STUDY = """
model: {preset: qwen3-30b-a3b}
training: {seq_len: 4096, global_batch: 512, framework: megatron%s}
cluster: {gpu: h100-sxm-80gb, gpus: 8}
"""


def test_a_study_names_its_modules() -> None:
    tr = build_specs(parse_study(STUDY % ", recompute_modules: [moe_act, layernorm]")).training
    assert tr.framework.activations.recompute_modules == ("moe_act", "layernorm")
    own = build_specs(parse_study(STUDY % "")).training.framework.activations
    assert own.recompute_modules == ("core_attn",)
    with pytest.raises(StudyError, match="training.recompute_modules must hold names of"):
        build_specs(parse_study(STUDY % ", recompute_modules: [router]"))


@pytest.mark.parametrize(("text", "match"), [
    # Megatron-Core's TransformerConfig refuses both (transformer_config.py __post_init__)
    (", recompute_modules: [mla_up_proj]", "'mla_up_proj' needs multi-latent attention"),
    (", recompute_modules: [moe_act]", "'moe_act' needs MoE layers"),
    # torchtitan's selective is its per-op policy, DeepSpeed has no selective: not their switch
    (", recompute_modules: [core_attn]", "which the 'torchtitan' profile does not take"),
    (", recompute_modules: [mlp]", "which the 'deepspeed' profile does not take"),
    (", grad_reduce_in_bf16: true", "grad_reduce_in_bf16: Megatron-Core's switch .*'nanotron'"),
])
def test_modules_a_study_cannot_run_are_refused(text: str, match: str) -> None:
    dense = STUDY.replace("qwen3-30b-a3b", "llama3-8b")
    for name in ("torchtitan", "deepspeed", "nanotron"):
        if name in match:
            dense = dense.replace("framework: megatron", f"framework: {name}")
    with pytest.raises(StudyError, match=match):
        build_specs(parse_study(dense % text))


def _plan_file(modules: tuple[str, ...]) -> PlanFile:
    plan = Plan(tp=2, pp=1, dp=4, ep=8, zero_stage=1, sequence_parallel=True,
                recompute="selective")
    training = _megatron(recompute_modules=modules)
    return PlanFile(study="modules-check", model=get_preset("qwen3-30b-a3b"),
                    gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=8, training=training,
                    plan=plan)


def test_megatron_export_names_the_modules_it_was_searched_with() -> None:
    script = render("megatron", _plan_file(("moe_act", "layernorm")))["megatron.sh"]
    assert flag_values(script, "pretrain_gpt.py", "--recompute-granularity") == ["selective"]
    assert flag_values(script, "pretrain_gpt.py", "--recompute-modules") == ["moe_act",
                                                                            "layernorm"]
    default = render("megatron", _plan_file(("core_attn",)))["megatron.sh"]
    assert "--recompute-modules" not in default  # Megatron-Core's own default


def test_nemo_export_builds_the_modules_into_a_transformer_config() -> None:
    files = render("nemo", _plan_file(("moe_act", "layernorm")))
    cfg = nemo_model_config(files)  # Megatron-Core's __post_init__ checks the module names
    assert cfg.recompute_granularity == "selective"
    assert list(cfg.recompute_modules) == ["moe_act", "layernorm"]
    assert np.isfinite(cfg.num_layers)


def test_explain_says_what_selective_recomputes(tmp_path: Path) -> None:
    study = tmp_path / "ds.yaml"
    study.write_text(STUDY % ", recompute_modules: [moe_act, layernorm]")
    app = typer.Typer()
    app.command("explain")(explain_cmd)
    app.command("noop")(lambda: None)
    got = CliRunner().invoke(app, ["explain", str(study), "--plan",
                                   "tp=1,dp=8,ep=8,mbs=1,recompute=selective,zero=1", "--json"])
    assert got.exit_code == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["training"]["selective_recomputes"] == "Megatron-Core modules moe_act, layernorm"
    text = CliRunner().invoke(app, ["explain", str(study), "--plan",
                                    "tp=1,dp=8,ep=8,mbs=1,recompute=selective,zero=1"]).stdout
    assert "selective recomputes Megatron-Core modules moe_act, layernorm" in " ".join(
        text.split())
