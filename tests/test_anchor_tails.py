"""How much of one measured run's error is its cluster's (issue #37): each regime's residuals as
a bulk and a tail of pathologies (search.inputs.anchor_tails), fitted on residuals the test
makes, and a run far in the tail anchoring a study near the family's prediction."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from measured_rows import one_run_csv

from search.inputs import (
    CalibrationError,
    Tail,
    case_from_row,
    cluster_share,
    load_calibration,
    tails_from,
)
from tcf_search.calibration.anchor import cluster_targets, fit
from tcf_search.calibration.layouts import layout_row
from tcf_search.calibration.training_logs import read_measured
from tcf_search.calibration.transfer_fit import fit_tails

LAYOUT = {"model": "llama3-8b", "gpu": "h100-sxm-80gb", "num_gpus": 8, "gpus_per_node": 8,
          "framework": "megatron", "plan": "tp=1,pp=1,mbs=1,recompute=none,zero=1",
          "seq_len": 8192, "global_batch": 64}
REGIME = "hopper/bf16/dense"


def _residuals(groups: int, runs: int, bulk: float, tail: float, weight: float,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = groups * runs
    r = np.where(rng.random(n) < weight, rng.normal(0.0, tail, n), rng.normal(0.0, bulk, n))
    return r, np.repeat(np.arange(groups).astype(str), runs)


def test_a_known_mixture_is_recovered() -> None:
    r, g = _residuals(groups=40, runs=50, bulk=0.05, tail=1.0, weight=0.15)
    (tail,) = fit_tails(r, g, np.full(len(r), REGIME)).values()
    assert tail.bulk_sd == pytest.approx(0.05, rel=0.15)
    assert tail.tail_sd == pytest.approx(1.0, rel=0.2)
    assert tail.tail_weight == pytest.approx(0.15, abs=0.04)
    assert tail.groups == 40


def test_a_regime_without_a_tail_or_with_few_groups_gets_none() -> None:
    one, g = _residuals(groups=40, runs=50, bulk=0.05, tail=0.05, weight=0.0)
    few, gf = _residuals(groups=3, runs=50, bulk=0.05, tail=1.0, weight=0.15)
    regimes = np.array(["a"] * len(one) + ["b"] * len(few))
    got = fit_tails(np.concatenate([one, few]), np.concatenate([g, np.char.add("f", gf)]),
                    regimes)
    assert got == {}


def test_an_ordinary_residual_is_the_cluster_s_and_a_pathological_one_is_not() -> None:
    tail = Tail(bulk_sd=0.08, tail_sd=1.3, tail_weight=0.12)
    assert tail.bulk_share(0.0) > 0.99
    assert tail.bulk_share(-0.1) > 0.9
    assert tail.bulk_share(-1.5) < 0.01  # a run 4.5x slower than the family's prediction
    assert cluster_share({REGIME: tail}, "ampere/bf16/dense", -1.5) == 1.0  # no tail: in full
    back = tails_from({REGIME: tail.to_dict()})
    assert back[REGIME].bulk_share(-0.1) == pytest.approx(tail.bulk_share(-0.1), rel=1e-3)


def test_a_pathological_run_hardly_moves_the_study(tmp_path: Path) -> None:
    tails = {REGIME: Tail(bulk_sd=0.08, tail_sd=1.3, tail_weight=0.12)}
    slow = read_measured([one_run_csv(tmp_path, LAYOUT, 0.2)])  # 5x slower than predicted
    got = fit(slow, prior_weight=0.0, tails=tails)
    m = got.calibration.measured
    assert m is not None and m.compute_scale > 0.95
    (run,) = m.runs
    assert run["cluster_share"] < 0.01
    assert run["cluster_tokens_per_s"] == pytest.approx(run["family_tokens_per_s"], rel=0.02)
    assert any("tail" in line and "check the run" in line for line in got.lines)
    # without the tail the same run moves the scale all the way (no pull)
    bare = fit(slow, prior_weight=0.0, tails={}).calibration.measured
    assert bare is not None and bare.compute_scale < 0.5


def test_an_ordinary_run_anchors_in_full(tmp_path: Path) -> None:
    tails = {REGIME: Tail(bulk_sd=0.08, tail_sd=1.3, tail_weight=0.12)}
    runs = read_measured([one_run_csv(tmp_path, LAYOUT, 0.95)])
    with_tail = fit(runs, prior_weight=0.0, tails=tails).calibration.measured
    without = fit(runs, prior_weight=0.0, tails={}).calibration.measured
    assert with_tail is not None and without is not None
    assert with_tail.compute_scale == pytest.approx(without.compute_scale, abs=0.01)
    (run,) = with_tail.runs
    assert run["cluster_share"] > 0.95


def test_targets_are_the_family_times_the_cluster_share_of_the_residual() -> None:
    row, _ = layout_row(LAYOUT, "test")
    case = case_from_row(row)
    tails = {REGIME: Tail(bulk_sd=0.08, tail_sd=1.3, tail_weight=0.12)}
    cluster, shares = cluster_targets([case], np.array([50.0]), np.array([100.0]), tails)
    r = math.log(0.5)
    assert shares[0] == pytest.approx(tails[REGIME].bulk_share(r))
    assert cluster[0] == pytest.approx(100.0 * math.exp(shares[0] * r))


def test_two_runs_are_taken_as_measured_and_a_tail_run_is_named() -> None:
    """How several runs differ tells compute from network: none is shrunk, and the one in its
    regime's tail is named for the user to check."""
    row, _ = layout_row(LAYOUT, "test")
    case = case_from_row(row)
    tails = {REGIME: Tail(bulk_sd=0.08, tail_sd=1.3, tail_weight=0.12)}
    cluster, shares = cluster_targets([case, case], np.array([20.0, 95.0]),
                                      np.array([100.0, 100.0]), tails)
    assert cluster == pytest.approx([20.0, 95.0])
    assert shares[0] < 0.01 < 0.9 < shares[1]


@pytest.mark.parametrize("cell", ["cluster_share: 2.0", "cluster_share: yes",
                                  "cluster_tokens_per_s: -5", "cluster_tokens_per_s: abc"])
def test_a_bad_cluster_figure_in_a_file_is_one_line(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "cal.yaml"
    path.write_text("format: tcf-search cluster calibration 1\nfiles: []\nlinks: {}\n"
                    "measured:\n  compute_scale: 1.0\n"
                    f"  runs: [{{file: a.csv, {cell}}}]\n")
    with pytest.raises(CalibrationError, match=r"measured\.runs\[\]\.cluster_") as err:
        load_calibration(path)
    assert "\n" not in str(err.value)
