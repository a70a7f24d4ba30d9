"""The hardware catalog: one cited YAML file per GPU SKU, loaded once into frozen ``GpuSpec``s.

>>> from hardware_catalog import get_gpu
>>> get_gpu("h100-sxm-80gb").peak_flops_bf16
989400000000000.0
"""

from __future__ import annotations

from hardware_catalog.catalog import (
    CATALOG_DIR,
    FABRIC_FIGURES,
    FAMILIES,
    CatalogError,
    UnknownSku,
    get_gpu,
    list_ids,
    load_calibration,
    load_catalog,
    sources,
)
from hardware_catalog.fabrics import (
    Fabric,
    UnknownFabric,
    fabric_fraction,
    fabric_step_latency,
    fabric_topology,
    get_fabric,
    load_fabrics,
)
from hardware_catalog.overrides import OVERRIDABLE_FIELDS, with_overrides
from hardware_catalog.prior_ranges import PriorRange, load_prior_ranges

__all__ = [
    "FABRIC_FIGURES",
    "CATALOG_DIR",
    "FAMILIES",
    "OVERRIDABLE_FIELDS",
    "CatalogError",
    "Fabric",
    "PriorRange",
    "UnknownFabric",
    "UnknownSku",
    "fabric_fraction",
    "fabric_step_latency",
    "fabric_topology",
    "get_fabric",
    "get_gpu",
    "list_ids",
    "load_calibration",
    "load_catalog",
    "load_fabrics",
    "load_prior_ranges",
    "sources",
    "with_overrides",
]
