"""``tcf-search nightly``: a dated table, a summary, and regressions found between nights."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tcf_search.nightly import nightly_cmd
from tcf_search.nightly_history import diff, previous_rows

STUDY = Path(__file__).resolve().parents[1] / "studies" / "llama3-8b-h100x8.yaml"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("nightly")(nightly_cmd)
    app.command("noop")(lambda: None)
    return app


def run(*args: str) -> tuple[int, str, str]:
    got = CliRunner().invoke(_app(), ["nightly", *args])
    return got.exit_code, got.stdout, got.stderr


def studies_dir(tmp_path: Path, reserve_gib: float | None = None) -> Path:
    doc = yaml.safe_load(STUDY.read_text())
    if reserve_gib is not None:  # e.g. a driver that now reserves more HBM
        doc["cluster"]["overrides"] = {"memory_reserve_bytes": reserve_gib * 2**30}
    folder = tmp_path / "studies"
    folder.mkdir(exist_ok=True)
    (folder / "llama3-8b-h100x8.yaml").write_text(yaml.safe_dump(doc))
    return folder


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list]:
    tmp = tmp_path_factory.mktemp("nightly")
    hist = tmp / "history"
    common = ["--sku", "h100-sxm-80gb", "-o", str(hist), "--trials", "4", "--no-report", "--json"]
    code1, out1, err1 = run(str(studies_dir(tmp)), "--date", "2025-01-01", *common)
    assert code1 == 0, err1
    # night 2: 20 GiB reserved: the first night's best plan (~68 GiB) cannot fit any more
    code2, out2, err2 = run(str(studies_dir(tmp, reserve_gib=20)), "--date", "2025-01-02",
                            *common)
    return hist, [code1, json.loads(out1)], [code2, json.loads(out2)]


def test_first_night_has_nothing_to_compare(two_nights: tuple[Path, list, list]) -> None:
    _, (_, night1), _ = two_nights
    assert night1["findings"] == [] and night1["runs"][0]["status"] == "ok"


def test_second_night_detects_the_regression(two_nights: tuple[Path, list, list]) -> None:
    hist, (_, night1), (code2, night2) = two_nights
    assert code2 == 1
    kinds = {f["kind"] for f in night2["findings"]}
    assert "no_longer_fits" in kinds and "best_plan_changed" in kinds
    assert night2["previous_dates"] == ["2025-01-01"]
    summary = (hist / "2025-01-02" / "summary.md").read_text()
    assert "REGRESSION" in summary and night1["runs"][0]["best_plan"] in summary


def test_results_table_holds_both_dates(two_nights: tuple[Path, list, list]) -> None:
    hist, _, _ = two_nights
    with (hist / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["date"] for r in rows] == ["2025-01-01", "2025-01-02"]
    assert {r["sku"] for r in rows} == {"h100-sxm-80gb"}
    assert (hist / "optuna.journal").is_file()  # one storage for every night's studies


def test_throughput_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    prev = {"date": "d0", "study": "s", "sku": "k", "status": "ok", "best_plan": "tp=1",
            "tokens_per_s_per_gpu": "1000"}
    row = {"study": "s", "sku": "k", "status": "ok", "best_plan": "tp=1",
           "tokens_per_s_per_gpu": 940.0}
    # still fits
    monkeypatch.setattr("tcf_search.nightly_history.rejudge", lambda *_: (None, 1000.0))
    down = diff(None, row, prev, threshold=0.05)  # -6%
    same = diff(None, {**row, "tokens_per_s_per_gpu": 960.0}, prev, threshold=0.05)  # -4%
    assert [(f.kind, f.regression) for f in down] == [("throughput_down", True)]
    assert same == []
    # a new best says how surely it beats the previous one, both judged tonight
    from search.uncertainty import p_best_faster

    moved = diff(None, {**row, "best_plan": "tp=2", "tokens_per_s_per_gpu": 1010.0}, prev,
                 threshold=0.05)
    assert [f.kind for f in moved] == ["best_plan_changed"]
    p = p_best_faster(1010.0, 1000.0)
    assert f"+1.0% over the previous best, really faster with P {p:.0%}" in moved[0].message


def test_previous_night_is_the_latest_earlier_date() -> None:
    rows = [{"date": d, "study": "s", "sku": "k"} for d in ("2025-01-03", "2025-01-01",
                                                            "2025-01-02")]
    assert previous_rows(rows, "2025-01-03")[("s", "k")]["date"] == "2025-01-02"


@pytest.mark.parametrize(("args", "words"), [
    (["--date", "yesterday"], "--date must be YYYY-MM-DD"),
    (["--sku", "h900"], "h900"),
])
def test_bad_input_exits_2(tmp_path: Path, args: list[str], words: str) -> None:
    code, out, err = run(str(studies_dir(tmp_path)), "-o", str(tmp_path / "h"), *args)
    assert code == 2 and out == "" and words in err and err.count("\n") == 1


OLD_COLUMNS = ("date", "study", "sku", "num_gpus", "status", "best_plan",
               "tokens_per_s_per_gpu", "mfu", "step_time_s", "peak_mem_gib", "usable_mem_gib",
               "dominant_challenge", "feasible_count", "trials", "elapsed_s", "error")


@pytest.fixture(scope="module")
def model_upgrade(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list, list]:
    """Night 1 in a table written before the cost_model column existed; nights 2 and 3 run
    under two cost models (the version patched where every caller reads it)."""
    tmp = tmp_path_factory.mktemp("nightly-model")
    hist = tmp / "history"
    hist.mkdir()
    old = dict(zip(OLD_COLUMNS, ("2025-01-01", "llama3-8b-h100x8", "h100-sxm-80gb", "8", "ok",
                                 "tp=1,pp=1,dp=8", "9999.5", "0.5", "1.25", "70.0", "75.0",
                                 "compute", "3", "4", "0.5", ""), strict=True))
    with (hist / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=OLD_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerow(old)
    common = ["--sku", "h100-sxm-80gb", "-o", str(hist), "--trials", "4", "--no-report", "--json"]
    nights = []
    with pytest.MonkeyPatch.context() as mp:
        for date, version in (("2025-01-02", "a" * 64), ("2025-01-03", "b" * 64)):
            mp.setattr("search.rescore.cost_model_version", lambda v=version: v)
            code, out, err = run(str(studies_dir(tmp)), "--date", date, *common)
            assert code in (0, 1), err
            nights.append(json.loads(out))
    return hist, old, nights[0], nights[1]


def test_old_results_table_gains_the_cost_model_column(
        model_upgrade: tuple[Path, dict, dict, dict]) -> None:
    hist, old, _, _ = model_upgrade
    with (hist / "results.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames is not None and reader.fieldnames[-2:] == ["cost_model",
                                                                         "calibration"]
    assert [r["date"] for r in rows] == ["2025-01-01", "2025-01-02", "2025-01-03"]
    # the old row: every cell kept, the new ones empty
    assert rows[0] == {**old, "cost_model": "", "calibration": ""}
    assert [r["cost_model"] for r in rows[1:]] == ["a" * 12, "b" * 12]


def test_summary_says_the_cost_model_changed(model_upgrade: tuple[Path, dict, dict, dict]) -> None:
    hist, _, night2, night3 = model_upgrade
    # night 2's previous row recorded no model: nothing is said either way
    assert night2["cost_model_changes"] == []
    assert "Cost model changed" not in (hist / "2025-01-02" / "summary.md").read_text()
    assert night3["cost_model_changes"] == [{"since": "2025-01-02", "from": "a" * 12,
                                             "to": "b" * 12,
                                             "runs": ["llama3-8b-h100x8@h100-sxm-80gb"]}]
    summary = (hist / "2025-01-03" / "summary.md").read_text()
    line = [x for x in summary.splitlines() if x.startswith("Cost model changed")]
    assert line == [f"Cost model changed since 2025-01-02 ({'a' * 12} → {'b' * 12}) for 1 of 1 "
                    f"run(s): a move in prediction since then is partly the model's; predictions "
                    f"are not comparable to earlier nights without a re-run."]
    assert f"; cost model {'b' * 12})." in summary
    # the run's own result keeps the full version
    result = json.loads((hist / "2025-01-03" / "llama3-8b-h100x8@h100-sxm-80gb" /
                         "result.json").read_text())
    assert result["search"]["cost_model"] == "b" * 64


def test_same_cost_model_says_nothing(two_nights: tuple[Path, list, list]) -> None:
    hist, _, (_, night2) = two_nights
    assert night2["cost_model_changes"] == [] and night2["runs"][0]["cost_model"]
    assert "Cost model changed" not in (hist / "2025-01-02" / "summary.md").read_text()


def test_each_sku_runs_anchored_on_its_own_calibration(tmp_path: Path) -> None:
    """Issue #37: ``--calibration SKU=FILE`` carries a cluster calibration per SKU into the
    night: that SKU's runs are anchored on it, the table says which file, and another SKU's
    runs are not."""
    import nccl_tests_files as nt
    from clirunner import cli

    (tmp_path / "nccl").mkdir()
    files = nt.write_set(tmp_path / "nccl")
    cal = tmp_path / "h100-cluster.yaml"
    code, _, err = cli("calibrate", "--nccl-tests", *map(str, files), "-o", str(cal))
    assert code == 0, err
    hist = tmp_path / "history"
    code, out, err = run(str(studies_dir(tmp_path)), "--sku", "h100-sxm-80gb",
                         "--sku", "h200-sxm-141gb", "--calibration", f"h100-sxm-80gb={cal}",
                         "-o", str(hist), "--trials", "3", "--no-report", "--json",
                         "--date", "2025-02-01")
    assert code == 0, err
    rows = {r["sku"]: r for r in json.loads(out)["runs"]}
    assert rows["h100-sxm-80gb"]["calibration"] == "h100-cluster.yaml"
    assert rows["h200-sxm-141gb"]["calibration"] == ""
    with (hist / "results.csv").open() as f:
        assert {r["sku"]: r["calibration"] for r in csv.DictReader(f)} == {
            "h100-sxm-80gb": "h100-cluster.yaml", "h200-sxm-141gb": ""}
    result = json.loads((hist / "2025-02-01" / "llama3-8b-h100x8@h100-sxm-80gb"
                         / "result.json").read_text())
    assert "nccl-tests" in json.dumps(result)


@pytest.mark.parametrize(("value", "says"), [
    ("h100-sxm-80gb", "SKU=FILE"), ("nope=x.yaml", "nope"),
    ("h100-sxm-80gb=/does/not/exist.yaml", "--calibration h100-sxm-80gb: "),
])
def test_a_bad_calibration_pair_is_one_line(tmp_path: Path, value: str, says: str) -> None:
    code, _, err = run(str(studies_dir(tmp_path)), "--calibration", value,
                       "-o", str(tmp_path / "h"), "--trials", "2", "--no-report")
    assert code == 2 and says in err and "Traceback" not in err
