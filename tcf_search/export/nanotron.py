"""nanotron: the whole YAML training config ``run_train.py --config-file`` reads (parallelism,
tokens, optimizer and schedule, the Llama model and its init) and the ``torchrun`` line.

Keys follow ``nanotron/config`` (``ParallelismArgs``, ``TokensArgs``, ``OptimizerArgs``): the
``main`` dialect adds ``recompute_layer`` and ``context_parallel_size`` that the 0.4 release lacks.
"""

from __future__ import annotations

from typing import Any

import yaml

from search.planfile import PlanFile

from . import rules
from .literals import comment
from .options import ExportOptions
from .shell import Raw, command, script, torchrun_head
from .view import LaunchView, facts_of

CONFIG = "nanotron.yaml"
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _optimizer(f: LaunchView, options: ExportOptions) -> dict[str, Any]:
    """OptimizerArgs: 0.4 holds the Adam fields itself; main moves them to optimizer_factory."""
    adam = {"adam_eps": 1.0e-8, "adam_beta1": 0.9, "adam_beta2": 0.95, "torch_adam_is_fused": True}
    out: dict[str, Any] = {"zero_stage": f.zero, "weight_decay": 0.01, "clip_grad": 1.0,
                           "accumulate_grad_in_fp32": True}
    out |= adam if f.version == "0.4" else {"optimizer_factory": {"name": "adamW", **adam}}
    out["learning_rate_scheduler"] = {
        "learning_rate": options.lr, "lr_warmup_steps": 0, "lr_warmup_style": "linear",
        "lr_decay_style": "cosine", "min_decay_lr": options.lr / 10}
    return out


def _model(pf: PlanFile, f: LaunchView) -> dict[str, Any]:
    m = pf.model
    llama: dict[str, Any] = {
        "is_llama_config": True, "hidden_size": m.hidden, "intermediate_size": m.ffn_hidden,
        "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads,
        "num_hidden_layers": m.layers, "vocab_size": m.vocab, "hidden_act": "silu",
        "max_position_embeddings": f.seq_len, "tie_word_embeddings": m.tied_embeddings}
    if f.version != "0.4":  # 0.4's LlamaConfig has no rope_theta (rules.NANOTRON refuses)
        llama["rope_theta"] = m.rope_base
    return {"init_method": {"std": 0.02}, "make_vocab_size_divisible_by": 1,
            "dtype": DTYPES.get(f.precision, "bfloat16"), "model_config": llama}


def sections(pf: PlanFile, f: LaunchView, options: ExportOptions) -> dict[str, Any]:
    """The whole config ``get_config_from_file`` reads (nanotron/config/config.py ``Config``).
    ``data.dataset: null`` runs nanotron's dummy data generator and no tokenizer is named, so
    nothing is downloaded; point both at real data to train on it."""
    run = options.run_name or pf.study
    parallelism: dict[str, Any] = {
        "dp": f.dp, "pp": f.pp, "tp": f.tp,
        "pp_engine": "afab" if f.schedule == "gpipe" else "1f1b",
        # REDUCE_SCATTER is nanotron's sequence-parallel TP mode.
        "tp_mode": "REDUCE_SCATTER" if f.sp else "ALL_REDUCE",
        "tp_linear_async_communication": f.sp,
        "expert_parallel_size": f.ep,
    }
    if f.version == "main":
        parallelism["recompute_layer"] = f.recompute == "full"
        parallelism["context_parallel_size"] = f.cp
    return {
        "general": {"project": "tcf-search", "run": run, "seed": 42},
        "checkpoints": {"checkpoints_path": f"checkpoints/{run}",
                        "checkpoint_interval": options.train_iters},
        "parallelism": parallelism,
        "model": _model(pf, f),
        "tokenizer": {"tokenizer_name_or_path": None},
        "logging": {"log_level": "info", "log_level_replica": "info",
                    "iteration_step_info_interval": 1},
        "tokens": {"sequence_length": f.seq_len, "train_steps": options.train_iters,
                   "micro_batch_size": f.micro_batch,
                   "batch_accumulation_per_replica": f.microbatches},
        "optimizer": _optimizer(f, options),
        "data": {"dataset": None, "seed": 42, "num_loading_workers": 1},
    }


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "nanotron")
    version = f.version
    rules.check("nanotron", rules.NANOTRON, f)
    head = (f"# nanotron {version} config for study {comment(pf.study)}, rank {pf.rank}; "
            "dummy data, no tokenizer: set data.dataset and tokenizer to train on real text.\n")
    text = head + yaml.safe_dump(sections(pf, f, options), sort_keys=False)
    body = command([*torchrun_head(f, options.master_port), options.nanotron_script],
                   [("--config-file", Raw('"$(dirname "$0")/nanotron.yaml"'))])
    return {CONFIG: text, "nanotron.sh": script("nanotron", pf, body, None, f.version)}
