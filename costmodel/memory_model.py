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
    pressure_start / pressure_slowdown: above ``pressure_start`` of usable memory the caching
        allocator frees cached blocks and retries cudaMalloc, synchronising the device; the
        step slows by ``pressure_slowdown`` per unit of the remaining headroom consumed.
    source: where the numbers come from.
    """

    activation_factor: float = 1.0
    logits_bytes_per_element: float = 6.0
    allocator_fraction: float = 0.1
    allocator_const_bytes: float = 0.5 * 2**30
    pressure_start: float = 0.9
    pressure_slowdown: float = 0.0
    source: str = "prior"
