"""The software stack's calibrated memory parameters (``Training.memory_model``): what a framework
holds beyond the tensor count of ``costmodel.memory``, and how its caching allocator behaves."""

from __future__ import annotations

from dataclasses import dataclass


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
