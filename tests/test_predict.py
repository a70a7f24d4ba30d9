"""`tcf-search predict`: the measured_runs schema in, predictions out, empty knobs chosen."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tcf_search.calibration.predict import CHOICE_COLUMNS, OUTPUT_COLUMNS, predict_csv

HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "tied_embeddings,gpu,gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,"
          "global_batch,recompute,sequence_parallel,precision,framework,status,"
          "tokens_per_sec_per_gpu")
LLAMA8B = "llama,32,4096,14336,32,8,128256,8192,swiglu,false,h100-sxm-80gb,8,64"


def _write(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "cases.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return p


def test_given_knobs_predicted_and_measured_columns_ignored(tmp_path: Path) -> None:
    src = _write(tmp_path, [
        f"a,{LLAMA8B},4,2,1,1,1,8,1,1,512,none,true,bf16,megatron,ok,123",
        f"b,{LLAMA8B},4,2,1,1,1,8,1,1,512,none,true,bf16,megatron,oom,",
    ])
    out = predict_csv(src, tmp_path / "out.csv")
    assert set(OUTPUT_COLUMNS) <= set(out.columns)
    a, b = out.iloc[0], out.iloc[1]
    assert a["pred_error"] is None or pd.isna(a["pred_error"])
    assert a["pred_tokens_per_sec_per_gpu"] == b["pred_tokens_per_sec_per_gpu"]  # status ignored
    assert a["pred_tokens_per_sec_per_gpu"] > 0 and a["pred_fits"] in ("true", "false")
    assert pd.isna(a["pred_choice_micro_batch"])  # given, so not chosen
    written = pd.read_csv(tmp_path / "out.csv")
    assert list(written.columns[:5]) == HEADER.split(",")[:5]


def test_empty_knobs_are_chosen_and_reported(tmp_path: Path) -> None:
    src = _write(tmp_path, [f"c,{LLAMA8B},4,2,,1,1,8,,,512,,,bf16,,,"])
    row = predict_csv(src, tmp_path / "out.csv").iloc[0]
    assert pd.isna(row["pred_error"]) or row["pred_error"] is None
    for col in CHOICE_COLUMNS:
        assert not pd.isna(row[col]), col
    assert row["pred_choice_recompute"] in ("none", "selective", "full")
    assert int(row["pred_choice_micro_batch"]) in (1, 2, 4, 8, 16, 32, 64)
    assert row["pred_fits"] == "true"  # a fitting choice exists for 8B on 64 H100


def test_choice_is_the_fastest_fitting_plan(tmp_path: Path) -> None:
    base = f"{LLAMA8B},4,2,1,1,1,8,1,{{mb}},512,none,true,bf16,,,"
    rows = [f"m{mb}," + base.format(mb=mb) for mb in (1, 2, 4, 8)]
    rows.append("free," + base.format(mb=""))
    out = predict_csv(_write(tmp_path, rows), tmp_path / "out.csv")
    fixed = out.iloc[:4]
    fitting = fixed[fixed["pred_fits"] == "true"]
    free = out.iloc[4]
    best_fixed = fitting["pred_tokens_per_sec_per_gpu"].max()
    assert free["pred_tokens_per_sec_per_gpu"] >= best_fixed - 1e-6


@pytest.mark.parametrize("bad,needle", [
    ("tp=3", "num_gpus must hold"),
    ("gpu", "unknown"),
    ("layers", "layers"),
])
def test_bad_rows_get_an_error_not_a_crash(tmp_path: Path, bad: str, needle: str) -> None:
    good = f"ok,{LLAMA8B},4,2,1,1,1,8,1,1,512,none,true,bf16,,,"
    if bad == "tp=3":
        row = f"x,{LLAMA8B},3,2,1,1,1,8,1,1,512,none,true,bf16,,,"
    elif bad == "gpu":
        row = "x," + LLAMA8B.replace("h100-sxm-80gb", "h900") + good[len(LLAMA8B) + 3:]
    else:
        row = "x," + LLAMA8B.replace("llama,32,", "llama,abc,") + good[len(LLAMA8B) + 3:]
    out = predict_csv(_write(tmp_path, [good, row]), tmp_path / "out.csv")
    assert pd.isna(out.iloc[0]["pred_error"]) or out.iloc[0]["pred_error"] is None
    assert needle in str(out.iloc[1]["pred_error"]).lower()


def test_first_stage_memory_is_reported_beside_the_peak(tmp_path: Path) -> None:
    # the Playbook logs rank 0's max_memory_reserved: the first pipeline stage. With a small
    # model and a large vocabulary the last stage (LM head, logits) holds the most bytes
    small = "tiny,8,1024,4096,16,16,131072,4096,swiglu,false,h100-sxm-80gb,8,8"
    src = _write(tmp_path, [
        f"a,{small},1,1,1,1,1,8,0,1,64,none,false,bf16,nanotron,ok,",
        f"b,{small},1,2,1,1,1,4,0,1,64,none,false,bf16,nanotron,ok,",
    ])
    out = predict_csv(src, tmp_path / "out.csv")
    one, two = out.iloc[0], out.iloc[1]
    assert one["pred_first_stage_mem_gib"] == pytest.approx(one["pred_peak_mem_gib"])
    assert 0 < two["pred_first_stage_mem_gib"] < 0.8 * two["pred_peak_mem_gib"]


def test_compile_column_fuses_an_eager_frameworks_elementwise_ops(tmp_path: Path) -> None:
    header = HEADER + ",compile"
    row = f"{LLAMA8B},1,1,1,1,1,64,3,1,512,none,false,bf16,torchtitan,ok,"
    src = tmp_path / "c.csv"
    src.write_text(header + "\n" + "\n".join(
        [f"eager,{row},", f"compiled,{row},true", f"said_no,{row},false"]) + "\n")
    out = predict_csv(src, tmp_path / "out.csv").set_index("case_id")
    tok = out["pred_tokens_per_sec_per_gpu"]
    assert tok["compiled"] > tok["eager"] == tok["said_no"]
    # nanotron's own fused kernels do not depend on the column
    nano = tmp_path / "n.csv"
    nrow = row.replace("torchtitan", "nanotron")
    nano.write_text(header + "\n" + "\n".join([f"a,{nrow},", f"b,{nrow},true"]) + "\n")
    n = predict_csv(nano, tmp_path / "n_out.csv")["pred_tokens_per_sec_per_gpu"]
    assert n.iloc[0] == n.iloc[1]


def test_the_allocator_stall_has_its_column(tmp_path: Path) -> None:
    """A nanotron row whose peak nears usable memory reports the expected stall (held in the
    compute time), a Megatron twin none: only nanotron's profile is fitted to stall."""
    near = f"{LLAMA8B},2,1,1,1,1,32,0,1,256,none,true,bf16"
    out = predict_csv(_write(tmp_path, [f"n,{near},nanotron,ok,", f"m,{near},megatron,ok,"]),
                      tmp_path / "out.csv")
    n, m = out.iloc[0], out.iloc[1]
    assert n["pred_peak_mem_gib"] > 0.8 * n["pred_usable_mem_gib"]
    assert 0.0 < n["pred_time_stall_s"] < n["pred_time_compute_s"]
    assert m["pred_time_stall_s"] == 0.0


