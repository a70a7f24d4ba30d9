"""The sections of a study file, as a pydantic schema: each field's type, range and rule.

Unknown keys are rejected, inf and nan are never a count, and ``true`` is never a number; a
broken rule raises ``ValueError``, which :func:`search.inputs.study.parse_study` turns into one
``field.path: rule (got value)`` line.
"""


from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)

from hardware_catalog import load_fabrics
from hardware_catalog.frameworks import EXPORT_FORMATS, frameworks
from search.inputs.axes import (
    MAX_GPUS,
    BoolAxis,
    DispatcherAxis,
    IntAxis,
    ModulesAxis,
    RecomputeAxis,
    ScheduleAxis,
    ZeroAxis,
)
from search.inputs.presets import preset_names
from search.inputs.yamlinput import whole_number

# the quantile levels of the residual tables (search/uncertainty.py): 5%, 10%, ..., 95%; a
# study's objective.risk lies within them
LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))


class _Section(BaseModel):
    # inf and nan are never a count, a size, a rate or a price.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic would read true as 1.0
        raise ValueError(f"must be a number, not true or false (got {value!r})")
    return value


Int = Annotated[int, Strict()]
# a count that may be written in scientific notation (4e6 tokens)
WholeInt = Annotated[int, Strict(), BeforeValidator(whole_number)]
Float = Annotated[float, BeforeValidator(_not_bool)]
Bool = Annotated[bool, Strict()]
# Beyond this the enumeration (layer splits) would not finish: more layers than any model has.
MAX_LAYERS = 4096
class MoeRouterSection(_Section):
    """Routing beyond top-k softmax (costmodel.layer_style.MoeRouter)."""

    score: Literal["softmax", "sigmoid"] = "softmax"
    groups: Int = Field(default=1, gt=0)
    group_topk: Int = Field(default=1, gt=0)
    scaling: float = Field(default=1.0, gt=0)
    expert_bias: Bool = False


class Moe(_Section):
    experts: Int = Field(gt=0)
    topk: Int = Field(gt=0)
    ffn_hidden: Int = Field(default=0, ge=0)  # 0: the dense ffn_hidden
    shared_experts: Int = Field(default=0, ge=0)
    dense_layers: Int = Field(default=0, ge=0)  # leading dense layers (DeepSeek-V3: 3)
    layer_freq: Int = Field(default=1, ge=1)  # then every Nth layer MoE (Llama 4 Maverick: 2)
    router: MoeRouterSection | None = None


class Mla(_Section):
    """Multi-head latent attention (costmodel.mla.MlaSpec)."""

    q_lora_rank: Int = Field(default=0, ge=0)  # 0: queries projected directly
    kv_lora_rank: Int = Field(gt=0)
    qk_nope_head_dim: Int = Field(gt=0)
    qk_rope_head_dim: Int = Field(gt=0)
    v_head_dim: Int = Field(gt=0)


class RopeScalingSection(_Section):
    """RoPE's long-context scaling (costmodel.layer_style.RopeScaling; Hugging Face
    ``rope_scaling``): llama3 reads the freq factors, yarn the betas and mscales."""

    kind: Literal["llama3", "yarn"]
    factor: float = Field(gt=0)
    original_max_position_embeddings: Int = Field(gt=0)
    low_freq_factor: float = Field(default=1.0, gt=0)
    high_freq_factor: float = Field(default=4.0, gt=0)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


class Architecture(_Section):
    layers: Int = Field(gt=0)
    hidden: Int = Field(gt=0)
    ffn_hidden: Int = Field(gt=0)
    heads: Int = Field(gt=0)
    kv_heads: Int | None = Field(default=None, gt=0)  # None: equal to heads (MHA)
    vocab: Int = Field(gt=0)
    head_dim: Int = Field(default=0, ge=0)
    ffn_type: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: Bool = False
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position_embedding: Literal["rope", "learned"] = "rope"
    rope_base: float = Field(default=10000.0, gt=0)
    rope_scaling: RopeScalingSection | None = None
    bias: Literal["none", "qkv", "all"] = "none"
    moe: Moe | None = None
    mla: Mla | None = None
    sliding_window: Int = Field(default=0, ge=0)  # 0: attend to the whole sequence
    attention_chunk: Int = Field(default=0, ge=0)  # Llama 4's chunked attention (tokens)
    window_skip_freq: Int = Field(default=0, ge=0)  # every Nth layer full (0: all windowed)
    attention_sinks: Bool = False  # a learnable softmax offset per head (gpt-oss)
    qk_norm: Bool = False  # RMSNorm over each query and key head (Qwen3)
    mtp_layers: Int = Field(default=0, ge=0)  # multi-token prediction depths (costmodel.mtp)
    # the routed experts' gated activation clamped to +-limit (gpt-oss; 0: unclamped)
    swiglu_limit: float = Field(default=0.0, ge=0)


