"""Contract tests over every catalog entry, plus the loader's errors and overrides."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from costmodel.specs import Efficiency, GpuSpec
from hardware_catalog import (
    CATALOG_DIR,
    CatalogError,
    UnknownSku,
    get_gpu,
    list_ids,
    load_catalog,
    with_overrides,
)
from hardware_catalog.catalog import NUMERIC_FIELDS, OPTIONAL_FIELDS, UNCALIBRATED_SOURCE

REQUIRED_IDS = {
    "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-pcie-80gb", "h100-sxm-96gb-500w",
    "h200-sxm-141gb", "b200-180gb", "gb200-nvl72", "mi300x", "mi325x", "l40s",
    "h800-sxm-80gb", "a800-sxm-40gb", "a800-sxm-80gb",
    "mi355x", "mi350x", "b300-288gb", "gb300-nvl72",
}
WITHOUT_FP8 = {"a100-sxm-40gb", "a100-sxm-80gb", "a800-sxm-40gb", "a800-sxm-80gb"}
GIB = 2**30
IDS = sorted(REQUIRED_IDS)
DEFAULTS = {f.name: f.default for f in dataclasses.fields(GpuSpec)}


def _raw(sku_id: str) -> dict:
    return yaml.safe_load((CATALOG_DIR / f"{sku_id}.yaml").read_text())


def test_catalog_holds_every_required_sku() -> None:
    assert REQUIRED_IDS <= set(list_ids())
    assert list_ids() == sorted(load_catalog())


def test_catalog_is_loaded_once() -> None:
    assert get_gpu("h100-sxm-80gb") is get_gpu("h100-sxm-80gb")


@pytest.mark.parametrize("sku_id", IDS)
def test_every_number_is_positive_and_cited(sku_id: str) -> None:
    gpu, raw = get_gpu(sku_id), _raw(sku_id)
    assert gpu.id == sku_id and gpu.name and gpu.family
    for field in NUMERIC_FIELDS:
        if field in OPTIONAL_FIELDS and field not in raw:  # GpuSpec's default (host link: 0)
            assert getattr(gpu, field) == DEFAULTS[field], field
            continue
        assert getattr(gpu, field) > 0, field
        assert len(raw[field]["source"]) > 20, f"{sku_id}.{field} source is too thin to check"


def test_offload_hosts_are_catalogued_where_frameworks_offload() -> None:
    """The SKUs Megatron-Core's activation offloading runs on in practice carry a host link
    below their NVLink and host memory above their HBM; a SKU without them offloads nothing."""
    for sku_id in ("h100-sxm-80gb", "h200-sxm-141gb", "b200-180gb", "gb200-nvl72"):
        gpu = get_gpu(sku_id)
        assert 0 < gpu.host_link_bw_bytes_per_s < gpu.intra_node_bw_bytes_per_s
        assert gpu.host_memory_bytes > gpu.hbm_bytes
    assert get_gpu("mi300x").host_link_bw_bytes_per_s == 0


@pytest.mark.parametrize("sku_id", IDS)
def test_precision_peaks_are_ordered(sku_id: str) -> None:
    gpu = get_gpu(sku_id)
    assert gpu.peak_flops_fp16 == gpu.peak_flops_bf16  # same tensor-core rate on all of these
    if sku_id in WITHOUT_FP8:  # no FP8 tensor cores: no FP8 peak, so no fp8 training
        assert gpu.peak_flops_fp8 == 0 and "fp8" not in gpu.precisions
    else:
        # Dense FP8 is twice dense BF16 on Hopper, Blackwell and CDNA3; L40S prints 733 vs 362.05.
        assert gpu.peak_flops_fp8 == pytest.approx(2 * gpu.peak_flops_bf16, rel=0.02)


@pytest.mark.parametrize("sku_id", IDS)
def test_values_are_dense_unidirectional_and_in_range(sku_id: str) -> None:
    gpu = get_gpu(sku_id)
    # Dense bf16 of every SKU here lies between L40S (362 TF) and MI355X (2.52 PF); a sparse
    # figure or a TFLOPS-vs-FLOPS slip would fall outside.
    assert 300e12 <= gpu.peak_flops_bf16 <= 2.52e15
    assert 1 <= gpu.hbm_bw_bytes_per_s / 1e12 <= 8.0 or gpu.family == "ada"
    limit = {"ampere": 300e9, "hopper": 450e9, "ada": 32e9, "cdna3": 448e9, "blackwell": 900e9,
             "cdna4": 537.6e9, "blackwell-ultra": 900e9}
    assert gpu.intra_node_bw_bytes_per_s <= limit[gpu.family]  # unidirectional: half the ads
    assert gpu.network_bw_bytes_per_s < gpu.intra_node_bw_bytes_per_s or gpu.family == "ada"
    assert 0 < gpu.intra_node_latency_s < gpu.network_latency_s < 1e-4
    assert isinstance(gpu.intra_node_domain_size, int)


@pytest.mark.parametrize("sku_id", IDS)
def test_memory_is_reported_capacity_minus_a_reserve(sku_id: str) -> None:
    gpu = get_gpu(sku_id)
    assert 0 < gpu.usable_bytes < gpu.hbm_bytes
    assert 0.5 * GIB <= gpu.memory_reserve_bytes <= 4 * GIB
    assert 39 * GIB < gpu.hbm_bytes < 288 * GIB  # 288 GiB on MI355X, of which HIP shows 287.98


def test_worked_examples() -> None:
    h100 = get_gpu("h100-sxm-80gb")
    assert h100.intra_node_bw_bytes_per_s == 450e9  # NVLink4 900 GB/s bidirectional / 2
    assert h100.network_bw_bytes_per_s == 50e9  # 400 Gb/s / 8 bits
    assert h100.hbm_bytes == pytest.approx(79.11 * GIB)
    assert h100.usable_bytes == pytest.approx((79.11 - 1.5) * GIB)
    assert get_gpu("gb200-nvl72").intra_node_domain_size == 72
    assert get_gpu("b200-180gb").intra_node_domain_size == 8



def test_blackwell_worked_examples() -> None:
    """NVIDIA's sparse figures halved: HGX B200 (1,000 W) 4.5 / 9 PFLOPS bf16 / fp8 sparse ->
    2.25 / 4.5 dense; GB200 NVL72 (1,200 W) 360 / 720 PFLOPS per 72-GPU rack -> 5 / 10 per GPU
    sparse -> 2.5 / 5 dense. The one GPU differs by its power, so every peak by the same 10/9;
    HBM 7.7 vs 576 TB/s / 72 = 8 TB/s; NVLink5 1.8 TB/s bidirectional -> 900 GB/s on both; one
    400 Gb/s NIC (50 GB/s) per GPU on both."""
    b200, gb200 = get_gpu("b200-180gb"), get_gpu("gb200-nvl72")
    assert (b200.peak_flops_bf16, b200.peak_flops_fp8) == (2.25e15, 4.5e15)
    assert (gb200.peak_flops_bf16, gb200.peak_flops_fp8) == (2.5e15, 5.0e15)
    for field in ("peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp8"):
        assert getattr(gb200, field) / getattr(b200, field) == pytest.approx(10 / 9)
    assert (b200.hbm_bw_bytes_per_s, gb200.hbm_bw_bytes_per_s) == (7.7e12, 8.0e12)
    assert b200.intra_node_bw_bytes_per_s == gb200.intra_node_bw_bytes_per_s == 900e9
    assert b200.network_bw_bytes_per_s == gb200.network_bw_bytes_per_s == 50e9
    assert b200.family == gb200.family == "blackwell"  # one calibration for both

def test_unknown_id_lists_valid_ids() -> None:
    with pytest.raises(UnknownSku) as err:
        get_gpu("h100")
    assert isinstance(err.value, ValueError)
    assert "'h100'" in str(err.value) and all(i in str(err.value) for i in REQUIRED_IDS)


def test_uncalibrated_family_gets_prior() -> None:
    if (CATALOG_DIR / "calibration.yaml").exists():
        pytest.skip("the package ships a calibration")
    assert get_gpu("l40s").efficiency == Efficiency(source=UNCALIBRATED_SOURCE)


# --------------------------------------------------------------------------- overrides


def test_overrides_replace_fields_and_nested_efficiency() -> None:
    gpu = get_gpu("h100-sxm-96gb-500w")
    new = with_overrides(gpu, {"peak_flops_bf16": 800e12, "intra_node_domain_size": 8,
                               "efficiency": {"gemm_peak_fraction": 0.6}})
    assert new.peak_flops_bf16 == 800e12 and new.intra_node_domain_size == 8
    assert new.efficiency.gemm_peak_fraction == 0.6
    assert new.efficiency.memory_bw_fraction == gpu.efficiency.memory_bw_fraction
    assert "gemm_peak_fraction" in new.efficiency.source
    assert get_gpu("h100-sxm-96gb-500w").peak_flops_bf16 == gpu.peak_flops_bf16 != 800e12


def test_override_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(CatalogError, match="peak_flops_bf16") as err:
        with_overrides(get_gpu("l40s"), {"peak_tflops": 1.0})
    assert "peak_tflops" in str(err.value)
    with pytest.raises(CatalogError, match="gemm_peak_fraction"):
        with_overrides(get_gpu("l40s"), {"efficiency": {"gemm_peak": 0.5}})


@pytest.mark.parametrize("overrides", [{"hbm_bytes": 0}, {"network_bw_bytes_per_s": -1.0},
                                       {"intra_node_domain_size": 2.5}, {"hbm_bytes": True},
                                       {"id": "other"}])
def test_override_rejects_bad_values(overrides: dict) -> None:
    with pytest.raises(CatalogError, match=next(iter(overrides))):
        with_overrides(get_gpu("mi300x"), overrides)


# --------------------------------------------------------------------------- malformed files


@pytest.fixture
def tmp_catalog(tmp_path: Path) -> Path:
    shutil.copy(CATALOG_DIR / "h100-sxm-80gb.yaml", tmp_path / "h100-sxm-80gb.yaml")
    return tmp_path


def _edit(path: Path, change: Callable[[dict], object]) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


def test_directory_argument_loads_that_folder(tmp_catalog: Path) -> None:
    assert list_ids(tmp_catalog) == ["h100-sxm-80gb"]
    here, main = get_gpu("h100-sxm-80gb", tmp_catalog), get_gpu("h100-sxm-80gb")
    # the copy has no calibration.yaml beside it: same numbers, prior efficiency
    assert dataclasses.replace(here, efficiency=main.efficiency) == main
    assert here.efficiency.source == "prior (uncalibrated)"


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("hbm_bw_bytes_per_s"), "'hbm_bw_bytes_per_s' is missing"),
    (lambda d: d["peak_flops_fp8"].pop("source"), r"peak_flops_fp8\.source is required"),
    (lambda d: d["network_latency_s"].update(value=0), "network_latency_s must be > 0"),
    (lambda d: d["hbm_bytes"].update(value_gib="lots"), "hbm_bytes.value_gib must be a number"),
    (lambda d: d.update(family="volta"), "family must be one of"),
    (lambda d: d.update(id="h100"), "id must equal the file name"),
    (lambda d: d.update(peak_tflops={"value": 1, "source": "x"}), "unknown fields"),
    (lambda d: d["intra_node_domain_size"].update(value=7.5), "must be a whole number"),
])
def test_malformed_file_names_file_and_field(
        tmp_catalog: Path, change: Callable[[dict], object], message: str) -> None:
    _edit(tmp_catalog / "h100-sxm-80gb.yaml", change)
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog(tmp_catalog)
    assert "h100-sxm-80gb.yaml" in str(err.value)


def test_exponent_without_sign_is_still_a_number(tmp_catalog: Path) -> None:
    path = tmp_catalog / "h100-sxm-80gb.yaml"
    path.write_text(path.read_text().replace("989.4e+12", "989.4e12"))
    assert load_catalog(tmp_catalog)["h100-sxm-80gb"].peak_flops_bf16 == 989.4e12


def test_calibration_file_sets_family_efficiency(tmp_catalog: Path) -> None:
    (tmp_catalog / "calibration.yaml").write_text(
        "hopper:\n  gemm_peak_fraction: 0.81\n  source: 'fit on rows 1-40'\n")
    gpu = load_catalog(tmp_catalog)["h100-sxm-80gb"]
    assert gpu.efficiency.gemm_peak_fraction == 0.81
    assert gpu.efficiency.source == "fit on rows 1-40"
    assert gpu.efficiency.kernel_overhead_s == Efficiency().kernel_overhead_s


@pytest.mark.parametrize(("text", "message"), [
    ("hoper:\n  gemm_peak_fraction: 0.8\n  source: x\n", "unknown family 'hoper'"),
    ("hopper:\n  gemm_peak_fraction: 0.8\n", r"hopper\.source is required"),
    ("hopper:\n  gemm_fraction: 0.8\n  source: x\n", "unknown keys"),
    ("hopper:\n  kernel_overhead_s: 0\n  source: x\n", r"kernel_overhead_s must be > 0"),
    ("hopper:\n  dtensor_op_overhead_s: -1e-5\n  source: x\n",
     r"dtensor_op_overhead_s must be > 0"),
])
def test_bad_calibration_names_file_and_field(tmp_catalog: Path, text: str, message: str) -> None:
    (tmp_catalog / "calibration.yaml").write_text(text)
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog(tmp_catalog)
    assert "calibration.yaml" in str(err.value)


def test_a_family_without_a_fit_borrows_its_lenders_and_says_so(tmp_path: Path) -> None:
    """A Blackwell Ultra part takes the blackwell entry (its lender), labelled as the fit labels
    its own transfers; an entry of its own, once runs fit one, wins; no lender entry: the prior.
    (One folder per calibration: the catalog of a folder is loaded once.)"""
    lender = "blackwell:\n  gemm_peak_fraction: 0.53\n  source: 'fit on GB200 rows'\n"
    own = "blackwell-ultra:\n  gemm_peak_fraction: 0.6\n  source: 'fit on GB300 rows'\n"
    effs = {}
    for name, calibration in (("none", ""), ("lender", lender), ("own", lender + own)):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(CATALOG_DIR / "gb300-nvl72.yaml", folder / "gb300-nvl72.yaml")
        if calibration:
            (folder / "calibration.yaml").write_text(calibration)
        effs[name] = get_gpu("gb300-nvl72", folder).efficiency
    assert effs["none"].source == UNCALIBRATED_SOURCE
    assert effs["lender"].gemm_peak_fraction == 0.53
    assert effs["lender"].source.startswith("transferred from the blackwell fit: no measured "
                                            "blackwell-ultra runs to fit")
    assert "fit on GB200 rows" in effs["lender"].source
    assert (effs["own"].gemm_peak_fraction, effs["own"].source) == (0.6, "fit on GB300 rows")


def test_an_unmeasured_dtensor_overhead_may_be_zero(tmp_catalog: Path) -> None:
    # the fit writes every Efficiency field; this one is 0 where no host was measured
    (tmp_catalog / "calibration.yaml").write_text(
        "hopper:\n  dtensor_op_overhead_s: 0.0\n  source: 'fit'\n")
    assert load_catalog(tmp_catalog)["h100-sxm-80gb"].efficiency.dtensor_op_overhead_s == 0.0


def test_specs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_gpu("l40s").hbm_bytes = 1.0  # type: ignore[misc]
    assert isinstance(get_gpu("l40s"), GpuSpec)
