"""A stack whose runs report no memory takes, as its allocator's fragmentation, the most its
launched runs leave room for (``tcf_search.calibration.memory_fit.launched_bounds``): a run that
ran fit. Rows of its own: Llama-3-8B-shaped runs on 8 H100 at growing micro-batches."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from tcf_search.calibration.dataset import load_groups, predict_groups
from tcf_search.calibration.memory_fit import LaunchedBound, launched_bounds
from tcf_search.calibration.writing import _set_fitted, stack_fractions


def row(name: str, micro_batch: int, framework: str = "megatron", status: str = "ok",
        peak_mem_gib: float | None = None) -> dict[str, object]:
    return dict(case_id=name, source="unit", model_name="m8b", layers=32, hidden=4096,
                ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256, seq_len=2048,
                ffn_type="swiglu", tied_embeddings=False, gpu="h100-sxm-80gb", gpus_per_node=8,
                num_gpus=8, tp=1, pp=1, vpp=1, cp=1, ep=1, dp=8, zero_stage=1,
                micro_batch=micro_batch, global_batch=64, recompute="none",
                sequence_parallel=False, precision="bf16", framework=framework, status=status,
                tokens_per_sec_per_gpu=1000.0, peak_mem_gib=peak_mem_gib)


def bounds_of(rows: list[dict[str, object]]) -> tuple[pd.DataFrame, dict[str, LaunchedBound]]:
    frame = pd.DataFrame(rows)
    groups, errors = load_groups(frame)
    assert not errors.str.len().any(), errors.tolist()
    return frame, launched_bounds(frame, groups, pd.Series(True, index=frame.index))


def test_the_tightest_launched_run_sets_the_bound_at_which_it_just_fits() -> None:
    # micro-batch 1 leaves room for a fraction above 1, 2 for a few per cent; 4 and 8 are over
    # usable memory before any fragmentation: the count misses there, they are listed, not used
    rows = [row("mb1", 1), row("mb2", 2), row("mb4", 4), row("mb8", 8),
            row("mb8-oom", 8, status="oom")]
    frame, bounds = bounds_of(rows)
    b = bounds["megatron-core"]
    assert b.row == "mb2" and b.over == ("mb4", "mb8") and b.rows == 4
    assert 0.0 < b.fraction < 0.1
    groups, _ = load_groups(frame)
    pred = predict_groups(groups, len(frame), None, {"allocator_fraction": b.fraction})
    assert pred["peak_mem_bytes"][1] == pytest.approx(pred["usable_bytes"][1], rel=1e-9)
    assert pred["peak_mem_bytes"][0] < pred["usable_bytes"][0]


def test_stacks_with_measured_memory_or_expandable_segments_take_no_bound() -> None:
    # torchtitan maps expandable segments (no fragmentation priced); a nanotron row reports
    # its reserved peak, which its stack's fit reads instead
    rows = [row("tt", 2, "torchtitan") | {"zero_stage": 3},
            row("nt", 2, "nanotron", peak_mem_gib=70.0), row("nt2", 1, "nanotron")]
    _, bounds = bounds_of(rows)
    assert bounds == {}


def test_the_written_bound_rounds_down_into_its_stack_s_section() -> None:
    b = LaunchedBound(fraction=0.130095, row="r", rows=1, over=())
    # a bound above the default allocator's fitted fraction does not contradict it
    fractions = stack_fractions({"megatron-core": b, "x": replace(b, fraction=0.5)}, 0.228)
    assert fractions == {"megatron-core": 0.13, "x": 0.228}
    text = ("frameworks:\n  a:\n    memory_model:\n      allocator_fraction: 0.2  # fitted\n"
            "  b:\n    x: 1\n  c:\n    memory_model:\n      allocator_fraction: 0.3  # fitted\n")
    assert "allocator_fraction: 0.05  # fitted\n  b:" in _set_fitted(
        text, "allocator_fraction", 0.05, "a")
    assert text.endswith("0.3  # fitted\n") and _set_fitted(
        text, "allocator_fraction", 0.05, "c").endswith("0.05  # fitted\n")
    with pytest.raises(KeyError, match="in its b profile"):
        _set_fitted(text, "allocator_fraction", 0.05, "b")
