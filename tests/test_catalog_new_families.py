"""The CDNA4 and Blackwell Ultra parts (issue #37): AMD MI355X and MI350X, NVIDIA HGX B300 and
GB300 NVL72. Every number cited, each family labelled borrowed from the nearest fitted family
(no measured run of either is fitted), studies on them run, and what differs from the part they
follow is priced: the NIC of Blackwell Ultra, the clock of the MI350X."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import cli

from costmodel.specs import ClusterSpec
from hardware_catalog import get_gpu
from hardware_catalog.catalog import (
    BORROWED_FAMILIES,
    NUMERIC_FIELDS,
    OPTIONAL_FIELDS,
    load_catalog,
    transfer_efficiency,
)
from search.uncertainty import calibration_status

# SKU -> (family, the family it borrows from)
NEW = {"mi355x": ("cdna4", "hopper"), "mi350x": ("cdna4", "hopper"),
       "b300-288gb": ("blackwell-ultra", "blackwell"),
       "gb300-nvl72": ("blackwell-ultra", "blackwell")}
STUDY = ("name: v\nmodel: {preset: %s}\ncluster: {gpu: %s, nodes: %d}\n"
         "training: {framework: megatron-lm, seq_len: 4096, global_batch: 256}\n"
         "search: {trials: 20, seed: 0}\n")


@pytest.mark.parametrize("sku", NEW)
def test_catalog_show_cites_every_number(sku: str) -> None:
    code, out, err = cli("catalog", "show", sku)
    assert code == 0, err
    doc = json.loads(out)
    cited = doc["sources"]
    # every required field, and the optional ones the file gives, with a source naming a URL
    assert set(NUMERIC_FIELDS) - OPTIONAL_FIELDS <= set(cited)
    for field in (f for f in NUMERIC_FIELDS if f in cited):
        assert "https://" in cited[field]["source"] or "Not usable" in cited[field]["source"], field
        assert doc[field] > 0, field
    assert "peak_flops_fp8" in cited  # FP8 tensor cores on both families
    assert cited["efficiency"]["source"] == get_gpu(sku).efficiency.source


@pytest.mark.parametrize(("sku", "family"), NEW.items())
def test_each_family_says_it_is_borrowed_from_the_nearest_fitted(
        sku: str, family: tuple[str, str]) -> None:
    own, lender = family
    gpu = get_gpu(sku)
    assert gpu.family == own and BORROWED_FAMILIES[own] == lender
    # the lender's numbers (at the SKU's own measured matmul ceiling where it has one), the
    # lender's fit named in the source
    lent = {"hopper": "h100-sxm-80gb", "blackwell": "gb200-nvl72"}[lender]
    carried = transfer_efficiency(get_gpu(lent).efficiency, lender, gpu, load_catalog())
    assert gpu.efficiency.gemm_peak_fraction == pytest.approx(carried.gemm_peak_fraction)
    assert get_gpu(lent).efficiency.source in gpu.efficiency.source
    status = calibration_status(ClusterSpec(gpu=gpu, num_gpus=8))
    assert status["borrowed_from"] == lender and not status["validated"]
    assert f"{own} efficiency borrowed from {lender}, unvalidated" in status["line"]


def test_worked_examples() -> None:
    """MI350X is the MI355X at 2.2 instead of 2.4 GHz (256 CUs x 4,096 BF16 FLOPs a clock:
    2,516.6 and 2,306.9 TFLOPS), memory and Infinity Fabric alike (7 links x 153.6 GB/s
    bidirectional -> 537.6 GB/s one way). Blackwell Ultra keeps Blackwell's BF16/FP8 rates: HGX
    B300 = HGX B200 (2.25 PF dense), GB300 = GB200 (2.5 PF), and doubles the NIC (ConnectX-8, 800
    Gb/s -> 100 GB/s)."""
    mi355, mi350 = get_gpu("mi355x"), get_gpu("mi350x")
    assert mi355.peak_flops_bf16 == pytest.approx(256 * 2.4e9 * 4096, rel=1e-4)
    for field in ("peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp8"):
        assert getattr(mi350, field) / getattr(mi355, field) == pytest.approx(2.2 / 2.4, rel=1e-4)
    for field in ("hbm_bytes", "hbm_bw_bytes_per_s", "intra_node_bw_bytes_per_s"):
        assert getattr(mi350, field) == getattr(mi355, field), field
    assert mi355.intra_node_bw_bytes_per_s == pytest.approx(7 * 153.6e9 / 2)
    assert mi355.hbm_bytes > get_gpu("mi325x").hbm_bytes
    for ultra, base in (("b300-288gb", "b200-180gb"), ("gb300-nvl72", "gb200-nvl72")):
        u, b = get_gpu(ultra), get_gpu(base)
        assert (u.peak_flops_bf16, u.peak_flops_fp8) == (b.peak_flops_bf16, b.peak_flops_fp8)
        assert u.intra_node_bw_bytes_per_s == b.intra_node_bw_bytes_per_s == 900e9
        assert u.intra_node_domain_size == b.intra_node_domain_size
        assert u.network_bw_bytes_per_s == 2 * b.network_bw_bytes_per_s == 100e9
        assert u.hbm_bytes > 1.45 * b.hbm_bytes  # 288 GB vs 180 / 186 GB marketed


@pytest.mark.parametrize("sku", NEW)
def test_a_llama_study_runs_end_to_end(tmp_path: Path, sku: str) -> None:
    """Llama 3 8B on two nodes: searched and written (run), and a plan of it explained with the
    family's borrowed calibration named."""
    study = tmp_path / "s.yaml"
    study.write_text(STUDY % ("llama3-8b", sku, 2))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "r"), "--quiet")
    assert code == 0, err
    result = json.loads((tmp_path / "r" / "result.json").read_text())
    assert result["top"] and result["feasible_count"] > 0, "the study ranked no plan"
    assert result["calibration"]["borrowed_from"] == NEW[sku][1]
    code, out, err = cli("explain", str(study), "--plan", "tp=4,pp=1,mbs=1,zero=1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["calibration"]["family"] == NEW[sku][0]
    assert doc["calibration"]["borrowed_from"] == NEW[sku][1]
    assert doc["step"]["tokens_per_s_per_gpu"] > 0


def test_a_70b_plan_fits_the_288_gb_parts_only(tmp_path: Path) -> None:
    """Llama 3 70B at TP 2, ZeRO-1 over DP 8, full recompute: 35.3e9 parameters a GPU hold bf16
    weights (70.6 GB) and fp32 main grads (141.2 GB), plus fp32 master weights and Adam moments
    sharded 8 ways (35.3e9 x 12 / 8 = 53 GB): 265 GB = 247 GiB before activations. It fits the
    Blackwell Ultra and CDNA4 parts (266-286 GiB usable), not B200 (177 GiB)."""
    fits = {}
    for sku in (*NEW, "b200-180gb"):
        study = tmp_path / f"{sku}.yaml"
        study.write_text(STUDY % ("llama3-70b", sku, 2))
        code, out, err = cli("explain", str(study), "--plan",
                             "tp=2,pp=1,mbs=1,zero=1,recompute=full", "--json")
        assert code == 0, err
        memory = json.loads(out)["memory"]
        assert memory["peak_gib"] > 247
        fits[sku] = memory["fits"]
    assert fits == {**dict.fromkeys(NEW, True), "b200-180gb": False}


def test_the_doubled_nic_makes_the_cross_node_all_reduce_cheaper(tmp_path: Path) -> None:
    """TP 8 inside the node, DP 2 across two nodes: B300's DP all-reduce runs on twice B200's
    NIC, so it costs less; TP (same NVLink) costs the same."""
    times = {}
    for sku in ("b300-288gb", "b200-180gb"):
        study = tmp_path / f"{sku}.yaml"
        study.write_text(STUDY % ("llama3-8b", sku, 2))
        code, out, err = cli("explain", str(study), "--plan", "tp=8,pp=1,mbs=1,zero=1", "--json")
        assert code == 0, err
        collectives = json.loads(out)["communication"]["collectives"]
        times[sku] = {g: sum(c["time_s"] for c in collectives if c["group"] == g)
                      for g in ("tp", "dp")}
    assert times["b300-288gb"]["dp"] < 0.8 * times["b200-180gb"]["dp"]
    assert times["b300-288gb"]["tp"] == pytest.approx(times["b200-180gb"]["tp"])