class ModelSection(_Section):
    """Exactly one of ``preset``, ``architecture`` or ``hf_config`` (a path relative to the
    study file)."""

    preset: str | None = None
    architecture: Architecture | None = None
    hf_config: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        given = [k for k in ("preset", "architecture", "hf_config") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of preset, architecture, hf_config (got {given})")
        return self

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and name not in preset_names():
            raise ValueError(f"must be one of {', '.join(preset_names())} (got {name!r})")
        return name


class TrainingSection(_Section):
    seq_len: Int = Field(gt=0)
    global_batch: Int | None = Field(default=None, gt=0)  # sequences
    global_batch_tokens: WholeInt | None = Field(default=None, gt=0)
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    # tokens, for time-to-train and GPU-hours
    token_budget: Float | None = Field(default=None, gt=0, lt=1e30)
    # the framework's behaviour and calibrated memory footprint (hardware_catalog/frameworks.yaml);
    # the switches below, when given, override its defaults
    framework: str = "generic"
    overlap_grad_reduce: Bool | None = None
    overlap_param_gather: Bool | None = None
    tp_comm_overlap: Bool | None = None
    flash_attention: Bool | None = None
    # fp8 weights held in fp8 only (Megatron-LM --fp8-param-gather); gradients accumulated and
    # reduced in bf16 instead of fp32 (--grad-reduce-in-bf16)
    fp8_param_gather: Bool | None = None
    grad_reduce_in_bf16: Bool | None = None
    # Adam's moments held in bf16 (Megatron-LM --use-precision-aware-optimizer --exp-avg-dtype
    # bf16 --exp-avg-sq-dtype bf16; the fp32 master weights stay), as Megatron-Bridge's
    # DeepSeek-V3 recipes run
    adam_moments_in_bf16: Bool | None = None
    # the loss as Megatron-Core fuses it (--cross-entropy-loss-fusion --cross-entropy-fusion-impl
    # native|te): "te" is Transformer Engine's in-place cross-entropy, which keeps the logits
    # alone (2 bytes each, not the fp32 softmax too; Megatron-Bridge's performance recipes run
    # it); unfused unless given
    cross_entropy_fusion_impl: Literal["native", "te"] | None = None
    # torch.compile: fuses the norms, RoPE and activation functions a framework runs eagerly
    compile: Bool | None = None
    # PyTorch's caching allocator with expandable segments
    # (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): no fragmentation reserved beyond what
    # is allocated (costmodel.memory.allocator_fraction); the profile's unless given
    expandable_segments: Bool | None = None
    # what recompute=selective recomputes under a Megatron-Core profile (--recompute-modules;
    # costmodel/recompute_modules.py): the profile's ["core_attn"] unless given
    recompute_modules: list[str] | None = None
    # how the framework lays tp, cp, ep, dp and pp over the ranks, fastest first (Megatron-Core's
    # --use-tp-pp-dp-mapping: "tp-cp-ep-pp-dp"); the profile's unless given
    rank_order: str | None = None
    # MoE dispatch as Megatron-Core runs it (costmodel/moe.py, costmodel/parallel/expert.py):
    # --moe-token-dispatcher-type (flex: DeepEP / HybridEP), --overlap-moe-expert-parallel-comm,
    # --moe-permute-fusion, --moe-router-fusion, --moe-shared-expert-overlap, and token drop
    # with padding (--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity); the
    # profile's unless given. A given dispatcher or overlap is not searched.
    moe_dispatcher: Literal["alltoall", "allgather", "flex"] | None = None
    moe_a2a_overlap: Bool | None = None
    moe_permute_fusion: Bool | None = None
    moe_router_fusion: Bool | None = None
    moe_shared_expert_overlap: Bool | None = None
    moe_pad_to_capacity: Bool | None = None

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, value: str) -> str:
        if value not in frameworks():
            raise ValueError(f"must be one of {', '.join(frameworks())} (got {value!r})")
        return value

    @model_validator(mode="after")
    def _fp8_only(self) -> TrainingSection:
        if self.fp8_param_gather and self.precision != "fp8":
            raise ValueError("fp8_param_gather needs precision: fp8 "
                             f"(got precision {self.precision!r})")
        return self

    @model_validator(mode="after")
    def _one_batch(self) -> TrainingSection:
        if (self.global_batch is None) == (self.global_batch_tokens is None):
            raise ValueError("give exactly one of global_batch (sequences) or global_batch_tokens")
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            below = self.global_batch_tokens // self.seq_len * self.seq_len
            nearest = ", ".join(f"{n:,}" for n in (below, below + self.seq_len) if n > 0)
            raise ValueError(f"global_batch_tokens % seq_len == 0 must hold "
                             f"(got {self.global_batch_tokens} and {self.seq_len}; nearest "
                             f"whole batches: {nearest})")
        return self

    @property
    def sequences(self) -> int:
        if self.global_batch is not None:
            return self.global_batch
        assert self.global_batch_tokens is not None
        return self.global_batch_tokens // self.seq_len


