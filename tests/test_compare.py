"""``tcf-search compare``: the framework's trade-off directions, computed for one model/cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tcf_search.compare import compare_cmd

STUDY = Path(__file__).resolve().parents[1] / "studies" / "llama3-70b-h100x64.yaml"
BASE = "tp=2,pp=2,mbs=1,recompute=selective,zero=1,sp=true"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("compare")(compare_cmd)
    app.command("noop")(lambda: None)
    return app


def run(*args: str) -> tuple[int, str, str]:
    got = CliRunner().invoke(_app(), ["compare", str(STUDY), *args])
    return got.exit_code, got.stdout, got.stderr


def rows(*techniques: str, base: str = BASE) -> dict[str, dict[str, Any]]:
    args = [a for t in techniques for a in ("--with", t)]
    code, out, err = run("--base", base, *args, "--json")
    assert code == 0, err
    return {r["technique"]: r for r in json.loads(out)["techniques"]}


def rel(row: dict[str, Any], key: str) -> float:
    return float(row["deltas"][key]["relative"])


def test_trade_off_directions_of_the_framework() -> None:
    r = rows("recompute=full", "tp=4", "pp=4")
    # recompute lowers memory and raises compute
    assert rel(r["recompute=full"], "mem_activations_gib") < -0.5
    assert rel(r["recompute=full"], "compute_s") > 0.1
    assert rel(r["recompute=full"], "tokens_per_s_per_gpu") < 0
    # TP lowers per-GPU memory and raises communication
    assert rel(r["tp=4"], "mem_weights_gib") < 0 and rel(r["tp=4"], "peak_mem_gib") < 0
    assert rel(r["tp=4"], "comm_gib") > 0 and rel(r["tp=4"], "comm_exposed_s") > 0
    # PP lowers per-stage memory and adds to the bubble
    assert rel(r["pp=4"], "mem_weights_gib") < 0
    assert rel(r["pp=4"], "bubble_s") > 0


def test_world_size_is_kept_and_said() -> None:
    r = rows("tp=4")["tp=4"]
    assert r["plan"]["tp"] * r["plan"]["pp"] * r["plan"]["dp"] * r["plan"]["cp"] == 64
    assert r["adjusted"] == ["dp 16→8 (keeps 64 GPUs)"]


def test_zero3_shards_weights_and_adds_gathers() -> None:
    # Megatron-FSDP has no pipeline axis in megatron-core 0.16 (frameworks.yaml zero_stages_pp)
    r = rows("zero=3", base=BASE.replace("pp=2", "pp=1"))["zero=3"]
    assert rel(r, "mem_weights_gib") < -0.5 and rel(r, "comm_gib") > 0


def test_summary_sentence_and_table() -> None:
    code, out, _ = run("--base", BASE, "--with", "recompute=full")
    assert code == 0 and "activations −" in out and "compute +" in out and "tokens/s −" in out
    code, out, _ = run("--base", BASE, "--with", "recompute=full", "--quiet")
    assert out.startswith("recompute=full: activations −")


def test_bad_with_names_itself_and_exits_2() -> None:
    code, out, err = run("--base", BASE, "--with", "tp=3")
    assert code == 2 and out == "" and err.startswith("error: --with tp=3:")
    code, _, err = run("--base", BASE, "--with", "warp=9")
    assert code == 2 and "unknown key 'warp'" in err


def test_best_of_a_folder_ranked_by_another_cost_model_is_noted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import search.rescore
    from search.inputs.study import load_study
    from search.pipeline import RunOptions, run_study

    study = STUDY.with_name("llama3-8b-h100x8.yaml")
    run_study(load_study(study), RunOptions(out_dir=tmp_path, trials=4))
    args = ["compare", str(study), "--result", str(tmp_path), "--with", "recompute=full", "-q"]
    got = CliRunner().invoke(_app(), args)
    assert got.exit_code == 0 and got.stderr == ""  # ranked and compared by this model
    ranked = json.loads((tmp_path / "result.json").read_text())["search"]["cost_model"]
    monkeypatch.setattr(search.rescore, "cost_model_version", lambda: "e" * 64)
    got = CliRunner().invoke(_app(), args)
    assert got.exit_code == 0 and got.stdout.startswith("recompute=full:")
    assert got.stderr == (f"note: {tmp_path} was ranked by cost model {ranked[:12]}; compared "
                          f"under eeeeeeeeeeee (rerun the study to re-score its trials)\n")
