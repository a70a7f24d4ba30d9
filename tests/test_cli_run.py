"""``tcf-search run`` / ``tcf-search STUDY.yaml``: the JSON document, the result folder, resuming,
and one clear line for bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import search.rescore
from search.inputs.planfile import load_plan_file
from search.rescore import cost_model_version
from tcf_search.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "studies" / "tiny-cpu.yaml"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_document_and_result_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    code, out, err = run(capsys, str(TINY), "-o", str(tmp_path), "--json", "--exhaustive")
    assert code == 0, err
    doc = json.loads(out)
    for key in ("best", "top", "feasible_count", "pruned_by", "trials", "elapsed_s", "optimum"):
        assert key in doc
    assert doc["feasible_count"] > 0 and doc["trials"] == doc["search"]["trials_target"]
    assert doc["best"] == doc["top"][0] and doc["best"]["rank"] == 1
    assert doc["optimum"]["regret"] == pytest.approx(0.0, abs=1e-12)  # every unit was judged
    assert json.loads((tmp_path / "result.json").read_text()) == doc
    # how surely #1 beats each later plan, from the shipped held-out pairs
    vs = doc["ranking"]["vs_best"]
    assert [r["rank"] for r in vs] == [t["rank"] for t in doc["top"][1:]]
    tops = [t["predicted"]["tokens_per_s_per_gpu"] for t in doc["top"]]
    assert vs[0]["tokens_per_s_gap"] == pytest.approx(tops[0] / tops[1] - 1.0)
    assert all(0.0 <= r["p_best_faster"] <= 1.0 for r in vs)

    best = load_plan_file(tmp_path / "best_plan.yaml")
    assert best.rank == 1 and best.gpu == "cpu-local" and best.num_gpus == 2
    assert {k: getattr(best.plan, k) for k in doc["best"]["plan"]} == doc["best"]["plan"]
    assert best.predicted["tokens_per_s_per_gpu"] == doc["best"]["predicted"][
        "tokens_per_s_per_gpu"]
    ranks = sorted((tmp_path / "top").glob("rank-*.yaml"))
    assert len(ranks) == len(doc["top"])
    assert load_plan_file(tmp_path / "top" / "rank-2.yaml").rank == 2

    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == doc["trials"]
    assert {"number", "state", "tp", "pp", "dp", "tokens_per_s_per_gpu", "peak_mem_gib",
            "constraint_memory_gib"} <= set(rows[0])


def test_same_command_resumes_and_other_study_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "run", str(TINY), "-o", str(tmp_path), "-q")[0] == 0
    code, out, _ = run(capsys, "run", str(TINY), "-o", str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["search"]["trials_this_run"] == 0
    assert doc["search"]["cost_model"] == cost_model_version()
    assert doc["search"]["study_name"] == "tiny-cpu" and "rescored" not in doc["search"]
    # after an upgrade: the trials judged again, one note line, the new version recorded
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search.rescore, "cost_model_version", lambda: "c" * 64)
        code, out, err = run(capsys, "run", str(TINY), "-o", str(tmp_path), "--json")
    again = json.loads(out)
    assert code == 0 and again["search"]["cost_model"] == "c" * 64
    assert again["search"]["rescored"]["trials"] == doc["trials"] == again["trials"]
    assert err.count("\n") == 1 and err.startswith("note: storage ") and "re-scored" in err
    assert again["best"]["plan"] == doc["best"]["plan"]  # the same formulas: the same answer
    other = tmp_path / "tiny-cpu.yaml"
    other.write_text(TINY.read_text().replace("seq_len: 256", "seq_len: 512"))
    code, _, err = run(capsys, "run", str(other), "-o", str(tmp_path))
    assert code == 2
    assert err.count("\n") == 1 and "different study definition" in err


def test_table_and_default_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, str(TINY))
    assert code == 0
    assert (tmp_path / "runs" / "tiny-cpu" / "best_plan.yaml").is_file()
    assert "tok/s/GPU" in out and "tiny-cpu" in out


def test_no_feasible_layout_answers_with_nearest_misses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "full.yaml"
    study.write_text(TINY.read_text().replace(
        "gpus_per_node: 2\n", "gpus_per_node: 2\n  overrides: {hbm_bytes: 4.0e+6}\n"))
    code, out, _ = run(capsys, str(study), "-o", str(tmp_path / "out"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["best"] is None and doc["feasible_count"] == 0
    assert doc["pruned_by"]["memory"] == doc["valid_count"] > 0
    assert doc["near_misses"] and doc["near_misses"][0]["reason"].startswith("needs ")
    code, out, _ = run(capsys, str(study), "-o", str(tmp_path / "out2"))
    assert "no feasible layout" in out and "needs " in out


def test_no_valid_layout_says_why_nothing_is_near(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # TP 3 divides none of Llama 3 8B's 32 heads: no layout is valid, so none reaches the memory
    # stage and there is no nearest miss to list; the answer names the rule instead.
    study = tmp_path / "tp3.yaml"
    study.write_text((ROOT / "studies" / "llama3-8b-h100x8.yaml").read_text().replace(
        "search_space:\n", "search_space:\n  tp: 3\n"))
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "nearest misses" not in out
    assert "no valid layout" in out
    lines = out.splitlines()
    rule = next(line for line in lines if line.strip().startswith("tp_heads:"))
    assert "heads % tp == 0" in rule and "12,288 layouts" in rule
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["valid_count"] == 0 and doc["near_misses"] == []
    assert doc["pruned_by"]["tp_heads"] == 12_288


@pytest.mark.parametrize("objective, column, key", [
    ("time_to_train", "days", "time_to_train_days"),
    ("cost", "cost $", "cost_usd"),
])
def test_table_shows_the_objective_it_optimised(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                objective: str, column: str, key: str) -> None:
    study = tmp_path / "tiny-cpu.yaml"
    study.write_text(TINY.read_text()
                     .replace("precision: bf16\n", "precision: bf16\n  token_budget: 1.0e+9\n")
                     .replace("gpus_per_node: 2\n", "gpus_per_node: 2\n  price_per_gpu_hour: 2.5\n")
                     .replace("metric: tokens_per_s", f"metric: {objective}"))
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "out"))
    assert code == 0, err
    header = next(line for line in out.splitlines() if "tok/s/GPU" in line)
    assert column in header
    best = json.loads((tmp_path / "out" / "result.json").read_text())["best"]["predicted"][key]
    fmt = "{:,.2f}" if key == "time_to_train_days" else "{:,.0f}"
    first = next(line for line in out.splitlines() if line.lstrip().startswith("1 "))
    assert fmt.format(best) in first


@pytest.mark.parametrize("text, message", [
    ("model: {preset: llama9}\n", "error: model.preset: must be one of"),
    ("model: [\n", "error: study: not valid YAML"),
    (TINY.read_text().replace("gpu: cpu", "gpu: cpu\n  gpux: 1"), "error: cluster.gpux: unknown"),
], ids=["preset", "yaml", "unknown-key"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          text: str, message: str) -> None:
    study = tmp_path / "bad.yaml"
    study.write_text(text)
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_missing_study_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(tmp_path / "absent.yml"))
    assert code == 2 and "cannot read" in err and err.count("\n") == 1


def test_version_and_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("tcf-search ")
    code, out, _ = run(capsys, "catalog", "list")
    assert code == 0 and "h100-sxm-80gb" in out
    code, out, _ = run(capsys, "catalog", "show", "h100-sxm-80gb")
    assert code == 0 and json.loads(out)["id"] == "h100-sxm-80gb"
    code, _, err = run(capsys, "catalog", "show", "h999")
    assert code == 2 and "h100-sxm-80gb" in err and err.count("\n") == 1


def test_console_entry_point_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {seq_len: 0}\n")
    proc = subprocess.run([sys.executable, "-m", "tcf_search", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_export_section_runs_the_export_hook(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "tiny-cpu.yaml"
    study.write_text(TINY.read_text() + "export: {formats: [megatron], output: launch}\n")
    code, _, err = run(capsys, str(study), "-o", str(tmp_path / "out"), "-q")
    assert code == 0, err
    assert any((tmp_path / "out" / "launch").rglob("*")), "the export wrote launcher files"


def test_nothing_fits_names_the_closest_not_a_rule(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38: 405B on 8 A100-40GB: the nearest misses included tp=4, pp=2, vpp=5, whose most
    # even split (63 + 63 layers) makes no 5 chunks; explaining it raised the vpp_layers rule
    # (exit 2) instead of saying that nothing fits and by how much
    study = tmp_path / "405b.yaml"
    study.write_text("name: big\nmodel: {preset: llama3.1-405b}\n"
                     "training: {seq_len: 8192, global_batch: 64}\n"
                     "cluster: {gpu: a100-sxm-40gb, gpus: 8}\n")
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "out"))
    assert code == 0, err
    head = next(line for line in out.splitlines() if "no feasible layout" in line)
    assert "no layout fits in memory; the closest needs " in head
    assert "GiB over the 34.1 GiB usable" in head and "layers % (pp * vpp)" not in out
    code, out, _ = run(capsys, str(study), "-o", str(tmp_path / "out2"), "--json")
    misses = json.loads(out)["near_misses"]
    assert len(misses) == 5 and any(m["plan"]["vpp"] > 1 for m in misses)
    assert all(m["needs_gib"] > m["usable_gib"] for m in misses)
