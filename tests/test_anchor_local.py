"""The layout transfer of an anchor run's residual (search.inputs.layout_transfer, issue #37):
fitted on residuals made with a known distance-correlation, it recovers it; kriging moves a plan
by what it shares with the anchor and leaves it a narrower interval near the anchor than far
from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from search.anchored_interval import AnchoredSpread
from search.inputs import CalibrationError, load_calibration
from search.inputs.layout_transfer import FEATURES, LOG_AXES, Transfer, distance, krige, layout_of
from search.inputs.sections import LEVELS
from tcf_search.calibration.transfer_fit import fit_transfer

TRUE = Transfer(far=0.2, near=0.8, decay=2.0)


def _synthetic(t: Transfer, groups: int, runs: int, seed: int) -> tuple[np.ndarray, ...]:
    """Residuals of ``groups`` groups, each of ``runs`` runs at random layouts (tp and pp 1-4,
    micro-batch 1-4, ZeRO 0/1) and its own spread (2% to 50%), drawn from ``t``'s correlation."""
    rng = np.random.default_rng(seed)
    res, grp, lay = [], [], []
    col = {name: i for i, name in enumerate(FEATURES)}
    for g in range(groups):
        x = np.zeros((runs, len(FEATURES)))
        for name in ("tp", "pp", "micro_batch"):
            x[:, col[name]] = rng.integers(0, 3, runs)  # log2 coordinates
        x[:, col["zero_stage"]] = rng.integers(0, 2, runs)
        k = t.correlation(distance(x, x))
        np.fill_diagonal(k, 1.0)
        res.append(np.linalg.cholesky(k) @ rng.standard_normal(runs) * rng.uniform(0.02, 0.5))
        grp += [g] * runs
        lay.append(x)
    return np.concatenate(res), np.array(grp), np.concatenate(lay)


def test_a_known_distance_correlation_is_recovered() -> None:
    # over seeds 0-5 the fit gives far 0.18-0.34 (the difference scale that puts the groups in
    # one unit leans a little toward groups whose runs share most), near 0.75-0.84, decay
    # 1.3-2.4: the bounds hold on every one
    for seed in (0, 3):
        got, how = fit_transfer(*_synthetic(TRUE, groups=300, runs=10, seed=seed))
        assert got.far == pytest.approx(TRUE.far, abs=0.15)
        assert got.near == pytest.approx(TRUE.near, abs=0.07)
        assert got.decay == pytest.approx(TRUE.decay, rel=0.4)
        assert how["groups"] == 300 and how["pairs"] == 300 * 10 * 9


def test_uncorrelated_layouts_transfer_nothing_past_the_cluster() -> None:
    # residuals that share only their group's offset: the transfer is flat in distance
    flat = Transfer(far=0.4, near=0.41, decay=1.0)
    got, _ = fit_transfer(*_synthetic(flat, groups=150, runs=10, seed=2))
    assert got.near - got.far < 0.12
    assert got.far == pytest.approx(0.4, abs=0.08)


def test_layout_distance_counts_doublings_and_switches() -> None:
    cols = {"tp": np.array([1, 4]), "pp": np.array([2, 2]), "cp": 1, "ep": 1, "vpp": 1,
            "micro_batch": np.array([1, 2]), "zero_stage": np.array([1, 1]),
            "recompute": np.array([0, 2]), "sequence_parallel": np.array([0, 0])}
    x = layout_of(cols, seq_len=4096, global_batch=256)
    assert x[0, LOG_AXES.index("seq_len")] == 12.0
    # tp 1 -> 4: two doublings; micro-batch 1 -> 2: one; recompute none -> full: one switch
    assert distance(x[:1], x[1:])[0, 0] == 4.0


def test_the_interval_is_narrower_near_the_anchor_than_far_from_it() -> None:
    anchor = np.zeros((1, len(FEATURES)))
    plans = np.zeros((3, len(FEATURES)))
    plans[1, 0], plans[2, 0] = 1.0, 8.0  # tp x2, tp x256
    shift, sd = krige(TRUE, anchor, np.array([0.1]), plans)
    # the anchor's residual after the cluster-wide scale moves its own layout by the within
    # part of `near`, a far layout by almost nothing
    assert shift[0] == pytest.approx(0.1 * (TRUE.near - TRUE.far) / (1 - TRUE.far))
    assert shift[0] > shift[1] > shift[2] >= 0 and shift[2] < 0.002
    assert sd[0] < sd[1] < sd[2] <= 1.0
    assert sd[0] == pytest.approx(np.sqrt(1 - TRUE.near**2))
    spread = AnchoredSpread(q=tuple(np.linspace(-0.3, 0.3, len(LEVELS))), n=1, groups=1,
                            basis="test")
    widths = [np.subtract(*spread.at(s).interval(1000.0, 0.9, 0.1)) for s in sd]
    assert widths[0] < widths[1] < widths[2]


def test_two_anchors_at_one_layout_count_once() -> None:
    one = krige(TRUE, np.zeros((1, len(FEATURES))), np.array([0.1]), np.zeros((1, len(FEATURES))))
    two = krige(TRUE, np.zeros((2, len(FEATURES))), np.array([0.1, 0.1]),
                np.zeros((1, len(FEATURES))))
    # a second run of the same layout and residual adds its noise's worth, not double
    assert one[0][0] < two[0][0] < 2 * one[0][0]
    assert two[1][0] < one[1][0]


def test_a_bad_transfer_block_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cal.yaml"
    path.write_text("format: tcf-search cluster calibration 1\nfiles: []\nlinks: {}\n"
                    "measured:\n  compute_scale: 1.0\n  runs: [{file: a.csv}]\n"
                    "  transfer: {far: 0.5, near: 0.2, decay: 1.0}\n")
    with pytest.raises(CalibrationError, match=r"measured\.transfer must map far, near and "
                                               r"decay .* 0 <= far <= near < 1") as err:
        load_calibration(path)
    assert "\n" not in str(err.value)
