"""What a framework's layers hold and run: the bytes of weights, gradients, states and
activations, the attention kernel, the other kernels and their launch, and what frees stored
activations (groups of :class:`~costmodel.framework.FrameworkProfile`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodel.errors import SpecError
from costmodel.framework.checks import RECOMPUTE_MODES, as_subset, check_choices
from costmodel.graphs import graph_scope
from costmodel.recompute_modules import module_set


@dataclass(frozen=True, slots=True, kw_only=True)
class Numerics:
    """The bytes of what a step holds and moves: weights, gradients, optimizer states and
    activations, and what fp8 training keeps."""

    master_weights: bool
    """An fp32 master copy of the weights next to the low-precision ones."""
    grad_dtype_bytes: int
    """Bytes of a gradient element as accumulated: 4 for an fp32 accumulation buffer (Megatron's
    ``main_grad``, nanotron's fp32 accumulator), 2 for bf16/fp16 gradients."""
    grad_reduce_bytes: int
    """Bytes of a gradient element as reduced (0: ``grad_dtype_bytes``). FSDP2's
    ``reduce_dtype=float32`` reduces in 4 (with sync off the gradients are accumulated whole in
    fp32: ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``)."""
    optimizer_state_bytes: int
    """Bytes of an optimizer state element (Adam's m and v, SGD's momentum): 4 in fp32 beside
    fp32 masters; torch.optim's ``zeros_like`` keeps the parameter's dtype (2: bf16 in NeMo
    AutoModel's MoE models)."""
    activation_dtype_bytes: float
    """Bytes of an activation element, exchanged, stored for backward and streamed by
    elementwise kernels: 2 under bf16/fp16 autocast (fp8 GEMMs too); 4 without it (CPU
    validation runs in fp32)."""
    fp8_param_gather: bool
    """fp8 weights only (Megatron-LM ``--fp8-param-gather``): 1 byte a weight, not bf16 plus a
    cast, all-gathered in fp8 by the distributed optimizer (the fp32 masters stay)."""
    fp8_saves_cast_inputs: bool
    """fp8 keeps the GEMM inputs' fp8 casts for backward (Transformer Engine's Linear); torchao's
    float8 keeps the bf16 inputs and casts again in backward."""
    fp8_weight_cache: bool
    """fp8 weight casts cached after a step's first micro-batch (Megatron-Core's TE layers pass
    ``is_first_microbatch``, ``megatron/core/extensions/transformer_engine.py``); torchao's
    Float8Linear casts its weight at every forward."""
    fp8_cast_compiles: bool
    """fp8's dynamic casts are PyTorch ops that ``torch.compile`` fuses with the kernels that
    produce their inputs: torchao's Float8Linear scales a tensor by ``torch.max(torch.abs(x))``
    and casts it with plain tensor ops (torchao/float8/float8_utils.py ``tensor_to_amax``,
    float8_scaling_utils.py ``hp_tensor_to_float8_dynamic`` at eab345c). Transformer Engine's
    casts are its own CUDA kernels, which compile leaves alone (``costmodel.kernels``)."""

    def __post_init__(self) -> None:
        if self.activation_dtype_bytes not in (2.0, 4.0):
            raise SpecError("training.activation_dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), "
                            f"but got {self.activation_dtype_bytes!r}")
        check_choices(optimizer_state_bytes=(self.optimizer_state_bytes, (2, 4)),
                       grad_reduce_bytes=(self.grad_reduce_bytes, (0, 2, 4)))

    @property
    def grad_reduce_dtype_bytes(self) -> int:
        """Bytes of a gradient element on the wire (and in an unsharded accumulation)."""
        return self.grad_reduce_bytes or self.grad_dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention:
    """The attention kernel and context parallelism's exchange."""

    flash_attention: bool
    """A fused attention kernel, which stores no score matrix; off: eager attention
    (Korthikanti et al.'s 5as/h score terms)."""
    attention_kernel: Literal["flash1", "flash2", "flash3"]
    """The fused-attention kernel: "flash1", FlashAttention-1's generation (llm-foundry's MPT,
    its Triton port); "flash2", FlashAttention-2 and its peers (nanotron, PyTorch SDPA);
    "flash3", FlashAttention-3 or cuDNN's under Transformer Engine (Hopper on)."""
    cp_comm: Literal["ring", "all_gather"]
    """CP's K/V exchange (``costmodel/parallel/context.py``): cp - 1 ring steps (Megatron-Core's
    p2p), or one all-gather (torchtitan's default)."""

    def __post_init__(self) -> None:
        check_choices(attention_kernel=(self.attention_kernel, ("flash1", "flash2", "flash3")),
                       cp_comm=(self.cp_comm, ("ring", "all_gather")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernels:
    """How the rest of a layer's work runs and is launched: the loss, the elementwise
    kernels, the host's issue cost and CUDA graphs."""

    loss_kernel: Literal["fused", "native", "eager_fp32", "te_inplace"]
    """The loss over the logits: "fused" (one fp32 softmax pass each way), "native"
    (Megatron-Core's fused vocab-parallel cross-entropy, ``--cross-entropy-loss-fusion``, priced
    as "fused"), nanotron's "eager_fp32" ops (``costmodel.compute.LOSS_FP32_BYTES``), or
    Transformer Engine's parallel cross-entropy, which writes the gradient over the logits in its
    forward and keeps nothing else (``costmodel.compute.LOSS_LOGIT_PASSES``; Megatron-Core
    cross_entropy_fusion_impl "te")."""
    fused_elementwise: bool
    """Norms, RoPE and the activation function as fused kernels (nanotron's, Transformer
    Engine's, torch.compile); off: eager composites, several HBM passes each
    (``costmodel.compute.EAGER_*``)."""
    host_overhead_s: float
    """CPU seconds to issue one kernel or collective (eager PyTorch; ~10-20 us for lean
    stacks)."""
    cuda_graph_impl: Literal["none", "local", "transformer_engine"]
    """CUDA graphs (``costmodel/graphs.py``; Megatron-Core ``--cuda-graph-impl``): "none" runs
    eagerly."""
    cuda_graph_scope: tuple[str, ...]
    """What a layer's graphs capture (Megatron-Core ``--cuda-graph-scope``); (): the whole
    layer."""
    expandable_segments: bool
    """PyTorch's caching allocator maps its segments as growable virtual ranges
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): freed blocks of any size serve later
    requests, so the reserved peak keeps little beyond the allocated one
    (``costmodel.memory.allocator_fraction``)."""

    def __post_init__(self) -> None:
        check_choices(loss_kernel=(self.loss_kernel,
                                   ("fused", "native", "eager_fp32", "te_inplace")))
        object.__setattr__(self, "cuda_graph_scope",
                           graph_scope(self.cuda_graph_impl, self.cuda_graph_scope))


@dataclass(frozen=True, slots=True, kw_only=True)
class Activations:
    """What the framework does to free stored activations: recompute them, or offload them to
    host memory."""

    recompute_modes: tuple[str, ...]
    """The recompute modes the framework runs (validity: ``costmodel.rules``
    ``framework_recompute``)."""
    partial_recompute: bool
    """Full recompute may cover part of a stage (Megatron-LM's ``--recompute-num-layers``)."""
    recompute_per_chunk: bool
    """A partial full-recompute count is per model chunk (Megatron-LM's
    ``--recompute-num-layers``): with vpp chunks a multiple of vpp. Validity: rule
    ``recompute_chunks``."""
    selective_recompute: Literal["activation", "every_other_mm", "modules"]
    """What ``recompute="selective"`` recomputes: "activation" (the MLP's activation, attention's
    scores without flash attention: Korthikanti et al.), "every_other_mm" (torchtitan's per-op
    policy: every elementwise op and every second GEMM; the rest and attention saved) or
    "modules": Megatron-Core's ``recompute_modules`` (``costmodel/recompute_modules.py``)."""
    recompute_modules: tuple[str, ...]
    """Megatron-Core's selective modules (``--recompute-modules``), where
    ``selective_recompute`` is "modules"; a plan may name its own."""
    cpu_offloading: bool
    """Activations offloaded to host memory per layer (Megatron-Core's
    ``--cpu-offloading-num-layers``, Transformer Engine's offload context): rule
    ``cpu_offload``; ``costmodel/offload.py``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", module_set(self.recompute_modules))
        check_choices(selective_recompute=(self.selective_recompute,
                                            ("activation", "every_other_mm", "modules")))
        as_subset(self, "recompute_modes", RECOMPUTE_MODES)
