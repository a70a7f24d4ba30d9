"""Slurm: an sbatch script that runs the chosen launcher's script once per node under ``srun``,
with ``NODE_RANK`` and ``MASTER_ADDR`` taken from Slurm; torchrun then starts the GPU processes.

``#SBATCH`` lines are parsed by sbatch, not by a shell, so values there are checked against a
plain character set instead of quoted; the job name is a label and is sanitised.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from search.planfile import PlanFile

from .options import ExportError, ExportOptions
from .view import facts_of

SCRIPT = "slurm.sbatch"
_PLAIN = re.compile(r"[A-Za-z0-9._,-]+")
_TIME = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}")  # ASCII digits: \d is any script's

Renderer = Callable[[PlanFile, ExportOptions], dict[str, str]]


def job_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:64] or "tcf-search"


def _directive(name: str, value: str | None, pattern: re.Pattern[str]) -> list[str]:
    if value is None:
        return []
    if not pattern.fullmatch(value):
        raise ExportError(f"options.slurm_{name} must match {pattern.pattern}, but got {value!r}")
    return [f"#SBATCH --{name}={value}"]


def render_with(launchers: dict[str, Renderer], pf: PlanFile,
                options: ExportOptions) -> dict[str, str]:
    name = options.slurm_launcher
    if name not in launchers:
        raise ExportError(f"options.slurm_launcher must be one of {sorted(launchers)}, "
                          f"but got {name!r}")
    files = launchers[name](pf, options)  # raises ExportRefused with that launcher's rules
    launcher_script = next(p for p in files if p.endswith(".sh"))
    f = facts_of(pf, options, name)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(options.run_name or pf.study)}",
        f"#SBATCH --nodes={f.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={f.nproc_per_node}",
        "#SBATCH --exclusive",
        *_directive("time", options.slurm_time, _TIME),
        *_directive("partition", options.slurm_partition, _PLAIN),
        *_directive("account", options.slurm_account, _PLAIN),
        f"# Submit from the export folder: sbatch {SCRIPT}  (runs {launcher_script} per node)",
        "set -euo pipefail",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={int(options.master_port)}",
        "export MASTER_ADDR MASTER_PORT",
        f'LAUNCHER="$SLURM_SUBMIT_DIR/{launcher_script}"',
        # Single quotes: each node expands its own SLURM_NODEID, not the batch host's.
        "# shellcheck disable=SC2016  # single quotes: each node expands its own SLURM_NODEID",
        "srun --kill-on-bad-exit=1 bash -c 'NODE_RANK=\"$SLURM_NODEID\" exec bash \"$0\"' "
        '"$LAUNCHER"',
        "",
    ]
    return {**files, SCRIPT: "\n".join(lines)}
