"""Work is bounded inside the documented limits (issue 39, item 5). 4,096 layers on 2**20 GPUs
made the memory screen build 56 million table cells (a 12 GB numpy ``MemoryError``): a budget on
layouts x layers now refuses it in one line before any table is built. ``predict`` read a whole
CSV and held every row's candidate plans (8.3 GiB for 10**6 rows): it now reads, predicts and
writes a chunk of rows at a time, and rows with the same inputs share one prediction; the output
is byte for byte what it was (the 10**6-row figures: ``benchmarks/robust_bounds.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from clirunner import ROOT, cli, one_line_error

import search.prune
from search.inputs.specs import build_specs
from search.inputs.study import load_study
from search.prune import MAX_TABLE_CELLS
from search.space import build_space, enumerate_layouts
from tcf_search.calibration import predict

HUGE = ("name: huge\nmodel:\n  architecture: {layers: 4096, hidden: 8192, ffn_hidden: 28672, "
        "heads: 64, vocab: 128256}\ntraining: {seq_len: 4096, global_batch: 1048576}\n"
        "cluster: {gpu: h100-sxm-80gb, gpus: 1048576}\n")
HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "tied_embeddings,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,gpu,"
          "gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,global_batch,"
          "recompute,sequence_parallel,precision,framework,notes")
# a dense and an MoE row with every knob given, and one that leaves micro_batch, recompute and
# the split to predict; one whose tp does not divide the GPUs (a pred_error)
ROWS = [",llama 8B,32,4096,14336,32,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,2,2,1,1,1,"
        "16,1,1,512,selective,true,bf16,megatron",
        ",mixtral,32,4096,14336,32,8,32000,4096,swiglu,false,8,2,14336,0,h100-sxm-80gb,8,64,1,4,1,"
        "1,8,16,1,1,256,full,false,bf16,megatron",
        ",llama 70B,80,8192,28672,64,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,8,2,,1,1,"
        "4,1,,256,,true,bf16,nemo",
        ",llama 8B,32,4096,14336,32,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,3,2,1,1,1,"
        "16,1,1,512,selective,true,bf16,megatron"]


def test_a_space_over_the_table_budget_is_one_line_before_any_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    monkeypatch.setattr(search.prune, "need_tables",
                        lambda *a, **k: built.append(1) or pytest.fail("tables built"))
    study = tmp_path / "huge.yaml"
    study.write_text(HUGE)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "out"))
    # 6,960 layouts (Megatron-FSDP's ZeRO-2/3 beside no pipeline) x 4,097 layer counts: 28.5
    # million cells, 1.7 x the budget
    one_line_error(code, err, "search_space: 6,960 valid layouts x 4,097 layer counts",
                   "= 28,515,120 memory-table cells, over the budget of 16,777,216",
                   "list fewer values in search_space")
    assert not built and not (tmp_path / "out").exists()
    # every shipped study stays far inside it (the largest: 6.4 million cells)
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        s = load_study(path)
        space = build_space(s, build_specs(s))
        cells = len(enumerate_layouts(space).columns["pp"]) * (space.facts.layers + 1)
        assert cells < MAX_TABLE_CELLS / 2, path.name


def _cases(path: Path, n: int) -> Path:
    with path.open("w") as f:
        f.write(HEADER + "\n")
        for i in range(n):
            f.write(f"case-{i:06d}{ROWS[i % len(ROWS)]},sweep {i}\n")  # notes: no fabric
    return path


def test_predict_reads_a_chunk_at_a_time_and_predicts_each_input_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _cases(tmp_path / "cases.csv", 8_000)  # 1 MB
    size = src.stat().st_size
    whole = tmp_path / "whole.csv"
    predict.predict_file(src, whole, chunk_rows=10**6)
    computed: list[int] = []
    real_candidates = predict.candidates
    monkeypatch.setattr(predict, "candidates",
                        lambda case: computed.append(1) or real_candidates(case))
    opened: list[Any] = []
    real_open = predict.open_input

    @contextmanager
    def recording(*args: Any) -> Iterator[Any]:
        with real_open(*args) as f:
            opened.append(f)
            yield f

    monkeypatch.setattr(predict, "open_input", recording)
    seen: list[tuple[int, int]] = []

    def each(frame: pd.DataFrame) -> None:  # rows predicted, bytes read so far
        seen.append((len(frame), opened[0].tell()))

    done = predict.predict_file(src, tmp_path / "out.csv", chunk_rows=1_000, each=each)
    assert (done.rows, done.errors) == (8_000, 2_000)
    assert [rows for rows, _ in seen] == [1_000] * 8
    assert seen[0][1] < size / 2  # the first chunk predicted with most of the file unread
    # once per distinct input, not once per row (each row's notes differ, naming no fabric)
    assert len(computed) == len(ROWS)
    assert (tmp_path / "out.csv").read_bytes() == whole.read_bytes()


def test_predict_output_does_not_depend_on_the_chunks(tmp_path: Path) -> None:
    src = ROOT.parent / "shared" / "data" / "measured_runs.csv"
    if not src.is_file():
        pytest.skip(f"{src} is not here (the project's shared data)")
    head = tmp_path / "head.csv"
    head.write_text("".join(src.read_text().splitlines(keepends=True)[:150]))
    whole, small = tmp_path / "whole.csv", tmp_path / "small.csv"
    predict.predict_file(head, whole, chunk_rows=10**6)
    predict.predict_file(head, small, chunk_rows=37)
    assert whole.read_bytes() == small.read_bytes()
    assert predict.predict_csv(head, tmp_path / "frame.csv").shape[0] == 149
