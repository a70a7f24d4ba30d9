"""How surely #1 beats the others: pairs of held-out runs ordered by the model
(tcf_search.calibration.ranking), read back by search.uncertainty and shown by run, explain and
the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from search.output import ranking_line
from search.uncertainty import Uncertainty, p_best_faster, ranking_resolution
from tcf_search.calibration.ranking import (
    GAP_EDGES,
    ordered_pairs,
    pooled_non_decreasing,
    ranking_table,
    two_fold_check,
)

RANKING = {"gap_edges": [0.0, 0.02, 0.1], "p_right": [0.55, 0.7, 0.9],
           "pairs": [10, 20, 30], "groups": [3, 4, 5]}
UNC = Uncertainty(throughput={}, memory={}, ranking=RANKING)


def test_pooling_keeps_order_and_averages_violators_by_weight() -> None:
    assert pooled_non_decreasing([0.5, 0.6, 0.9], [1, 1, 1]) == [0.5, 0.6, 0.9]
    # 0.8 then 0.6 violate: pooled at (0.8 * 1 + 0.6 * 3) / 4 = 0.65
    assert pooled_non_decreasing([0.5, 0.8, 0.6, 0.9], [1, 1, 3, 1]) == pytest.approx(
        [0.5, 0.65, 0.65, 0.9])


def _frame() -> pd.DataFrame:
    """Two sweep groups of three runs: in A the model orders every pair right; in B it swaps
    the two closest runs."""
    rows = []
    for model, measured in (("A", (100.0, 200.0, 400.0)), ("B", (100.0, 99.0, 300.0))):
        for tok in measured:
            rows.append({"source": "playbook", "model_name": model, "num_gpus": 8,
                         "tokens_per_sec_per_gpu": tok})
    return pd.DataFrame(rows)


def test_pairs_are_within_a_group_and_judged_by_hand() -> None:
    frame = _frame()
    predicted = np.array([110.0, 190.0, 420.0, 100.0, 101.0, 290.0])
    pairs = ordered_pairs(frame, predicted, pd.Series(True, index=frame.index))
    assert len(pairs) == 6  # three pairs in each group, none across
    b = pairs[pairs["group"].str.contains("B")].sort_values("gap")
    assert b["right"].tolist() == [0.0, 1.0, 1.0]
    assert b["gap"].iloc[0] == pytest.approx(np.log(101.0 / 100.0))


def test_each_group_weighs_alike_in_a_bin() -> None:
    frame = _frame()
    predicted = np.array([110.0, 190.0, 420.0, 100.0, 101.0, 290.0])
    table = ranking_table(frame, predicted, pd.Series(True, index=frame.index))
    assert table["gap_edges"] == list(GAP_EDGES)
    assert sum(table["pairs"]) == 6
    # the first bin holds only B's swapped pair (|log 1.01| < 0.01): ordered right 0 times
    assert table["pairs"][0] == 1 and table["p_right"][0] == 0.0
    assert table["p_right"] == sorted(table["p_right"])


def test_the_two_fold_check_judges_one_groups_table_on_the_others_pairs() -> None:
    frame = _frame()
    predicted = np.array([110.0, 190.0, 420.0, 100.0, 101.0, 290.0])
    everything = pd.Series(True, index=frame.index)
    half = frame["model_name"].eq("A")
    rows = {c["bin"]: c for c in two_fold_check(frame, predicted, everything, half)}
    # B's swapped pair (bin 0) is judged by A's table, which has no pair there: P 0.5
    assert rows[0]["pairs"] == 1 and rows[0]["right"] == 0.0 and rows[0]["p"] == 0.5
    assert sum(c["pairs"] for c in rows.values()) == 6


def test_p_best_faster_reads_the_bin_and_mirrors_a_negative_gap() -> None:
    assert p_best_faster(1010.0, 1000.0, UNC) == 0.55
    assert p_best_faster(1050.0, 1000.0, UNC) == 0.7
    assert p_best_faster(2000.0, 1000.0, UNC) == 0.9
    assert p_best_faster(1000.0, 1050.0, UNC) == pytest.approx(0.3)
    assert p_best_faster(1010.0, 1000.0, Uncertainty(throughput={}, memory={})) is None


def test_the_run_line_names_the_first_plan_beaten_with_confidence() -> None:
    doc = ranking_resolution([1000.0, 999.0, 990.0, 850.0], UNC)
    assert [r["rank"] for r in doc["vs_best"]] == [2, 3, 4]
    assert [r["p_best_faster"] for r in doc["vs_best"]] == [0.55, 0.55, 0.9]
    line = ranking_line(doc, sure=0.8)
    assert "#2, and really faster with P 55%" in line
    assert "#4 (+17.6%)" in line
    close = ranking_line(ranking_resolution([1000.0, 999.0], UNC), sure=0.8)
    assert "none of the 2 shown is below #1 with P >= 80%" in close
    assert ranking_line(ranking_resolution([1000.0], UNC)) == ""


def test_the_shipped_ranking_is_a_probability_rising_with_the_gap() -> None:
    from search.uncertainty import load_uncertainty

    r = load_uncertainty().ranking
    assert r["gap_edges"] == list(GAP_EDGES)
    p = r["p_right"]
    assert len(p) == len(GAP_EDGES) and p == sorted(p)
    assert all(0.0 <= x <= 1.0 for x in p)
