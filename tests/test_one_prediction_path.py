"""bench_accuracy's figures and ``tcf-search predict`` price the shared rows alike (issue #36 item
1): the calibration path (``calibration.dataset.predict_groups``, what the fit evaluates) and
predict's (``calibration.predict.predict_frame``, the CSV as a user hands it) give the same
tokens/s and the same fit on every row but those where predict searches a knob or the stage
split the row leaves empty (its fastest plan that fits; the calibration path prices the
profile's default there): 22 of the shared file's 4,537 rows at this writing (Megatron's weak
scaling 9, NeMo's long-sequence table 4, the Llama 3 paper 3, ...; Megatron-Bridge's releases
and NeMo's 24.07 table give their recipes' splits, sequence parallelism and recompute).
bench_accuracy computes every figure on predict's output (``accuracy.predicted_columns``); the
second test holds that its figures are those a user computes from that output. Skips where the
data is absent."""

from __future__ import annotations

import pandas as pd
import pytest

from tcf_search.calibration.accuracy import predicted_columns, report
from tcf_search.calibration.dataset import find_measured_csv, load_groups, predict_groups
from tcf_search.calibration.predict import predict_frame

CSV = find_measured_csv()
pytestmark = pytest.mark.skipif(CSV is None,
                                reason="../shared/data/measured_runs.csv is not on this machine")


@pytest.fixture(scope="module")
def cli() -> pd.DataFrame:
    """``tcf-search predict``'s output for the shared file as a user hands it."""
    assert CSV is not None
    return predict_frame(pd.read_csv(CSV, dtype=str, keep_default_na=False))


def test_both_paths_price_every_row_alike_where_predict_chooses_nothing(cli) -> None:
    assert CSV is not None
    frame = pd.read_csv(CSV)
    groups, _ = load_groups(frame)
    pred = predict_groups(groups, len(frame))
    cal_tok = pd.Series(pred["tokens_per_s_per_gpu"], index=frame.index)
    cal_fit = pd.Series(pred["fits"], index=frame.index).astype(float) > 0.5
    cli_tok = pd.to_numeric(cli["pred_tokens_per_sec_per_gpu"], errors="coerce")
    cli_fit = cli["pred_fits"].astype(str).str.lower().isin(["true", "1"])
    # the same rows are priced (and refused) by both
    assert (cal_tok.notna() == cli_tok.notna()).all()
    priced = cal_tok.notna()
    assert priced.sum() > 4000
    differ = priced & (((cli_tok / cal_tok - 1).abs() > 1e-3) | (cli_fit != cal_fit))
    # where they differ, predict chose a knob (or the stage split) the row leaves empty
    chose = cli[[c for c in cli.columns if c.startswith("pred_choice_")]].notna().any(axis=1)
    assert not (differ & ~chose).any(), cli.loc[differ & ~chose, "case_id"].tolist()
    assert differ.sum() < 0.01 * len(frame)  # what differs stays a few rows


def test_the_benchmark_figures_are_those_of_predicts_output(cli) -> None:
    """The issue's own measure: the Playbook's runs that ran or ran out of memory, predict's
    fit verdict against the status, rank 0's peak against ``pred_first_stage_mem_gib``,
    tokens/s against ``pred_tokens_per_sec_per_gpu`` — computed here from the CSV columns
    alone, and by bench_accuracy's ``report`` on ``predicted_columns``."""
    assert CSV is not None
    frame = pd.read_csv(CSV)
    got = report(frame, predicted_columns(cli))
    fits = cli["pred_fits"].astype(str).str.lower().eq("true")
    mem = pd.to_numeric(cli["pred_first_stage_mem_gib"], errors="coerce")
    pb = frame["source"].eq("playbook") & frame["status"].isin(["ok", "oom"]) & mem.notna()
    ok = frame["status"].eq("ok")
    assert got["oom_rows"] == pb.sum() > 3000
    assert got["oom_accuracy"] == pytest.approx((fits[pb] == ok[pb]).mean())
    assert got["false_fits"] == pytest.approx((fits[pb] & ~ok[pb]).mean())
    measured = pb & ok & frame["peak_mem_gib"].notna()
    ape = (mem[measured] / frame.loc[measured, "peak_mem_gib"] - 1).abs()
    assert got["mem_mape"] == pytest.approx(ape.mean())
    tok = pd.to_numeric(cli["pred_tokens_per_sec_per_gpu"], errors="coerce")
    dgxc = frame["source"].eq("dgxc-benchmarking") & frame["status"].eq("ok") & tok.notna()
    ape_tok = (tok[dgxc] / frame.loc[dgxc, "tokens_per_sec_per_gpu"] - 1).abs()
    assert got["dgxc_median_ape"] == pytest.approx(ape_tok.median())


def test_every_run_that_ran_is_priced_or_refused_for_a_cell_it_leaves_empty(cli) -> None:
    """Issue #36 item 2: no layout a framework launched (``ok`` or ``oom``) is refused for its
    layout. What is left refused names a cell the row leaves empty that no release gives (at
    this writing Korthikanti et al.'s two 530B rows at 2,240 GPUs, from the paper's abstract:
    no vocabulary, no global batch); NeMo's Nemotron-8B/22B take the launcher's 256k vocabulary
    (hardware_catalog/frameworks.yaml release_switches nemo)."""
    assert CSV is not None
    frame = pd.read_csv(CSV, dtype=str, keep_default_na=False)
    ran = frame["status"].isin(["ok", "oom"]).to_numpy()
    errors = cli["pred_error"].to_numpy()
    refused = [(frame.iloc[i], str(errors[i])) for i in range(len(frame))
               if ran[i] and isinstance(errors[i], str) and errors[i]]
    for row, error in refused:
        field, _, rule = error.partition(":")
        assert rule.strip() == "required, but the cell is empty", (row["case_id"], error)
        assert field in row and row[field] == "", (row["case_id"], error)
    priced = pd.to_numeric(cli["pred_tokens_per_sec_per_gpu"], errors="coerce").notna()
    assert priced.to_numpy()[ran].sum() == ran.sum() - len(refused)
