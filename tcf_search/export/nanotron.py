"""nanotron: the YAML ``parallelism`` / ``tokens`` sections (plus ZeRO stage, dtype and the Llama
model shape) to merge into a nanotron training config, and the ``torchrun run_train.py`` line.

Keys follow ``nanotron/config`` (``ParallelismArgs``, ``TokensArgs``, ``OptimizerArgs``): the
``main`` dialect adds ``recompute_layer`` and ``context_parallel_size`` that the 0.4 release lacks.
"""

from __future__ import annotations

from typing import Any

import yaml

from search.planfile import PlanFile

from . import rules
from .options import ExportError, ExportOptions
from .shell import Raw, command, comment_safe, script, torchrun_head
from .view import LaunchView, facts_of

VERSIONS = ("main", "0.4")
CONFIG = "nanotron.yaml"
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def sections(pf: PlanFile, f: LaunchView, options: ExportOptions) -> dict[str, Any]:
    m = pf.model
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
        "general": {"project": "tcf-search", "run": options.run_name or pf.study},
        "parallelism": parallelism,
        "tokens": {"sequence_length": f.seq_len, "train_steps": options.train_iters,
                   "micro_batch_size": f.micro_batch,
                   "batch_accumulation_per_replica": f.microbatches},
        "optimizer": {"zero_stage": f.zero, "accumulate_grad_in_fp32": True},
        "model": {"dtype": DTYPES.get(f.precision, "bfloat16"), "model_config": {
            "is_llama_config": True, "hidden_size": m.hidden, "intermediate_size": m.ffn_hidden,
            "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads,
            "num_hidden_layers": m.layers, "vocab_size": m.vocab,
            "max_position_embeddings": f.seq_len, "tie_word_embeddings": m.tied_embeddings}},
    }


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    version = options.target_version or "main"
    if version not in VERSIONS:
        raise ExportError(f"options.target_version for nanotron must be one of {VERSIONS}, "
                          f"but got {version!r}")
    f = facts_of(pf, options, default_version="main")
    rules.check("nanotron", rules.NANOTRON, f)
    head = (f"# nanotron {version} sections for study {comment_safe(pf.study)}, rank {pf.rank}.\n"
            "# Merge into a full nanotron config (data, tokenizer, optimizer schedule).\n")
    text = head + yaml.safe_dump(sections(pf, f, options), sort_keys=False)
    body = command([*torchrun_head(f, options.master_port), options.nanotron_script],
                   [("--config-file", Raw('"$(dirname "$0")/nanotron.yaml"'))])
    return {CONFIG: text, "nanotron.sh": script("nanotron", pf, body)}
