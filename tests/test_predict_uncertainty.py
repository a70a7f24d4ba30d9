"""`tcf-search predict` writes the 80% interval, its regime and P(OOM) that `explain` prints for
the same plan (issue #41)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from clirunner import cli

from tcf_search.calibration.predict import OUTPUT_COLUMNS, predict_csv

HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "tied_embeddings,gpu,gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,"
          "global_batch,recompute,sequence_parallel,precision,framework")
# Llama 3 8B (the llama3-8b preset's shapes), seq 8192 on 64 H100
LLAMA8B = "llama3-8b,32,4096,14336,32,8,128256,8192,swiglu,false,h100-sxm-80gb,8,64"
STUDY = """model: {{preset: llama3-8b}}
training: {{seq_len: 8192, global_batch: 512, framework: {framework}}}
cluster: {{gpu: h100-sxm-80gb, gpus: 64}}
"""
# (tp, dp, zero, micro-batch, recompute, sp): single-stage plans, so that predict has no
# pipeline split to choose and judges the very plan explain does; the last two sit near the
# memory limit, where P(OOM) is neither 0 nor 1
PLANS = [(4, 16, 1, 1, "none", True), (2, 32, 0, 1, "none", True),
         (1, 64, 1, 1, "none", False), (2, 32, 1, 2, "none", True)]


@pytest.mark.parametrize("framework", ["megatron", "nanotron"])
def test_predict_gives_explains_interval_and_p_oom(tmp_path: Path, framework: str) -> None:
    rows = [f"r{i},{LLAMA8B},{tp},1,1,1,1,{dp},{z},{mbs},512,{rc},{str(sp).lower()},bf16,"
            f"{framework}" for i, (tp, dp, z, mbs, rc, sp) in enumerate(PLANS)]
    src = tmp_path / "cases.csv"
    src.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    out = predict_csv(src, tmp_path / "out.csv")
    assert out["pred_error"].isna().all(), out["pred_error"].tolist()
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(framework=framework))
    p_ooms = []
    for i, (tp, dp, z, mbs, rc, sp) in enumerate(PLANS):
        code, stdout, err = cli("explain", str(study), "--plan",
                                f"tp={tp},pp=1,dp={dp},zero={z},mbs={mbs},recompute={rc},"
                                f"sp={str(sp).lower()}", "--json")
        assert code == 0, err
        doc = json.loads(stdout)
        u, row = doc["uncertainty"], out.iloc[i]
        assert row["pred_tokens_per_sec_per_gpu"] == pytest.approx(
            doc["step"]["tokens_per_s_per_gpu"], rel=1e-5)
        lo, hi = u["tokens_per_s_interval"]
        assert (row["pred_tokens_per_sec_lo"], row["pred_tokens_per_sec_hi"]) == (
            pytest.approx(lo, rel=1e-5), pytest.approx(hi, rel=1e-5))
        assert row["pred_tokens_per_sec_lo"] < row["pred_tokens_per_sec_per_gpu"] \
            < row["pred_tokens_per_sec_hi"]
        assert row["pred_interval_regime"] == u["interval_regime"]
        assert row["pred_p_oom"] == pytest.approx(u["p_oom"], abs=1e-6)
        p_ooms.append(u["p_oom"])
    assert any(0.0 < p < 1.0 for p in p_ooms), p_ooms  # the comparison reached a real tail


def test_the_columns_are_written_and_documented(tmp_path: Path) -> None:
    cols = ("pred_tokens_per_sec_lo", "pred_tokens_per_sec_hi", "pred_interval_regime",
            "pred_p_oom")
    assert set(cols) <= set(OUTPUT_COLUMNS)
    src = tmp_path / "cases.csv"
    src.write_text(HEADER + "\n" + f"a,{LLAMA8B},4,1,1,1,1,16,1,1,512,none,true,bf16,megatron\n")
    predict_csv(src, tmp_path / "out.csv")
    written = pd.read_csv(tmp_path / "out.csv")
    assert set(cols) <= set(written.columns)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert all(c in readme for c in cols)
