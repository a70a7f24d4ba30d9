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


# The launcher release each format targets, the default first: the latest release on the
# package index when written (megatron-core 0.16.1, megatron-bridge 0.3.1, deepspeed 0.19.8,
# torchtitan 0.3.0, accelerate 1.15.0). nanotron defaults to its main branch: the 0.4 release
# on PyPI fails its own imports (a cycle through nanotron.logging) and has no rope_theta.
TARGETS: dict[str, tuple[str, ...]] = {
    "megatron": ("0.16",),
    "nemo": ("0.3",),
    "deepspeed": ("0.19",),
    "torchtitan": ("0.3", "0.2"),
    "nanotron": ("main", "0.4"),
    "accelerate": ("1.15",),
}


def target_for(fmt: str, options: ExportOptions) -> str:
    """The version ``fmt`` renders for: ``target_version`` is one version (for the formats that
    have it) or ``FMT=V`` pairs separated by commas; a format not named gets its default."""
    known = TARGETS[fmt]
    raw = (options.target_version or "").strip()
    if "=" in raw:
        pairs = dict(item.strip().partition("=")[::2] for item in raw.split(",") if item.strip())
        unknown = sorted(set(pairs) - set(TARGETS))
        if unknown:
            raise ExportError(f"--target-version names unknown format {unknown[0]!r} "
                              f"(valid: {', '.join(TARGETS)})")
        raw = pairs.get(fmt, "").strip()
    version = raw or known[0]
    if version not in known:
        raise ExportError(f"options.target_version for {fmt} must be one of {known}, "
                          f"but got {version!r}")
    return version


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportOptions:
    """Knobs that are not part of the plan: where the training code lives and how jobs launch.

    ``target_version`` names the launcher release a format targets (``TARGETS``, see
    ``target_for``): torchtitan ``"0.3"`` (a Python config function, the default) or ``"0.2"``
    (TOML); nanotron ``"main"`` (default) or ``"0.4"`` (the PyPI release, without recompute, CP
    or a RoPE base); one release each for the others.
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
