"""Hugging Face Accelerate: an FSDP2 config with the ND-parallel ``parallelism_config`` (data
replicate/shard, TP, CP), plus ``accelerate launch`` on every node.

ZeRO maps to FSDP2 as in ``accelerate/commands/launch.py``: 3 reshards after forward, 2 keeps
parameters gathered (``fsdp_reshard_after_forward: false``); 0 is plain multi-GPU DDP. FSDP2 has
no optimizer-only sharding, so ZeRO-1 is refused by the table's ``framework_zero`` (the
``accelerate`` profile's ``zero_stages``, as torchtitan's). The config
has no model: the searched one is written beside it as a Hugging Face config.json (``hf_model``),
whose folder the script gets as ``--model_config``.
"""

from __future__ import annotations

from typing import Any

import yaml

from search.inputs import PlanFile

from . import hf_model, rules
from .literals import comment
from .options import ExportOptions
from .shell import Raw, command, script
from .view import LaunchView, facts_of

CONFIG = "accelerate.yaml"
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


def config(pf: PlanFile, f: LaunchView, options: ExportOptions) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if f.zero > 0 else "MULTI_GPU",
        "mixed_precision": MIXED_PRECISION[f.precision],
        "num_machines": f.nodes,
        "num_processes": f.num_gpus,
        "machine_rank": 0,
        "main_process_port": options.master_port,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,
        "debug": False,
    }
    if f.zero > 0:
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": f.zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": f.recompute == "full",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
        cfg["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": f.dp,
            "parallelism_config_tp_size": f.tp,
            "parallelism_config_cp_size": f.cp,
        }
    return cfg


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "accelerate")
    rules.check("accelerate", rules.ACCELERATE, f)
    head = (f"# Accelerate config for study {comment(pf.study)}, rank {pf.rank}; "
            f"per-GPU micro-batch {f.micro_batch}, gradient accumulation {f.microbatches}.\n")
    note = hf_model.HEADER.format(family=hf_model.family(pf.model))
    text = head + note + yaml.safe_dump(config(pf, f, options), sort_keys=False)
    body = command(
        ["accelerate", "launch", "--config_file", Raw('"$(dirname "$0")/accelerate.yaml"'),
         "--machine_rank", Raw('"${NODE_RANK:-0}"'),
         "--main_process_ip", Raw('"${MASTER_ADDR:-localhost}"')],
        [(options.train_script,),
         ("--per_device_train_batch_size", f.micro_batch,
          "--gradient_accumulation_steps", f.microbatches),
         ("--model_config", Raw('"$(dirname "$0")"'))])
    return {CONFIG: text, hf_model.FILENAME: hf_model.render(pf.model, f.seq_len),
            "accelerate.sh": script("accelerate", pf, body, None, f.version, note)}
