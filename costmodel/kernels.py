"""What one GPU's kernels run on and how long one GEMM takes (see ``costmodel.compute``): the
micro-batch's tokens, the plan's TP sharding, the peaks and achieved HBM bandwidth, and a layer's
forward and backward from its parts. Shared by the dense layer (``compute``) and the MoE layer
(``moe``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel.plans import PlanArrays
from costmodel.recompute import Gemm
from costmodel.specs import ClusterSpec, Training

BF16 = 2.0
BWD_KERNEL_FACTOR = 2.0
# the host issues about twice the forward's operations in backward: each GEMM's input and weight
# gradients (Transformer Engine's GroupedLinear backward: a dgrad and a wgrad
# general_grouped_gemm, one GEMM per expert each, and under fp8 the output gradient quantised per
# split), autograd's kernel or two per elementwise op; a captured region replays its backward
# graph as one launch
BWD_HOST_FACTOR = 2.0
# Flash attention's backward runs 2.5x its forward's FLOPs (the scores recomputed, then the three
# gradients' matmuls) at a lower rate than the forward: on H100 SXM5 at head dim 128 and 4k-16k
# tokens, FlashAttention-2 310-322 TFLOPS backward against 368-370 forward, cuDNN 499-516
# against 595-609, FlashAttention-3 542-561 against 638-648 (Shah et al., 2024,
# "FlashAttention-3", arXiv 2407.08608, figs. 5 and 6): 0.82-0.87 of the forward's rate. The
# attention fractions (Efficiency.*attention_peak_fraction) are the forward's rate, so a
# recomputed forward costs what a forward does. A prior, not fitted
FLASH_BWD_RATE = 0.85
# HBM bytes a compiled dynamic fp8 cast moves per element of its input: it reads the bf16 tensor
# its producer wrote (2) and writes the fp8 copy (1). Dynamic (tensorwise) scaling needs the
# tensor's amax before it can cast; torch.compile's Inductor computes that reduction in the
# kernel that produces the tensor (a pointwise op and a reduction over the same elements fuse
# into one kernel with two outputs), so the amax costs no pass of its own. Stacks with
# Transformer Engine's separate cast kernels pay the family's fitted
# ``fp8_cast_bytes_per_element`` instead (fitted on NeMo's tables).
COMPILED_CAST_BYTES = 3.0


def gemm_time(m: np.ndarray, n: np.ndarray, k: np.ndarray, peak: float, c: ClusterSpec,
               in_bytes: float) -> np.ndarray:
    """One GEMM of m x k by k x n: FLOPs at the size-dependent fraction of ``peak``, never
    faster than its operands stream from HBM."""
    eff = c.gpu.efficiency
    flops = 2.0 * m * n * k
    x = np.minimum(np.minimum(m, n), k)
    sat = x / (x + eff.gemm_half_size)
    frac = eff.fp8_gemm_peak_fraction if in_bytes == 1.0 else eff.gemm_peak_fraction
    compute_s = flops / (peak * frac * sat)
    bytes_moved = in_bytes * (m * k + k * n) + max(in_bytes, BF16) * m * n  # fp8 writes bf16
    return np.maximum(compute_s, bytes_moved / c.gpu.hbm_bw_bytes_per_s) + eff.kernel_overhead_s



@dataclass(frozen=True, slots=True)
class Kernels:
    """What one GPU's kernels of one micro-batch run on: its tokens, the plan's TP sharding, the
    peaks and the achieved HBM bandwidth; :meth:`gemm` times one of its GEMMs."""

    cluster: ClusterSpec
    tokens: np.ndarray  # M, tokens of the micro-batch on this GPU
    tp: np.ndarray
    cp: np.ndarray
    sp: np.ndarray
    pieces: np.ndarray  # rows pieces a TP GEMM runs as under overlapped TP communication
    peak: float
    in_bytes: float  # bytes of a GEMM input element
    act: float  # bytes of an activation element
    hbm: float  # achieved bandwidth of elementwise kernels
    fp8: bool
    cast_bytes: float  # HBM bytes a GEMM input's fp8 cast moves per element
    weight_cast: bool  # each GEMM casts its weight (no cache, no fp8 weights)
    host_op_s: float  # CPU time to issue one operation (:func:`host_op_s`)

    def gemm(self, n: np.ndarray | float, k: np.ndarray | float,
             split: bool = False) -> np.ndarray:
        M, c, eff = self.tokens, self.cluster, self.cluster.gpu.efficiency
        n_arr, k_arr = np.broadcast_to(n, M.shape), np.broadcast_to(k, M.shape)
        if split:
            t = self.pieces * gemm_time(M / self.pieces, n_arr, k_arr, self.peak, c,
                                         self.in_bytes)
        else:
            t = gemm_time(M, n_arr, k_arr, self.peak, c, self.in_bytes)
        if self.fp8:  # quantize the input (Transformer Engine's cast_transpose with its amax
            # reduction, or a compiled cast: cast_bytes), and the weight where weight_cast
            cast = M * k_arr + (k_arr * n_arr if self.weight_cast else 0.0)
            t = t + self.cast_bytes * cast / self.hbm + 2.0 * eff.kernel_overhead_s
        return t

    def unquantized(self) -> Kernels:
        """These kernels outside fp8, at the activations' dtype and the dense peak: the LM head
        under fp8 training. Megatron-Core's output layer is its own ColumnParallelLinear, not a
        Transformer Engine module, which fp8_autocast leaves in bf16 (megatron/core/models/gpt/
        gpt_model.py; an fp8 head is opt-in, MXFP8 only: fp8_output_proj); torchtitan's float8
        converter filters the "output" linear; llm-foundry's MPT ties it to the embedding."""
        if not self.fp8:
            return self
        return replace(self, peak=self.cluster.gpu.peak_flops("bf16"), in_bytes=self.act,
                       fp8=False)

    def layer_gemm(self, g: Gemm, split: bool) -> np.ndarray:
        """One of a layer's weight GEMMs, sharded by TP along the dimension it names."""
        if g.column_parallel:
            return self.gemm(g.n / self.tp, float(g.k), split=split)
        return self.gemm(float(g.n), g.k / self.tp, split=split)


