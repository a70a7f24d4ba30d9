"""The caching allocator's stall near capacity (``MemoryModel.pressure_*``,
``costmodel.memory.allocator_stall``): a cliff at the reserved peak's ``pressure_start`` share of
usable memory, charged by the chance that the real peak passes it (a normal in log memory of
``pressure_width``), at most ``pressure_slowdown`` of the step. Memory itself is untouched."""

from __future__ import annotations

import numpy as np
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, MemoryModel, ModelSpec, Plan, estimate_batch
from costmodel.plans import plans_to_arrays
from hardware_catalog.frameworks import framework_settings

MICRO_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)


def _run(llama8b: ModelSpec, h100, mm: MemoryModel) -> dict[str, np.ndarray]:
    """llama 8B on one node, tp 2, ZeRO-1, selective recompute: the micro-batch walks the peak from
    well inside usable memory to past it."""
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plans = [Plan(tp=2, dp=4, zero_stage=1, recompute="selective", micro_batch=b)
             for b in MICRO_BATCHES]
    tr = training_for(seq_len=4096, global_batch=4 * 48, memory_model=mm)
    return estimate_batch(llama8b, cluster, tr, plans_to_arrays(plans))


def _stall(llama8b: ModelSpec, h100, **pressure: float) -> tuple[np.ndarray, np.ndarray]:
    """(stalled step / unstalled step - 1, peak / usable) over the micro-batches."""
    off = _run(llama8b, h100, MemoryModel(pressure_slowdown=0.0))
    on = _run(llama8b, h100, MemoryModel(**pressure))
    np.testing.assert_array_equal(on["peak_mem_bytes"], off["peak_mem_bytes"])
    return on["step_time_s"] / off["step_time_s"] - 1.0, off["peak_mem_bytes"] / off["usable_bytes"]


def test_the_walk_crosses_capacity(llama8b: ModelSpec, h100) -> None:
    _, frac = _stall(llama8b, h100, pressure_slowdown=2.0)
    # under Megatron-Core's selective recompute (core_attn) one sequence is 61% of usable
    # memory, sixteen past it
    assert frac.min() < 0.65 and frac.max() > 1.3


def test_a_cliff_at_the_start(llama8b: ModelSpec, h100) -> None:
    """Far below the start no stall, far above the whole slowdown, never more, rising with the
    peak; half of it where the peak is the start."""
    s = 2.0
    extra, frac = _stall(llama8b, h100, pressure_slowdown=s, pressure_width=0.05)
    assert np.all(np.diff(extra[np.argsort(frac)]) >= -1e-12)
    assert np.all((extra >= 0.0) & (extra <= s + 1e-9))
    assert np.all(extra[frac < 0.75] < 1e-3 * s)
    assert np.all(extra[frac > 1.25] > 0.99 * s)
    mid, _ = _stall(llama8b, h100, pressure_slowdown=s, pressure_width=0.05,
                    pressure_start=float(frac[3]))
    assert mid[3] == pytest.approx(s / 2, rel=1e-6)


def test_a_surer_peak_is_a_sharper_cliff(llama8b: ModelSpec, h100) -> None:
    """With less doubt about the peak, a plan below the start is charged less and one above
    more."""
    wide, frac = _stall(llama8b, h100, pressure_slowdown=2.0, pressure_width=0.2)
    sharp, _ = _stall(llama8b, h100, pressure_slowdown=2.0, pressure_width=0.02)
    below, above = (frac < 0.95) & (frac > 0.6), frac > 1.05
    assert below.any() and above.any()
    assert np.all(sharp[below] < wide[below]) and np.all(sharp[above] > wide[above])


def test_no_slowdown_no_stall(llama8b: ModelSpec, h100) -> None:
    extra, _ = _stall(llama8b, h100, pressure_slowdown=0.0, pressure_width=0.1)
    np.testing.assert_array_equal(extra, 0.0)


def test_only_the_fitted_framework_stalls() -> None:
    """The stall is fitted on nanotron's runs (its profile's memory model); frameworks with no
    measured run near capacity keep the prior of none, and every one starts at usable memory."""
    nanotron = framework_settings("nanotron")["memory_model"]
    assert nanotron.pressure_slowdown > 0.0 and nanotron.pressure_start == 1.0
    assert 0.0 < nanotron.pressure_width < 0.5
    for fw in ("generic", "megatron", "torchtitan", "deepspeed"):
        mm = framework_settings(fw)["memory_model"]
        assert mm.pressure_slowdown == 0.0 and mm.pressure_start == 1.0


def test_the_normal_distribution_function() -> None:
    """The cost model's own Phi (numpy alone) against scipy's, over the range that matters."""
    from scipy.special import ndtr

    from costmodel.memory_model import normal_cdf

    z = np.linspace(-8.0, 8.0, 4001)
    np.testing.assert_allclose(normal_cdf(z), ndtr(z), atol=2e-7)
    assert normal_cdf(np.array([-np.inf]))[0] == 0.0 and normal_cdf(np.array([np.inf]))[0] == 1.0
