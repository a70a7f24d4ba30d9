"""Export a plan to the launchers people run: every format renders text purely, checked first
against that launcher's own rules (``rules.py``); ``write_exports`` alone does the I/O."""

from __future__ import annotations

from collections.abc import Callable

from search.inputs import PlanFile

from . import accelerate, deepspeed, megatron, nanotron, nemo, slurm, torchtitan
from .options import ExportError, ExportOptions, ExportRefused
from .writer import ExportExists, write_exports

Renderer = Callable[[PlanFile, ExportOptions], dict[str, str]]

LAUNCHERS: dict[str, Renderer] = {
    "megatron": megatron.render,
    "nemo": nemo.render,
    "deepspeed": deepspeed.render,
    "torchtitan": torchtitan.render,
    "nanotron": nanotron.render,
    "accelerate": accelerate.render,
}


def _slurm(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    return slurm.render_with(LAUNCHERS, pf, options)


FORMATS: dict[str, Renderer] = {**LAUNCHERS, "slurm": _slurm}


def render(fmt: str, pf: PlanFile, options: ExportOptions | None = None) -> dict[str, str]:
    """Files (relative name -> text) of one format; raises ExportRefused with the broken rules."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)} or all, but got {fmt!r}")
    return FORMATS[fmt](pf, options or ExportOptions())


__all__ = ["FORMATS", "LAUNCHERS", "ExportError", "ExportExists", "ExportOptions",
           "ExportRefused", "render", "write_exports"]