def kernels_of(cluster: ClusterSpec, tr: Training, p: PlanArrays) -> Kernels:
    gpu = cluster.gpu
    tp, cp = p.tp.astype(float), p.cp.astype(float)
    sp = p.sequence_parallel.astype(bool)
    fp8 = tr.precision == "fp8"
    act = tr.framework.numerics.activation_dtype_bytes
    # Overlapping TP communication with the GEMMs (Transformer Engine's userbuffers ring
    # exchange, PyTorch's async TP) runs each TP GEMM as tp pieces of M / tp rows, one per step
    # of the all-gather or reduce-scatter ring: smaller GEMMs, one launch each
    pieces = np.where(sp & (tp > 1) & tr.framework.tp.tp_comm_overlap & (not gpu.synchronous),
                      tp, 1.0)
    num = tr.framework.numerics
    # a stack whose casts are tensor ops fuses them exactly where it fuses its elementwise
    # kernels: under torch.compile (search.inputs.specs.training_spec)
    compiled = num.fp8_cast_compiles and tr.framework.kernels.fused_elementwise
    # Megatron-Core's TE layers cache the weights' fp8 copies after a step's first micro-batch
    # (is_first_microbatch, megatron/core/extensions/transformer_engine.py): paid once a step,
    # not per GEMM; fp8 weights (fp8_param_gather: TE's fp8 parameters, torchao's FSDP float8
    # all-gather) arrive cast, and torchao skips a tensor already in fp8
    # (float8_scaling_utils.py hp_tensor_to_float8_dynamic: tensor_already_casted_to_fp8)
    return Kernels(cluster=cluster, tokens=p.micro_batch * float(tr.seq_len) / cp, tp=tp, cp=cp,
                   sp=sp,
                   pieces=pieces, peak=gpu.peak_flops(tr.precision),
                   in_bytes=1.0 if fp8 else act, act=act,
                   hbm=gpu.hbm_bw_bytes_per_s * gpu.efficiency.memory_bw_fraction, fp8=fp8,
                   cast_bytes=(COMPILED_CAST_BYTES if compiled
                               else gpu.efficiency.fp8_cast_bytes_per_element),
                   weight_cast=not (num.fp8_weight_cache or num.fp8_param_gather),
                   host_op_s=host_op_s(cluster, tr))


def host_op_s(cluster: ClusterSpec, tr: Training) -> float:
    """CPU time to issue one framework operation: the framework's own (its ``host_overhead_s``,
    as on an x86 DGX host) times the host CPU's ``GpuSpec.host_issue_factor``."""
    return tr.framework.kernels.host_overhead_s * cluster.gpu.host_issue_factor



def attention_bwd_factor(tr: Training) -> float:
    """Attention's backward seconds over its forward's: flash attention's 2.5x the FLOPs at
    ``FLASH_BWD_RATE`` of the forward's rate; unfused attention's twice the batched GEMMs and
    the softmax's gradient, 2.5x as the forward runs them."""
    return 2.5 / FLASH_BWD_RATE if tr.framework.attention.flash_attention else 2.5


def fwd_bwd(gemm_s: np.ndarray, wgrad_s: np.ndarray, attention_s: np.ndarray,
            elem_s: np.ndarray, overhead_s: float, kernels: float,
            elem_bwd_s: np.ndarray | None = None, *,
            attention_bwd: float) -> tuple[np.ndarray, np.ndarray]:
    """A layer's forward and backward: backward runs the GEMMs twice (the input gradients as
    the forward runs them, split where TP communication overlaps them; the weight gradients,
    ``wgrad_s``, whole), ``attention_bwd`` times attention's forward seconds
    (:func:`attention_bwd_factor`), the elementwise kernels' backward traffic (``elem_bwd_s``,
    counted kernel by kernel; twice the forward's where not given) and ``BWD_KERNEL_FACTOR``
    times the kernels."""
    fwd = gemm_s + attention_s + elem_s + overhead_s * kernels
    elem_bwd = 2.0 * elem_s if elem_bwd_s is None else elem_bwd_s
    bwd = (gemm_s + wgrad_s + attention_bwd * attention_s + elem_bwd
           + BWD_KERNEL_FACTOR * overhead_s * kernels)
    return fwd, bwd
