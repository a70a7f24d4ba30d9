"""Load the per-SKU YAML files of this folder into frozen ``GpuSpec`` objects.

Each ``<id>.yaml`` holds ``id``, ``name``, ``family``, ``notes`` and one entry per numeric
``GpuSpec`` field: ``{value: <SI units>, source: "<datasheet + URL>", note: "<optional>"}``;
byte fields may give ``value_gib`` instead of ``value``. ``calibration.yaml``, when present, maps
a family to ``Efficiency`` fields plus ``source``. See README.md in this folder.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from costmodel.specs import Efficiency, GpuSpec, SpecError
from hardware_catalog.fabrics import get_fabric
from hardware_catalog.files import CATALOG_DIR, CatalogError, as_number, read_yaml

CALIBRATION_FILE = "calibration.yaml"
DATA_FILES = frozenset({CALIBRATION_FILE, "fabrics.yaml", "frameworks.yaml",  # not SKUs
                        "prior_ranges.yaml", "uncertainty.yaml", "anchored.yaml"})
FAMILIES = ("ampere", "hopper", "blackwell", "ada", "cdna3", "cpu")
# Families no measured run has fitted, each with the nearest fitted family it borrows from
# (CDNA4 from Hopper, as CDNA3 does; Blackwell Ultra from Blackwell, its own silicon's base).
# The fit writes FAMILIES alone, so a borrower takes its lender's entry as calibration.yaml holds
# it, labelled "transferred from the <lender> fit" as the fit labels its own transfers (which
# search.uncertainty.calibration_status reports as "borrowed from <lender>, unvalidated"); an
# entry of its own in calibration.yaml, once measured runs fit one, wins.
BORROWED_FAMILIES: dict[str, str] = {"cdna4": "hopper", "blackwell-ultra": "blackwell"}
SKU_FAMILIES = (*FAMILIES, *BORROWED_FAMILIES)
# optional blocks of an entry written by `tcf-search calibrate`: its own measured efficiency
# (used instead of the family's) and the raw measurements behind it (kept, not read)
_MEASURED_BLOCKS = ("efficiency", "measurements")
UNCALIBRATED_SOURCE = "prior (uncalibrated)"
# 0 is a value of these: none measured, or (FlashAttention-1's fraction) not told apart from
# FlashAttention-2's
_ZERO_MEANS_UNMEASURED = frozenset({"dtensor_op_overhead_s", "network_step_latency_s",
                                    "flash1_attention_peak_fraction"})
_EFFICIENCY_TEXT = frozenset({"source", "network_fabric"})
# what a family naming its measured cluster's fabric reads from that fabric (fabrics.yaml)
FABRIC_FIGURES: tuple[str, ...] = ("network_bw_fraction", "network_step_latency_s")
GIB = 2**30

_TEXT_FIELDS = ("id", "name", "family", "notes")
NUMERIC_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(GpuSpec)
    if f.name not in (*_TEXT_FIELDS, "efficiency")
)
_INT_FIELDS = frozenset({"intra_node_domain_size", "sm_count"})
# what a SKU may leave out: the host link and host memory (0: nothing offloads to the host),
# an FP8 peak (absent: no FP8 tensor cores, as on A100; GpuSpec.precisions) and the bytes of a
# weight's cached fp8 copy (absent: 1, the data alone), the SM count (absent: 0, the SMs a
# communication kernel holds beside compute are not priced) and the measured matmul ceiling
# (absent: 0, a borrowed fit is not rescaled) and the host CPU's issue time (absent: 1, an x86
# DGX host's)
OPTIONAL_FIELDS = frozenset({"host_link_bw_bytes_per_s", "host_memory_bytes",
                             "host_link_network_share", "peak_flops_fp8",
                             "fp8_weight_copy_bytes", "sm_count", "matmul_bf16_flops",
                             "host_issue_factor"})
# The SKU each fitted family's measured rows ran on, whose matmul ceiling its fractions sit under
REFERENCE_SKUS: dict[str, str] = {"ampere": "a100-sxm-80gb", "hopper": "h100-sxm-80gb",
                                  "blackwell": "b200-180gb"}
# the efficiency fields the matrix units' rate bounds: GEMMs, fp8 GEMMs and flash attention
MATMUL_BOUND = ("gemm_peak_fraction", "fp8_gemm_peak_fraction", "attention_peak_fraction",
                "flash1_attention_peak_fraction", "flash3_attention_peak_fraction")
TRANSFERRED = "transferred from the "
MATMUL_SCALED = "matmul-bound fractions x "
_ENTRY_KEYS = frozenset({"value", "value_gib", "source", "note"})
EFFICIENCY_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Efficiency) if f.name != "source"
)


class UnknownSku(CatalogError):
    """No catalog entry has the requested id; the message lists the valid ids."""


def _numeric_entry(path: Path, field: str, entry: object) -> float:
    where = f"{path.name}: {field}"
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} must be a mapping {{value, source}}, but got {entry!r}")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise CatalogError(f"{where} has unknown keys {unknown}; allowed: {sorted(_ENTRY_KEYS)}")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise CatalogError(f"{where}.source is required (datasheet title + URL), but is missing")
    if ("value" in entry) == ("value_gib" in entry):
        raise CatalogError(f"{where} needs exactly one of 'value' or 'value_gib'")
    if "value_gib" in entry:
        if not field.endswith("_bytes"):
            raise CatalogError(f"{where}.value_gib is only allowed on *_bytes fields")
        value = as_number(f"{where}.value_gib", entry["value_gib"]) * GIB
    else:
        value = as_number(f"{where}.value", entry["value"])
    if not value > 0:
        raise CatalogError(f"{where} must be > 0, but got {value}")
    if field in _INT_FIELDS and value != int(value):
        raise CatalogError(f"{where} must be a whole number, but got {value}")
    return value


def _parse_sku(path: Path, efficiency: dict[str, Efficiency]) -> GpuSpec:
    doc = read_yaml(path)
    unknown = sorted(set(doc) - set(_TEXT_FIELDS) - set(NUMERIC_FIELDS) - set(_MEASURED_BLOCKS))
    if unknown:
        raise CatalogError(f"{path.name}: unknown fields {unknown}; "
                           f"allowed: {sorted((*_TEXT_FIELDS, *NUMERIC_FIELDS))}")
    for field in (*_TEXT_FIELDS, *NUMERIC_FIELDS):
        if field not in doc and field not in OPTIONAL_FIELDS:
            raise CatalogError(f"{path.name}: required field '{field}' is missing")
    for field in _TEXT_FIELDS:
        if not isinstance(doc[field], str) or not doc[field].strip():
            raise CatalogError(f"{path.name}: {field} must be a non-empty string, "
                               f"but got {doc[field]!r}")
    if doc["id"] != path.stem:
        raise CatalogError(f"{path.name}: id must equal the file name '{path.stem}', "
                           f"but got id={doc['id']!r}")
    if doc["family"] not in SKU_FAMILIES:
        raise CatalogError(f"{path.name}: family must be one of {list(SKU_FAMILIES)}, "
                           f"but got {doc['family']!r}")
    numbers: dict[str, Any] = {f: _numeric_entry(path, f, doc[f]) for f in NUMERIC_FIELDS
                               if f in doc}
    for field in _INT_FIELDS & numbers.keys():
        numbers[field] = int(numbers[field])
    eff = family_efficiency(doc["family"], efficiency)
    if "efficiency" in doc:
        own = doc["efficiency"]
        if not isinstance(own, dict) or "source" not in own:
            raise CatalogError(f"{path.name}: efficiency.source is required (how it was measured)")
        eff = efficiency_from_mapping(f"{path.name}: efficiency", Efficiency(), own)
    try:
        return GpuSpec(id=doc["id"], name=doc["name"], family=doc["family"], efficiency=eff,
                       **numbers)
    except SpecError as exc:
        raise CatalogError(f"{path.name}: {exc}") from exc


def family_efficiency(family: str, efficiency: dict[str, Efficiency]) -> Efficiency:
    """The family's calibrated efficiency; a borrowing family's lender's, saying so; the prior
    where neither has an entry."""
    if family in efficiency:
        return efficiency[family]
    lender = BORROWED_FAMILIES.get(family, "")
    if lender in efficiency:
        own = efficiency[lender]
        return dataclasses.replace(own, source=f"transferred from the {lender} fit: no measured "
                                   f"{family} runs to fit (the {lender} fit: {own.source})")
    return Efficiency(source=UNCALIBRATED_SOURCE)


def efficiency_from_mapping(where: str, base: Efficiency, entry: object) -> Efficiency:
    """``base`` with the fields of ``entry`` (a mapping of Efficiency fields) replaced."""
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} must be a mapping of Efficiency fields, but got {entry!r}")
    unknown = sorted(set(entry) - set(EFFICIENCY_FIELDS) - {"source"})
    if unknown:
        raise CatalogError(f"{where} has unknown keys {unknown}; "
                           f"valid: {sorted((*EFFICIENCY_FIELDS, 'source'))}")
    values: dict[str, Any] = {}
    for key, raw in entry.items():
        if key in _EFFICIENCY_TEXT:
            if not isinstance(raw, str) or (key == "source" and not raw.strip()):
                need = "a non-empty string" if key == "source" else "a string"
                raise CatalogError(f"{where}.{key} must be {need}, got {raw!r}")
            values[key] = raw
            continue
        value = as_number(f"{where}.{key}", raw)
        if not (value > 0 or (key in _ZERO_MEANS_UNMEASURED and value == 0)):
            raise CatalogError(f"{where}.{key} must be > 0, but got {value}")
        values[key] = value
    return dataclasses.replace(base, **values)


def with_network_fabric(where: str, eff: Efficiency, directory: Path) -> Efficiency:
    """``eff`` with the network fraction and ring step of the fabric it names (``network_fabric``:
    the family's measured cluster's), read from that directory's fabrics.yaml: the figures are
    the fabric's, written once there."""
    if not eff.network_fabric:
        return eff
    try:
        fab = get_fabric(eff.network_fabric, directory)
    except CatalogError as exc:
        raise CatalogError(f"{where}.network_fabric: {exc}") from None
    return dataclasses.replace(eff, network_bw_fraction=fab.network_bw_fraction,
                               network_step_latency_s=fab.network_step_latency_s)


