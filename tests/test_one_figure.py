"""One figure for one layout (issue #40): the search's table, `explain` and `tcf-search predict`
give the same tokens/s for a shipped study's best plan, and a NeMo study finds a plan at least
as fast as what predict gives NVIDIA's own layout of the run."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
from clirunner import cli
from export_plans import STUDIES

from costmodel.plan_fields import PLAN_FIELDS
from search.inputs.measured import case_from_row
from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study
from tcf_search.calibration.predict import predict_csv

# what a study's model keeps that no cost reads (the name, RoPE's base and scaling, the router's
# kind): left out of the comparison of the model a CSV row rebuilds
COSTLESS = ("name", "rope_base", "rope_scaling", "moe_router")


def _row(pf: PlanFile) -> dict[str, object]:
    """A measured_runs row that states every knob of the plan file, as a user would write it."""
    m, p = pf.model, pf.plan
    row: dict[str, object] = {
        "case_id": pf.study, "model_name": m.name, "layers": m.layers, "hidden": m.hidden,
        "ffn_hidden": m.ffn_hidden, "heads": m.heads, "kv_heads": m.kv_heads, "vocab": m.vocab,
        "ffn_type": m.ffn_type, "tied_embeddings": str(m.tied_embeddings).lower(),
        "moe_experts": m.moe_experts, "moe_topk": m.moe_topk,
        "moe_ffn_hidden": m.moe_ffn_hidden, "moe_shared_experts": m.moe_shared_experts,
        "bias": m.bias, "sliding_window": m.sliding_window,
        "head_dim": m.head_dim, "dense_layers": m.moe_dense_layers,
        "moe_layer_freq": m.moe_layer_freq,
        "attention_chunk": m.attention_chunk, "window_skip_freq": m.window_skip_freq,
        "attention_sinks": str(m.attention_sinks).lower(), "qk_norm": str(m.qk_norm).lower(),
        "seq_len": pf.training.seq_len, "global_batch": pf.training.global_batch,
        "precision": pf.training.precision, "framework": pf.framework, "gpu": pf.gpu,
        "gpus_per_node": pf.gpus_per_node, "num_gpus": pf.num_gpus,
    }
    if m.mla is not None:
        row.update({f.name: getattr(m.mla, f.name) for f in dataclasses.fields(m.mla)})
    for f in PLAN_FIELDS:
        v = getattr(p, f.name)
        row[f.csv] = ("+".join(v) if isinstance(v, tuple) else str(v).lower()
                      if isinstance(v, bool) else v)
    return row


def _expressible(pf: PlanFile, row: dict[str, object]) -> str:
    """'' where the CSV row rebuilds the study's model and switches, else what it cannot say."""
    case = case_from_row({k: str(v) for k, v in row.items()})
    lost = [f.name for f in dataclasses.fields(pf.model) if f.name not in COSTLESS
            and getattr(case.model, f.name) != getattr(pf.model, f.name)]
    if case.training.framework != pf.training.framework:
        lost.append("the study's training switches")
    return ", ".join(lost)


@pytest.fixture(scope="module")
def best_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, PlanFile]]:
    out = tmp_path_factory.mktemp("studies")
    plans = {}
    for path in STUDIES:
        folder = out / path.stem
        run_study(load_study(path), RunOptions(out_dir=folder, trials=20, workers=1))
        top = folder / "top" / "rank-1.yaml"
        if top.exists():
            plans[path.stem] = (folder, load_plan_file(top))
    return plans


