"""Exports read back the way their launchers read them: the plans a format accepts, the flags of
an exported ``torchrun`` line, and the configs Megatron-Core, NeMo's overrides and torchtitan's
ConfigManager build from them. Shared by the round-trip and the model-feature tests; each reader
skips, saying why, when its launcher is not installed (extra: export-check)."""

from __future__ import annotations

import dataclasses
import importlib
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from search.inputs.planfile import PlanFile
from tcf_search.export import ExportOptions, ExportRefused, render


def exported(plans: dict[str, PlanFile], fmt: str, options: ExportOptions | None = None
             ) -> Iterator[tuple[str, PlanFile, dict[str, str]]]:
    """(name, plan, files) of each plan the format accepts; a refusal must name its rules."""
    accepted = 0
    for name, pf in plans.items():
        try:
            files = render(fmt, pf, options)
        except ExportRefused as e:
            assert e.reasons and all(e.reasons), name
            continue
        accepted += 1
        yield name, pf, files
    assert accepted, f"no plan is accepted by {fmt}"


def launcher_flags(script: str, entry: str) -> dict[str, str | bool]:
    """Flags after ``entry`` in an exported ``torchrun`` line, as argparse would see them."""
    line = script.split("set -euo pipefail", 1)[1]
    words = shlex.split(line.replace("\\\n", " "), comments=True)
    words = words[words.index(entry) + 1:]
    flags: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            flags[w] = True if nxt.startswith("--") else nxt
    return flags


def flag_values(script: str, entry: str, flag: str) -> list[str]:
    """Every value of a flag that takes several (``--recompute-modules a b``) in the exported
    ``torchrun`` line, as argparse's ``nargs="*"`` would read them."""
    line = script.split("set -euo pipefail", 1)[1]
    words = shlex.split(line.replace("\\\n", " "), comments=True)
    words = words[words.index(entry) + 1:]
    if flag not in words:
        return []
    rest = words[words.index(flag) + 1:]
    return rest[:next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]


def megatron_core() -> tuple[Any, Any]:
    """torch and Megatron-Core's ``transformer_config`` module; a skip names what is missing."""
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    return torch, tc


# Megatron-LM's megatron.training (parse_args, validate_args) is not on the package index: the
# megatron-core wheel ships megatron.core only. The exported flags are read into Megatron-Core's
# TransformerConfig, whose __post_init__ holds the parallel and model checks.
def transformer_config_kwargs(flags: dict[str, Any], torch: Any) -> dict[str, Any]:
    def num(flag: str) -> int | None:
        return int(flags[flag]) if flag in flags else None

    return {
        "num_layers": num("--num-layers"), "hidden_size": num("--hidden-size"),
        "ffn_hidden_size": num("--ffn-hidden-size"),
        "num_attention_heads": num("--num-attention-heads"),
        "num_query_groups": num("--num-query-groups"), "kv_channels": num("--kv-channels"),
        "tensor_model_parallel_size": num("--tensor-model-parallel-size"),
        "pipeline_model_parallel_size": num("--pipeline-model-parallel-size"),
        "virtual_pipeline_model_parallel_size": num("--num-virtual-stages-per-pipeline-rank"),
        # the explicit layout gives vpp itself (TransformerConfig.__post_init__ reads it)
        "pipeline_model_parallel_layout": flags.get("--pipeline-model-parallel-layout"),
        "context_parallel_size": num("--context-parallel-size") or 1,
        "expert_model_parallel_size": num("--expert-model-parallel-size") or 1,
        # unset, TransformerConfig takes tp (as Megatron-LM's --expert-tensor-parallel-size)
        "expert_tensor_parallel_size": num("--expert-tensor-parallel-size"),
        "sequence_parallel": bool(flags.get("--sequence-parallel")),
        "num_layers_in_first_pipeline_stage": num("--decoder-first-pipeline-num-layers"),
        "num_layers_in_last_pipeline_stage": num("--decoder-last-pipeline-num-layers"),
        "recompute_granularity": flags.get("--recompute-granularity"),
        "recompute_method": flags.get("--recompute-method"),
        "recompute_num_layers": num("--recompute-num-layers"),
        "num_moe_experts": num("--num-experts"),
        "moe_router_topk": num("--moe-router-topk") or 2,
        "moe_ffn_hidden_size": num("--moe-ffn-hidden-size"),
        "mtp_num_layers": num("--mtp-num-layers"),
        "gated_linear_unit": bool(flags.get("--swiglu")),
        "add_bias_linear": not flags.get("--disable-bias-linear"),
        "add_qkv_bias": bool(flags.get("--add-qkv-bias")),
        "normalization": flags.get("--normalization", "LayerNorm"),
        # unsaid, the launcher takes TransformerConfig's 0.1 each
        "hidden_dropout": float(flags.get("--hidden-dropout", 0.1)),
        "attention_dropout": float(flags.get("--attention-dropout", 0.1)),
        "bf16": bool(flags.get("--bf16")), "fp16": bool(flags.get("--fp16")),
        "pipeline_dtype": torch.bfloat16,
    }



