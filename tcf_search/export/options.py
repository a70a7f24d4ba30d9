"""What the user chooses about an export, and the error for a plan a launcher cannot run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodel.errors import TcfError

FsdpImpl = Literal["megatron", "torch"]


class ExportError(TcfError):
    """An export request is malformed (unknown format, bad option); the message names it."""


class ExportRefused(TcfError):
    """The launcher cannot run this plan as predicted; ``reasons`` has a line per broken rule."""

    def __init__(self, fmt: str, reasons: list[str]) -> None:
        self.format = fmt
        self.reasons = list(reasons)
        super().__init__(f"{fmt} refuses this plan: " + "; ".join(self.reasons))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportOptions:
    """Knobs that are not part of the plan: where the training code lives and how jobs launch.

    ``target_version`` selects a launcher's config dialect where it changed incompatibly:
    torchtitan ``"0.3"`` (a Python config function, the default) or ``"0.2"`` (TOML);
    nanotron ``"main"`` (default) or ``"0.4"`` (the PyPI release, without recompute or CP).
    ``slurm_launcher`` is the format the sbatch script runs on every node.
    """

    target_version: str | None = None
    fsdp_impl: FsdpImpl = "megatron"
    train_iters: int = 1000
    lr: float = 3.0e-4
    master_port: int = 29500
    run_name: str | None = None  # default: the study name
    megatron_script: str = "pretrain_gpt.py"
    nemo_script: str = "scripts/training/run_recipe.py"
    nemo_recipe: str | None = None  # default: the named model's recipe (export/nemo.py RECIPES)
    train_script: str = "train.py"  # DeepSpeed / Accelerate user script
    titan_module: str = "llama3"
    titan_config: str = "llama3_8b"
    titan_flavor: str | None = None  # 0.2 TOML only; default: the flavour of the model's shape
    nanotron_script: str = "run_train.py"
    slurm_launcher: str = "megatron"
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_time: str = "04:00:00"

    def __post_init__(self) -> None:
        if self.fsdp_impl not in ("megatron", "torch"):
            raise ExportError(f"options.fsdp_impl must be 'megatron' or 'torch', "
                              f"but got {self.fsdp_impl!r}")
        if not 0 < self.master_port < 65536:
            raise ExportError(f"options.master_port must be in 1..65535, got {self.master_port}")
        if self.train_iters <= 0:
            raise ExportError(f"options.train_iters must be > 0, got {self.train_iters}")