class ClusterSection(_Section):
    """``gpu`` is a catalog id; ``gpu_spec`` instead defines a device the catalog lacks (e.g. the
    CPU "cluster" of tiny-cpu.yaml) with the :class:`costmodel.GpuSpec` fields it needs."""

    gpu: str
    gpus: Int | None = Field(default=None, gt=0)
    nodes: Int | None = Field(default=None, gt=0)
    gpus_per_node: Int = Field(default=8, gt=0)
    # the inter-node fabric (hardware_catalog/fabrics.yaml): sets the network efficiency
    fabric: str | None = None
    # its topology, where the fabric's is not the cluster's: nodes whose rails share leaf
    # switches, and the leaves' downlink over uplink bandwidth into the spine
    rail_group_nodes: Int | None = Field(default=None, gt=0)
    oversubscription: Float | None = Field(default=None, ge=1, lt=1e3)
    overrides: dict[str, Any] = Field(default_factory=dict)
    gpu_spec: dict[str, Any] | None = None
    price_per_gpu_hour: Float | None = Field(default=None, gt=0, lt=1e30)  # for objective: cost
    # the cluster's own links fitted on its nccl-tests (tcf-search calibrate --nccl-tests -o
    # FILE): a path relative to the study file, like model.hf_config (search/inputs/links.py)
    calibration: str | None = None

    @field_validator("fabric")
    @classmethod
    def _known_fabric(cls, value: str | None) -> str | None:
        known = sorted(load_fabrics())
        if value is not None and value not in known:
            raise ValueError(f"must be one of {', '.join(known)} (got {value!r})")
        return value

    @model_validator(mode="after")
    def _size(self) -> ClusterSection:
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("give exactly one of gpus or nodes")
        n = self.num_gpus
        if max(n, self.gpus_per_node) > MAX_GPUS:
            raise ValueError(f"gpus <= {MAX_GPUS} and gpus_per_node <= {MAX_GPUS} must hold "
                             f"(got gpus={n}, gpus_per_node={self.gpus_per_node})")
        if n > self.gpus_per_node and n % self.gpus_per_node:
            raise ValueError(f"gpus % gpus_per_node == 0 must hold on more than one node "
                             f"(got gpus={n}, gpus_per_node={self.gpus_per_node})")
        return self

    @property
    def num_gpus(self) -> int:
        return self.gpus if self.gpus is not None else (self.nodes or 0) * self.gpus_per_node