def test_an_unsaid_recompute_takes_the_lightest_partial_one_that_fits(tmp_path: Path) -> None:
    """Meta's 405B layout (Dubey et al. 2024, Table 4: TP8 PP16 DP128 on 16,384 H100, 16M-token
    batches) leaves recompute unsaid; nothing but full recompute of some layers fits, and predict
    takes the fewest a stage (Megatron-LM's --recompute-num-layers, per model chunk: a multiple
    of vpp), faster than recomputing all of them. A row that says "full" recomputes all."""
    shape = ("llama,126,16384,53248,128,8,128256,8192,swiglu,false,h100-sxm-80gb,8,16384,"
             "8,16,,1,1,128,,,2048,{rc},,bf16,,ok,")
    out = predict_csv(_write(tmp_path, [f"free,{shape.format(rc='')}",
                                        f"all,{shape.format(rc='full')}"]),
                      tmp_path / "out.csv")
    free, whole = out.iloc[0], out.iloc[1]
    assert free["pred_choice_recompute"] == "full" and free["pred_fits"] == "true"
    n, vpp = int(free["pred_choice_recompute_layers"]), int(free["pred_choice_vpp"])
    assert 0 < n < 8 and n % vpp == 0
    assert pd.isna(whole["pred_choice_recompute_layers"])  # "full" given: all layers
    assert free["pred_tokens_per_sec_per_gpu"] > whole["pred_tokens_per_sec_per_gpu"]