def load_calibration(directory: Path) -> dict[str, Efficiency]:
    """Family -> Efficiency from ``calibration.yaml``; empty when the file does not exist. A
    family that names its measured cluster's fabric (``network_fabric``) takes that fabric's
    network figures and may not give them again."""
    path = directory / CALIBRATION_FILE
    if not path.exists():
        return {}
    doc = read_yaml(path)
    result: dict[str, Efficiency] = {}
    for family, entry in doc.items():
        where = f"{path.name}: {family}"
        if family not in SKU_FAMILIES:
            raise CatalogError(f"{path.name}: unknown family {family!r}; "
                               f"valid: {list(SKU_FAMILIES)}")
        if not isinstance(entry, dict) or "source" not in entry:
            raise CatalogError(f"{path.name}: {family}.source is required (the fit and its rows)")
        twice = sorted(set(entry) & set(FABRIC_FIGURES)) if "network_fabric" in entry else []
        if twice:
            raise CatalogError(f"{where}.{twice[0]}: given with network_fabric, whose fabric "
                               "(fabrics.yaml) holds it; write it once, there")
        eff = efficiency_from_mapping(where, Efficiency(), entry)
        result[family] = with_network_fabric(where, eff, directory)
    return result


def lender_of(eff: Efficiency) -> str:
    """The fitted family an efficiency was transferred from ("" when fitted or a prior)."""
    if TRANSFERRED not in eff.source:
        return ""
    return eff.source.split(TRANSFERRED, 1)[1].split(" ", 1)[0]


