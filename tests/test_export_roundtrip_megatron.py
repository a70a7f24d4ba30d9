"""The Megatron family read back by its own config code: Megatron-LM's flags and NeMo's
(Megatron-Bridge) ``model.*`` overrides, each built into Megatron-Core's TransformerConfig, over
every shipped study's top plans and the golden plans (``pip install -e .[export-check]``).

A format either accepts a plan, and then its launcher's parser accepts the file and reads back
the plan's model and parallel sizes, or refuses it with a rule. A test skips, with the reason
shown by ``pytest -rs``, when its launcher is not installed; what each could use is in
docs/export.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from export_helpers import (
    exported,
    launcher_flags,
    megatron_kwargs,
    nemo_model_config,
    nemo_overrides,
)
from export_plans import PLANS, seventy_b

from search.inputs.planfile import PlanFile, load_plan_file
from tcf_search.export import ExportOptions, ExportRefused, render

# --- Megatron-LM / Megatron-Core ---------------------------------------------------------------


def megatron_config(files: dict[str, str]) -> tuple[Any, dict[str, str | bool]]:
    tc, flags, kw = megatron_kwargs(files)
    return tc.TransformerConfig(**kw), flags


def test_megatron_core_accepts_every_export(plans: dict[str, PlanFile]) -> None:
    for name, pf, files in exported(plans, "megatron"):
        cfg, flags = megatron_config(files)
        m = pf.model
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads) == (
            m.layers, m.hidden, m.heads), name
        assert (cfg.num_query_groups or cfg.num_attention_heads) == m.kv_heads, name
        assert cfg.gated_linear_unit == (m.ffn_type == "swiglu"), name
        assert cfg.add_bias_linear == (m.bias == "all"), name
        assert cfg.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
        # the searched model has no dropout (the launcher's default is 0.1 each)
        assert (cfg.hidden_dropout, cfg.attention_dropout) == (0.0, 0.0), name
        if m.position_embedding == "rope":
            assert int(flags["--rotary-base"]) == m.rope_base, name
        assert int(flags["--vocab-size"]) == m.vocab
        assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (
            pf.plan.tp, pf.plan.pp), name
        assert (cfg.virtual_pipeline_model_parallel_size or 1) == pf.plan.vpp, name
        assert (cfg.mtp_num_layers or 0) == m.mtp_layers, name


def test_megatron_fsdp_modes_carry_their_required_flags() -> None:
    pf = load_plan_file(PLANS / "fsdp8b.yaml")  # ZeRO-3 with overlap_param_gather
    flags = launcher_flags(render("megatron", pf)["megatron.sh"], "pretrain_gpt.py")
    for flag in ("--use-megatron-fsdp", "--use-distributed-optimizer",
                 "--no-gradient-accumulation-fusion", "--overlap-param-gather"):
        assert flag in flags
    assert flags["--ckpt-format"] == "fsdp_dtensor"
    torch_fsdp = ExportOptions(fsdp_impl="torch")
    flags = launcher_flags(render("megatron", pf, torch_fsdp)["megatron.sh"], "pretrain_gpt.py")
    # validate_args: --overlap-param-gather only with the distributed optimizer or Megatron-FSDP
    assert "--use-torch-fsdp2" in flags and "--overlap-param-gather" not in flags
    zero2 = dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, zero_stage=2))
    with pytest.raises(ExportRefused, match="no torch-FSDP ZeRO-2"):
        render("megatron", zero2, torch_fsdp)


def test_megatron_70b_reads_back() -> None:
    pf = seventy_b()
    cfg, flags = megatron_config(render("megatron", pf))
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups) == (
        80, 8192, 64, 8)
    assert flags["--vocab-size"] == "128256" and flags["--rotary-base"] == "500000"
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size,
            cfg.virtual_pipeline_model_parallel_size) == (pf.plan.tp, pf.plan.pp, pf.plan.vpp)


# --- NeMo / Megatron-Bridge ----------------------------------------------------------------------

def test_nemo_model_overrides_build_a_transformer_config(plans: dict[str, PlanFile]) -> None:
    for name, pf, files in exported(plans, "nemo"):
        cfg = nemo_model_config(files)
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_query_groups) == (
            pf.model.layers, pf.model.hidden, pf.model.kv_heads), name
        assert cfg.gated_linear_unit == (pf.model.ffn_type == "swiglu"), name
        assert nemo_overrides(files)["tokenizer.vocab_size"] == str(pf.model.vocab)


def test_nemo_70b_reads_back() -> None:
    pf = seventy_b()
    files = render("nemo", pf)
    cfg = nemo_model_config(files)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups) == (
        80, 8192, 64, 8)
    o = nemo_overrides(files)
    assert o["tokenizer.vocab_size"] == "128256" and o["model.rotary_base"] == "500000"
    assert "--recipe llama3_70b_pretrain_config" in files["nemo.sh"]
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (
        pf.plan.tp, pf.plan.pp)


def test_nemo_never_downloads_an_unnamed_model() -> None:
    tiny = load_plan_file(PLANS / "pp8b.yaml")
    tiny = dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, name="my-llama"))
    with pytest.raises(ExportRefused, match="Hugging Face config"):
        render("nemo", tiny)

