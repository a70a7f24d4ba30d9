"""A study's ``baseline:`` (or ``--baseline``) beside the best: in ``run`` (table and --json),
``explain``, ``compare`` and ``report``, with the gain split by challenge; why the search space
excludes a baseline (the axis and its values, or the rule); a baseline that does not fit; bad
baselines as one line, exit 2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from costmodel import Plan
from costmodel.estimate import estimate
from search.baseline import baseline_doc, exclusions, parse_baseline, versus
from search.inputs.planspec import PlanSpecError
from search.inputs.specs import build_specs
from search.inputs.study import load_study, parse_study
from search.space import build_space
from tcf_search.cli import main

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "studies" / "tiny-cpu.yaml"
EIGHT_B = ROOT / "studies" / "llama3-8b-h100x8.yaml"
# inside tiny-cpu's space (tp, pp, mbs, recompute and zero among its searched values)
INSIDE = "tp=1,pp=2,mbs=1,recompute=full,zero=0"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def with_baseline(tmp_path: Path, source: Path, baseline: str, name: str = "study") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(source.read_text() + f"\nbaseline: {json.dumps(baseline)}\n")
    return path


def adds_up(gain: dict[str, float]) -> bool:
    parts = gain["compute"] + gain["communication"] + gain["memory"]
    return abs(parts - gain["total"]) <= 1e-9 * max(1.0, abs(gain["total"]))


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """tiny-cpu with an in-space baseline, searched exhaustively: the best is the optimum."""
    tmp = tmp_path_factory.mktemp("baseline")
    study = with_baseline(tmp, TINY, INSIDE)
    out = tmp / "out"
    code = main(["run", str(study), "-o", str(out), "--exhaustive", "-q"])
    assert code == 0
    return study, out, json.loads((out / "result.json").read_text())


def test_run_json_shows_the_baseline_beside_the_best(finished: tuple[Path, Path, dict]) -> None:
    _, _, doc = finished
    b = doc["baseline"]
    assert b["origin"] == "study baseline" and b["in_space"] and b["excluded_by"] == []
    assert Plan(**b["plan"]) == parse_baseline(INSIDE, build_specs(load_study(TINY)))
    v = b["versus"]
    assert v["plan"] == doc["best"]["plan"]
    best_tps = doc["best"]["predicted"]["tokens_per_s_per_gpu"]
    # the best's figure (estimate_batch, in the search) and the split's (estimate) agree
    assert v["figures"]["tokens_per_s_per_gpu"] == pytest.approx(best_tps, rel=1e-9)
    assert v["gain"]["total"] == pytest.approx(
        best_tps / b["figures"]["tokens_per_s_per_gpu"] - 1, rel=1e-9)
    assert v["gain"]["total"] >= 0  # exhaustive: nothing in the space beats the best
    assert adds_up(v["gain"])
    assert any("tokens/s: compute" in line for line in b["lines"])


def test_run_table_and_flag_override(finished: tuple[Path, Path, dict], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    study, _, _ = finished
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "t"), "--trials", "5")
    assert code == 0, err
    assert f"baseline {INSIDE.replace('pp=2', 'pp=2,dp=1')} (study baseline)" in out
    assert "inside the search space" in out and "the best vs the baseline: " in out
    code, out, err = run(capsys, str(study), "-o", str(tmp_path / "t"), "--json",
                         "--baseline", "tp=2,pp=1,mbs=2,recompute=none,zero=0")
    assert code == 0, err
    doc = json.loads(out)["baseline"]
    assert doc["origin"] == "--baseline" and doc["plan"]["tp"] == 2


@pytest.mark.parametrize("a, b", list(itertools.combinations([
    "tp=1,pp=1,mbs=1,recompute=selective,zero=1",
    "tp=2,pp=2,mbs=1,recompute=selective,zero=1",
    "tp=1,pp=4,vpp=2,mbs=1,recompute=full,zero=1",
    "tp=8,pp=1,mbs=2,recompute=none,zero=0,sp=true",
    "tp=2,pp=1,cp=2,mbs=1,recompute=none,zero=3",  # Megatron-FSDP: no pp (frameworks.yaml)
], 2)))
def test_the_gain_split_adds_up_to_the_total(a: str, b: str) -> None:
    specs = build_specs(load_study(EIGHT_B))
    base, plan = parse_baseline(a, specs), parse_baseline(b, specs)
    for x, y in ((base, plan), (plan, base)):
        v = versus(specs, x, y)
        assert adds_up(v["gain"]), v["gain"]
        assert v["gain"]["total"] == pytest.approx(
            v["figures"]["tokens_per_s_per_gpu"]
            / v["baseline_figures"]["tokens_per_s_per_gpu"] - 1, rel=1e-12)


def test_outside_the_space_by_an_axis_names_the_axis_and_its_values() -> None:
    study = load_study(TINY)
    specs = build_specs(study)
    plan = parse_baseline("tp=1,pp=1,mbs=8,recompute=selective,zero=0", specs)
    found = exclusions(build_space(study, specs), plan)
    assert [(x["kind"], x["name"], x["value"]) for x in found] == [
        ("axis", "micro_batch", 8), ("axis", "recompute", "selective")]
    assert found[0]["searched"] == [1, 2, 4]
    assert ("micro_batch=8 is not among the searched values of search_space.micro_batch: "
            "[1, 2, 4]") == found[0]["text"]
    doc = baseline_doc(specs, plan, "study baseline", space=build_space(study, specs))
    assert doc["in_space"] is False and doc["figures"]["tokens_per_s_per_gpu"] > 0
    assert "  outside the search space:" in doc["lines"]


def test_outside_the_space_by_a_rule_names_the_rule_and_its_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = with_baseline(tmp_path, TINY, "tp=2,pp=1,mbs=2,recompute=none,zero=2")
    code, out, err = run(capsys, "explain", str(study), "--plan", INSIDE, "--json")
    assert code == 0, err
    b = json.loads(out)["baseline"]
    assert [x["name"] for x in b["excluded_by"]] == ["zero_sharding"]
    assert b["excluded_by"][0]["rule"] == (
        "zero_stage == 0, dp * cp > 1 or the experts have expert-DP replicas "
        "(in a canonical space)")
    assert b["figures"]["fits"]  # the tool's own figure is still given
    code, out, err = run(capsys, "explain", str(study), "--plan", INSIDE)
    assert code == 0, err
    assert "rule zero_sharding: zero_stage == 0, dp * cp > 1" in out
    assert "this plan vs the baseline:" in out


def test_a_baseline_that_does_not_fit_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", str(EIGHT_B), "--plan",
                         "tp=1,pp=1,zero=3,mbs=1,recompute=none", "--baseline",
                         "tp=1,pp=1,mbs=8,recompute=none,zero=0", "--json")
    assert code == 0, err
    b = json.loads(out)["baseline"]
    assert not b["figures"]["fits"] and b["figures"]["headroom_gib"] < 0
    assert "does NOT fit" in b["lines"][0] and "hard constraint" in b["lines"][0]
    assert "the baseline does not fit in memory" in b["versus"]["summary"]


SEVENTY_B = ROOT / "studies" / "llama3-70b-h100x1024.yaml"


def test_compare_base_beaten_by_the_baseline_speaks_of_the_base_not_the_search(
        capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38: the study baseline (tp=4,pp=4,cp=2,vpp=5) beats the user's --base, not the
    # search's best; the old line said the search had not converged
    code, out, err = run(capsys, "compare", str(SEVENTY_B), "--base",
                         "tp=8,pp=4,mbs=1,zero=1,sp=true", "--with", "recompute=full",
                         "--with", "pp=8", "--json")
    assert code == 0, err
    b = json.loads(out)["baseline"]
    assert b["in_space"] and b["versus"]["gain"]["total"] < 0  # the baseline is faster
    text = " ".join(b["lines"])
    assert "search's best" not in text.replace("is not the search's best", "")
    assert "not converged" not in text and "searched" not in b
    line = next(x for x in b["lines"] if "beats" in x)
    assert line.strip().startswith("the baseline beats the base (")
    assert f"{b['figures']['tokens_per_s_per_gpu']:,.0f} vs " in line


def test_explain_of_the_best_compare_and_report(finished: tuple[Path, Path, dict],
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    study, out, doc = finished
    code, text, err = run(capsys, "explain", str(study), "--rank", "1", "--result", str(out))
    assert code == 0, err
    assert "Baseline" in text and "the best vs the baseline:" in text

    best = ",".join(f"{k}={v}" for k, v in doc["best"]["plan"].items())
    code, text, err = run(capsys, "compare", str(study), "--base", best, "--json")
    assert code == 0, err  # no --with: the baseline is the comparison
    cmp = json.loads(text)
    assert cmp["baseline"]["row"]["technique"] == "baseline"
    assert adds_up(cmp["baseline"]["versus"]["gain"])
    code, text, err = run(capsys, "compare", str(study), "--base", best, "-q")
    assert code == 0 and text.strip().startswith("the base vs the baseline:"), err

    code, text, err = run(capsys, "compare", str(study), "--result", str(out), "-q")
    assert code == 0 and text.strip().startswith("the best vs the baseline:"), err

    html = tmp_path / "r.html"
    code, _, err = run(capsys, "report", str(out), "-o", str(html), "--no-png")
    assert code == 0, err
    page = html.read_text()
    assert "Baseline: your current recipe beside the best" in page and "id=baseline" in page


def test_report_marks_the_baseline_on_the_heat_map_and_the_scatter(
        finished: tuple[Path, Path, dict]) -> None:
    pytest.importorskip("matplotlib")
    from tcf_search.report import plots
    from tcf_search.report.data import load_result

    data = load_result(finished[1])
    heat = plots.layout_heatmap(data)
    assert heat is not None
    outlined = [p for p in heat.axes[0].patches if not p.get_fill()]
    assert len(outlined) == 1  # the baseline's (tp, pp) cell
    (x, y) = outlined[0].get_xy()
    assert (round(x + 0.46), round(y + 0.46)) == (1, 0)  # pp=2 (column 1), tp=1 (row 0)
    scatter = plots.throughput_scatter(data)
    assert scatter is not None
    labels = scatter.axes[0].get_legend_handles_labels()[1]
    assert "baseline" in labels


def test_report_baseline_flag_overrides(finished: tuple[Path, Path, dict], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    study, out, _ = finished
    html = tmp_path / "r.html"
    code, _, err = run(capsys, "report", str(out), "-o", str(html), "--no-png", "--study",
                       str(study), "--baseline", "tp=1,pp=1,mbs=8,recompute=full,zero=2")
    assert code == 0, err
    assert "micro_batch=8 is not among the searched values" in html.read_text()


BAD = [
    ("tp8", "each item must be key=value"),
    ("tpp=2", "unknown key 'tpp'"),
    ("tp=2,dp=3", "world_size: tp * pp * cp * dp == num_gpus"),
    ("tp=3", "tp * pp * cp must divide num_gpus"),
    ("tp=2,recompute=some", "recompute must be one of"),
]


@pytest.mark.parametrize("text, rule", BAD)
def test_bad_baseline_flag_is_one_line_exit_2(text: str, rule: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in (["explain", str(TINY), "--plan", INSIDE],
                ["compare", str(TINY), "--base", INSIDE]):
        code, _, err = run(capsys, *cmd, "--baseline", text)
        assert code == 2 and err.startswith("error: --baseline") and rule in err, err
        assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("text, rule", BAD[:3])
def test_bad_study_baseline_is_one_line_exit_2_before_the_search(
        text: str, rule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = with_baseline(tmp_path, TINY, text)
    code, _, err = run(capsys, str(study), "-o", str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: baseline") and rule in err, err
    assert err.count("\n") == 1 and not (tmp_path / "out" / "result.json").exists()


def test_the_study_key_is_a_string() -> None:
    with pytest.raises(ValueError, match="^baseline: "):
        parse_study(TINY.read_text() + "\nbaseline: 5\n")
    with pytest.raises(PlanSpecError, match="^baseline: unknown key"):
        parse_baseline("tpp=1", build_specs(load_study(TINY)))


@pytest.mark.parametrize("name", ["llama3-70b-h100x1024", "llama3.1-405b-h100x16384",
                                  "llama3.1-405b-h100x4096"])
def test_shipped_baselines_are_valid_and_in_their_space(name: str) -> None:
    study = load_study(ROOT / "studies" / f"{name}.yaml")
    specs = build_specs(study)
    assert study.baseline is not None
    plan = parse_baseline(study.baseline, specs)
    assert exclusions(build_space(study, specs), plan) == []
    doc = baseline_doc(specs, plan, "study baseline")
    assert doc["figures"]["fits"]


def test_the_405b_baseline_fits_with_its_recipes_bf16_gradients(tmp_path: Path) -> None:
    """Megatron-Bridge's 405B performance recipe reduces gradients in bf16 (scripts/performance/
    configs/llama/llama31_llm_pretrain.py set_llama31_common_configs: ddp.grad_reduce_in_fp32 =
    False): with the study's fp32 gradients (Llama 3's) the layout fits inside the headroom the
    search keeps free, with training.grad_reduce_in_bf16 outside it, and the only change is the
    gradient buffer, halved (bf16 weights and bf16 gradients hold alike)."""
    source = ROOT / "studies" / "llama3.1-405b-h100x4096.yaml"
    text = source.read_text().replace("  precision: bf16\n",
                                      "  precision: bf16\n  grad_reduce_in_bf16: true\n", 1)
    assert "grad_reduce_in_bf16: true" in text
    bf16_file = tmp_path / "bf16grads.yaml"
    bf16_file.write_text(text)
    peaks, free = {}, {}
    for key, path in (("fp32", source), ("bf16", bf16_file)):
        study = load_study(path)
        specs = build_specs(study)
        assert study.baseline is not None
        plan = parse_baseline(study.baseline, specs)
        peaks[key] = estimate(specs.model, specs.cluster, plan, specs.training).memory
        free[key] = (peaks[key].usable_bytes - peaks[key].peak_bytes) / GIB - specs.headroom_gib
    assert peaks["fp32"].fits and free["fp32"] < 0 < free["bf16"]
    fp32, bf16 = peaks["fp32"].peak, peaks["bf16"].peak
    assert fp32.grads_bytes == pytest.approx(2 * bf16.grads_bytes)
    assert bf16.grads_bytes == pytest.approx(bf16.weights_bytes)
    for part in ("weights_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes"):
        assert getattr(fp32, part) == pytest.approx(getattr(bf16, part))
