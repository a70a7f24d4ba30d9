"""The cost model's answer for one plan: the three challenges, in the framework's order."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

GIB = 2**30
Tier = Literal["nvlink", "network", "none", "host"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Bytes per GPU on one pipeline stage at its peak."""

    stage: Literal["first", "middle", "last"]
    layers: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float  # logits/loss, communication buffers, gathered FSDP units
    overhead_bytes: float  # CUDA context share, allocator fragmentation

    @property
    def model_state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return (self.model_state_bytes + self.activations_bytes + self.buffers_bytes
                + self.overhead_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    stages: tuple[StageMemory, ...]
    usable_bytes: float
    # activations offloaded to pinned host memory, and the host memory a GPU may pin
    host_bytes: float = 0.0
    host_usable_bytes: float = 0.0

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total_bytes)

    @property
    def peak_bytes(self) -> float:
        return self.peak.total_bytes

    @property
    def slack_bytes(self) -> float:
        """``<= 0`` means the plan fits (Optuna's constraint convention)."""
        return self.peak_bytes - self.usable_bytes

    @property
    def fits(self) -> bool:
        return self.slack_bytes <= 0 and self.host_bytes <= self.host_usable_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTime:
    """One micro-batch through one pipeline stage, forward and backward (the recomputed forward
    and, on the last, the LM head and loss included): its kernels and its exposed communication.
    The pipeline steps at its slowest stage's pace; the others wait."""

    stage: Literal["first", "middle", "last"]
    layers: int
    compute_s: float
    comm_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One named collective, per GPU per optimizer step."""

    name: str  # e.g. "dp_grad_reduce_scatter", "tp_all_gather", "pp_send_recv"
    # edp: the experts' data-parallel group; host: a GPU and its host memory (costmodel.offload)
    group: Literal["dp", "edp", "tp", "pp", "cp", "ep", "host"]
    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "copy"]
    group_size: int
    bytes: float  # payload per GPU per step
    tier: Tier
    time_s: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        return self.time_s - self.exposed_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeEstimate:
    """FLOPs per GPU per step. Model FLOPs follow the 6N + 12·L·h·s convention (PaLM/Megatron:
    attention counted without causal halving); hardware FLOPs add the recomputed forward."""

    model_flops: float
    hardware_flops: float
    # model FLOPs with attention as a causal mask computes it (about half the scores) over the
    # convention's: the second, labelled MFU figure (StepEstimate.mfu_causal)
    causal_flops_share: float = 1.0
    time_s: float  # kernel time of forward+backward including recompute
    recompute_time_s: float
    optimizer_time_s: float
    gemm_efficiency: float  # achieved fraction of peak over the GEMMs
    # what overlapped communication slows the kernels by (its NCCL kernels hold SMs); in time_s
    contention_time_s: float = 0.0
    # the caching allocator's expected stall near capacity (frees and retries); in time_s
    stall_time_s: float = 0.0
    # one micro-batch through each pipeline stage (first; first and last at pp 2; all three
    # beyond): where the pipeline's pace comes from
    stage_times: tuple[StageTime, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEstimate:
    memory: MemoryEstimate
    compute: ComputeEstimate
    collectives: tuple[Collective, ...]
    bubble_time_s: float
    step_time_s: float
    tokens_per_step: int
    num_gpus: int
    # MFU and HFU divide by the dense bf16 peak whatever the precision (one convention, the
    # PaLM/Megatron one), so an fp8 plan's MFU compares with a bf16 plan's; what the GEMMs'
    # own precision could reach is the second, labelled figure
    peak_flops_per_gpu: float  # dense bf16
    precision_peak_flops_per_gpu: float  # dense, at the plan's precision (fp8: twice bf16)

    @property
    def comm_time_s(self) -> float:
        return sum(c.time_s for c in self.collectives)

    @property
    def comm_exposed_s(self) -> float:
        return sum(c.exposed_s for c in self.collectives)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.num_gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.compute.model_flops / self.step_time_s / 1e12

    @property
    def mfu(self) -> float:
        return self.compute.model_flops / self.step_time_s / self.peak_flops_per_gpu

    @property
    def mfu_causal(self) -> float:
        """MFU with causal-aware model FLOPs (attention halved under a causal mask): what
        long-context reports quote beside the convention's figure."""
        return self.mfu * self.compute.causal_flops_share

    @property
    def hfu(self) -> float:
        return self.compute.hardware_flops / self.step_time_s / self.peak_flops_per_gpu

    @property
    def mfu_precision_peak(self) -> float:
        """Model FLOPs over the dense peak of the precision the GEMMs run in."""
        return self.compute.model_flops / self.step_time_s / self.precision_peak_flops_per_gpu

    @property
    def dominant_challenge(self) -> Literal["memory", "compute", "communication", "bubble"]:
        """The binding challenge: memory if it does not fit, else the largest time share."""
        if not self.memory.fits:
            return "memory"
        shares = {"compute": self.compute.time_s + self.compute.optimizer_time_s,
                  "communication": self.comm_exposed_s, "bubble": self.bubble_time_s}
        return max(shares, key=lambda k: shares[k])  # type: ignore[arg-type, return-value]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            peak_mem_gib=self.memory.peak_bytes / GIB,
            usable_mem_gib=self.memory.usable_bytes / GIB,
            fits=self.memory.fits,
            comm_time_s=self.comm_time_s,
            comm_exposed_s=self.comm_exposed_s,
            tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
            model_tflops_per_gpu=self.model_tflops_per_gpu,
            mfu=self.mfu,
            mfu_causal=self.mfu_causal,
            hfu=self.hfu,
            mfu_precision_peak=self.mfu_precision_peak,
            dominant_challenge=self.dominant_challenge,
        )
        return out
