"""Framework profiles (``frameworks.yaml`` beside this file): how each training framework
behaves, as the cost model's :class:`~costmodel.framework.FrameworkProfile` (its switches and the
calibrated memory model), built by :func:`framework_profile` alone.

Switches are facts about the frameworks (their defaults); values marked ``# fitted`` and the
``memory_model`` section are written by ``python -m tcf_search.calibration.fit --write``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from costmodel.framework import FrameworkProfile
from costmodel.specs import MemoryModel

PROFILES_FILE = Path(__file__).with_name("frameworks.yaml")


PRECISIONS = ("bf16", "fp16", "fp8")
# a measured row's release, by the two forms its source_detail takes (release_key):
# a launch script's "<owner>/<repo>@<commit> <workload>/<file>" (the commit's first 8 hex digits
# and the workload's folder), or a performance table's "... section <release> <system>"
# (Megatron-Bridge's summary: the container release and the DGX system; the row's model then
# names the recipe), or a documentation table's "<file> @<commit> (<container> ...)" (NeMo's
# performance summary: the commit and the row's model)
RELEASE_KEY = re.compile(r"@([0-9a-f]{8})[0-9a-f]* ([\w.-]+)/")
SECTION_KEY = re.compile(r"\bsection (\S+) (\S+)\s*$")
DOC_KEY = re.compile(r"\.md @([0-9a-f]{8})[0-9a-f]* \(")

# The launchers a plan exports to (``tcf_search.export`` renders each; a test holds the two
# equal), so that a study's ``export.formats`` is checked before the search runs.
EXPORT_FORMATS: tuple[str, ...] = ("megatron", "nemo", "deepspeed", "torchtitan", "nanotron",
                                   "accelerate", "slurm")


@lru_cache(maxsize=1)
def load_profiles() -> dict[str, Any]:
    """Framework profiles (``frameworks.yaml`` beside this file): each framework's switches
    (data, not fitted) plus the values ``python -m tcf_search.calibration.fit`` fitted, and the
    fitted memory model."""
    raw = yaml.safe_load(PROFILES_FILE.read_text()) if PROFILES_FILE.exists() else {}
    return raw or {}


def memory_model(framework: str = "") -> MemoryModel:
    """The calibrated memory model: the PyTorch allocator's numbers (``memory_model``) with the
    framework's own activation/logits footprint (its profile's ``memory_model`` section)."""
    profiles = load_profiles()
    mm = MemoryModel(**(profiles.get("memory_model") or {}))
    own = profiles.get("frameworks", {}).get(framework, {}).get("memory_model")
    return replace(mm, **own) if own else mm


def resolve_framework(framework: str, source: str = "") -> str:
    """The profile a framework name runs: aliases (``megatron-core`` is ``megatron``) and, for
    a measured row, the release its ``source`` pins (Megatron-LM in the SC21 paper)."""
    profiles = load_profiles()
    name = framework.strip().lower()
    name = (profiles.get("aliases") or {}).get(name, name)
    return (profiles.get("source_releases") or {}).get(source.strip().lower(), {}).get(name, name)


def framework_settings(framework: str, precision: str = "bf16") -> dict[str, object]:
    """Training switches of a framework ('' or unknown: the generic Megatron-like profile),
    with its memory model. ``<switch>_<precision>`` entries apply at that precision only."""
    framework = resolve_framework(framework)
    frameworks = load_profiles().get("frameworks", {})
    settings = dict(frameworks.get("generic", {}))
    settings.update(frameworks.get(framework, {}))
    settings = _at_precision(settings, precision)
    settings["memory_model"] = memory_model(framework if framework in frameworks else "generic")
    return settings


def framework_profile(framework: str, precision: str = "bf16",
                      switches: Mapping[str, object] | None = None) -> FrameworkProfile:
    """The profile a framework runs at ``precision`` (:func:`framework_settings`: the generic
    profile, which names every switch, merged with the framework's), with ``switches`` (a
    study's allowed overrides, a measured row's release switches) on top."""
    return FrameworkProfile.from_switches({**framework_settings(framework, precision),
                                           **(switches or {})})


def _at_precision(settings: Mapping[str, object], precision: str) -> dict[str, object]:
    """``settings`` with each ``<switch>_<precision>`` entry applied at that precision only."""
    out = {k: v for k, v in settings.items() if k.rsplit("_", 1)[-1] not in PRECISIONS}
    for key, value in settings.items():
        base, _, prec = key.rpartition("_")
        if key not in out and prec == precision:
            out[base] = value
    return out


def release_key(detail: str, model: str = "") -> str:
    """The ``release_switches`` key of a measured row's release ('' where its source_detail
    names none): "<commit8> <workload>" for a launch script at a commit, "<release> <system>
    <model>" for a performance table's section, "<commit8> <model>" for a documentation table
    at a commit, the model as the row's ``model_name`` cell
    without its parenthesis, lower case, words joined by "-" ("Qwen3_30B_a3B" is
    "qwen3-30b-a3b", "DeepSeekV3 (w/ MTP)" is "deepseekv3")."""
    match = RELEASE_KEY.search(detail)
    if match:
        return f"{match[1]} {match[2]}"
    name = re.sub(r"\(.*?\)", "", model).strip().lower()
    name = re.sub(r"[^a-z0-9.]+", "-", name).strip("-")
    if match := SECTION_KEY.search(detail.strip()):
        return f"{match[1]} {match[2]} {name}"
    match = DOC_KEY.search(detail)
    return f"{match[1]} {name}" if match else ""


def release_switches(source: str, detail: str, model: str = "",
                     precision: str = "bf16") -> dict[str, object]:
    """What the release a measured row names ran (``release_switches`` in frameworks.yaml,
    under the row's ``source``, at :func:`release_key`), at ``precision``: Training switches and
    plan fields; {} for a release not listed."""
    releases = (load_profiles().get("release_switches") or {}).get(source.strip().lower(), {})
    key = release_key(detail, model)
    if not key or key not in releases:
        return {}
    # "*": what every listed release of the source ran, under its own entries
    return _at_precision({**releases.get("*", {}), **releases[key]}, precision)


def table_errata(source: str, detail: str, model: str = "") -> dict[str, object]:
    """The cells of a measured row's published table that its release's own code contradicts
    (``table_errata`` in frameworks.yaml, keyed as :func:`release_switches`): the code's
    values, and ``why``; {} for a row without any."""
    errata = (load_profiles().get("table_errata") or {}).get(source.strip().lower(), {})
    key = release_key(detail, model)
    return dict(errata.get(key) or {}) if key else {}


def row_defaults(framework: str, precision: str = "bf16", source: str = "",
                 detail: str = "", model: str = "") -> dict[str, object]:
    """What a measured row ran where its cells are silent (plan knobs and Training switches):
    ``framework``'s published recipes (``row_defaults`` in frameworks.yaml), then what the
    release its ``source_detail`` (and, for a table's section, its ``model_name``) names ran
    (:func:`release_switches`), each at ``precision``."""
    profiles = load_profiles()
    settings = _at_precision(
        (profiles.get("row_defaults") or {}).get(resolve_framework(framework), {}), precision)
    return {**settings, **release_switches(source, detail, model, precision)}


def megatron_core_profiles() -> list[str]:
    """The profiles that are Megatron-Core stacks (``megatron_core`` in frameworks.yaml), under
    which a study may name Megatron-Core's own switches."""
    return list(load_profiles().get("megatron_core") or [])


def is_megatron_core(framework: str) -> bool:
    return resolve_framework(framework) in megatron_core_profiles()


def frameworks() -> list[str]:
    """Names of the known framework profiles and their aliases."""
    profiles = load_profiles()
    return sorted([*profiles.get("frameworks", {}), *(profiles.get("aliases") or {})])
