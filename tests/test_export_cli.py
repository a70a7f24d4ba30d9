"""``tcf-search export`` on a result folder and on a plan file, and the study pipeline hook."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tcf_search.export import ExportError
from tcf_search.export.cli import export_cmd, export_for_study, options_from_mapping

PLANS = Path(__file__).parent / "golden" / "export" / "plans"


@pytest.fixture()
def result_dir(tmp_path: Path) -> Path:
    result = tmp_path / "study-out"
    (result / "top").mkdir(parents=True)
    shutil.copy(PLANS / "dense70b.yaml", result / "best_plan.yaml")
    shutil.copy(PLANS / "dense70b.yaml", result / "top" / "rank-1.yaml")
    shutil.copy(PLANS / "pp8b.yaml", result / "top" / "rank-2.yaml")
    return result


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("export")(export_cmd)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps "export" a subcommand, as in the real CLI
        pass

    return app


def run(*args: str) -> tuple[int, str]:
    got = CliRunner().invoke(_app(), ["export", *args])
    return got.exit_code, got.output


def test_single_format_from_result_folder(result_dir: Path) -> None:
    code, out = run(str(result_dir), "--format", "megatron")
    assert code == 0, out
    script = result_dir / "export" / "best" / "megatron.sh"
    assert f"wrote {script}" in out and "--num-virtual-stages-per-pipeline-rank 2" in (
        script.read_text())


def test_all_formats_print_refusals_with_their_rule(result_dir: Path, tmp_path: Path) -> None:
    code, out = run(str(result_dir), "--format", "all", "-o", str(tmp_path / "x"), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert "deepspeed" in report["refused"] and "nemo" not in report["refused"]
    assert any("interleaved" in r for r in report["refused"]["deepspeed"])
    names = {Path(p).name for p in report["written"]}
    assert {"megatron.sh", "nemo.sh", "slurm.sbatch"} <= names


def test_rank_picks_top_file_and_missing_rank_lists_available(result_dir: Path) -> None:
    code, out = run(str(result_dir), "--format", "nanotron", "--rank", "2")
    assert code == 0, out
    assert (result_dir / "export" / "rank-2" / "nanotron.yaml").exists()
    code, out = run(str(result_dir), "--format", "nanotron", "--rank", "7")
    assert code == 2 and "ranks available: 1, 2" in out


def test_no_overwrite_without_force_then_force(result_dir: Path) -> None:
    assert run(str(result_dir), "--format", "megatron")[0] == 0
    script = result_dir / "export" / "best" / "megatron.sh"
    before = script.stat().st_mtime_ns
    assert run(str(result_dir), "--format", "megatron")[0] == 0  # its own file: a no-op rerun
    assert script.stat().st_mtime_ns == before
    script.write_text("# the user's own script\n")
    code, out = run(str(result_dir), "--format", "megatron")
    assert code == 2 and "--force" in out
    assert script.read_text() == "# the user's own script\n"
    assert run(str(result_dir), "--format", "megatron", "--force")[0] == 0
    assert script.read_text() != "# the user's own script\n"


def test_plan_file_input_refusal_exits_nonzero(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    shutil.copy(PLANS / "dense70b.yaml", plan)
    code, out = run(str(plan), "--format", "deepspeed")
    assert code == 1 and "refused deepspeed" in out and "framework_schedule" in out
    code, out = run(str(plan), "--format", "megatron", "--set", "lr=1e-4",
                    "--set", "train_iters=10")
    assert code == 0, out
    text = (tmp_path / "export-plan" / "megatron.sh").read_text()
    assert "--lr 0.0001" in text and "--train-iters 10" in text


def test_unknown_format_and_bad_set_are_one_line_errors(result_dir: Path) -> None:
    code, out = run(str(result_dir), "--format", "jax")
    assert code == 2 and out.startswith("error: format must be one of")
    code, out = run(str(result_dir), "--format", "megatron", "--set", "nope=1")
    assert code == 2 and "export.options.nope: unknown key" in out


def test_export_for_study_reports_refusals_without_raising(result_dir: Path) -> None:
    report = export_for_study(result_dir, ["megatron", "accelerate"],
                              options={"run_name": "r1"})
    assert report.refused["accelerate"] and len(report.written) == 1
    assert "checkpoints/r1" in Path(report.written[0]).read_text()


def test_options_mapping_rejects_unknown_keys() -> None:
    with pytest.raises(ExportError, match="export.options.fsdp: unknown key"):
        options_from_mapping({"fsdp": "torch"})
    assert options_from_mapping({"fsdp_impl": "torch"}).fsdp_impl == "torch"
