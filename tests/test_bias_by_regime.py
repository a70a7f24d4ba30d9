"""The signed error by regime (issue #36 item 5), on a frame the test makes: a regime the model
prices too fast shows a positive median log ratio, one it prices too slow a negative one, and
what did not run or is too thin to judge stays out."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tcf_search.calibration.accuracy import BIAS_MIN_ROWS, bias_by_regime


def _rows(n: int, **cells: object) -> pd.DataFrame:
    base = {"source": "a", "framework": "torchtitan", "precision": "bf16", "layers": 32,
            "hidden": 4096, "ffn_hidden": 14336, "ffn_type": "swiglu", "moe_experts": 0,
            "moe_topk": 0, "moe_ffn_hidden": 0, "moe_shared_experts": 0, "vocab": 128256,
            "num_gpus": 64, "compile": True, "gpu": "h100-sxm-80gb", "status": "ok",
            "tokens_per_sec_per_gpu": 1000.0}
    base.update(cells)
    return pd.DataFrame([base] * n)


def _params(f: pd.DataFrame) -> pd.Series:
    """Llama 3 8B's parameters a token multiplies, on every row."""
    return pd.Series(8.0e9, index=f.index)


def test_a_regime_priced_too_fast_is_positive_and_too_slow_negative() -> None:
    f = pd.concat([_rows(6, source="fast"), _rows(6, source="slow", precision="fp8"),
                   _rows(3, source="thin"), _rows(6, source="oom", status="oom")],
                  ignore_index=True)
    ratio = {"fast": 1.2, "slow": 0.8, "thin": 1.0, "oom": 1.0}
    tok = f["tokens_per_sec_per_gpu"] * f["source"].map(ratio)
    out = bias_by_regime(f, tok, pd.Series(True, index=f.index), _params(f))
    assert out["source"]["fast"]["median_log_ratio"] == pytest.approx(math.log(1.2))
    assert out["source"]["slow"]["median_log_ratio"] == pytest.approx(math.log(0.8))
    assert out["source"]["fast"]["rows"] == 6
    assert "thin" not in out["source"] and 3 < BIAS_MIN_ROWS  # too few rows to judge
    assert "oom" not in out["source"]  # did not run: no tokens/s to judge
    assert set(out["precision"]) == {"bf16", "fp8"}
    assert out["size"] == {"3-15B": {"median_log_ratio": pytest.approx(0.0, abs=1e-12),
                                     "rows": 15}}
    assert set(out["mode"]) == {"compiled"} and set(out["kind"]) == {"dense"}
    assert set(out["recompute"]) == {"unstated"}  # a frame without the column


def test_recomputation_is_an_axis() -> None:
    """Full recomputation (a forward run twice) is priced apart from none: its bias shows."""
    f = pd.concat([_rows(6, recompute="full"), _rows(6, recompute="none")], ignore_index=True)
    tok = f["tokens_per_sec_per_gpu"] * f["recompute"].map({"full": 0.9, "none": 1.0})
    out = bias_by_regime(f, tok, pd.Series(True, index=f.index), _params(f))
    assert out["recompute"]["full"]["median_log_ratio"] == pytest.approx(math.log(0.9))
    assert out["recompute"]["none"]["median_log_ratio"] == pytest.approx(0.0, abs=1e-12)


def test_only_the_rows_asked_for_are_judged() -> None:
    f = pd.concat([_rows(6), _rows(6, num_gpus=8)], ignore_index=True)
    tok = f["tokens_per_sec_per_gpu"] * 1.1
    out = bias_by_regime(f, tok, f["num_gpus"].gt(8), _params(f))
    assert out["scale"] == {"9-64": {"median_log_ratio": pytest.approx(math.log(1.1)),
                                     "rows": 6}}
