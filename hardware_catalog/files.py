"""What every file of the catalog folder shares: where it is, its error, and how a YAML file and
a number in it are read (the SKU files, calibration.yaml, fabrics.yaml, prior_ranges.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from costmodel.errors import TcfError

CATALOG_DIR = Path(__file__).resolve().parent


class CatalogError(TcfError):
    """A catalog or calibration file breaks a rule; the message names the file and field."""


def as_number(where: str, raw: object) -> float:
    """A YAML scalar as a float. PyYAML reads ``1e12`` (no dot, no exponent sign) as a string,
    so numeric strings are accepted; booleans and anything else are not."""
    if isinstance(raw, bool):
        raise CatalogError(f"{where} must be a number, but got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            pass
    raise CatalogError(f"{where} must be a number, but got {raw!r}")


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path.name}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise CatalogError(f"{path.name}: top level must be a mapping, "
                           f"but got {type(doc).__name__}")
    return doc
