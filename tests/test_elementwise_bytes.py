"""The HBM traffic of a layer's memory-bound kernels, kernel by kernel: a fused kernel moves fewer
bytes than its eager twin, and a fused kernel's backward moves what that kernel reads and writes
(RMSNorm 3 per element, RoPE 2, SwiGLU 5 per output), not twice its forward."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan
from costmodel.compute import _elementwise
from costmodel.kernels import kernels_of
from costmodel.plans import as_plan_arrays, plans_to_arrays


def _elem(model: ModelSpec, gpu, plan: Plan, **training):  # type: ignore[no-untyped-def]
    tr = training_for(seq_len=4096, global_batch=64, **training)
    kn = kernels_of(ClusterSpec(gpu=gpu, num_gpus=8), tr, as_plan_arrays(plans_to_arrays([plan])))
    return _elementwise(model, tr, kn), kn


@pytest.mark.parametrize("plan", [Plan(dp=8, micro_batch=1), Plan(tp=2, dp=4, micro_batch=2),
                                  Plan(tp=4, dp=2, micro_batch=1, sequence_parallel=True)])
def test_fused_moves_fewer_bytes_than_eager_forward_and_backward(h100, llama8b: ModelSpec,
                                                                 plan: Plan) -> None:
    fused, _ = _elem(llama8b, h100, plan)
    eager, _ = _elem(llama8b, h100, plan, fused_elementwise=False)
    assert np.all(fused.fwd_s < eager.fwd_s)
    assert np.all(fused.bwd_s < eager.bwd_s)


def test_fused_backward_is_counted_kernel_by_kernel(h100, llama8b: ModelSpec) -> None:
    """Llama 3 8B on one GPU of 4,096 tokens: forward 2 norms x 2 + 2 adds x 3 = 10 h, RoPE 2 on
    q and k (5,120 wide), SwiGLU 3 f; backward 2 norms x 3 + 2 adds x 3 = 12 h, RoPE 2, SwiGLU
    5 f. The backward is less than twice the forward (which double counted the adds and RoPE)."""
    elem, kn = _elem(llama8b, h100, Plan(dp=8, micro_batch=1))
    h, f, rw = 4096, 14336, 32 * 128 + 8 * 128
    per_elem_s = 4096 * 2 / kn.hbm
    assert elem.fwd_s[0] == pytest.approx(per_elem_s * (10 * h + 2 * rw + 3 * f), rel=1e-12)
    assert elem.bwd_s[0] == pytest.approx(per_elem_s * (12 * h + 2 * rw + 5 * f), rel=1e-12)
    assert elem.bwd_s[0] < 2.0 * elem.fwd_s[0]


def test_eager_backward_runs_twice_the_composites_passes(h100, llama8b: ModelSpec) -> None:
    """Eager norms, RoPE and SwiGLU: twice their forward passes (18, 10, 5 elements); the residual
    adds one add each, as fused."""
    elem, kn = _elem(llama8b, h100, Plan(dp=8, micro_batch=1), fused_elementwise=False)
    h, f, rw = 4096, 14336, 32 * 128 + 8 * 128
    per_elem_s = 4096 * 2 / kn.hbm
    expect = (2 * 2 * 18 + 6) * h + 2 * 10 * rw + 2 * 5 * f
    assert elem.bwd_s[0] == pytest.approx(per_elem_s * expect, rel=1e-12)


def test_learned_positions_rotate_nothing(h100, llama8b: ModelSpec) -> None:
    """GPT-3's and MPT's learned position embeddings are added once at the input: no layer
    rotates a query or key, so the layer moves RoPE's 2 elements per rotated one less each way."""
    from dataclasses import replace

    plan = Plan(dp=8, micro_batch=1)
    rope, kn = _elem(llama8b, h100, plan)
    learned, _ = _elem(replace(llama8b, position_embedding="learned"), h100, plan)
    rw, per_elem_s = 32 * 128 + 8 * 128, 4096 * 2 / kn.hbm
    assert rope.fwd_s[0] - learned.fwd_s[0] == pytest.approx(per_elem_s * 2 * rw, rel=1e-9)
    assert rope.bwd_s[0] - learned.bwd_s[0] == pytest.approx(per_elem_s * 2 * rw, rel=1e-9)
