"""How uncertainty.yaml's bounds are made: smoothed split-conformal levels (the k-th of n at
k / (n + 1), interpolated between), groups weighing alike, and regimes whose groups cannot bound a
level left to a coarser one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from search.uncertainty import LEVELS, Uncertainty, interval
from tcf_search.calibration.uncertainty import (
    conformal_bounds,
    coverage,
    pooled_quantiles,
    throughput_table,
)


@pytest.mark.parametrize("n", [9, 10, 19, 20, 37])
def test_one_row_a_group_puts_the_kth_smallest_at_level_k_over_n_plus_one(n: int) -> None:
    values = np.arange(1.0, n + 1.0)  # the k-th smallest is k, so level p reads p (n + 1)
    got = conformal_bounds(values, np.arange(n))
    for p, q in zip(LEVELS, got, strict=True):
        k = (n + 1) * p
        want = k if 1 - 1e-9 <= k <= n + 1e-9 else math.copysign(math.inf, p - 0.5)
        assert q == pytest.approx(want, abs=1e-5), p


def test_the_80_percent_bounds_of_twenty_rows_lie_between_order_statistics() -> None:
    # 21 * 0.1 = 2.1 and 21 * 0.9 = 18.9: a tenth of the way past the 2nd and short of the
    # 19th (the order statistics themselves, 2 and 19, held a new row 81% of the time, not 80%)
    lo, hi = conformal_bounds(np.arange(1.0, 21.0), np.arange(20), levels=(0.1, 0.9))
    assert (lo, hi) == pytest.approx((2.1, 18.9))


def test_a_group_of_many_rows_weighs_as_one() -> None:
    values = np.array([0.3, -0.2, 0.1, -0.5, 0.0, 0.2, -0.1, 0.4, -0.3, 0.05])
    groups = np.arange(values.size)
    many = np.concatenate([values, np.full(200, values[3])])  # group 3 swept 200 more times
    swept = conformal_bounds(many, np.concatenate([groups, np.full(200, 3)]))
    once = conformal_bounds(values, groups)
    # group 3 (-0.5, the smallest) holds the slot of levels 1/11 +- 0.5/11 either way: its 201
    # rows spread over it, its one row at its middle; every level from its neighbour's (2/11) on
    # reads the same, where row quantiles would read -0.5 up to the 95% level
    for p, a, b in zip(LEVELS, swept, once, strict=True):
        if p >= 2 / 11:
            assert a == b, p
        else:
            assert -0.5 <= a <= -0.3 or math.isinf(a), p


def test_pooled_quantiles_weigh_groups_alike() -> None:
    # one row at 0, a sweep of 99 rows at 1, one row at 2: by rows the 5% and 95% are both 1
    values = np.array([0.0, *[1.0] * 99, 2.0])
    groups = np.array([0, *[1] * 99, 2])
    q = pooled_quantiles(values, groups)
    assert q[0] == 0.0 and q[LEVELS.index(0.5)] == 1.0 and q[-1] == 2.0


def test_the_bounds_hold_a_new_group_at_their_level_where_row_quantiles_do_not() -> None:
    """Groups of 1-30 rows with a group effect: a row of a new group falls inside the 80%
    bounds of K = 9 groups 80% of the time (Monte Carlo, fixed seed), neither less nor (as the
    order statistics did, up to 80% + 2 / (K + 1)) more."""
    rng = np.random.default_rng(0)
    hits, naive = [], []
    for _ in range(3000):
        sizes = rng.integers(1, 31, size=9)
        groups = np.repeat(np.arange(9), sizes)
        values = rng.normal(0, 1, 9)[groups] + rng.normal(0, 0.3, groups.size)
        new = rng.normal(0, 1) + rng.normal(0, 0.3)
        lo, hi = conformal_bounds(values, groups, levels=(0.1, 0.9))
        hits.append(lo <= new <= hi)
        a, b = np.quantile(values, (0.1, 0.9))
        naive.append(a <= new <= b)
    sd = math.sqrt(0.8 * 0.2 / len(hits))
    assert 0.8 - 3 * sd <= np.mean(hits) <= 0.8 + 3 * sd
    assert np.mean(naive) < 0.8 - 3 * sd  # pooled rows understate the spread between groups


def _frame(n_groups: int, kind_moe: bool = False) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    rows = []
    for g in range(n_groups):
        for _ in range(1 + g % 3):
            rows.append({"model_name": f"m{g}", "num_gpus": 8, "gpu": "h100-sxm-80gb",
                         "precision": "bf16", "moe_experts": 8 if kind_moe else 0,
                         "source": "llm-foundry", "status": "ok", "pp": 1,
                         "after_pp_fix": False,
                         "tokens_per_sec_per_gpu": 1000.0 * math.exp(rng.normal(0, 0.1))})
    frame = pd.DataFrame(rows)
    return frame, {"tokens_per_s_per_gpu": np.full(len(frame), 1000.0)}


def test_a_regime_is_written_only_with_groups_enough_for_the_80_percent_bounds() -> None:
    # the 10% and 90% bounds need K + 1 >= 10 groups: 8 give none, 9 give them (but not 5%)
    frame, pred = _frame(8)
    assert throughput_table(frame, pred, pd.Series(True, index=frame.index)) == {}
    frame, pred = _frame(9)
    table = throughput_table(frame, pred, pd.Series(True, index=frame.index))
    entry = table["hopper/bf16/dense/small"]
    assert entry["groups"] == 9 and entry["n"] == len(frame)
    assert math.isinf(entry["q"][0]) and math.isfinite(entry["q"][1])
    assert set(table) == {"hopper/bf16/dense/small", "hopper/bf16/dense", "hopper/bf16",
                          "hopper", "all"}


def test_a_level_the_regime_cannot_bound_is_borrowed() -> None:
    fine = [-math.inf, *[0.01 * (i - 9) for i in range(1, 18)], math.inf]
    coarse = [0.02 * (i - 9) for i in range(19)]
    unc = Uncertainty(throughput={"hopper/bf16/dense/small": {"q": fine},
                                  "all": {"q": coarse}}, memory={})
    regime = ("hopper", "bf16", "dense", "small")
    assert interval(1.0, regime, unc=unc)[2] == "hopper/bf16/dense/small"
    lo, hi, key = interval(1.0, regime, 0.05, 0.95, unc=unc)
    assert key == "all" and math.isfinite(lo) and math.isfinite(hi)


def test_coverage_counts_rows_and_groups_of_the_other_half() -> None:
    frame, pred = _frame(40)
    cov = coverage(frame, pred, pd.Series(True, index=frame.index))
    assert cov["rows"] == len(frame) and cov["groups"] == 40
    assert 0.0 <= cov["within"] <= 1.0 and 0.0 <= cov["within_groups"] <= 1.0
    assert set(cov["by_regime"]) == {"hopper/bf16/dense"}
