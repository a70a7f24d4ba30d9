"""``tcf-search explain``: the three challenges read off the cost model, and a computed verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import search.rescore
from costmodel import estimate
from search.inputs.specs import build_specs
from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study
from tcf_search.explain import explain_cmd, parse_plan

STUDIES = Path(__file__).resolve().parents[1] / "studies"
S70 = STUDIES / "llama3-70b-h100x64.yaml"
S8 = STUDIES / "llama3-8b-h100x8.yaml"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("explain")(explain_cmd)
    app.command("noop")(lambda: None)  # keeps "explain" a subcommand, as in the real CLI
    return app


def run(*args: str) -> tuple[int, str, str]:
    got = CliRunner().invoke(_app(), ["explain", *args])
    return got.exit_code, got.stdout, got.stderr


@pytest.fixture(scope="module")
def result8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("r8")
    run_study(load_study(S8), RunOptions(out_dir=out, trials=5))
    return out


def test_json_numbers_are_the_cost_model_s() -> None:
    plan_text = "tp=4,pp=4,vpp=2,mbs=1,recompute=selective,zero=1,sp=true"
    code, out, _ = run(str(S70), "--plan", plan_text, "--json")
    assert code == 0
    doc = json.loads(out)
    specs = build_specs(load_study(S70))
    e = estimate(specs.model, specs.cluster, parse_plan(plan_text, specs), specs.training)
    assert doc["plan"]["dp"] == 4
    assert doc["memory"]["peak_gib"] == pytest.approx(e.memory.peak_bytes / 2**30)
    assert doc["memory"]["fits"] == e.memory.fits
    assert len(doc["memory"]["stages"]) == 3  # pp > 2: first, middle, last
    assert doc["compute"]["mfu"] == pytest.approx(e.mfu)
    assert "6·N" in doc["compute"]["flop_convention"]
    names = {c["name"] for c in doc["communication"]["collectives"]}
    assert {"tp_activation_allreduce", "pp_activation_send_recv", "dp_grad_reduce"} <= names
    for c in doc["communication"]["collectives"]:
        assert 0 <= c["exposed_s"] <= c["time_s"] + 1e-12
    assert doc["verdict"]["binding"] == e.dominant_challenge
    # the step parts add up to the step
    assert sum(doc["step"]["breakdown"].values()) == pytest.approx(e.step_time_s, rel=1e-6)


def test_best_change_is_the_best_neighbour() -> None:
    code, out, _ = run(str(S70), "--plan", "tp=8,pp=4,mbs=1,recompute=full,zero=1,sp=true",
                       "--json")
    doc = json.loads(out)
    v = doc["verdict"]
    assert code == 0 and v["improves"] and v["neighbours_evaluated"] >= 8
    base = doc["step"]["tokens_per_s_per_gpu"]
    best = v["best_change"]
    assert best["gain"] == pytest.approx(best["tokens_per_s_per_gpu"] / base - 1)
    fitting = [a for a in v["alternatives"] if a["fits"]]
    assert best["tokens_per_s_per_gpu"] == max(a["tokens_per_s_per_gpu"] for a in fitting)
    assert best["gain"] > 0
    # each move says how surely it is really faster: the shipped held-out pairs at its gap
    from search.uncertainty import p_best_faster

    assert best["p_faster"] == p_best_faster(best["tokens_per_s_per_gpu"], base)
    assert "really faster with P" in v["advice"]
    assert all(0.0 <= a["p_faster"] <= 1.0 for a in v["alternatives"])


def test_plan_that_does_not_fit_is_bound_by_memory_and_told_how_to_fit() -> None:
    code, out, _ = run(str(S70), "--plan", "tp=1,pp=1,mbs=1,recompute=none,zero=0", "--json")
    doc = json.loads(out)
    assert code == 0 and not doc["memory"]["fits"] and doc["memory"]["headroom_gib"] < 0
    assert doc["verdict"]["binding"] == "memory"


def test_text_output_has_the_framework_sections() -> None:
    code, out, _ = run(str(S70), "--plan", "tp=4,pp=4,mbs=1,recompute=selective,zero=1")
    assert code == 0
    order = [out.index(w) for w in ("1. Memory", "2. Compute", "3. Communication", "Verdict")]
    assert order == sorted(order)


def test_rank_of_a_result_folder(result8: Path) -> None:
    code, out, _ = run(str(result8), "--rank", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    rank2 = json.loads((result8 / "result.json").read_text())["top"][1]
    assert doc["plan"] == rank2["plan"]
    assert doc["step"]["tokens_per_s_per_gpu"] == pytest.approx(
        rank2["predicted"]["tokens_per_s_per_gpu"])
    code, out, _ = run(str(S8), "--rank", "1", "--result", str(result8), "--quiet")
    assert code == 0 and "bound by" in out


def test_a_ranking_by_another_cost_model_is_noted(result8: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(str(result8), "--rank", "1", "--quiet")
    assert code == 0 and "note:" not in err  # ranked and explained by this model
    monkeypatch.setattr(search.rescore, "cost_model_version", lambda: "e" * 64)
    code, out, err = run(str(result8), "--rank", "1", "--quiet")
    ranked = json.loads((result8 / "result.json").read_text())["search"]["cost_model"]
    assert code == 0 and "bound by" in out
    assert err == (f"note: {result8} was ranked by cost model {ranked[:12]}; explained under "
                   f"eeeeeeeeeeee (rerun the study to re-score its trials)\n")


@pytest.mark.parametrize(("args", "words"), [
    (["--plan", "tp=8,bogus=1"], "unknown key 'bogus'"),
    (["--plan", "tp=8,pp=4,dp=32"], "num_gpus"),
    ([], "--plan"),
    (["--rank", "1", "--result", "/nonexistent"], "--result"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str) -> None:
    code, out, err = run(str(S70), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


def test_missing_rank_lists_the_ranks(result8: Path) -> None:
    code, _, err = run(str(result8), "--rank", "99")
    assert code == 2 and "ranks available: 1, 2, 3, 4, 5" in err


def test_the_allocator_stall_is_said(tmp_path: Path) -> None:
    """A nanotron plan whose peak nears usable memory is told its expected allocator stall, in
    the text and --json (the kernels' time holds it); a roomy one is told nothing."""
    study = tmp_path / "nt.yaml"
    study.write_text(S8.read_text().replace("  precision: bf16",
                                            "  precision: bf16\n  framework: nanotron"))
    near, roomy = "tp=2,pp=1,mbs=1,recompute=none,zero=1", "tp=2,pp=1,mbs=1,recompute=full,zero=1"
    code, out, _ = run(str(study), "--plan", near)
    assert code == 0 and "caching allocator freeing and retrying" in " ".join(out.split())
    doc = json.loads(run(str(study), "--plan", near, "--json")[1])
    c = doc["compute"]
    assert 0.0 < c["stall_time_s"] < c["time_s"] and 0.0 < c["stall_chance"] <= 1.0
    # the expected stall is the chance times what a stalled step adds to the unstalled one
    unstalled = doc["step"]["step_time_s"] - c["stall_time_s"]
    assert c["stall_time_s"] == pytest.approx(c["stall_chance"] * c["stall_slowdown"] * unstalled)
    assert f"a {c['stall_chance']:.0%} chance the peak passes usable memory" in " ".join(
        out.split())
    code, out, _ = run(str(study), "--plan", roomy)
    assert code == 0 and "caching allocator" not in " ".join(out.split())
    doc = json.loads(run(str(study), "--plan", roomy, "--json")[1])
    assert doc["compute"]["stall_time_s"] < 0.005 * doc["step"]["step_time_s"]
