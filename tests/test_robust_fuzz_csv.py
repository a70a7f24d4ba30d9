"""CSVs for ``tcf-search predict``, fuzzed. Two layers of contract:

* a file that is not a CSV at all (binary junk, another encoding, an unterminated quote, nothing)
  or an output path that cannot be written ends with exit 2 and ONE line on stderr;
* a readable CSV whose cells are wrong (text for numbers, negative, zero, huge, inf, nan,
  unknown SKU, unknown recompute mode, formula-looking text) is predicted row by row: exit 0,
  the bad row gets a ``pred_error`` naming its column, every other row is predicted exactly as
  without the bad one, and no row carries an inf or nan prediction.

Never a traceback; cells are data, never evaluated.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcf_search.cli import main

MEASURED = Path(__file__).resolve().parents[2] / "shared" / "data" / "measured_runs.csv"
EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# A dense and an MoE case in the measured_runs.csv schema, with every knob given.
HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "tied_embeddings,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,gpu,"
          "gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,global_batch,"
          "recompute,sequence_parallel,precision,framework")
ROWS = [
    "a,llama 8B,32,4096,14336,32,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,2,2,1,1,1,16,"
    "1,1,512,selective,true,bf16,megatron",
    "b,mixtral,32,4096,14336,32,8,32000,4096,swiglu,false,8,2,14336,0,h100-sxm-80gb,8,64,1,4,1,1,"
    "8,16,1,1,256,full,false,bf16,megatron",
    "c,llama 70B,80,8192,28672,64,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,8,2,1,1,1,4,"
    "1,1,256,full,true,bf16,nemo",
]
BASE = HEADER + "\n" + "\n".join(ROWS) + "\n"
# Columns that configure the prediction (free-text columns are passed through untouched).
CONFIG = ["layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len", "ffn_type",
          "tied_embeddings", "moe_experts", "moe_topk", "gpu", "gpus_per_node", "num_gpus", "tp",
          "pp", "vpp", "cp", "ep", "dp", "zero_stage", "micro_batch", "global_batch",
          "recompute", "sequence_parallel", "precision"]
# Values that are wrong in any configuration column.
ALWAYS_BAD = ["-1", "-4096", "abc", "1.5", "inf", "-inf", "nan", "NaN", "12abc", "0x10", "1,2",
              "=1+1", "@SUM(A1)", "$(touch PWNED)", "\x00", "é", "true false"]
MAYBE_BAD = ["0", "1", "2", "3", "1e30", "99999999999999999999999", "2147483648", " ", "false"]
PRED = ["pred_tokens_per_sec_per_gpu", "pred_step_time_s", "pred_peak_mem_gib"]


@dataclass(frozen=True)
class Outcome:
    code: int
    err: str
    frame: pd.DataFrame | None


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


def predict(data: str | bytes, *extra: str) -> Outcome:
    count_input("csv")
    with tempfile.TemporaryDirectory(prefix="tcf-fuzz-csv-") as tmp:
        cases, out = Path(tmp) / "cases.csv", Path(tmp) / "pred.csv"
        if isinstance(data, bytes):
            cases.write_bytes(data)
        else:
            cases.write_text(data, encoding="utf-8")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(["predict", str(cases), "-o", str(out), *extra])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        text = err.getvalue()
        assert "Traceback" not in text
        assert code in (0, 2), f"exit {code}: {text[-300:]}"
        assert not list(Path(tmp).glob("*.tmp")), "a temporary file was left behind"
        assert not (Path(tmp) / "PWNED").exists() and not Path("PWNED").exists()
        if code == 2:
            lines = text.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), lines
            assert not out.exists()
            return Outcome(code, text, None)
        frame = pd.read_csv(out, dtype=str, keep_default_na=False)
        return Outcome(code, text, frame)


def with_cell(row: int, column: str, value: str) -> str:
    rows = list(csv.DictReader(io.StringIO(BASE)))
    rows[row][column] = value
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def finite_predictions(frame: pd.DataFrame) -> None:
    for i, row in frame.iterrows():
        if row["pred_error"]:
            continue
        for col in PRED:
            assert math.isfinite(float(row[col])), f"row {i}: {col}={row[col]!r}"


@pytest.fixture(scope="module")
def baseline() -> pd.DataFrame:
    r = predict(BASE)
    assert r.code == 0 and r.frame is not None
    assert not r.frame["pred_error"].any(), r.frame["pred_error"].tolist()
    return r.frame


def assert_others_unchanged(frame: pd.DataFrame, baseline: pd.DataFrame, bad: int) -> None:
    for i in range(len(ROWS)):
        if i != bad:
            assert list(frame.loc[i, PRED]) == list(baseline.loc[i, PRED]), i


@FUZZ
@given(row=st.integers(0, len(ROWS) - 1), column=st.sampled_from(CONFIG),
       value=st.sampled_from(ALWAYS_BAD))
def test_a_bad_cell_fails_its_row_only(baseline: pd.DataFrame, row: int, column: str,
                                        value: str) -> None:
    r = predict(with_cell(row, column, value))
    assert r.code == 0 and r.frame is not None, r.err
    assert len(r.frame) == len(ROWS)
    error = str(r.frame.loc[row, "pred_error"])
    assert error, f"{column}={value!r} was accepted"
    assert "\n" not in error
    words = {column, column.split("_")[0], "gpu" if column == "gpu" else column}
    assert any(w in error.lower() for w in words) or "must hold" in error, error
    assert_others_unchanged(r.frame, baseline, row)
    finite_predictions(r.frame)


@FUZZ
@given(row=st.integers(0, len(ROWS) - 1), column=st.sampled_from(CONFIG),
       value=st.one_of(st.sampled_from(MAYBE_BAD), st.text(
           st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=12)))
def test_any_cell_gives_a_prediction_or_a_row_error(baseline: pd.DataFrame, row: int, column: str,
                                                   value: str) -> None:
    r = predict(with_cell(row, column, value))
    if r.code == 2:  # e.g. a NUL or a lone quote made the file unreadable as CSV
        assert "CASES.csv" in r.err
        return
    assert r.frame is not None and len(r.frame) == len(ROWS)
    assert_others_unchanged(r.frame, baseline, row)
    finite_predictions(r.frame)


@FUZZ
@given(blob=st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_junk_files_end_in_one_line_or_row_errors(blob: str | bytes) -> None:
    r = predict(blob)
    if r.frame is not None:  # readable as a CSV of sorts: rows without the columns fail alone
        finite_predictions(r.frame)
        assert all(r.frame["pred_error"]) or r.frame.empty


@FUZZ
@given(cut=st.integers(0, len(BASE)))
def test_truncated_files(cut: int) -> None:
    r = predict(BASE[:cut])
    if r.frame is not None:
        finite_predictions(r.frame)


@pytest.mark.parametrize("data", [b"", b"\xff\xfe\x00junk", BASE.encode("utf-16"),
                                  BASE + '"unterminated\n'],
                         ids=["empty", "binary", "utf16", "open-quote"])
def test_unreadable_files_are_one_line(data: str | bytes) -> None:
    r = predict(data)
    assert r.code == 2 and "CASES.csv" in r.err


def test_output_paths_that_cannot_be_written(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cases = tmp_path / "cases.csv"
    cases.write_text(BASE)
    kept = tmp_path / "kept.csv"
    kept.write_text("precious\n")
    (tmp_path / "folder").mkdir()
    for target, extra in [(tmp_path / "no-such-folder" / "p.csv", []),
                          (tmp_path / "folder", ["--force"]),
                          (kept, [])]:
        code = main(["predict", str(cases), "-o", str(target), *extra])
        _, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: -o"), err
    assert kept.read_text() == "precious\n", "overwritten without --force"
    assert not list(tmp_path.rglob("*.tmp"))
    assert main(["predict", str(cases), "-o", str(kept), "--force"]) == 0
    assert kept.read_text().startswith("case_id,")


@pytest.mark.skipif(not MEASURED.is_file(), reason="needs ../shared/data/measured_runs.csv")
def test_the_published_measurements_predict_without_error_rows_crashing() -> None:
    r = predict(MEASURED.read_bytes())
    assert r.code == 0 and r.frame is not None and len(r.frame) > 100
    finite_predictions(r.frame)
