"""Apply user overrides (a CLI flag, a cluster file) to a catalog ``GpuSpec``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from costmodel.specs import Efficiency, GpuSpec, SpecError
from hardware_catalog.catalog import (
    FABRIC_FIGURES,
    NUMERIC_FIELDS,
    CatalogError,
    as_number,
    efficiency_from_mapping,
)

# The id names the SKU a plan was made for; renaming it through an override would hide that.
OVERRIDABLE_FIELDS: tuple[str, ...] = ("name", "family", *NUMERIC_FIELDS, "efficiency")


def with_overrides(gpu: GpuSpec, overrides: Mapping[str, Any]) -> GpuSpec:
    """``gpu`` with ``overrides`` applied; ``efficiency`` may be a partial dict of its fields.

    An overridden efficiency gets its source extended with the keys that were changed, so that
    reports still say where each number came from.
    """
    unknown = sorted(set(overrides) - set(OVERRIDABLE_FIELDS))
    if unknown:
        raise CatalogError(f"gpu override keys {unknown} are not valid for {gpu.id!r}; "
                           f"valid keys: {list(OVERRIDABLE_FIELDS)}")
    changes: dict[str, Any] = {}
    for key, raw in overrides.items():
        where = f"gpu override '{key}'"
        if key == "efficiency":
            changes[key] = _efficiency_override(gpu.efficiency, raw)
        elif key in ("name", "family"):
            if not isinstance(raw, str):
                raise CatalogError(f"{where} must be a string, but got {raw!r}")
            changes[key] = raw
        else:
            value = as_number(where, raw)
            if not value > 0:
                raise CatalogError(f"{where} must be > 0, but got {value}")
            if key == "intra_node_domain_size":
                if value != int(value):
                    raise CatalogError(f"{where} must be a whole number, but got {value}")
                changes[key] = int(value)
            else:
                changes[key] = value
    try:
        return dataclasses.replace(gpu, **changes)
    except SpecError as exc:
        raise CatalogError(str(exc)) from exc


def _efficiency_override(base: Efficiency, raw: object) -> Efficiency:
    if isinstance(raw, Efficiency):
        return raw
    if not isinstance(raw, Mapping):
        raise CatalogError(f"gpu override 'efficiency' must be a mapping or Efficiency, "
                           f"but got {raw!r}")
    entry = dict(raw)
    if "source" not in entry:
        changed = ", ".join(sorted(entry))
        entry["source"] = f"{base.source}; overridden: {changed}"
    if set(entry) & set(FABRIC_FIGURES) and "network_fabric" not in entry:
        entry["network_fabric"] = ""  # the network figures are the user's, not a fabric's
    return efficiency_from_mapping("gpu override 'efficiency'", base, entry)
