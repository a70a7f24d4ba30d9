"""What ``python -m tcf_search.calibration.fit --write`` writes: calibration.yaml (the families'
efficiencies), the fitted lines of frameworks.yaml (nanotron's footprint, each stack's
fragmentation bound) and its closing ``memory_model`` section (the allocator's fit)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import yaml

from costmodel.specs import Efficiency, MemoryModel
from hardware_catalog import CATALOG_DIR, FABRIC_FIGURES
from hardware_catalog.frameworks import PROFILES_FILE, load_profiles
from search import residual_stack
from tcf_search.calibration.memory_fit import LaunchedBound

PROFILE_LINE = re.compile(r"^  [a-z0-9-]+:")  # a profile's first line under ``frameworks:``


def _set_fitted(text: str, key: str, value: float, section: str = "") -> str:
    """Replace the value on the first ``key:`` line marked ``# fitted``; with ``section``, the
    first one inside that framework profile."""
    lines = text.splitlines(keepends=True)
    start = 0
    if section:
        start = next((i + 1 for i, line in enumerate(lines)
                      if line.startswith(f"  {section}:")), len(lines))
    for i in range(start, len(lines)):
        line = lines[i]
        if section and PROFILE_LINE.match(line):
            break
        if line.lstrip().startswith(f"{key}:") and "# fitted" in line:
            indent = line[: len(line) - len(line.lstrip())]
            lines[i] = f"{indent}{key}: {value:.4g}  # fitted\n"
            return "".join(lines)
    where = f" in its {section} profile" if section else ""
    raise KeyError(f"frameworks.yaml has no fitted line for {key}{where}")


def stack_fractions(bounds: dict[str, LaunchedBound], fitted: float) -> dict[str, float]:
    """Each stack's fragmentation: its launched runs' bound where that is below the default
    allocator's ``fitted`` one (where they leave more room, they do not contradict it), rounded
    down to the 4 decimals written (rounded up, the run that sets it would not fit)."""
    return {stack: math.floor(min(b.fraction, fitted) * 1e4) / 1e4 for stack, b in bounds.items()}


def bound_section(stack: str) -> str:
    """The profile whose ``memory_model`` holds a stack's fitted fragmentation line: the
    stack's first in frameworks.yaml (the others alias its section)."""
    return next(p for p in load_profiles().get("frameworks", {}) if residual_stack(p) == stack)


def write_efficiencies(effs: dict[str, Efficiency]) -> Path:
    """calibration.yaml; a family priced on its measured cluster's fabric names it and leaves
    that fabric's network figures to fabrics.yaml (written once)."""
    def entry(e: Efficiency) -> dict[str, object]:
        out = dataclasses.asdict(e)
        drop = FABRIC_FIGURES if e.network_fabric else ("network_fabric",)
        return {k: v for k, v in out.items() if k not in drop}
    cal = CATALOG_DIR / "calibration.yaml"
    cal.write_text("# Written by `python -m tcf_search.calibration.fit --write`; do not edit by "
                   "hand.\n"
                   + yaml.safe_dump({f: entry(e) for f, e in effs.items()}, sort_keys=False))
    return cal


def write_calibration(effs: dict[str, Efficiency], mm: MemoryModel,
                      nanotron: dict[str, float], fractions: dict[str, float]) -> None:
    cal = write_efficiencies(effs)
    prof_path = PROFILES_FILE
    head, _, _ = prof_path.read_text().partition("\nmemory_model:")
    for key, value in nanotron.items():
        head = _set_fitted(head, key, value)
    for stack, value in fractions.items():
        head = _set_fitted(head, "allocator_fraction", value, bound_section(stack))
    prof_path.write_text(head + "\nmemory_model:\n" + "".join(
        f"  {k}: {v!r}\n" if k != "source" else f"  {k}: {json.dumps(v)}\n"
        for k, v in dataclasses.asdict(mm).items()))
    print("wrote", cal, "and", prof_path)


def allocator_model(memory: dict[str, float], rows: int) -> MemoryModel:
    """The generic memory model: the allocator's terms as fitted on ``rows`` Playbook runs."""
    return replace(MemoryModel(), **memory,  # type: ignore[arg-type]
                   source="fitted by python -m tcf_search.calibration.fit on Playbook ok runs "
                   f"of non-held-out groups: allocator_* on max_memory_reserved ({rows} rows);"
                   " activation_factor, logits_bytes_per_element and pressure_* are priors here "
                   "(Korthikanti's count; bf16 logits + fp32 softmax; no slowdown) and fitted for "
                   "nanotron in its profile")
