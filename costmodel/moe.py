"""The MoE layer's compute on one GPU, as Megatron-Core runs it (megatron/core/transformer/moe/):

* the router (router.py TopKRouter): the gating GEMM of the rank's sequence-parallel tokens by the
  h x E router weight, then softmax, top-k and the load-balancing loss in fp32 over tokens x
  experts (moe_utils.py topk_softmax_with_capacity, switch_load_balancing_loss_func);
* the dispatcher's local copies (token_dispatcher.py, moe_utils.py permute/unpermute): the
  alltoall dispatcher permutes top-k copies of each token before the all-to-all, sorts the
  received chunks by local expert (sort_chunks_by_idxs) when a rank holds several experts, and
  undoes both after the experts (the unpermute weights each copy by its probability and sums
  them); --moe-permute-fusion runs each as one kernel that reads once and writes once. The
  allgather dispatcher permutes the gathered tokens of the whole TP x EP group; the flex
  (DeepEP) dispatcher fuses the send-side permute into its dispatch kernel;
* the routed experts (experts.py TEGroupedMLP, Transformer Engine's GroupedLinear: one GEMM per
  local expert): each expert GEMM is its own roofline at its tokens per expert (m = the
  rank's routed tokens / local experts), so fine-grained experts, whose weights are read every
  micro-batch for few tokens, fall towards the memory bound, and each pays its launch; no
  grouped-GEMM penalty beyond that: the one MoE model measured (Grok-1: 8 experts of width
  32,768) runs expert GEMMs as large as dense ones, so the rows cannot see one (a share of
  the dense GEMM fraction fitted there went to its bound of 1); under fp8 their inputs (top-k
  copies of every token) are quantised like any other GEMM input;
* the busiest EP rank sets the pace: its experts run ``moe_load_imbalance`` times the mean
  tokens (1 under force-balanced routing or capacity padding);
* shared experts (shared_experts.py): a dense MLP on every token, TP-sharded like the dense
  layers;
* experts with biases (gpt-oss): fc2's bias added eagerly, local expert by local expert
  (:func:`expert_bias`);
* the host's wait (:func:`host_syncs`, :func:`sync_stall`): a dropless dispatcher needs the
  token counts on the host to size its buffers and TE GroupedLinear's per-expert splits, and
  waits for them once per MoE layer forward (recomputed forwards too; the backward reuses the
  splits): the GPU drains, then idles while the counts cross to the host and it issues the
  next kernel, and the host cannot run ahead of the post-sync kernels any more;
* the host's issue (:func:`host_segments`): every operation of the layer, counted from the code
  (the constants below), by the segments a CUDA graph scope captures (``costmodel.graphs``).

The dispatch's communication is ``costmodel.parallel.expert``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from costmodel import dispatch
from costmodel.attention import rope_elems as rope_width
from costmodel.graphs import MOE_SEGMENTS, host_ops
from costmodel.kernels import Kernels, attention_bwd_factor, fwd_bwd, gemm_time
from costmodel.mapping import expert_tp
from costmodel.plans import PlanArrays
from costmodel.specs import ModelSpec, Training

if TYPE_CHECKING:
    from costmodel.layer_parts import _DenseLayer

FP32 = 4.0
# fp32 passes over tokens x experts in the router: the logits, softmax (read, write), top-k
# (read), the probabilities and routing map scattered back (write two), the load-balancing
# loss's reductions (read two)
ROUTER_FP32_PASSES = 8.0
# Operations the host issues in one MoE layer forward, as Megatron-Core core_v0.16.0 runs it
# (megatron/core/transformer/moe/); each is a Python-level op or collective, and a library call
# that launches a kernel per expert counts one per expert. Each also launches (at least) one
# kernel on the GPU, which pays ``kernel_overhead_s`` for it.
# transformer_layer.py _forward_mlp: the pre-MLP norm, and the bias-dropout-add after the MoE
PRE_MLP_NORM_OPS, MLP_BDA_OPS = 1.0, 1.0
# router.py TopKRouter.forward: the gating GEMM (moe_utils.py RouterGatingLinearFunction, one
# te_general_gemm); top-k with the softmax score (moe_utils.py topk_routing_with_score_function:
# topk, softmax, type_as, then the probabilities and the routing map scattered into tokens x
# experts: zeros_like, scatter; zeros_like, int, scatter, bool), one fused kernel under
# --moe-router-fusion (TE fused_topk_with_score_function); the load-balancing loss (_apply_aux_loss;
# recipes train with one: compute_routing_scores_for_aux_loss softmax, topk, zeros_like, int,
# scatter, bool; get_tokens_per_expert_and_token_count sum and all-reduce over TP x CP;
# switch_load_balancing_loss_func sum, multiply, sum, scale; MoEAuxLossAutoScaler and the aux-loss
# tracker's add), fused: TE's score and loss kernels in place of those two groups of four and six
ROUTER_GATING_OPS = 1.0
TOPK_OPS, FUSED_TOPK_OPS = 9.0, 1.0
AUX_LOSS_OPS, FUSED_AUX_LOSS_OPS = 14.0, 6.0
# token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess with EP or TP, dropless: tokens per
# expert (sum), the input splits (reshape, sum), the counts all-gathered over TP x EP, this
# rank's experts' slice (contiguous), the per-rank and per-TP-rank sums and the local experts'
# sum (the sum alone on one rank); padded to capacity, two torch.full of the capacity. The other
# dispatchers (allgather, flex) are taken to issue as many.
COUNT_OPS, PADDED_COUNT_OPS = 7.0, 2.0
# moe_utils.py permute (with probabilities): the routing map transposed (bool, T.contiguous),
# token indices (arange, expand), masked_select of them and of the transposed probabilities
# (T.contiguous, masked_select), index_select of the tokens; unpermute: the probabilities
# masked-selected through the transposed map (two T.contiguous, masked_select), the tokens
# weighted (multiply, cast), scattered into a zeroed output (zeros, scatter_add). Fused
# (--moe-permute-fusion, TE's moe_permute_with_probs / moe_unpermute): one call each
PERMUTE_OPS, UNPERMUTE_OPS, FUSED_PERMUTE_OPS = 7.0, 7.0, 1.0
# sort_chunks_by_idxs, with several local experts under EP or expert TP: the received tokens and
# probabilities split into chunks and concatenated by local expert (split, cat, twice), the
# experts' output back (split, cat); fused: one call each way
SORT_OPS, FUSED_SORT_OPS = 6.0, 2.0
# the dropless dispatcher's device-to-host copies on its side stream
# (_maybe_dtoh_and_synchronize: tokens per expert, the input, output and TP splits, the output
# size, the per-local-expert counts) and its event's record and wait
DTOH_OPS = 7.0
# the dispatch's all-to-alls (tokens, probabilities; token_dispatch) and the combine's
# (token_combine); under expert TP an all-gather of tokens and probabilities and a reduce-scatter
A2A_OPS, EXPERT_TP_COLLECTIVES = 3.0, 3.0
# experts.py TEGroupedMLP.forward: fc1 and fc2 are Transformer Engine GroupedLinear modules
# (transformer_engine/pytorch/module/grouped_linear.py _GroupedLinear.forward, v2.8: the input
# split by expert, general_grouped_gemm launching one GEMM per expert and, under fp8,
# tex.split_quantize quantising each expert's split), between them the activation weighted by
# the probabilities (weighted_bias_swiglu_impl) and, under fp8, the tokens and probabilities
# padded per expert and unpadded (quantization_padding)
GEMMS_PER_EXPERT, EXPERT_FIXED_OPS, FP8_PADDING_OPS = 2.0, 3.0, 3.0
# experts.py TEGroupedMLP with biases (add_bias_linear; core_v0.15.0 to core_v0.17.1): fc1 adds its
# bias in its grouped GEMM (skip_bias_add False; Transformer Engine's GroupedLinear folds the
# bias gradient into the weight-gradient GEMM), fc2 returns its bias (skip_bias_add True) for
# _apply_bias to add eagerly: the output split by expert and by expert each bias scaled by every
# copy's probability and added (torch.split twice, then b * p and t + b * p per local expert),
# then concatenated (torch.cat). HBM passes over the routed copies (width h), forward: the
# product written, the sum's two reads and its write, the cat's read and write; backward: the
# product's two gradients (the gradient times p, reduced over tokens for the bias; times b,
# reduced over h for the probability: read, write, read each) and the split's gradient
# concatenated (read, write)
BIAS_FWD_PASSES, BIAS_BWD_PASSES = 6.0, 8.0
# operations a local expert, and besides: forward the two splits and the cat, backward the
# splits' two cats
BIAS_FWD_OPS_PER_EXPERT, BIAS_BWD_OPS_PER_EXPERT = 2.0, 4.0
BIAS_FWD_FIXED_OPS, BIAS_BWD_FIXED_OPS = 3.0, 2.0
# shared_experts.py SharedExpertMLP: fc1, activation, fc2, and the add to the routed output
SHARED_EXPERT_OPS = 4.0
# a clamped gated activation (ModelSpec.swiglu_limit, gpt-oss's) as TEGroupedMLP runs it under
# bias_activation_fusion (fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl,
# core_v0.15.0 to core_v0.17.1): the gate half clamped from above and the linear half from both
# sides, two eager ops, and the halves concatenated again (torch.cat) before the compiled
# activation: a read and a write of f per clamp and of 2f for the cat, 8 elements per element of
# the expert width, each top-k copy; then the activation's linear offset made a device tensor
# from a host scalar (torch.tensor(linear_offset, device=...)), a blocking host-to-device copy,
# which PyTorch completes with a stream synchronisation (aten/src/ATen/native/cuda/Copy.cu,
# copy_kernel_cuda: memcpy_and_sync): the GPU drains once more per MoE layer forward
GLU_CLAMP_ELEMS_PER_F = 8.0
GLU_CLAMP_OPS = 4.0  # the two clamps, the cat and the offset's copy
# a few bytes of token counts copied device-to-host on a side stream and the host woken by
# its event (cudaMemcpyAsync + cudaEventSynchronize over PCIe): a prior, not fitted
D2H_SYNC_S = 10e-6


@dataclass(frozen=True, slots=True)
class MoeLayer:
    routed_s: np.ndarray  # the routed experts' GEMMs (and their fp8 casts)
    permute_s: np.ndarray  # the dispatcher's local copies
    router_s: np.ndarray
    shared_s: np.ndarray  # the shared experts' GEMMs
    experts_fwd_s: np.ndarray  # the routed experts' GEMMs and activation function, forward
    elem_s: np.ndarray
    kernels: np.ndarray  # kernels the GPU launches, relative to a dense layer
    host_ops: np.ndarray  # operations the host issues per forward (graph launches for captures)
    fwd_s: np.ndarray
    bwd_s: np.ndarray


def tokens_per_expert(model: ModelSpec, p: PlanArrays, kn: Kernels) -> np.ndarray:
    """Routed tokens one local expert processes per micro-batch, on average: a rank's experts
    take the routed copies of all M tokens of its TP group (gathered over the expert-TP ranks)
    with 1/tp of each expert when the experts are tensor-parallel (expert TP = tp), or of its
    own M / tp sequence shard with whole experts when EP folds over the TP ranks."""
    own = expert_tp(p).astype(float) / kn.tp
    return kn.tokens * own * model.moe_topk * p.ep / model.moe_experts


def glu_clamp_ops(model: ModelSpec) -> float:
    """Operations a clamped activation adds to each run of the experts' activation
    (:data:`GLU_CLAMP_OPS`; 0 unclamped)."""
    return GLU_CLAMP_OPS if model.swiglu_limit else 0.0


def expert_act_elems(model: ModelSpec, tr: Training, act_elems: float) -> float:
    """Forward HBM elements per token of the routed experts' activation function (a dense MLP's:
    ``act_elems`` at width ffn_hidden) on the busiest rank's top-k copies at the expert width,
    with a clamped activation's eager clamps and cat (:data:`GLU_CLAMP_ELEMS_PER_F`)."""
    per_f = act_elems / model.ffn_hidden + (GLU_CLAMP_ELEMS_PER_F if model.swiglu_limit else 0.0)
    return model.moe_topk * tr.framework.moe.moe_load_imbalance * per_f * model.expert_ffn_hidden


