"""DeepSpeed: a JSON config (batch sizes, ZeRO stage, precision, checkpointing, pipeline, AutoTP,
AutoEP) plus the ``torchrun`` line that starts the user's script with it. DeepSpeed's config has
no model: the searched one is written beside it as a Hugging Face config.json (``hf_model``),
whose folder the script gets as ``--model_config``.

Batch keys obey DeepSpeed's own identity, checked in ``deepspeed/runtime/config.py``:
``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world``,
where ``world`` is the data-parallel size when an mpu is given (the pipeline engine's grid) and
every rank otherwise. ``deepspeed.initialize`` with AutoTP passes no mpu (its TP groups are made
in ``merge_tp_model_init_into_config``), so each TP rank counts: with tp > 1 the config gives the
micro-batch and accumulation steps only and DeepSpeed derives its batch figure from them.
"""

from __future__ import annotations

from typing import Any

from search.inputs import PlanFile

from . import hf_model, rules
from .literals import json_text
from .options import ExportOptions
from .shell import Raw, command, script, torchrun_head
from .view import LaunchView, facts_of

CONFIG = "deepspeed.json"
LAUNCHER = "deepspeed.sh"


def config(pf: PlanFile, f: LaunchView) -> dict[str, Any]:
    fw = pf.training.framework
    cfg: dict[str, Any] = {} if f.tp > 1 and f.pp == 1 else {"train_batch_size": f.global_batch}
    cfg |= {
        "train_micro_batch_size_per_gpu": f.micro_batch,
        "gradient_accumulation_steps": f.microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "bf16": {"enabled": f.precision == "bf16"},
        "fp16": {"enabled": f.precision == "fp16"},
        "zero_optimization": {
            "stage": f.zero,
            "overlap_comm": fw.dp.overlap_grad_reduce,
            "contiguous_gradients": True,
        },
    }
    if f.recompute == "full":
        # The model's layers call deepspeed.checkpointing; these are that API's switches.
        cfg["activation_checkpointing"] = {"partition_activations": f.tp > 1,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    if f.pp > 1:
        cfg["pipeline"] = {"stages": f.pp, "partition": "uniform",
                           "activation_checkpoint_interval": 1 if f.recompute == "full" else 0}
    if f.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": f.tp}
    if f.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": f.ep}
    return cfg


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "deepspeed")
    rules.check("deepspeed", rules.DEEPSPEED, f)
    text = json_text(config(pf, f))
    body = command([*torchrun_head(f, options.master_port), options.train_script],
                   [("--deepspeed", "--deepspeed_config", Raw(f'"$(dirname "$0")/{CONFIG}"')),
                    ("--model_config", Raw('"$(dirname "$0")"'))])
    note = hf_model.HEADER.format(family=hf_model.family(pf.model))
    return {CONFIG: text, hf_model.FILENAME: hf_model.render(pf.model, f.seq_len),
            LAUNCHER: script("deepspeed", pf, body, None, f.version, note)}
