"""Memory-only mode: fake tensors, a fake process group and the memory tracker, on CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="validation needs the optional torch extra "
                                    "(pip install -e '.[validate]')")

from costmodel_helpers import training_for

from costmodel.params import embedding_params, norm_params, total_params  # noqa: E402
from costmodel.specs import ModelSpec, Plan  # noqa: E402
from tcf_search.validate.agreement import measured_parts  # noqa: E402
from tcf_search.validate.memory_only import measure_memory  # noqa: E402

TINY = ModelSpec(name="t", layers=4, hidden=64, ffn_hidden=128, heads=4, kv_heads=2, vocab=256)
TRAIN = training_for(seq_len=32, global_batch=2)
FP32 = 4


def test_fsdp_rank_holds_exactly_its_shard_of_the_analytic_parameters() -> None:
    # ZeRO-3 over 2 ranks: each holds total_params / 2 fp32 elements (every dim-0 size here
    # is even, so FSDP2 pads nothing); fp32 gradients the same; AdamW's m and v twice that.
    # Worked example: a layer has attention 64*64 + 2*64*32 + 64*64 = 12,288, MLP 3*64*128 =
    # 24,576 and norms 128, so 4 layers 147,968; embedding + head 2*256*64 = 32,768; final
    # norm 64: 180,800 in all, 90,400 per rank.
    r = measure_memory(TINY, Plan(dp=2, zero_stage=3, micro_batch=1), TRAIN)
    shard = total_params(TINY) // 2
    assert r.param_count == shard
    assert r.param_bytes == FP32 * shard
    parts = measured_parts(r.maxima, r.layer_activations)
    assert parts["weights"] == FP32 * shard
    assert parts["grads"] == FP32 * shard
    # plus AdamW's fp32 step counter, one scalar per parameter tensor: 9 per layer + 3
    tensors = 9 * TINY.layers + 3
    assert parts["optimizer"] == 2 * FP32 * shard + FP32 * tensors
    assert parts["activations"] > 0
    assert r.peak_bytes >= sum(parts[k] for k in ("weights", "optimizer"))


def test_pipeline_first_stage_holds_its_layers_and_the_embedding() -> None:
    # pp=2: stage 0 has layers 0-1 and the embedding, no final norm and no output head.
    r = measure_memory(TINY, Plan(pp=2, micro_batch=1), TRAIN, pp_rank=0)
    body = total_params(TINY) - 2 * embedding_params(TINY) - TINY.hidden
    expected = body // 2 + embedding_params(TINY)
    assert r.layers == 2 and r.stage_id == 0
    assert r.param_count == expected
    assert r.param_bytes == FP32 * expected
    assert norm_params(TINY) == 2 * TINY.hidden


def test_a_checkpointed_layer_keeps_only_its_input() -> None:
    # Full recompute in bf16 (one-rank FSDP2 units): each more layer adds its input, 2 B per
    # element of (tokens, hidden), and nothing else: the fp32 RoPE tables are shared by the
    # layers, not copied per call (FSDP2 would cast them per block unless told not to).
    train = training_for(seq_len=512, global_batch=1)
    acts = []
    for layers in (2, 4):
        m = ModelSpec(name="t", layers=layers, hidden=64, ffn_hidden=128, heads=4, kv_heads=2,
                      vocab=256)
        r = measure_memory(m, Plan(micro_batch=1, recompute="full"), train)
        acts.append(r.layer_activations)
    assert acts[1] - acts[0] == 2 * 2 * 512 * 64  # two layers' bf16 inputs