def megatron_kwargs(files: dict[str, str]) -> tuple[Any, dict[str, str | bool], dict[str, Any]]:
    """Megatron-Core's ``transformer_config`` module, the flags of the exported ``megatron.sh``
    and the TransformerConfig keywords they give."""
    torch, tc = megatron_core()
    flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
    return tc, flags, transformer_config_kwargs(flags, torch)


# megatron-bridge (0.3.1 on the index) needs transformer-engine, mamba-ssm and causal-conv1d,
# CUDA builds that do not install on a CPU machine; its recipe and Hydra overrides then cannot
# run here. The model.* overrides are built into Megatron-Core's TransformerConfig, which Bridge's
# GPTModelProvider extends (megatron/bridge/models/gpt_provider.py adds the fields below).
PROVIDER_FIELDS = {"seq_length", "rotary_base", "position_embedding_type",
                   "share_embeddings_and_output_weights", "moe_layer_freq", "rope_scaling",
                   "rope_scaling_factor"}


def nemo_overrides(files: dict[str, str]) -> dict[str, str]:
    words = shlex.split(files["nemo.sh"].split("run_recipe.py", 1)[1].replace("\\\n", " "))
    return dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("--"))


def nemo_model_config(files: dict[str, str]) -> Any:
    torch, tc = megatron_core()
    o = nemo_overrides(files)
    # a DeepSeek recipe's provider is an MLATransformerConfig (nemo.latent_overrides)
    cls = tc.MLATransformerConfig if "model.kv_lora_rank" in o else tc.TransformerConfig
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {"pipeline_dtype": torch.bfloat16}
    for key, text in o.items():
        section, _, name = key.partition(".")
        if section != "model" or name in PROVIDER_FIELDS:
            continue
        assert name in fields, f"model.{name} is not a {cls.__name__} field"
        kw[name] = yaml.safe_load(text)
    return cls(**kw)


def titan_config(files: dict[str, str], folder: Path) -> Any:
    """The exported module loaded by torchtitan's ConfigManager, as ``torchtitan.train`` does.

    Each read gets a folder of its own under ``folder`` and writes no bytecode: the importer
    takes a cached ``__pycache__/*.pyc`` as current when the source's size and its mtime in whole
    seconds match, so two exports of one size written to one path within a second (tp=1 and tp=2
    differ by one digit) would read back as the first."""
    pytest.importorskip("triton", reason="torchtitan's models import triton (extra: export-check)")
    manager = pytest.importorskip("torchtitan.config.manager",
                                  reason="torchtitan not installed (extra: export-check)")
    home = Path(tempfile.mkdtemp(prefix="titan-", dir=folder))
    (home / "tcf_titan_config.py").write_text(files["tcf_titan_config.py"])
    sys.modules.pop("tcf_titan_config", None)
    sys.path.insert(0, str(home))
    no_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        importlib.invalidate_caches()
        return manager.ConfigManager().parse_args(
            ["--module", "tcf_titan_config", "--config", "tcf_plan"])
    finally:
        sys.dont_write_bytecode = no_bytecode
        sys.path.remove(str(home))
        sys.modules.pop("tcf_titan_config", None)
