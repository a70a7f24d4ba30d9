"""Megatron-LM's own argument code on an exported ``megatron.sh``: ``parse_args``,
``validate_args`` and ``core_transformer_config_from_args`` of ``megatron/training/arguments.py``.

``megatron.training`` is in no package (the megatron-core wheel ships ``megatron.core`` only),
so it is read from a source checkout named by ``MEGATRON_LM_SRC`` (e.g. ``git clone
https://github.com/NVIDIA/Megatron-LM && git checkout core_v0.16.1``, the release the export
targets); without it the callers skip, saying so. It runs in a child process: the checkout's
``megatron.core`` then shadows the installed one, and Megatron's global arguments stay there.

On a CPU machine four things stand in for a GPU node: the device reports compute capability
9.0 (an H100; validate_args asks for it), ``six`` (imported only by Megatron's BERT and GPT-2
tokenizers, never used here) is an empty module when absent, the fused RoPE kernel is off
when building the config (it needs Transformer Engine, a CUDA build), and Transformer Engine's
version and its fused MoE permutation kernels, which the config checks (MoE at fp8,
--moe-permute-fusion), read as 2.8's (callables never called here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHILD = r"""
import json, os, sys, types
import torch
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
try:
    import six  # noqa: F401
except ImportError:
    sys.modules["six"] = types.ModuleType("six")
import megatron.core.utils as U
from packaging.version import Version
# Transformer Engine is a CUDA build absent here: the config's version checks (MoE at fp8 asks
# for TE >= 1.7) read the version the release is run with
U.get_te_version = lambda: Version("2.8.0")
# and its fused MoE permutation kernels (--moe-permute-fusion), which the config looks for
import megatron.core.transformer.moe.moe_utils as M
for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
             "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
    setattr(M, name, getattr(M, name, None) or (lambda *a, **k: None))
import megatron.training.arguments as A
A.get_device_arch_version = lambda: 9
keys = json.loads(os.environ["TCF_MEGATRON_READ"])
runs = json.loads(sys.stdin.read())
for words, world, script_env in runs:
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(script_env, WORLD_SIZE=str(world))
    sys.argv = ["pretrain_gpt.py", *words]
    try:
        args = A.parse_args()
        A.validate_args(args)
        args.apply_rope_fusion = False
        cfg = A.core_transformer_config_from_args(args)
    except (AssertionError, ValueError, SystemExit) as e:
        print("TCF-RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}))
        continue
    out = {k: getattr(cfg, k, getattr(args, k, None)) for k in keys}
    out["config_class"] = type(cfg).__name__
    print("TCF-RESULT " + json.dumps(out, default=str))
"""


def source() -> Path:
    raw = os.environ.get("MEGATRON_LM_SRC", "")
    path = Path(raw) if raw else None
    if path is None or not (path / "megatron" / "training" / "arguments.py").is_file():
        pytest.skip("Megatron-LM's megatron.training is in no package: set MEGATRON_LM_SRC to a "
                    "Megatron-LM checkout (core_v0.16.1) to run its parse_args/validate_args")
    return path


def script_env(script: str) -> dict[str, str]:
    """The variables the script assigns and exports before launching (``NAME=value``)."""
    head = script.split("set -euo pipefail", 1)[1].split("torchrun", 1)[0]
    return dict(line.split("=", 1) for line in head.splitlines()
                if re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", line))


def launcher_words(script: str, entry: str = "pretrain_gpt.py") -> list[str]:
    line = script.split("set -euo pipefail", 1)[1]
    words = shlex.split(line.replace("\\\n", " "), comments=True)
    return words[words.index(entry) + 1:]


def megatron_lm_reads_many(runs: list[tuple[str, int]], keys: list[str]
                           ) -> list[dict[str, Any]]:
    """For each (exported megatron.sh, world size): the config Megatron-LM builds from its
    flags, as ``keys`` read from the TransformerConfig (or the parsed args) and
    ``config_class``, or ``error``: Megatron's own message where parse_args, validate_args or
    the config refuses the flags. One child process reads them all."""
    src = source()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get(
        "PYTHONPATH", "")]), "TCF_MEGATRON_READ": json.dumps(keys), "RANK": "0",
        "LOCAL_RANK": "0"}
    # the exports' words on stdin: many exports pass the limit of one environment variable
    words = json.dumps([[launcher_words(s), w, script_env(s)] for s, w in runs])
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, input=words,
                         capture_output=True, text=True, timeout=900, check=False)
    lines = [x for x in run.stdout.splitlines() if x.startswith("TCF-RESULT ")]
    assert run.returncode == 0 and len(lines) == len(runs), run.stderr[-3000:]
    return [json.loads(x.removeprefix("TCF-RESULT ")) for x in lines]


def megatron_lm_reads(script: str, world: int, keys: list[str]) -> dict[str, Any]:
    """One export's config as Megatron-LM builds it; fails with Megatron's message."""
    got = megatron_lm_reads_many([(script, world)], keys)[0]
    assert "error" not in got, got["error"]
    return got
