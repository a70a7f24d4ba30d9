"""The software stack's calibrated memory parameters (``training.framework.memory_model``): what
a framework holds beyond the tensor count of ``costmodel.memory``, and how its caching allocator
behaves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryModel:
    """Calibrated, physically meaningful memory parameters of the software stack.

    activation_factor: stored activations relative to the tensor-by-tensor count of
        ``costmodel.memory`` (framework extras: saved casts, masks, autograd bookkeeping).
    logits_bytes_per_element: bytes held per logit element while the loss runs (bf16 logits,
        fp32 upcast, softmax and its gradient).
    allocator_fraction: caching-allocator fragmentation, as a fraction of the volatile
        (activation and logits) bytes that ``max_memory_reserved`` holds beyond what is allocated.
    allocator_const_bytes: fixed workspace (cuBLAS, NCCL buffers inside the torch allocator).
    pressure_start: the share of usable memory at which the caching allocator's demand (the
        reserved peak) stalls: cudaMalloc fails, the allocator frees its cached blocks
        (synchronising the device) and retries, every step.
    pressure_slowdown: how much longer a stalled step takes (1.0: twice as long).
    pressure_width: the predicted peak's log uncertainty (the memory fit's residual spread):
        a plan predicted near ``pressure_start`` stalls with the probability it implies.
    source: where the numbers come from.
    """

    activation_factor: float = 1.0
    logits_bytes_per_element: float = 6.0
    allocator_fraction: float = 0.1
    allocator_const_bytes: float = 0.5 * 2**30
    pressure_start: float = 1.0
    pressure_slowdown: float = 0.0
    pressure_width: float = 0.1
    source: str = "prior"


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal's distribution function, by Abramowitz & Stegun 7.1.26 for erf
    (absolute error below 1.5e-7; no scipy: the cost model imports numpy alone)."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)