class SearchSpaceSection(_Section):
    """Each knob: ``auto`` (a domain derived from the model and cluster), one value (fixed) or a
    list (searched). ``dp`` is derived from the world size; a value or list restricts it."""

    tp: IntAxis = "auto"
    pp: IntAxis = "auto"
    dp: IntAxis = "auto"
    cp: IntAxis = (1,)
    ep: IntAxis = "auto"
    expert_tp: IntAxis = "auto"  # Megatron-Core's --expert-tensor-parallel-size (MoE only)
    vpp: IntAxis = "auto"
    zero_stage: ZeroAxis = "auto"
    micro_batch: IntAxis = "auto"
    recompute: RecomputeAxis = "auto"
    sequence_parallel: BoolAxis = "auto"
    pp_schedule: ScheduleAxis = "auto"
    # Megatron-Core's selective modules per plan (--recompute-modules): null, the training's set
    # for every plan; auto, every set of the modules that free memory on the model
    recompute_modules: ModulesAxis = None
    # the MoE dispatch per plan (Megatron-Core's --moe-token-dispatcher-type and
    # --overlap-moe-expert-parallel-comm): auto, every one the framework's launcher offers,
    # unless the study's training section fixes it
    moe_dispatcher: DispatcherAxis = "auto"
    moe_a2a_overlap: BoolAxis = "auto"
    uneven_pipeline: Bool = True  # CP-SAT may give the first/last stage other layer counts
    partial_recompute: Bool = True  # CP-SAT picks how many layers per stage are recomputed
    # a single stage without recompute offloads the fewest layers' activations that fit to host
    # memory, where the framework can (rule cpu_offload; costmodel/offload.py)
    cpu_offload: Bool = True
    tp_in_node: Bool = True  # keep TP inside one NVLink domain


class ObjectiveSection(_Section):
    metric: Literal["tokens_per_s", "mfu", "time_to_train", "cost"] = "tokens_per_s"
    second: Literal["memory_headroom"] | None = None
    # memory kept free on every GPU: an absolute figure, or else a fraction of usable memory.
    # Default 10%: Playbook runs predicted above 90% of usable memory ran 22% slower (median)
    # as the caching allocator frees and retries (issue #2's closing note).
    memory_headroom_gib: Float | None = Field(default=None, ge=0)
    memory_headroom_fraction: Float = Field(default=0.1, ge=0, lt=1)
    # rank tokens/s plans by this quantile of the held-out error (0.2: the tokens/s a plan
    # reaches with 80% probability) times the probability that it fits (search/uncertainty.py);
    # within the levels the held-out residuals are tabled at (a rarer one would be clamped)
    risk: Float | None = Field(default=None, ge=LEVELS[0], le=LEVELS[-1])


class SearchSection(_Section):
    trials: Int = Field(default=300, gt=0)
    sampler: Literal["auto", "tpe", "nsga2", "random", "brute_force"] = "auto"
    seed: Int = Field(default=0, ge=0, lt=2**32)  # numpy's seed range
    storage: str | None = None  # default: a journal file in the output folder
    study_name: str | None = None  # default: the study's name
    workers: Int = Field(default=1, gt=0)
    top_k: Int = Field(default=10, gt=0)


class ExportSection(_Section):
    """Launcher configs written at the end of a study (implemented in ``tcf_search.export``)."""

    formats: list[str] = Field(default_factory=list)
    rank: Int = Field(default=1, gt=0)
    output: str | None = None  # folder, relative to the study's output folder
    force: Bool = False
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n != "all" and n not in EXPORT_FORMATS]
        if unknown:
            raise ValueError(f"must be among {', '.join(EXPORT_FORMATS)}, all "
                             f"(got {unknown[0]!r})")
        return names

    @field_validator("output")
    @classmethod
    def _inside_output(cls, output: str | None) -> str | None:
        # A study file may not make the exporter write outside the result folder.
        rel = PurePosixPath(output or ".")
        if rel.is_absolute() or ".." in rel.parts or "\\" in (output or ""):
            raise ValueError(f"must be a folder inside the output folder, without .. "
                             f"(got {output!r})")
        return output


class ValidationSection(_Section):
    """Short real runs of the top plans (implemented in ``tcf_search.validate``)."""

    top: Int = Field(default=3, gt=0)
    steps: Int = Field(default=3, gt=0)
    warmup: Int = Field(default=1, ge=0)
    device: Literal["cpu", "cuda"] = "cpu"
    timeout_s: Float = Field(default=600.0, gt=0)
    memory_only: Bool = False
    options: dict[str, Any] = Field(default_factory=dict)
