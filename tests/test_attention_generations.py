"""FlashAttention's generations priced apart: llm-foundry's MPT tables ran FlashAttention-1's
Triton port (``attention_kernel: flash1``), which the A100 fit measures; PyTorch SDPA's flash
backend (torchtitan) runs FlashAttention-2, whose A100 fraction is the published one. Where a
family's runs do not tell the two apart (H100: one fraction for both), 0 stands for "the same"."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from costmodel_helpers import profile_for, training_for

from costmodel import ClusterSpec, ModelSpec, Plan
from costmodel.compute import _attention_fwd
from costmodel.kernels import kernels_of
from costmodel.plans import as_plan_arrays, plans_to_arrays
from hardware_catalog import get_gpu
from hardware_catalog.catalog import efficiency_from_mapping
from hardware_catalog.files import CatalogError


def _attention_s(model: ModelSpec, gpu_id: str, framework: str) -> float:
    tr = training_for(framework, seq_len=8192, global_batch=64)
    kn = kernels_of(ClusterSpec(gpu=get_gpu(gpu_id), num_gpus=8), tr,
                    as_plan_arrays(plans_to_arrays([Plan(dp=8, micro_batch=1)])))
    return float(np.asarray(_attention_fwd(model, tr, kn))[0])


def test_the_stacks_name_their_generation() -> None:
    assert profile_for("llm-foundry").attention.attention_kernel == "flash1"
    assert profile_for("torchtitan").attention.attention_kernel == "flash2"
    assert profile_for("megatron").attention.attention_kernel == "flash3"


def test_on_a100_flash_attention_1_runs_at_its_own_fraction(llama8b: ModelSpec) -> None:
    """The same attention on A100 takes longer under FlashAttention-1's Triton port than under
    FlashAttention-2, in the ratio of their calibrated fractions."""
    eff = get_gpu("a100-sxm-80gb").efficiency
    assert 0 < eff.flash1_attention_peak_fraction < eff.attention_peak_fraction
    fa1 = _attention_s(llama8b, "a100-sxm-80gb", "llm-foundry")
    fa2 = _attention_s(llama8b, "a100-sxm-80gb", "torchtitan")
    assert fa1 / fa2 == pytest.approx(
        eff.attention_peak_fraction / eff.flash1_attention_peak_fraction, rel=1e-9)


def test_where_the_runs_do_not_tell_them_apart_one_fraction_prices_both(
        llama8b: ModelSpec) -> None:
    assert get_gpu("h100-sxm-80gb").efficiency.flash1_attention_peak_fraction == 0.0
    assert _attention_s(llama8b, "h100-sxm-80gb", "llm-foundry") == pytest.approx(
        _attention_s(llama8b, "h100-sxm-80gb", "torchtitan"), rel=1e-12)


def test_a_calibration_file_may_leave_it_zero_but_not_negative() -> None:
    base = get_gpu("h100-sxm-80gb").efficiency
    assert efficiency_from_mapping("x", base, {"flash1_attention_peak_fraction": 0.0}) == replace(
        base, flash1_attention_peak_fraction=0.0)
    with pytest.raises(CatalogError, match="flash1_attention_peak_fraction must be > 0"):
        efficiency_from_mapping("x", base, {"flash1_attention_peak_fraction": -0.1})


def test_flash_attention_s_backward_runs_below_its_forward_s_rate() -> None:
    """Flash attention's backward: 2.5x the forward's FLOPs at FLASH_BWD_RATE of its rate (the
    FlashAttention-3 paper's figures, 0.82-0.87), so a layer's backward holds 2.5 / 0.85 of its
    attention forward; unfused attention's backward stays 2.5x its forward."""
    from costmodel.kernels import FLASH_BWD_RATE, attention_bwd_factor, fwd_bwd

    assert 0.82 <= FLASH_BWD_RATE <= 0.87
    flash = training_for("megatron", seq_len=8192, global_batch=64)
    eager = training_for("megatron", seq_len=8192, global_batch=64, flash_attention=False)
    assert attention_bwd_factor(flash) == pytest.approx(2.5 / FLASH_BWD_RATE)
    assert attention_bwd_factor(eager) == 2.5
    zero, attn = np.zeros(1), np.full(1, 0.01)
    fwd, bwd = fwd_bwd(zero, zero, attn, zero, 0.0, 1.0, elem_bwd_s=zero,
                       attention_bwd=attention_bwd_factor(flash))
    assert float(fwd[0]) == pytest.approx(0.01)
    assert float(bwd[0]) == pytest.approx(0.01 * 2.5 / FLASH_BWD_RATE)