def test_table_explain_and_predict_agree_on_every_shipped_best(
        best_plans: dict[str, tuple[Path, PlanFile]], tmp_path: Path) -> None:
    assert len(best_plans) >= len(STUDIES) - 1  # tiny-cpu and the rest all have a best
    rows, compared, skipped = [], [], {}
    for name, (folder, pf) in best_plans.items():
        table = json.loads((folder / "result.json").read_text())["top"][0]["predicted"]
        code, out, err = cli("explain", str(folder), "--rank", "1", "--json")
        assert code == 0, err
        assert json.loads(out)["step"]["tokens_per_s_per_gpu"] == pytest.approx(
            table["tokens_per_s_per_gpu"], rel=1e-9), name
        row = _row(pf)
        if why := _expressible(pf, row):
            skipped[name] = why
            continue
        rows.append(row)
        compared.append((name, table["tokens_per_s_per_gpu"]))
    src = tmp_path / "rows.csv"
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)
    got = predict_csv(src, tmp_path / "out.csv")
    for (name, want), (_, pred) in zip(compared, got.iterrows(), strict=True):
        assert pred["pred_error"] is None or pred["pred_error"] != pred["pred_error"], \
            (name, pred["pred_error"])
        assert pred["pred_tokens_per_sec_per_gpu"] == pytest.approx(want, rel=1e-5), name
    # most shipped models are what the CSV schema can say; those it cannot are named: DeepSeek-V3's
    # leading dense layers and MTP (issue #35 asks for the columns), GPT-3's LayerNorm and learned
    # positions, Qwen3's head dimension apart from hidden / heads; and the Megatron-Bridge
    # recipes' switches (MoE fusions, bf16 gradients, fp8 weight gathers), which no CSV column
    # says
    assert len(compared) >= 8, skipped
    assert set(skipped) <= {"deepseek-v3-h100x2048", "gpt3-175b-a100x1024",
                            "qwen3-30b-a3b-h100x8", "qwen3-235b-a22b-h100x256",
                            "deepseek-v3-b200x256", "gpt-oss-120b-h100x64",
                            "llama3-70b-gb200x64"}, skipped


NEMO_70B = """model: {preset: llama3.1-70b}
training: {seq_len: 8192, global_batch: 128, precision: fp8, framework: nemo}
cluster: {gpu: h100-sxm-80gb, gpus: 64}
search_space: {cp: auto}
"""
# NeMo's Llama 3 70B fp8 recipe on 64 H100 as NVIDIA published it (the shared file's nemo rows):
# TP4 PP4 VPP5 CP2, micro-batch 1, global batch 128, seq 8192, the distributed optimizer
PUBLISHED = {"tp": 4, "pp": 4, "vpp": 5, "cp": 2, "dp": 2, "zero_stage": 1, "micro_batch": 1,
             "sequence_parallel": "true", "recompute": "none"}


def test_a_nemo_study_finds_at_least_nvidias_layout(tmp_path: Path) -> None:
    """With one source of NeMo's defaults (its profile, TP overlap on as its recipes run it), a
    study of the run searches the published layout's switches, so its best is at least what
    predict gives that layout (issue #40: it fell 2-6% short while row_defaults alone turned TP
    overlap on)."""
    study = tmp_path / "nemo70.yaml"
    study.write_text(NEMO_70B)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "out"), "--exhaustive")
    assert code == 0, err
    best = json.loads((tmp_path / "out" / "result.json").read_text())["top"][0]["predicted"]
    row = {"case_id": "published", "model_name": "llama3.1-70b", "layers": 80, "hidden": 8192,
           "ffn_hidden": 28672, "heads": 64, "kv_heads": 8, "vocab": 128256, "seq_len": 8192,
           "ffn_type": "swiglu", "tied_embeddings": "false", "gpu": "h100-sxm-80gb",
           "gpus_per_node": 8, "num_gpus": 64, "global_batch": 128, "precision": "fp8",
           "framework": "nemo", **PUBLISHED}
    src = tmp_path / "published.csv"
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    pred = predict_csv(src, tmp_path / "pred.csv").iloc[0]
    assert best["tokens_per_s_per_gpu"] >= pred["pred_tokens_per_sec_per_gpu"] * 0.99, (
        best, pred["pred_tokens_per_sec_per_gpu"])
    # and the study's profile is the one the row got: TP overlap on, no row default needed
    assert load_study(study).training.tp_comm_overlap is None
