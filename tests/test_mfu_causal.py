"""MFU as people quote it (issue #36 item 6): the convention's figure (attention without causal
halving) stays, a causal-aware second figure is computed beside it, and a figure above
``search.output.MFU_FLAG`` of the peak is flagged in the run table and explained."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from costmodel_helpers import training_for
from typer.testing import CliRunner

from costmodel import ClusterSpec, ModelSpec, Plan, estimate, estimate_batch
from costmodel.params import active_params, model_flops_per_token
from costmodel.plans import plans_to_arrays
from search.output import MFU_FLAG, mfu_label, mfu_legend
from tcf_search.cli import app

STUDY_128K = Path(__file__).resolve().parents[1] / "studies" / "llama3-8b-128k-h100x64.yaml"


def test_causal_flops_halve_the_attention_term_only(llama8b: ModelSpec) -> None:
    """6·L·a·(d_qk + d_v)·s per token without halving; with it the scores of query i cover its
    i + 1 keys: (s + 1)/2 on average is s/2 to within the model's own rounding."""
    s = 131072
    full, causal = model_flops_per_token(llama8b, s), model_flops_per_token(llama8b, s, True)
    attention = 6.0 * llama8b.layers * llama8b.heads * 2 * llama8b.d_head * s
    assert full - causal == pytest.approx(attention / 2.0, rel=1e-9)
    assert causal > 6.0 * (active_params(llama8b) - llama8b.vocab * llama8b.hidden) * 0.99


def test_sliding_window_layers_keep_their_window(llama8b: ModelSpec) -> None:
    """A windowed layer's queries see at most w keys: its causal term is w - w²/2s of s, not s/2,
    so a windowed model's causal figure is closer to its convention figure."""
    windowed = replace(llama8b, sliding_window=4096)  # every layer windowed
    s = 32768
    share_full = model_flops_per_token(llama8b, s, True) / model_flops_per_token(llama8b, s)
    share_win = model_flops_per_token(windowed, s, True) / model_flops_per_token(windowed, s)
    assert share_full < share_win < 1.0


def test_mfu_causal_is_the_mfu_over_the_causal_flops(h100, llama8b: ModelSpec) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    tr = training_for(seq_len=32768, global_batch=8)
    plan = Plan(dp=8, zero_stage=1, cp=1, recompute="full")
    est = estimate(llama8b, cluster, plan, tr)
    share = model_flops_per_token(llama8b, 32768, True) / model_flops_per_token(llama8b, 32768)
    assert est.mfu_causal == pytest.approx(est.mfu * share, rel=1e-9)
    assert est.mfu_causal < est.mfu
    assert est.to_dict()["mfu_causal"] == pytest.approx(est.mfu_causal)
    batch = estimate_batch(llama8b, cluster, tr, plans_to_arrays([plan]))
    assert float(batch["mfu_causal"][0]) == pytest.approx(est.mfu_causal, rel=1e-9)


def test_the_table_flags_an_mfu_above_the_bar_and_says_what_it_counts() -> None:
    high = {"mfu": MFU_FLAG + 0.05, "mfu_causal": 0.48}
    low = {"mfu": MFU_FLAG - 0.05, "mfu_causal": 0.40}
    assert mfu_label(high).endswith("!") and not mfu_label(low).endswith("!")
    assert mfu_legend([low]) == []
    (line,) = mfu_legend([low, high])
    assert "causal" in line and "48.0%" in line
    # a study stored before the figure existed still gets the flag's meaning
    (old,) = mfu_legend([{"mfu": 0.9}])
    assert "without causal halving" in old


def test_a_128k_study_flags_its_mfu_and_explain_gives_the_causal_figure(tmp_path: Path) -> None:
    out = tmp_path / "r"
    got = CliRunner().invoke(app, ["run", str(STUDY_128K), "-o", str(out), "--trials", "30"])
    assert got.exit_code == 0, got.output
    assert "%!" in got.output and "! MFU above 75%" in got.output
    exp = CliRunner().invoke(app, ["explain", str(STUDY_128K), "--rank", "1", "--result",
                                   str(out), "--json"])
    assert exp.exit_code == 0, exp.output
    c = json.loads(exp.stdout)["compute"]
    assert c["mfu"] > MFU_FLAG and 0.0 < c["mfu_causal"] < 0.7 * c["mfu"]
