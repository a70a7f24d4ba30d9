"""Uncertainty shown: intervals and P(OOM) from held-out residuals, the calibration a cluster
rests on, fp8 and NeMo's recipe defaults for measured rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, Plan, estimate
from hardware_catalog import get_gpu
from search.inputs.measured import case_from_row
from search.uncertainty import (
    LEVELS,
    Uncertainty,
    calibration_status,
    interval,
    p_oom,
    uncertainty_metrics,
)

SPREAD = [round(-0.3 + 0.6 * lv, 4) for lv in LEVELS]  # log ratios from -0.27 to +0.27
UNC = Uncertainty(throughput={"hopper/bf16": {"n": 50, "q": SPREAD},
                              "all": {"n": 90, "q": [2 * x for x in SPREAD]}},
                  memory={"n": 50, "q": [0.1 * (lv - 0.5) for lv in LEVELS]})


def test_the_interval_holds_the_prediction_and_widens_with_the_level() -> None:
    lo, hi, key = interval(1000.0, ("hopper", "bf16", "dense", "small"), unc=UNC)
    assert key == "hopper/bf16"
    assert lo < 1000.0 < hi
    lo2, hi2, _ = interval(1000.0, ("hopper", "bf16", "dense", "small"), 0.05, 0.95, unc=UNC)
    assert lo2 < lo and hi2 > hi


def test_a_regime_without_residuals_borrows_a_coarser_one() -> None:
    _, _, key = interval(1000.0, ("cdna3", "bf16", "dense", "small"), unc=UNC)
    assert key == "all"


def test_p_oom_falls_with_headroom_and_is_a_probability() -> None:
    usable = 80.0
    peaks = np.array([40.0, 76.0, 79.0, 80.0, 82.0, 120.0])
    p = p_oom(peaks, usable, unc=UNC)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(np.diff(p) >= 0)
    assert p[0] == 0.0 and p[-1] == 1.0
    assert 0.0 < p[3] < 1.0


def test_metrics_say_where_the_interval_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    import search.uncertainty as u

    monkeypatch.setattr(u, "load_uncertainty", lambda: UNC)
    m = uncertainty_metrics({"tokens_per_s_per_gpu": 1000.0, "peak_mem_gib": 60.0,
                             "usable_mem_gib": 80.0}, ("cdna3", "bf16", "dense", "small"), 0.2)
    assert "borrowed from all" in m["interval_note"]
    assert m["tokens_per_s_at_risk"] < 1000.0
    assert m["tokens_per_s_interval"][0] < m["tokens_per_s_at_risk"]


@pytest.mark.parametrize("gpu_id", ["mi300x", "mi325x", "l40s"])
def test_a_family_without_measurements_says_borrowed_unvalidated(gpu_id: str) -> None:
    status = calibration_status(ClusterSpec(gpu=get_gpu(gpu_id), num_gpus=8))
    assert status["borrowed_from"] == "hopper"
    assert "borrowed from hopper, unvalidated" in status["line"]
    assert "fabric: not given" in status["line"]


def test_a_partly_fitted_family_says_which_terms_are_borrowed() -> None:
    status = calibration_status(ClusterSpec(gpu=get_gpu("gb200-nvl72"), num_gpus=8))
    assert "GEMM terms fitted; other terms borrowed from hopper, unvalidated" in status["line"]
    assert not status["validated"]


def test_a_fitted_family_says_so() -> None:
    status = calibration_status(ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=8))
    assert status["validated"] and status["borrowed_from"] is None


def test_fp8_gemms_run_at_their_own_fitted_fraction(llama8b) -> None:
    gpu = get_gpu("h100-sxm-80gb")
    slow = replace(gpu, efficiency=replace(gpu.efficiency, fp8_gemm_peak_fraction=0.3))
    plan = Plan(dp=8)
    times = {}
    for prec in ("bf16", "fp8"):
        tr = training_for(seq_len=4096, global_batch=64, precision=prec)  # type: ignore[arg-type]
        times[prec] = [estimate(llama8b, ClusterSpec(gpu=g, num_gpus=8), plan, tr).step_time_s
                       for g in (gpu, slow)]
    assert times["bf16"][0] == times["bf16"][1]
    assert times["fp8"][1] > times["fp8"][0]


def _dgxc_row(**cells: object) -> dict[str, object]:
    row: dict[str, object] = {
        "model_name": "m", "layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32,
        "kv_heads": 8, "vocab": 128256, "seq_len": 8192, "gpu": "h100-sxm-80gb",
        "gpus_per_node": 8, "num_gpus": 16, "tp": 2, "pp": 1, "cp": 1, "dp": 8,
        "micro_batch": 1, "global_batch": 128, "precision": "bf16", "framework": "nemo",
        "source": "dgxc-benchmarking"}
    row.update(cells)
    return row


def test_nemo_rows_run_the_recipes_defaults_where_cells_are_empty() -> None:
    case = case_from_row(_dgxc_row())
    assert case.plan.zero_stage == 1  # distributed optimizer
    assert case.training.framework.tp.tp_comm_overlap
    assert "zero_stage" not in case.given
    assert case_from_row(_dgxc_row(zero_stage=0)).plan.zero_stage == 0
    other = case_from_row(_dgxc_row(framework="megatron"))
    assert other.plan.zero_stage == 0 and not other.training.framework.tp.tp_comm_overlap


def test_the_shipped_residuals_cover_the_measured_regimes() -> None:
    from search.uncertainty import load_uncertainty

    unc = load_uncertainty()
    assert {"all", "hopper/bf16/dense", "hopper/fp8"} <= set(unc.throughput)
    for entry in [*unc.throughput.values(), unc.memory]:
        assert entry["q"] == sorted(entry["q"])
    for entry in unc.throughput.values():  # 10% and 90% bounds need 9 groups or more
        assert entry["groups"] >= 9 and np.all(np.isfinite(entry["q"][1:-1]))
    assert np.all(np.isfinite(unc.throughput["all"]["q"]))  # the last resort bounds every level
    assert np.all(np.isfinite(unc.memory["q"]))
