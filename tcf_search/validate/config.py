"""What one validation run is asked to do, and what it reports. No torch here: the CLI, the
launcher and the comparison read these without the optional dependency installed."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from costmodel import rules
from costmodel.errors import TcfError
from costmodel.specs import ModelSpec, Plan, SpecError, Training

Outcome = Literal["ok", "oom", "crash", "timeout", "unsupported"]
Fault = Literal["none", "crash", "hang", "oom"]
Device = Literal["cpu", "cuda"]
MemorySource = Literal["cuda_max_memory_allocated", "mem_tracker", "fake_mem_tracker"]


class ValidationError(TcfError):
    """A validation request breaks a rule; the message names the field, the rule and the value."""


class Unsupported(ValidationError):
    """The harness cannot run this plan (e.g. MoE, context parallel on CPU); recorded, not fatal."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """One plan to run for real: the model, the plan, the step's batch, and the run's knobs.

    ``fault`` injects a failure into rank ``world_size - 1`` so tests can check that an OOM, a
    crash or a hang is recorded as the plan's outcome. ``memory_limit_bytes`` caps each CPU rank's
    heap (RLIMIT_DATA) so that a CPU run can meet a real out-of-memory error.
    """

    model: ModelSpec
    plan: Plan
    training: Training
    steps: int = 3
    warmup: int = 1
    device: Device = "cpu"
    seed: int = 0
    track_memory: bool = True
    fault: Fault = "none"
    memory_limit_bytes: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValidationError(f"steps must be >= 1, but got steps={self.steps}")
        if self.warmup < 0:
            raise ValidationError(f"warmup must be >= 0, but got warmup={self.warmup}")
        check_supported(self.model, self.plan, self.training, self.device)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "training": self.training.to_dict()})

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        raw = json.loads(text)
        return cls(**{**raw, "model": ModelSpec(**raw["model"]), "plan": Plan(**raw["plan"]),
                      "training": Training.from_dict(raw["training"])})


def as_run(training: Training, device: str) -> Training:
    """``training`` as the harness runs it on ``device``: CPU runs have no autocast (no fast
    bf16 on CPU), so their activations are fp32, and no CUDA caching allocator, so none of its
    fragmentation; the cost model is asked about that run."""
    if device == "cpu":
        mm = dataclasses.replace(training.framework.memory_model, allocator_fraction=0.0,
                                 allocator_const_bytes=0.0)
        return training.with_switches(activation_dtype_bytes=4.0, memory_model=mm)
    return training


def micro_batches(plan: Plan, training: Training) -> int:
    """Micro-batches per optimizer step per data-parallel rank."""
    per_rank, rest = divmod(training.global_batch, plan.dp * plan.micro_batch)
    if rest or per_rank < 1:
        raise ValidationError(
            "training.global_batch % (plan.dp * plan.micro_batch) == 0 must hold, but got "
            f"global_batch={training.global_batch}, dp={plan.dp}, micro_batch={plan.micro_batch}")
    return per_rank


def check_supported(model: ModelSpec, plan: Plan, training: Training, device: str) -> None:
    """Raise ``Unsupported`` for what the harness does not build, ``ValidationError`` for plans
    that are not valid arithmetic for this model: first the cost model's validity table
    (``costmodel.rules``, on a cluster of the plan's world size), then the harness's own.

    The harness's context parallelism (``validate.model.Attention``) gives each rank one
    contiguous chunk and all-gathers K and V, so by itself it needs only seq_len % cp == 0;
    the shared rule (seq_len % (2 * cp) == 0, load-balanced causal CP) implies it."""
    if plan.cpu_offload_layers:
        raise Unsupported(f"plan.cpu_offload_layers={plan.cpu_offload_layers}: the harness has no "
                          "asynchronous activation offloading like Transformer Engine's (torch's "
                          "save_on_cpu copies synchronously), so its step would not be the plan's")
    world = plan.world_size
    shared = rules.Facts(layers=model.layers, heads=model.heads, kv_heads=model.kv_heads,
                         experts=model.moe_experts, seq_len=training.seq_len,
                         global_batch=training.global_batch, num_gpus=world,
                         nvlink_domain=world)
    try:
        rules.check(plan, shared)
    except SpecError as exc:
        raise ValidationError(str(exc)) from None
    if model.is_moe or plan.ep > 1:
        raise Unsupported("model.moe_experts > 0 / plan.ep > 1: the harness builds dense models")
    if model.mtp_layers:
        raise Unsupported("model.mtp_layers > 0: the harness builds no multi-token prediction")
    if plan.cp > 1 and (plan.tp > 1 or plan.pp > 1):
        raise Unsupported(f"plan.cp={plan.cp} with tp={plan.tp}, pp={plan.pp}: the harness's "
                          "context parallel runs beside data parallel only (tp = pp = 1)")
    if model.kv_heads % plan.tp:
        raise ValidationError(f"model.kv_heads % plan.tp == 0 must hold for tensor parallel "
                              f"attention, but got kv_heads={model.kv_heads}, tp={plan.tp}")
    if model.ffn_hidden % plan.tp:
        raise ValidationError(f"model.ffn_hidden % plan.tp == 0 must hold, but got "
                              f"ffn_hidden={model.ffn_hidden}, tp={plan.tp}")
    if plan.sequence_parallel and training.seq_len % plan.tp:
        raise ValidationError(f"training.seq_len % plan.tp == 0 must hold with sequence "
                              f"parallel, but got seq_len={training.seq_len}, tp={plan.tp}")
    stages = plan.pp * plan.vpp
    if model.layers < stages:
        raise ValidationError(f"model.layers >= plan.pp * plan.vpp must hold, but got "
                              f"layers={model.layers}, pp={plan.pp}, vpp={plan.vpp}")
    if plan.pp > 1 and model.tied_embeddings:
        raise Unsupported("model.tied_embeddings with plan.pp > 1: the tie crosses stages")
    n_micro = micro_batches(plan, training)
    if plan.pp > 1 and n_micro < plan.pp:
        raise Unsupported(f"micro-batches >= plan.pp is needed by torch.distributed.pipelining "
                          f"schedules, but got micro-batches={n_micro}, pp={plan.pp}")
    if plan.pp > 1 and plan.schedule == "interleaved" and n_micro % plan.pp:
        raise ValidationError(f"micro-batches % plan.pp == 0 must hold for the interleaved "
                              f"schedule, but got micro-batches={n_micro}, pp={plan.pp}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankReport:
    """What one rank measured."""

    rank: int
    step_times_s: list[float]
    losses: list[float]
    peak_bytes: float  # tensor bytes at the peak (tracker) or max_memory_allocated (GPU)
    reserved_bytes: float = 0.0  # GPU: max_memory_reserved
    rss_peak_bytes: float = 0.0  # CPU: process max RSS, runtime included
    memory_parts: dict[str, float] = field(default_factory=dict)  # tracker categories at peak
    memory_maxima: dict[str, float] = field(default_factory=dict)  # each category's maximum
    layer_activation_bytes: float = float("nan")  # see memory.StepMemory
    memory_source: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One plan's outcome. ``step_time_s`` is the median over timed steps of the slowest rank."""

    outcome: Outcome
    step_time_s: float = float("nan")
    tokens_per_s_per_gpu: float = float("nan")
    peak_bytes: float = float("nan")  # max over ranks
    loss_first: float = float("nan")
    loss_last: float = float("nan")
    memory_parts: dict[str, float] = field(default_factory=dict)  # of the peak rank
    memory_maxima: dict[str, float] = field(default_factory=dict)  # of the peak rank
    layer_activation_bytes: float = float("nan")  # of the peak rank
    memory_source: str = ""
    wall_s: float = 0.0
    error: str = ""
    notes: list[str] = field(default_factory=list)
    ranks: list[RankReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunResult:
        ranks = [RankReport(**r) for r in raw.get("ranks", [])]
        return cls(**{**raw, "ranks": ranks})
