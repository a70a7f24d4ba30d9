"""Each regime's own layout transfer (issue #37): a regime whose runs err by one offset carries an
anchor run's error further than one whose runs each err their own way; fitted apart where a
regime has groups enough, the pooled transfer elsewhere, and ``calibrate --measured`` uses the
anchor run's regime's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from measured_rows import one_run_csv

from search.inputs import (
    FEATURES,
    MIN_REGIME_GROUPS,
    Transfer,
    distance,
    transfer_for,
)
from tcf_search.calibration.anchor import fit
from tcf_search.calibration.training_logs import read_measured
from tcf_search.calibration.transfer_fit import fit_regime_transfers, fit_transfer

FAR_CARRYING = Transfer(far=0.6, near=0.95, decay=4.0)  # one offset: a fixed recipe's error
LOCAL = Transfer(far=0.05, near=0.7, decay=1.0)  # each layout its own: a sweep's pathologies


def _regime(t: Transfer, name: str, groups: int, seed: int) -> tuple[np.ndarray, ...]:
    """``groups`` groups of 8 runs at random layouts (tp, pp, micro-batch 1-4), residuals drawn
    from ``t``'s correlation in each group's own spread (3% to 30%)."""
    rng = np.random.default_rng(seed)
    res, grp, lay = [], [], []
    for g in range(groups):
        x = np.zeros((8, len(FEATURES)))
        x[:, :2] = rng.integers(0, 3, (8, 2))
        x[:, FEATURES.index("micro_batch")] = rng.integers(0, 3, 8)
        k = t.correlation(distance(x, x))
        np.fill_diagonal(k, 1.0)
        res.append(np.linalg.cholesky(k) @ rng.standard_normal(8) * rng.uniform(0.03, 0.3))
        grp += [f"{name}|{g}"] * 8
        lay.append(x)
    return np.concatenate(res), np.array(grp), np.concatenate(lay), np.array([name] * 8 * groups)


def test_each_regime_with_groups_enough_gets_its_own() -> None:
    parts = [_regime(FAR_CARRYING, "ampere/bf16/dense", 120, 1),
             _regime(LOCAL, "hopper/bf16/dense", 120, 2),
             _regime(FAR_CARRYING, "blackwell/fp8/dense", MIN_REGIME_GROUPS - 1, 3)]
    r, g, lay, reg = (np.concatenate(c) for c in zip(*parts, strict=True))
    got = fit_regime_transfers(r, g, lay, reg)
    assert set(got) == {"ampere/bf16/dense", "hopper/bf16/dense"}  # too few groups: pooled
    far, local = got["ampere/bf16/dense"], got["hopper/bf16/dense"]
    # what a run tells a layout 3 doublings away, each regime's own against the truth
    for fitted, true in ((far, FAR_CARRYING), (local, LOCAL)):
        assert fitted.correlation(3.0) == pytest.approx(true.correlation(3.0), abs=0.12)
    pooled, _ = fit_transfer(r, g, lay)
    assert local.correlation(3.0) < pooled.correlation(3.0) < far.correlation(3.0)
    assert far.basis.startswith("ampere/bf16/dense: ") and "120 groups" in far.basis


def test_the_runs_regime_picks_its_own_else_the_pooled() -> None:
    own = {"ampere/bf16/dense": FAR_CARRYING}
    assert transfer_for(LOCAL, own, ["ampere/bf16/dense"] * 2) is FAR_CARRYING
    assert transfer_for(LOCAL, own, ["hopper/bf16/dense"]) is LOCAL
    # runs of two regimes share no regime's transfer
    assert transfer_for(LOCAL, own, ["ampere/bf16/dense", "ampere/fp8/dense"]) is LOCAL
    assert transfer_for(None, {}, ["ampere/bf16/dense"]) is None


LLAMA_8B = {"model": "llama3-8b", "gpu": "h100-sxm-80gb", "num_gpus": 8, "gpus_per_node": 8,
            "framework": "megatron", "plan": "tp=1,pp=1,mbs=1,recompute=none,zero=1",
            "seq_len": 8192, "global_batch": 64}


def test_calibrate_records_the_anchor_regime_s_transfer(tmp_path: Path) -> None:
    runs = read_measured([one_run_csv(tmp_path, LLAMA_8B, 0.9)])  # 10% slow
    got = fit(runs, transfer=LOCAL, tails={}, transfers={"hopper/bf16/dense": FAR_CARRYING})
    m = got.calibration.measured
    assert m is not None and m.transfer is FAR_CARRYING
    assert any("the hopper/bf16/dense regime's own fit" in line for line in got.lines)
    # its far part pulls the cluster's scale: one run moves it 60% of the way, not 5%
    pooled = fit(runs, transfer=LOCAL, tails={}, transfers={"ampere/bf16/dense": FAR_CARRYING})
    p = pooled.calibration.measured
    assert p is not None and p.transfer is LOCAL
    assert any("fitted over every regime" in line for line in pooled.lines)
    assert abs(np.log(m.compute_scale)) > 5 * abs(np.log(p.compute_scale)) > 0
