"""A measured run's CSV file (the measured_runs.csv schema) made from the family's own
prediction of a layout, for the tests of ``calibrate --measured``."""

from __future__ import annotations

import csv
from pathlib import Path

from search.inputs import case_from_row
from tcf_search.calibration.layouts import layout_row
from tcf_search.calibration.predict import run_prediction


def one_run_csv(folder: Path, layout: dict, ratio: float) -> Path:
    """One run of ``layout`` measured at ``ratio`` times the family's prediction."""
    row, _ = layout_row(layout, "test")
    family = float(run_prediction(case_from_row(row))["pred_tokens_per_sec_per_gpu"])
    row = {**row, "status": "ok", "tokens_per_sec_per_gpu": f"{family * ratio:.3f}"}
    path = folder / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    return path