def grouped_expert_time(model: ModelSpec, tr: Training, p: PlanArrays,
                        kn: Kernels) -> np.ndarray:
    """The busiest rank's routed-expert GEMMs of one forward: per local expert its up (gate)
    and down projection at m tokens, each its own roofline (weights read whatever m is), and
    under fp8 the quantisation of their inputs."""
    h, fe = float(model.hidden), float(model.expert_ffn_hidden)
    etp = expert_tp(p).astype(float)
    n_up = 2.0 * fe if model.ffn_type == "swiglu" else fe
    m = np.maximum(tokens_per_expert(model, p, kn) * tr.framework.moe.moe_load_imbalance, 1.0)
    h_arr = np.broadcast_to(h, m.shape)
    one = (gemm_time(m, n_up / etp, h_arr, kn.peak, kn.cluster, kn.in_bytes)
           + gemm_time(m, h_arr, fe / etp, kn.peak, kn.cluster, kn.in_bytes))
    if kn.fp8:  # each GEMM input quantised (both projections), the weights' where not cached
        cast = m * (h + fe / etp) + (h * (n_up + fe) / etp if kn.weight_cast else 0.0)
        one = (one + kn.cast_bytes * cast / kn.hbm
               + 2.0 * kn.cluster.gpu.efficiency.kernel_overhead_s)
    return one * model.moe_experts / p.ep


