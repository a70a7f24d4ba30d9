"""The long-sequence bench's arithmetic (benchmarks/long_sequence.py): NeMo's FLOPs formula as
NeMo wrote it, the table's layouts as published, and the attention efficiency it solves for
returning the fitted one on the model's own prediction."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from long_sequence import LLAMA2_7B, implied_attention, nemo_flops_per_token  # noqa: E402
from published_runs import NEMO_LONG_SEQUENCE  # noqa: E402

from costmodel import ClusterSpec, Plan, estimate  # noqa: E402
from hardware_catalog import get_gpu  # noqa: E402
from search.inputs.specs import training_spec  # noqa: E402


def test_nemo_formula_by_hand() -> None:
    """Llama 2 7B at 4k: 32 x 4096^2 x (12 + 12 + 18 x 11008/4096 + 12 x 4096/4096 +
    6 x 32000/(32 x 4096)) FLOPs a token; the attention term is 12 of that bracket."""
    bracket = 12 + 12 + 18 * 11008 / 4096 + 12 + 6 * 32000 / (32 * 4096)
    flops, share = nemo_flops_per_token(LLAMA2_7B, 4096)
    assert flops == pytest.approx(32 * 4096**2 * bracket)
    assert share == pytest.approx(12 / bracket)
    # at 1M tokens the attention term is nearly all of it
    assert nemo_flops_per_token(LLAMA2_7B, 1 << 20)[1] > 0.97


def test_layouts_cover_the_gpus_and_one_gpu_per_1k_tokens() -> None:
    for seq_k, gpus, batch, tp, pp, dp, cp, _ in NEMO_LONG_SEQUENCE:
        assert tp * pp * dp * cp == gpus
        assert gpus == seq_k  # the table's weak scaling: tokens per step fixed at 4M
        assert batch * seq_k == 4096


def test_implied_attention_recovers_the_fitted_efficiency() -> None:
    gpu = get_gpu("h100-sxm-80gb")
    cluster = ClusterSpec(gpu=gpu, num_gpus=64, gpus_per_node=8)
    plan = Plan(tp=4, dp=8, cp=2, micro_batch=1, zero_stage=1, sequence_parallel=True)
    training = training_spec(framework="nemo", precision="fp8", seq_len=65536, global_batch=64)
    tok = estimate(LLAMA2_7B, cluster, plan, training).tokens_per_s_per_gpu
    f = implied_attention(cluster, plan, training, tok)
    assert f == pytest.approx(gpu.efficiency.flash3_attention_peak_fraction, rel=1e-4)
    # slower than the model at every efficiency in range: no answer, not a clamp
    assert implied_attention(cluster, plan, training, tok * 1e-3) is None