def transfer_efficiency(eff: Efficiency, lender: str, gpu: GpuSpec,
                        skus: dict[str, GpuSpec]) -> Efficiency:
    """A fit carried from ``lender``'s runs to ``gpu``: the matmul-bound fractions keep their
    share of the SKU's own measured matmul ceiling (``matmul_bf16_flops`` over its bf16 peak)
    instead of its datasheet peak, ``x (gpu's ceiling / peak) / (the lender's reference SKU's)``:
    the vendor library's reach differs by SKU far more than the fit's stack effects do (H100
    reaches 80% of its peak in matmuls, MI300X 51%). Unchanged where either gives none; fp8 GEMMs
    and flash attention take the bf16 ratio (no fp8 ceiling is measured on the SKUs that
    borrow)."""
    ref = skus.get(REFERENCE_SKUS.get(lender, ""))
    if ref is None or gpu.matmul_bf16_flops <= 0 or ref.matmul_bf16_flops <= 0:
        return eff
    ratio = ((gpu.matmul_bf16_flops / gpu.peak_flops_bf16)
             / (ref.matmul_bf16_flops / ref.peak_flops_bf16))
    scaled = {f: getattr(eff, f) * ratio for f in MATMUL_BOUND}
    tf = 1e12
    return dataclasses.replace(
        eff, **scaled, source=f"{eff.source}; {MATMUL_SCALED}{ratio:.3f}: {gpu.id}'s measured "
        f"matmul ceiling {gpu.matmul_bf16_flops / tf:.0f} of {gpu.peak_flops_bf16 / tf:.0f} "
        f"TFLOP/s against {ref.id}'s {ref.matmul_bf16_flops / tf:.0f} of "
        f"{ref.peak_flops_bf16 / tf:.0f}")


