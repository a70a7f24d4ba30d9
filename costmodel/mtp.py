"""Multi-token prediction (DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report", sec. 2.2: D
sequential modules, each predicting one more future token), as Megatron-Core runs it
(megatron/core/transformer/multi_token_prediction.py, ``MultiTokenPredictionLayer``).

Each of the ``mtp_layers`` depths, per micro-batch: the embedding of the tokens shifted by one
(``_get_embeddings``: roll_tensor, then the model's own vocabulary-parallel embedding), RMSNorms of
that embedding and of the previous depth's hidden states (``enorm``, ``hnorm``), their concatenation
through ``eh_proj`` (a column-parallel 2h -> h GEMM whose output is gathered over TP and scattered
back to the sequence shards, ``_concat_embeddings``), one transformer layer of the decoder's last
layer's spec (gpt_layer_specs.py ``get_gpt_mtp_block_spec_for_backend``: ``layer_specs[-1]``,
so a MoE layer with its EP dispatch in DeepSeek-V3), its ``final_layernorm``, and the shared
output head and loss again (``process_mtp_loss``: ``output_layer`` then
``compute_language_model_loss`` per depth). Without an explicit layout every depth sits in the
last pipeline stage's last virtual chunk (``mtp_on_this_rank``, ``get_mtp_num_layers_to_build``),
and a layout may place them only there (pipeline_parallel_layer_layout.py
``validate_layer_layout``). Under ``--recompute-granularity full`` the whole module is
checkpointed whatever ``--recompute-num-layers`` says (``MultiTokenPredictionLayer.forward``).

The last stage holds the module's weights and, when it is not the first stage, its own copy of
the word embeddings (gpt_model.py builds ``LanguageModelEmbedding`` where ``pre_process or
mtp_process``; language_module.py ``setup_embeddings_and_output_layer`` keeps it in sync with the
first stage's), besides the output layer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from costmodel.compute import (
    EAGER_NORM_ELEMS,
    FUSED_NORM_BWD_ELEMS,
    LayerTimes,
)
from costmodel.kernels import BWD_HOST_FACTOR, host_op_s, kernels_of
from costmodel.mapping import expert_tp
from costmodel.params import attention_params, dense_mlp_params, embedding_params, expert_params
from costmodel.plan_fields import RECOMPUTE_CODES
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec, Training

if TYPE_CHECKING:
    from costmodel.parallel.context import ContextComm
    from costmodel.parallel.expert import ExpertComm
    from costmodel.parallel.tensor import TensorComm

# kernels of a depth's own forward: the embedding lookup, enorm, hnorm, concat, eh_proj (and its
# fp8 cast), the output gather, final_layernorm, the concatenation of the depths' outputs
BLOCK_KERNELS_FWD = 8.0
# bf16 elements per token and sequence shard a depth keeps for backward outside its layer: the
# enorm and hnorm inputs (h each), eh_proj's input (2h) and final_layernorm's input (h)
BLOCK_SAVED_ELEMS = 5.0


def mtp_layer_is_moe(model: ModelSpec) -> bool:
    """The MTP layer is the decoder's last layer's kind (``ModelSpec.moe_pattern``)."""
    return model.moe_pattern[-1]


def mtp_params(model: ModelSpec, p: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """Local (dense, routed-expert) parameters of all depths on the last stage: each depth's
    layer, sharded like a decoder layer (experts by EP and expert TP), eh_proj (2h x h / tp), its
    three norms; and the word-embedding copy (vocab / tp x h) the stage adds when pp > 1."""
    D, h = model.mtp_layers, model.hidden
    tp = p.tp.astype(float)
    dense = attention_params(model) / tp + 2.0 * h
    if mtp_layer_is_moe(model):
        dense = dense + (model.moe_shared_experts * expert_params(model) / tp
                         + h * model.moe_experts)
        experts = model.moe_experts / p.ep * expert_params(model) / expert_tp(p)
    else:
        dense = dense + dense_mlp_params(model) / tp
        experts = np.zeros_like(tp)
    dense = D * (dense + 2.0 * h * h / tp + 3.0 * h)
    embed = np.where((p.pp > 1) & (D > 0), embedding_params(model) / tp, 0.0)
    return dense + embed, D * experts


def block_saved_bytes(model: ModelSpec, tr: Training, p: PlanArrays) -> np.ndarray:
    """Bytes one depth keeps for backward beyond its transformer layer, one micro-batch: what
    ``BLOCK_SAVED_ELEMS`` counts (under full recompute: the checkpoint's two inputs, the
    hidden states and the shifted embedding)."""
    M = p.micro_batch * tr.seq_len / p.cp
    shard = np.where(p.sequence_parallel > 0, p.tp, 1).astype(float)
    elems = np.where(p.recompute == 2, 2.0, BLOCK_SAVED_ELEMS)
    return elems * M * model.hidden / shard * tr.framework.numerics.activation_dtype_bytes


def _block_kernels(model: ModelSpec, cluster: ClusterSpec, tr: Training,
                   p: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """One depth's own kernels, forward and backward, one micro-batch: memory-bound passes per
    token (the lookup writes h per TP rank before its reduce, its backward scatter-adds h; each
    norm as the layers' norms; the concat reads and writes 2h, the output concat h twice) and
    eh_proj (forward, input gradient split like a layer's TP GEMMs; weight gradient whole)."""
    kn = kernels_of(cluster, tr, p)
    h = float(model.hidden)
    shard = np.where(kn.sp, kn.tp, 1.0)
    norm, norm_bwd = ((2.0, FUSED_NORM_BWD_ELEMS) if tr.framework.kernels.fused_elementwise
                      else (EAGER_NORM_ELEMS, 2.0 * EAGER_NORM_ELEMS))
    fwd_elems = h + (3.0 * norm + 4.0 + 2.0) * h / shard
    bwd_elems = 2.0 * h + 3.0 * norm_bwd * h / shard
    per_elem_s = kn.tokens * kn.act / kn.hbm
    proj = kn.gemm(h / kn.tp, 2.0 * h, split=True)
    wgrad = kn.gemm(h / kn.tp, 2.0 * h)
    launch = BLOCK_KERNELS_FWD * cluster.gpu.efficiency.kernel_overhead_s
    fwd = per_elem_s * fwd_elems + proj + launch
    bwd = per_elem_s * bwd_elems + proj + wgrad + 2.0 * launch
    return fwd, bwd


@dataclass(frozen=True, slots=True)
class MtpStage:
    """What all depths add to one micro-batch of the stage that holds them (the last)."""

    compute_s: np.ndarray  # kernels: the block, its layer and the head with the loss
    comm_s: np.ndarray  # exposed: the layer's TP / CP / EP, eh_proj's and the vocabulary's TP
    recompute_s: np.ndarray  # the share of ``compute_s`` that re-runs
    host_s: np.ndarray  # host time to issue its kernels and collectives


def no_mtp(like: np.ndarray) -> MtpStage:
    """A stage without multi-token prediction: nothing added."""
    zero = np.zeros_like(like)
    return MtpStage(compute_s=zero, comm_s=zero, recompute_s=zero, host_s=zero)


def mtp_stage(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays,
              lt: LayerTimes, tensor: TensorComm, context: ContextComm,
              expert: ExpertComm) -> MtpStage:
    """Per depth: the block's kernels, the layer forward and backward (the selective extra, or
    under full recompute the block and the layer forward again), the head and loss; the
    layer's exposed communication as a decoder layer's, the embedding's and the head's
    vocabulary-parallel collectives, and eh_proj's: its input gathered over the sequence shards
    (2h) and its output over TP (h), both mirrored in backward (three embedding-sized sides)."""
    D = float(model.mtp_layers)
    if not D:
        return no_mtp(lt.head_fwd_s)
    moe = mtp_layer_is_moe(model)
    fwd_l, bwd_l = (lt.fwd_moe_s, lt.bwd_moe_s) if moe else (lt.fwd_dense_s, lt.bwd_dense_s)
    selective_l = lt.selective_extra_moe_s if moe else lt.selective_extra_s
    block_fwd, block_bwd = _block_kernels(model, cluster, tr, p)
    full = p.recompute == RECOMPUTE_CODES["full"]
    selective = p.recompute == RECOMPUTE_CODES["selective"]
    recompute = np.where(full, block_fwd + fwd_l, np.where(selective, selective_l, 0.0))
    compute = block_fwd + block_bwd + fwd_l + bwd_l + lt.head_fwd_s + lt.head_bwd_s + recompute
    comm_fwd = tensor.layer_exposed_s + context.exposed_fwd_s
    comm_bwd = tensor.layer_exposed_bwd_s + context.exposed_bwd_s
    if moe:
        comm_fwd, comm_bwd = comm_fwd + expert.exposed_fwd_s, comm_bwd + expert.exposed_bwd_s
    vocab = 4.0 * tensor.vocab_side_s + tensor.vocab_s["last"]
    comm = comm_fwd + comm_bwd + np.where(full, comm_fwd, 0.0) + vocab
    host_layer = (lt.host_fwd_moe_s if moe else lt.host_fwd_dense_s) + tensor.host_fwd_s
    host_fwd = host_layer + BLOCK_KERNELS_FWD * host_op_s(cluster, tr)
    selective_host = lt.selective_host_moe_s if moe else lt.selective_host_dense_s
    host = host_fwd * (1.0 + BWD_HOST_FACTOR + full) + np.where(selective, selective_host, 0.0)
    return MtpStage(compute_s=D * compute, comm_s=D * comm, recompute_s=D * recompute,
                    host_s=D * host)
