"""A fit borrowed from another family keeps its share of the SKU's own measured matmul ceiling
(``hardware_catalog.catalog.transfer_efficiency``): the matmul-bound fractions the lender's runs
fitted, times the SKU's ceiling over its peak and over the lender's reference SKU's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodel import Plan, plans_to_arrays
from costmodel.specs import ClusterSpec
from hardware_catalog import get_gpu, load_calibration, load_catalog
from hardware_catalog.catalog import (
    CATALOG_DIR,
    MATMUL_BOUND,
    REFERENCE_SKUS,
    lender_of,
    transfer_efficiency,
)
from search.inputs.presets import get_preset
from search.inputs.specs import training_spec
from search.priors import prior_spread
from search.uncertainty import calibration_status


def _borrowers() -> list[str]:
    return sorted(k for k, g in load_catalog().items() if lender_of(g.efficiency))


def test_mi300x_worked_example() -> None:
    """MI300X reaches 668.4 of its 1,307.4 TFLOP/s in bf16 matmuls, H100 SXM 794.5 of 989.4
    (stas00/ml-engineering's MAMF table): the Hopper fit's GEMM fraction x 0.637."""
    mi300x, hopper = get_gpu("mi300x"), load_calibration(CATALOG_DIR)["hopper"]
    ratio = (668.4 / 1307.4) / (794.5 / 989.4)
    assert ratio == pytest.approx(0.6366, abs=1e-4)
    for field in MATMUL_BOUND:
        assert getattr(mi300x.efficiency, field) == pytest.approx(getattr(hopper, field) * ratio)
    # the terms no matmul bounds are the lender's
    assert mi300x.efficiency.memory_bw_fraction == hopper.memory_bw_fraction
    assert mi300x.efficiency.nvlink_bw_fraction == hopper.nvlink_bw_fraction


@pytest.mark.parametrize("sku", _borrowers())
def test_no_borrowed_fit_prices_a_gemm_above_the_measured_ceiling(sku: str) -> None:
    """Where the SKU's ceiling is measured, the carried GEMM rate sits under it by the lender's
    own margin (Hopper's fit: 0.67 of H100's peak, 83% of its 794.5 TFLOP/s ceiling)."""
    gpu = get_gpu(sku)
    if gpu.matmul_bf16_flops <= 0:
        pytest.skip(f"{sku}: no measured matmul ceiling, so the lender's fractions stand")
    ref = get_gpu(REFERENCE_SKUS[lender_of(gpu.efficiency)])
    share = gpu.efficiency.gemm_peak_fraction * gpu.peak_flops_bf16 / gpu.matmul_bf16_flops
    lender_share = ref.efficiency.gemm_peak_fraction * ref.peak_flops_bf16 / ref.matmul_bf16_flops
    assert share == pytest.approx(lender_share) and share < 1.0


def test_without_a_measured_ceiling_the_lenders_fractions_stand() -> None:
    l40s, hopper = get_gpu("l40s"), load_calibration(CATALOG_DIR)["hopper"]
    assert l40s.matmul_bf16_flops == 0
    assert l40s.efficiency.gemm_peak_fraction == hopper.gemm_peak_fraction
    bare = dataclasses.replace(get_gpu("mi300x"), matmul_bf16_flops=0.0)
    assert transfer_efficiency(hopper, "hopper", bare, load_catalog()) == hopper


def test_the_run_header_says_the_fit_is_scaled() -> None:
    status = calibration_status(ClusterSpec(gpu=get_gpu("mi300x"), num_gpus=8))
    assert status["borrowed_from"] == "hopper" and not status["validated"]
    assert "mi300x's measured matmul ceiling" in status["line"]


def test_the_borrowed_fit_interval_carries_every_lender_to_the_ceiling() -> None:
    """The interval of a plan on a borrowed fit re-prices it with each fitted family's
    efficiency, each carried to the SKU's ceiling from its own reference SKU: on MI300X none of
    them prices it faster than the ceiling allows, so the spread stays within the lenders'
    own margins rather than the datasheet's (up to +80% before)."""
    cluster = ClusterSpec(gpu=get_gpu("mi300x"), num_gpus=8)
    tr = training_spec(seq_len=4096, global_batch=64, precision="bf16", framework="megatron")
    spread = prior_spread(get_preset("llama3-8b"), cluster, tr,
                          plans_to_arrays([Plan(tp=1, pp=1, dp=8, zero_stage=1)]))
    i = [t.flag for t in spread.terms].index("borrowed fit")
    assert 0.7 < spread.low[i, 0] <= 1.0 <= spread.high[i, 0] < 1.3
    assert np.isfinite(spread.low).all()