def expert_bias_ops(model: ModelSpec, p: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """Operations of fc2's bias add (_apply_bias), forward and backward; 0 without biases."""
    local = model.moe_experts / np.asarray(p.ep, dtype=float)
    on = 1.0 if model.bias == "all" else 0.0
    return (on * (BIAS_FWD_OPS_PER_EXPERT * local + BIAS_FWD_FIXED_OPS),
            on * (BIAS_BWD_OPS_PER_EXPERT * local + BIAS_BWD_FIXED_OPS))


def expert_bias(model: ModelSpec, tr: Training, p: PlanArrays,
                kn: Kernels) -> tuple[np.ndarray, np.ndarray]:
    """fc2's bias as _apply_bias adds it to the busiest rank's routed copies: its forward and
    backward seconds, HBM passes and launches (0 where the experts have no biases)."""
    on = 1.0 if model.bias == "all" else 0.0
    copies = (tokens_per_expert(model, p, kn) * tr.framework.moe.moe_load_imbalance
              * model.moe_experts / p.ep)
    pass_s = on * copies * model.hidden * kn.act / kn.hbm
    launch = kn.cluster.gpu.efficiency.kernel_overhead_s
    fwd_ops, bwd_ops = expert_bias_ops(model, p)
    return BIAS_FWD_PASSES * pass_s + fwd_ops * launch, BIAS_BWD_PASSES * pass_s + bwd_ops * launch


def router_ops(tr: Training) -> float:
    """Operations of the router's forward: gating, top-k and the load-balancing loss."""
    if tr.framework.moe.moe_router_fusion:
        return ROUTER_GATING_OPS + FUSED_TOPK_OPS + FUSED_AUX_LOSS_OPS
    return ROUTER_GATING_OPS + TOPK_OPS + AUX_LOSS_OPS


def router_time(model: ModelSpec, tr: Training, kn: Kernels) -> np.ndarray:
    """The gating GEMM on the rank's M / tp sequence-parallel tokens and the fp32 routing."""
    E, h = float(model.moe_experts), float(model.hidden)
    rows = kn.tokens / kn.tp
    eff = kn.cluster.gpu.efficiency
    gate = gemm_time(rows, np.broadcast_to(E, rows.shape), np.broadcast_to(h, rows.shape),
                     kn.peak, kn.cluster, max(kn.in_bytes, 2.0))  # the router stays bf16
    return (gate + ROUTER_FP32_PASSES * rows * E * FP32 / kn.hbm
            + (router_ops(tr) - 1.0) * eff.kernel_overhead_s)


def permute_elements(model: ModelSpec, tr: Training, p: PlanArrays,
                     kn: Kernels) -> np.ndarray:
    """HBM elements (of width h) the dispatcher's local copies move per token of the micro-batch,
    forward: send-side permute and unpermute over the rank's M / tp tokens, the expert side's
    chunk sort over the copies it received."""
    k = float(model.moe_topk)
    etp = expert_tp(p).astype(float)
    recv = etp * k * tr.framework.moe.moe_load_imbalance  # received copies, per dispatched token
    local = model.moe_experts / p.ep
    sort = np.where((local > 1) & (p.ep * etp > 1), 4.0 * recv, 0.0)  # sort and unsort, r+w
    if tr.framework.moe.moe_permute_fusion:  # read each token once, write its k copies; back
        alltoall = 2.0 * (1.0 + k) + sort
    else:  # index_select (read and write k copies); unpermute: weight by probability (read and
        # write k copies), scatter-add into a zeroed output (read k, write 1, zero 1)
        alltoall = 2.0 * k + (3.0 * k + 2.0) + sort
    d = dispatch.dispatcher(tr, p)
    # allgather: permute the gathered TP x EP tokens, and back; flex: the dispatch kernel
    # writes the received copies in place
    return np.where(d == dispatch.ALLGATHER, 2.0 * (etp * p.ep + recv),
                    np.where(d == dispatch.FLEX, 4.0 * recv, alltoall))


def host_syncs(tr: Training, p: PlanArrays) -> np.ndarray:
    """Device-to-host waits per MoE layer forward. Megatron-Core's alltoall dispatcher copies
    the splits and tokens per expert to the host and waits before the all-to-all
    (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess, cuda_sync_point
    "before_ep_alltoall" or, with EP 1, "before_finish") except with drop_and_pad, whose counts
    are the capacity; the allgather dispatcher moves tokens_per_expert with ``.cpu()``; DeepEP's
    dispatch waits on the host for the received counts (fused_a2a.py FusedDispatch: "the CPU
    will wait for GPU's signal"), HybridEP too unless given num_permuted_tokens (the padded
    capacity). Padding is taken to make flex HybridEP's."""
    padded = tr.framework.moe.moe_pad_to_capacity
    return np.where(padded & (dispatch.dispatcher(tr, p) != dispatch.ALLGATHER), 0.0, 1.0)


def sort_ops(model: ModelSpec, tr: Training, p: PlanArrays) -> np.ndarray:
    """The chunk sort and unsort of a rank holding several experts under EP or expert TP."""
    spread = (model.moe_experts / p.ep > 1) & (p.ep * expert_tp(p) > 1)
    return np.where(spread, FUSED_SORT_OPS if tr.framework.moe.moe_permute_fusion else SORT_OPS,
                    0.0)


def host_segments(model: ModelSpec, tr: Training, p: PlanArrays, kn: Kernels,
                  attn_ops: float) -> dict[str, np.ndarray]:
    """Operations of one MoE layer forward by the segments a CUDA graph scope captures
    (costmodel.graphs.MOE_SEGMENTS): attention; the router (with the pre-MLP norm and the shared
    experts unless they overlap the dispatch); the dispatcher's preprocess (counts, the first
    permute); the eager middle (device-to-host copies, the collectives, the chunk sort, the
    experts' grouped GEMMs); the unpermute and bias-dropout-add after the combine."""
    fused, fp8 = tr.framework.moe.moe_permute_fusion, kn.fp8
    local = model.moe_experts / p.ep
    etp = expert_tp(p).astype(float)
    shared = SHARED_EXPERT_OPS if model.moe_shared_experts else 0.0
    counts = (PADDED_COUNT_OPS if tr.framework.moe.moe_pad_to_capacity
              else np.where(p.ep * etp > 1, COUNT_OPS, 1.0))
    sort = sort_ops(model, tr, p)
    experts = (GEMMS_PER_EXPERT * local + EXPERT_FIXED_OPS
               + (GEMMS_PER_EXPERT * local + FP8_PADDING_OPS if fp8 else 0.0)
               + expert_bias_ops(model, p)[0] + glu_clamp_ops(model))
    middle = (host_syncs(tr, p) * DTOH_OPS + np.where(p.ep > 1, A2A_OPS, 0.0)
              + np.where(etp > 1, EXPERT_TP_COLLECTIVES, 0.0) + sort + experts
              + (shared if tr.framework.moe.moe_shared_expert_overlap else 0.0))
    ones = np.ones_like(kn.tokens)
    return {"attn": attn_ops * ones,
            "router": (PRE_MLP_NORM_OPS + router_ops(tr)
                       + (0.0 if tr.framework.moe.moe_shared_expert_overlap else shared)) * ones,
            "preprocess": (counts + (FUSED_PERMUTE_OPS if fused else PERMUTE_OPS)) * ones,
            "experts": middle * ones,
            "postprocess": ((FUSED_PERMUTE_OPS if fused else UNPERMUTE_OPS) + MLP_BDA_OPS) * ones}


def sync_stall(model: ModelSpec, tr: Training, p: PlanArrays, kn: Kernels, routed_s: np.ndarray,
               permute_s: np.ndarray, segments: dict[str, np.ndarray]) -> np.ndarray:
    """GPU idle time per MoE layer forward from the host's waits: the count's round trip and
    the host's issue of the first kernel after it, then what the host's issue of the rest of the
    layer's MoE operations (the collectives, the sort, the expert GEMMs, the unpermute; eager in
    every graph scope that leaves a sync) exceeds their GPU time; the transfers' own time, which
    also lets the host catch up, is left out. A clamped activation's copy
    (:data:`GLU_CLAMP_OPS`) waits once more: a round trip and the next kernel's issue."""
    syncs = host_syncs(tr, p)
    after = segments["experts"] - syncs * DTOH_OPS + segments["postprocess"]
    host_post = after * kn.host_op_s
    gpu_post = routed_s + permute_s / 2.0
    wait = D2H_SYNC_S + kn.host_op_s
    return (syncs * (wait + np.maximum(host_post - gpu_post, 0.0))
            + (wait if model.swiglu_limit else 0.0))


def moe_layer(model: ModelSpec, tr: Training, p: PlanArrays, kn: Kernels,
              dense: _DenseLayer) -> MoeLayer:
    h, fe = model.hidden, model.expert_ffn_hidden
    tp, elem, eff = kn.tp, dense.elem, kn.cluster.gpu.efficiency
    n_up_e = 2.0 * fe if model.ffn_type == "swiglu" else float(fe)
    routed = grouped_expert_time(model, tr, p, kn)
    bias_fwd, bias_bwd = expert_bias(model, tr, p, kn)
    shared = model.moe_shared_experts * (kn.gemm(n_up_e / tp, float(h))
                                         + kn.gemm(float(h), fe / tp))
    router = router_time(model, tr, kn)
    segments = host_segments(model, tr, p, kn, elem.attn_kernels_fwd)
    copies = sort_ops(model, tr, p) + (2.0 * FUSED_PERMUTE_OPS
                                       if tr.framework.moe.moe_permute_fusion
                                       else PERMUTE_OPS + UNPERMUTE_OPS)
    permute = (kn.tokens / tp * permute_elements(model, tr, p, kn) * h * kn.act / kn.hbm
               + copies * eff.kernel_overhead_s)
    moe_s = routed + shared + router + permute
    gemm_s = dense.qkv_s + dense.out_s + moe_s
    # the experts' activation function runs on the top-k copies (the busiest rank's), at the
    # expert width
    expert_act = expert_act_elems(model, tr, elem.act_elems)
    per_elem_s = kn.tokens * kn.act / kn.hbm
    elem_s = per_elem_s * (elem.replicated + (elem.rope_elems * rope_width(model) + expert_act)
                           / tp)
    # the GPU's launch costs of the router, copies and expert GEMMs are in their times; the
    # GPU launches a kernel for every operation whether a graph holds it or not, the host issues
    # the operations no graph holds (costmodel.graphs)
    eager = sum(segments.values())
    kernels = np.broadcast_to(eager / elem.kernels_fwd, kn.tokens.shape).astype(float)
    issued = host_ops(segments, MOE_SEGMENTS, tr.framework.kernels.cuda_graph_impl,
                      tr.framework.kernels.cuda_graph_scope)
    # the experts' GEMMs are not split for TP overlap: their weight gradients cost as forward
    fwd, bwd = fwd_bwd(gemm_s, dense.wgrad_attn_s + moe_s, dense.attention_s, elem_s,
                       elem.overhead_fwd_s, 1.0, attention_bwd=attention_bwd_factor(tr))
    fwd = fwd + bias_fwd + sync_stall(model, tr, p, kn, routed + bias_fwd, permute, segments)
    bwd = bwd + bias_bwd
    return MoeLayer(routed_s=routed, permute_s=permute, router_s=router,
                    shared_s=np.broadcast_to(shared, kn.tokens.shape).astype(float),
                    experts_fwd_s=routed + per_elem_s * expert_act / tp + bias_fwd,
                    elem_s=elem_s, kernels=kernels,
                    host_ops=np.broadcast_to(issued, kn.tokens.shape).astype(float),
                    fwd_s=fwd, bwd_s=bwd)
