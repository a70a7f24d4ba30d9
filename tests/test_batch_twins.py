"""The Playbook's reproducibility check (``calibration.accuracy.batch_twins``): a job batch's runs
over the same layouts run by other batches, on rows made here (not the shared file)."""

from __future__ import annotations

import pandas as pd
import pytest

from tcf_search.calibration.accuracy import MIN_TWINS, batch_twins


def _row(job: int, dp: int, tokens: float, zero: int = 0, **cells: object) -> dict[str, object]:
    return {"case_id": f"playbook-{job}", "source": "playbook", "status": "ok",
            "model_name": "m", "num_gpus": 8 * dp, "tp": 8, "pp": 1, "dp": dp, "cp": 1,
            "micro_batch": 1, "global_batch": 256, "seq_len": 4096, "after_pp_fix": False,
            "zero_stage": zero, "tokens_per_sec_per_gpu": tokens, **cells}


def test_a_slow_batch_runs_at_a_third_of_its_twins() -> None:
    rows = []
    for i in range(MIN_TWINS):
        rows.append(_row(13000_000 + i, 2 ** (i + 1), 900.0 + i))  # a batch at ZeRO-0
        rows.append(_row(14019_000 + i, 2 ** (i + 1), (900.0 + i) / 3, zero=1))  # a slow one
    got = batch_twins(pd.DataFrame(rows))
    assert got[14019]["median"] == pytest.approx(1 / 3, abs=1e-3)
    assert got[13000]["median"] == pytest.approx(3.0, abs=1e-3)
    assert got[14019]["runs"] == MIN_TWINS


def test_too_few_twins_other_sources_and_failed_runs_say_nothing() -> None:
    rows = [_row(13000_000 + i, 2 ** (i + 1), 900.0) for i in range(MIN_TWINS)]
    rows += [_row(14019_000 + i, 2 ** (i + 1), 300.0) for i in range(MIN_TWINS - 1)]
    rows += [_row(15000_000, 2, 100.0, status="oom"),
             {**_row(16000_000, 2, 100.0), "source": "nemo", "case_id": "nemo-1"}]
    assert batch_twins(pd.DataFrame(rows)) == {}
