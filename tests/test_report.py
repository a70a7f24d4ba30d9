"""``tcf-search report``: one offline HTML page with the issue's figures, and static PNGs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from search.pipeline import RunOptions, run_study
from search.study import load_study
from tcf_search.report import report_cmd
from tcf_search.report.plots import cell_reason, pareto_front
from tcf_search.report.schema import Cell

STUDIES = Path(__file__).resolve().parents[1] / "studies"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIGURES = ["memory", "step_time", "throughput_vs_memory", "convergence", "layout_heatmap"]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("report")(report_cmd)
    app.command("noop")(lambda: None)
    return app


def run(*args: str) -> tuple[int, str, str]:
    got = CliRunner().invoke(_app(), ["report", *args])
    return got.exit_code, got.stdout, got.stderr


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("r8")
    run_study(load_study(STUDIES / "llama3-8b-h100x8.yaml"), RunOptions(out_dir=out, trials=6))
    code, stdout, err = run(str(out), "--json")
    assert code == 0, err
    return out, json.loads(stdout)


def test_page_is_self_contained_with_every_figure(report: tuple[Path, dict]) -> None:
    folder, doc = report
    assert doc["figures"] == FIGURES and doc["notes"] == []
    text = (folder / "report.html").read_text()
    # nothing fetched: no scripts, no stylesheets, every image inline
    assert "<script" not in text and "<link" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert text.count('src="data:image/png;base64,') == len(FIGURES)
    assert all(w in text for w in ("Memory", "Compute", "Communication", "Verdict"))
    best = json.loads((folder / "result.json").read_text())["best"]
    assert f"{best['predicted']['tokens_per_s_per_gpu']:,.0f}" in text


def test_static_pngs(report: tuple[Path, dict]) -> None:
    folder, doc = report
    assert [Path(p).stem for p in doc["pngs"]] == FIGURES
    for p in doc["pngs"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(folder / "report_png") in p


def test_pareto_front_keeps_only_undominated_points() -> None:
    # (memory GiB, tokens/s): (2, 50) is beaten by (1, 60); (3, 90) and (1, 60) are not beaten
    pts = np.array([[1.0, 60.0], [2.0, 50.0], [3.0, 90.0], [3.5, 80.0], [0.5, 10.0]])
    assert pareto_front(pts).tolist() == [4, 0, 2]


def test_pruned_cell_is_labelled_by_its_constraint() -> None:
    assert cell_reason(Cell(tp=1, pp=2, valid=0, feasible=0,
                            pruned_by={"world_size": 10, "sp_tp": 2})) == "world_size"
    assert cell_reason(Cell(tp=1, pp=2, valid=5, feasible=0,
                            pruned_by={"memory": 5, "sp_tp": 9})) == "memory"


def test_folder_without_result_is_bad_input(tmp_path: Path) -> None:
    code, out, err = run(str(tmp_path))
    assert code == 2 and out == "" and "result.json is missing" in err


def test_renders_in_headless_chromium(report: tuple[Path, dict], tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: apt-get install -y chromium to check the page renders")
    folder, _ = report
    shot = tmp_path / "page.png"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--window-size=1200,3000"]
    page = (folder / "report.html").resolve().as_uri()
    subprocess.run([*args, f"--screenshot={shot}", page], capture_output=True, timeout=120,
                   check=True)
    from matplotlib.image import imread

    pixels = (imread(shot)[..., :3] * 255).round()
    # the activations bars (#dd8452) are drawn only if the inline PNGs decoded and displayed
    orange = np.all(np.abs(pixels - np.array([221, 132, 82])) <= 6, axis=-1).sum()
    assert orange > 2000, orange


def test_page_names_the_cost_model_that_ranked_it(report: tuple[Path, dict]) -> None:
    from search.rescore import cost_model_version

    folder, doc = report
    assert doc["cost_model"] == cost_model_version()
    text = (folder / "report.html").read_text()
    assert f"ranked by cost model {cost_model_version()[:12]}" in text


def test_result_ranked_by_another_cost_model_is_noted(report: tuple[Path, dict],
                                                      tmp_path: Path) -> None:
    from search.rescore import cost_model_version

    folder = tmp_path / "older"
    shutil.copytree(report[0], folder, ignore=shutil.ignore_patterns("report*"))
    result = json.loads((folder / "result.json").read_text())
    result["search"]["cost_model"] = "f" * 64
    (folder / "result.json").write_text(json.dumps(result))
    code, out, err = run(str(folder), "--no-png")
    assert code == 0, err
    note = (f"{folder} was ranked by cost model {'f' * 12}; explained under "
            f"{cost_model_version()[:12]} (rerun the study to re-score its trials)")
    assert err.splitlines() == [f"note: {note}"]
    text = (folder / "report.html").read_text()
    assert f"ranked by cost model {'f' * 12}" in text and f"<p class=note>{note}</p>" in text
    del result["search"]["cost_model"]  # a result written before the version was recorded
    (folder / "result.json").write_text(json.dumps(result))
    code, _, err = run(str(folder), "--no-png")
    assert code == 0 and err == ""
    assert "ranked by a cost model the result does not record" in (
        folder / "report.html").read_text()
