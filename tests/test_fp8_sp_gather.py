"""Under fp8 the forward's sequence-parallel all-gathers move the quantised input: Transformer
Engine's LayerNormLinear quantises in the norm and gathers the fp8 tensor
(transformer_engine/pytorch/module/layernorm_linear.py at v2.8), torchao's float8 TP casts before
the all-gather (PrepareFloat8ModuleInput, torchtitan's apply_tp). The backward's collectives and
bf16 training keep the activations' dtype; a stack without the switch gathers bf16."""

from __future__ import annotations

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from costmodel.specs import GpuSpec

PLAN = Plan(tp=8, pp=1, dp=2, micro_batch=1, zero_stage=0, sequence_parallel=True,
            recompute="none")


def _tp(llama8b: ModelSpec, h100: GpuSpec, framework: str, precision: str,
        **switches: object):  # noqa: ANN202 - test helper
    tr = training_for(framework, seq_len=4096, global_batch=32, precision=precision,
                      **switches)
    est = estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=16), PLAN, tr)
    return next(c for c in est.collectives if c.name == "tp_activation_allreduce")


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_fp8_gathers_move_one_byte_an_element(llama8b: ModelSpec, h100: GpuSpec,
                                              framework: str) -> None:
    """Per layer pass: forward two all-gathers (1 byte under fp8) and two reduce-scatters,
    backward four at 2 bytes: fp8 moves (1 + 2 + 4) / (2 + 2 + 4) of bf16's bytes."""
    bf16 = _tp(llama8b, h100, framework, "bf16")
    fp8 = _tp(llama8b, h100, framework, "fp8")
    assert fp8.bytes == pytest.approx(bf16.bytes * 7.0 / 8.0)
    assert fp8.time_s < bf16.time_s
    off = _tp(llama8b, h100, framework, "fp8", fp8_sp_gather=False)
    assert off.bytes == pytest.approx(bf16.bytes)
