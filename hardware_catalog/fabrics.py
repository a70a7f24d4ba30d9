"""Inter-node fabrics (``fabrics.yaml``): how much of the NICs' bandwidth collectives reach.

The network efficiency of a cluster depends on its fabric (InfiniBand, RoCE, EFA, ...), its
topology and its NCCL plugin, not on the GPU. A study or a measured row may name its fabric;
without one the cluster is priced as its GPU family's measured cluster was: the fabric that
family's calibration names (``network_fabric`` in calibration.yaml), resolved when the
calibration is loaded, so each fabric's figures are written once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from hardware_catalog.files import CATALOG_DIR, CatalogError, as_number, read_yaml

FABRICS_FILE = "fabrics.yaml"
_KEYS = frozenset({"description", "network_bw_fraction", "network_step_latency_s", "source",
                   "rail_group_nodes", "oversubscription"})


@dataclass(frozen=True, slots=True)
class Fabric:
    id: str
    description: str
    network_bw_fraction: float
    source: str
    # what one ring step across this fabric waits, where measured runs fit it; 0: the GPU's
    # NCCL prior (GpuSpec.network_latency_s)
    network_step_latency_s: float = 0.0
    # its topology: the nodes whose rails share leaf switches (0: not given, one group), and the
    # leaves' downlink over uplink bandwidth into the spine (1: non-blocking)
    rail_group_nodes: int = 0
    oversubscription: float = 1.0


class UnknownFabric(CatalogError):
    """No fabric has the requested id; the message lists the valid ids."""


@functools.lru_cache(maxsize=4)
def _load(directory: Path) -> dict[str, Fabric]:
    path = directory / FABRICS_FILE
    if not path.exists():
        return {}
    out: dict[str, Fabric] = {}
    for fid, entry in read_yaml(path).items():
        where = f"{path.name}: {fid}"
        if not isinstance(entry, dict) or not {"network_bw_fraction", "source"} <= set(entry):
            raise CatalogError(f"{where}: needs network_bw_fraction and source")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise CatalogError(f"{where}.{unknown[0]}: unknown key (valid: {sorted(_KEYS)})")
        frac = as_number(f"{where}.network_bw_fraction", entry["network_bw_fraction"])
        if not 0.0 < frac <= 1.0:
            raise CatalogError(f"{where}.network_bw_fraction must be in (0, 1], but got {frac}")
        step = as_number(f"{where}.network_step_latency_s",
                         entry.get("network_step_latency_s", 0.0))
        if not 0.0 <= step < 1.0:
            raise CatalogError(f"{where}.network_step_latency_s must be in [0, 1) seconds, "
                               f"but got {step}")
        group = as_number(f"{where}.rail_group_nodes", entry.get("rail_group_nodes", 0))
        if group < 0 or group != int(group):
            raise CatalogError(f"{where}.rail_group_nodes must be a whole number >= 0, "
                               f"but got {group}")
        over = as_number(f"{where}.oversubscription", entry.get("oversubscription", 1.0))
        if not over >= 1.0:
            raise CatalogError(f"{where}.oversubscription must be >= 1 (downlinks over uplinks),"
                               f" but got {over}")
        out[str(fid)] = Fabric(id=str(fid), description=str(entry.get("description", "")),
                               network_bw_fraction=frac, source=str(entry["source"]),
                               network_step_latency_s=step, rail_group_nodes=int(group),
                               oversubscription=over)
    return out


def load_fabrics(directory: Path | str | None = None) -> dict[str, Fabric]:
    root = CATALOG_DIR if directory is None else Path(directory).resolve()
    return dict(_load(root))


def get_fabric(fabric_id: str, directory: Path | str | None = None) -> Fabric:
    fabrics = load_fabrics(directory)
    try:
        return fabrics[fabric_id]
    except KeyError:
        raise UnknownFabric(f"unknown fabric {fabric_id!r}; valid ids: "
                            f"{', '.join(sorted(fabrics)) or '(none)'}") from None


def fabric_fraction(fabric_id: str, directory: Path | str | None = None) -> float | None:
    """The fabric's network fraction; None for "" (fabric not given)."""
    return get_fabric(fabric_id, directory).network_bw_fraction if fabric_id else None


def fabric_topology(fabric_id: str, directory: Path | str | None = None) -> tuple[int, float]:
    """The fabric's rail-group size and spine oversubscription; (0, 1.0) for "" (not given:
    one group, non-blocking)."""
    if not fabric_id:
        return 0, 1.0
    fab = get_fabric(fabric_id, directory)
    return fab.rail_group_nodes, fab.oversubscription


def fabric_step_latency(fabric_id: str, directory: Path | str | None = None) -> float | None:
    """The fabric's fitted ring-step latency; None for "" or a fabric that has none (the GPU's
    NCCL prior applies)."""
    step = get_fabric(fabric_id, directory).network_step_latency_s if fabric_id else 0.0
    return step or None
