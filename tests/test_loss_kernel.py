"""The LM head's loss in HBM bytes per logit: a fused cross-entropy streams the logits once each
way (act + 8 a pass), nanotron's eager fp32 loss (the cast_to_fp32 block, then
_ShardedCrossEntropy op by op) moves act + 36 forward and act + 12 backward, the cast's part
being act + 4 each way, and nothing to cast when the logits are fp32 already."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, Plan
from costmodel.compute import _loss_s, layer_times
from costmodel.kernels import kernels_of
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import SpecError


def _bytes_per_logit(model, gpu, plan: Plan, **training):  # type: ignore[no-untyped-def]
    tr = training_for(seq_len=4096, global_batch=64, **training)
    kn = kernels_of(ClusterSpec(gpu=gpu, num_gpus=8), tr, as_plan_arrays(plans_to_arrays([plan])))
    per_byte = kn.tokens * model.vocab / kn.tp / kn.hbm
    return tuple(float((t / per_byte)[0]) for t in _loss_s(model, tr, kn))


@pytest.mark.parametrize("plan", [Plan(dp=8, micro_batch=1), Plan(tp=4, dp=2, micro_batch=2)])
def test_bytes_per_logit(h100, llama8b, plan: Plan) -> None:
    assert np.allclose(_bytes_per_logit(llama8b, h100, plan), (10.0, 10.0, 0.0))
    eager = _bytes_per_logit(llama8b, h100, plan, loss_kernel="eager_fp32")
    assert np.allclose(eager, (38.0, 14.0, 12.0))
    fp32 = _bytes_per_logit(llama8b, h100, plan, loss_kernel="eager_fp32",
                            activation_dtype_bytes=4.0)
    assert np.allclose(fp32, (32.0, 8.0, 0.0))


def test_the_loss_is_part_of_the_head_time(h100, llama8b) -> None:
    p = as_plan_arrays(plans_to_arrays([Plan(dp=8, micro_batch=1)]))
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    fused = layer_times(llama8b, cluster, training_for(seq_len=4096, global_batch=64), p)
    eager = layer_times(llama8b, cluster, training_for(seq_len=4096, global_batch=64,
                                                   loss_kernel="eager_fp32"), p)
    head_gemms = fused.head_fwd_s + fused.head_bwd_s - fused.loss_s
    assert np.allclose(eager.head_fwd_s + eager.head_bwd_s - eager.loss_s, head_gemms)
    assert np.allclose(eager.loss_s / fused.loss_s, 52.0 / 20.0)


def test_unknown_loss_kernel_is_refused() -> None:
    with pytest.raises(SpecError, match="loss_kernel"):
        training_for(seq_len=4096, global_batch=64, loss_kernel="triton")  # type: ignore[arg-type]


def test_the_loss_holds_what_its_kernel_keeps(h100, llama8b) -> None:
    """Memory: Megatron's fused vocab-parallel loss keeps an fp32 softmax beside the bf16 logits
    (the generic 6 bytes a logit); llm-foundry's MPT runs flash-attn's fused cross-entropy, which
    keeps the bf16 logits and writes a bf16 gradient beside them (4): the difference is exactly
    2 bytes a logit of one micro-batch, in the last stage's buffers and nowhere else."""
    from costmodel.estimate import estimate
    from search.inputs.specs import training_spec

    plan = Plan(dp=8, micro_batch=2)
    cluster = ClusterSpec(gpu=h100, num_gpus=8)

    def last_stage(framework: str):  # type: ignore[no-untyped-def]
        tr = training_spec(framework=framework, precision="bf16", seq_len=4096, global_batch=64)
        return tr, estimate(llama8b, cluster, plan, tr).memory.stages[-1]

    generic_tr, generic = last_stage("megatron")
    foundry_tr, foundry = last_stage("llm-foundry")
    assert generic_tr.framework.memory_model.logits_bytes_per_element == 6.0
    assert foundry_tr.framework.memory_model.logits_bytes_per_element == 4.0
    logits = 2 * 4096 * llama8b.vocab
    assert generic.buffers_bytes - foundry.buffers_bytes == pytest.approx(2.0 * logits)
    assert foundry.activations_bytes == pytest.approx(generic.activations_bytes)
