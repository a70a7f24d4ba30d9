"""The plausible range of each cost-model prior no measured row validates
(``prior_ranges.yaml``): cited data that ``search.uncertainty`` re-prices a plan at."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from costmodel.specs import Efficiency
from hardware_catalog.files import CATALOG_DIR, CatalogError, as_number, read_yaml

PRIOR_RANGES_FILE = "prior_ranges.yaml"
_KEYS = frozenset({"low", "high", "source"})
_FIELDS = frozenset(f.name for f in dataclasses.fields(Efficiency)) - {"source"}


@dataclass(frozen=True, slots=True)
class PriorRange:
    """An Efficiency prior's plausible ends, in its own units, and where they come from."""

    field: str
    low: float
    high: float
    source: str


@functools.lru_cache(maxsize=4)
def _load(directory: Path) -> dict[str, PriorRange]:
    path = directory / PRIOR_RANGES_FILE
    if not path.exists():
        return {}
    out: dict[str, PriorRange] = {}
    for name, entry in read_yaml(path).items():
        where = f"{path.name}: {name}"
        if name not in _FIELDS:
            raise CatalogError(f"{where}: unknown Efficiency field (valid: {sorted(_FIELDS)})")
        if not isinstance(entry, dict) or set(entry) != _KEYS:
            raise CatalogError(f"{where}: needs exactly {sorted(_KEYS)}")
        low = as_number(f"{where}.low", entry["low"])
        high = as_number(f"{where}.high", entry["high"])
        if not 0.0 <= low <= high:
            raise CatalogError(f"{where}: 0 <= low <= high must hold, but got low={low}, "
                               f"high={high}")
        out[str(name)] = PriorRange(field=str(name), low=low, high=high,
                                    source=str(entry["source"]))
    return out


def load_prior_ranges(directory: Path | str | None = None) -> dict[str, PriorRange]:
    """Efficiency field -> its plausible range; empty where the file does not exist."""
    return dict(_load(CATALOG_DIR if directory is None else Path(directory).resolve()))
