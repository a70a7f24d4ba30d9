"""Exports train the searched model where the launcher has no model of its own: DeepSpeed and
Accelerate get the architecture as a Hugging Face ``config.json`` beside their configs, read back
by transformers. Over every preset: each format accepts a plain plan of the model and reads it
back, or refuses it naming the rule (never silently another model).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from export_helpers import exported, launcher_flags, nemo_model_config, titan_config
from export_plans import deepseek, llama31, plan_file

from costmodel import Plan
from search.inputs.planfile import PlanFile
from search.inputs.presets import PRESETS
from tcf_search.export import ExportRefused, render
from tcf_search.export.hf_model import family
from tcf_search.export.options import TARGETS

# --- DeepSpeed and Accelerate: the model beside the config ---------------------------------------

def hf_config(files: dict[str, str], folder: Path) -> Any:
    transformers = pytest.importorskip("transformers",
                                       reason="transformers not installed (extra: export-check)")
    (folder / "config.json").write_text(files["config.json"])
    return transformers.AutoConfig.from_pretrained(str(folder))


@pytest.mark.parametrize("fmt", ["deepspeed", "accelerate"])
def test_deepseek_v3_config_json_reads_back_mla(fmt: str, tmp_path: Path) -> None:
    pf = deepseek()
    # DeepSpeed runs MoE models at ZeRO-1/2 only (the moe_zero rule); Accelerate's FSDP at 3
    zero = 2 if fmt == "deepspeed" else 3
    # transformers' DeepseekV3ForCausalLM builds no MTP module (DeepSpeed's profile refuses one)
    pf = dataclasses.replace(pf, plan=Plan(tp=1, pp=1, dp=2048, zero_stage=zero),
                             model=dataclasses.replace(pf.model, mtp_layers=0),
                             training=dataclasses.replace(pf.training, global_batch=16384))
    files = render(fmt, pf)
    cfg = hf_config(files, tmp_path)
    assert cfg.model_type == "deepseek_v3"
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
            cfg.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts,
            cfg.moe_intermediate_size, cfg.first_k_dense_replace) == (256, 8, 1, 2048, 3)
    assert (cfg.rope_parameters["rope_type"], cfg.rope_parameters["factor"]) == ("yarn", 40.0)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (8, 4, 2.5)
    script = next(t for n, t in files.items() if n.endswith(".sh"))
    assert '--model_config "$(dirname "$0")"' in script and "config.json" in script


def test_llama_config_json_reads_back_70b_and_rope_scaling(tmp_path: Path) -> None:
    pf = dataclasses.replace(llama31(), plan=Plan(tp=1, pp=1, dp=512, zero_stage=3))
    cfg = hf_config(render("accelerate", pf), tmp_path)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.vocab_size) == ("llama", 80, 8192, 64, 8, 128256)
    p = cfg.rope_parameters
    assert (p["rope_type"], p["factor"], p["low_freq_factor"], p["high_freq_factor"],
            p["original_max_position_embeddings"], p["rope_theta"]) == (
        "llama3", 8.0, 1.0, 4.0, 8192, 500000.0)


# --- every preset through every format -----------------------------------------------------------

def simple(model: str) -> PlanFile:
    """A plan every launcher could run but for the model: data parallel over 8 GPUs, ZeRO-1."""
    return plan_file(model, Plan(tp=1, pp=1, dp=8, zero_stage=1), 8, 64, seq=2048)


def read_back(fmt: str, files: dict[str, str], pf: PlanFile, folder: Path) -> None:
    """The model as the launcher's own config code reads it: layers, width, heads, vocab."""
    m = pf.model
    if fmt in ("deepspeed", "accelerate"):
        cfg = hf_config(files, folder)
        layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
        assert (layers, cfg.vocab_size) == (m.layers, m.vocab)
        assert hf_model_class_builds(cfg)
        # no dropout, as searched (GPT2Config's defaults are 0.1 each)
        drops = [getattr(cfg, k) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop",
                                           "attention_dropout", "hidden_dropout")
                 if hasattr(cfg, k)]
        assert drops and not any(drops), drops
    elif fmt == "megatron":
        flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
        assert (flags["--num-layers"], flags["--vocab-size"]) == (str(m.layers), str(m.vocab))
        assert float(flags["--attention-dropout"]) == float(flags["--hidden-dropout"]) == 0.0
        assert ("--multi-latent-attention" in flags) == (m.mla is not None)
        assert ("--use-rope-scaling" in flags) == (
            m.rope_scaling is not None and m.rope_scaling.kind == "llama3")
    elif fmt == "nemo":
        cfg = nemo_model_config(files)
        assert (cfg.num_layers, cfg.hidden_size) == (m.layers, m.hidden)
    elif fmt == "torchtitan":
        model = titan_config(files, folder).model_spec.model
        rope = model.layers[0].attention.rope
        assert (len(model.layers), rope.scaling) == (
            m.layers, "llama" if m.rope_scaling else "none")
    else:
        assert f"num_hidden_layers: {m.layers}" in files["nanotron.yaml"]


def hf_model_class_builds(cfg: Any) -> bool:
    """The config names a causal-LM class transformers has for its model type."""
    auto = pytest.importorskip("transformers.models.auto.modeling_auto")
    return cfg.model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_every_preset_is_trained_or_refused_by_each_format(model: str, tmp_path: Path) -> None:
    pf = simple(model)
    for fmt in TARGETS:
        try:
            files = render(fmt, pf)
        except ExportRefused as e:
            assert e.reasons and all(e.reasons), (model, fmt)
            continue
        read_back(fmt, files, pf, tmp_path)
    assert family(pf.model) is not None  # every preset has a Hugging Face family


def test_deepspeed_and_accelerate_write_a_loadable_model_for_every_plan(
        tmp_path: Path) -> None:
    from export_plans import golden_plans
    plans = golden_plans()
    for fmt in ("deepspeed", "accelerate"):
        for _name, pf, files in exported(plans, fmt):
            assert json.loads(files["config.json"])["model_type"] == family(pf.model)
            read_back(fmt, files, pf, tmp_path)