def _transferred(gpu: GpuSpec, skus: dict[str, GpuSpec]) -> GpuSpec:
    lender = lender_of(gpu.efficiency)
    if not lender:
        return gpu
    return dataclasses.replace(
        gpu, efficiency=transfer_efficiency(gpu.efficiency, lender, gpu, skus))


@functools.lru_cache(maxsize=8)
def _load(directory: Path) -> dict[str, GpuSpec]:
    if not directory.is_dir():
        raise CatalogError(f"catalog directory {str(directory)!r} does not exist")
    efficiency = load_calibration(directory)
    paths = sorted(p for p in directory.glob("*.yaml") if p.name not in DATA_FILES)
    if not paths:
        raise CatalogError(f"catalog directory {str(directory)!r} holds no <id>.yaml files")
    skus = {p.stem: _parse_sku(p, efficiency) for p in paths}
    return {k: _transferred(gpu, skus) for k, gpu in skus.items()}


def load_catalog(directory: Path | str | None = None) -> dict[str, GpuSpec]:
    """Every SKU of ``directory`` (default: this package's data), loaded once and cached."""
    root = CATALOG_DIR if directory is None else Path(directory).resolve()
    return dict(_load(root))


def list_ids(directory: Path | str | None = None) -> list[str]:
    return sorted(load_catalog(directory))


def sources(sku_id: str, directory: Path | str | None = None) -> dict[str, dict[str, str]]:
    """Each catalogued number of the SKU with its source (and note), as its file gives them, and
    where its efficiency comes from: what ``tcf-search catalog show`` cites."""
    gpu = get_gpu(sku_id, directory)
    root = CATALOG_DIR if directory is None else Path(directory).resolve()
    doc = read_yaml(root / f"{sku_id}.yaml")
    cited = {field: {k: str(doc[field][k]) for k in ("source", "note") if k in doc[field]}
             for field in NUMERIC_FIELDS if field in doc}
    cited["efficiency"] = {"source": gpu.efficiency.source}
    return cited


def get_gpu(sku_id: str, directory: Path | str | None = None) -> GpuSpec:
    """The SKU with exactly this id; ``UnknownSku`` lists the valid ids otherwise."""
    catalog = load_catalog(directory)
    try:
        return catalog[sku_id]
    except KeyError:
        raise UnknownSku(f"unknown GPU SKU {sku_id!r}; valid ids: "
                         f"{', '.join(sorted(catalog))}") from None
