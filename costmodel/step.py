"""One training step, vectorised over plans, as the sum the three challenges make of it: each
stage's memory, then compute + exposed communication (TP/SP, CP and EP per layer, the pipeline's
point-to-point and shared embedding, data parallel by ZeRO stage) + the pipeline bubble + the
optimizer step, plus the allocator's stalls near capacity (the core of ``estimate``).

Each concern is one function in the module that owns it, called once from :func:`evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.comm import CollectiveArrays, contention_time
from costmodel.compute import hardware_flops, layer_times
from costmodel.mapping import STAGES, StageLayers, head_balance, stage_layers
from costmodel.memory import MemoryCoefficients, StageBytes, allocator_stall, step_memory
from costmodel.mtp import mtp_stage
from costmodel.offload import host_bytes, network_busy_s, offload_copies
from costmodel.optimizer import grad_accumulation_time, optimizer_time
from costmodel.parallel.context import ContextComm, context_parallel
from costmodel.parallel.data import data_parallel
from costmodel.parallel.expert import ExpertComm, expert_parallel
from costmodel.parallel.mesh import Mesh, mesh_of
from costmodel.parallel.tensor import TensorComm, tensor_parallel
from costmodel.params import model_flops_per_token
from costmodel.pipeline import (
    bubble_time,
    logits_hops,
    point_to_point,
    shared_embedding_sync,
    stage_times,
)
from costmodel.placement import Placement
from costmodel.plans import PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec, Training


@dataclass(frozen=True, slots=True)
class StepArrays:
    stages: dict[str, StageBytes]
    stage_layers: dict[str, np.ndarray]
    # one micro-batch through each stage: kernels, exposed communication (costmodel.pipeline)
    stage_compute_s: dict[str, np.ndarray]
    stage_comm_s: dict[str, np.ndarray]
    usable_bytes: float
    model_flops: np.ndarray
    causal_flops_share: float  # model FLOPs with causal attention over the convention's
    hardware_flops: np.ndarray
    compute_s: np.ndarray
    recompute_s: np.ndarray
    contention_s: np.ndarray  # what hidden communication slows the compute by
    stall_s: np.ndarray  # the caching allocator's expected free-and-retry near capacity
    host_bytes: np.ndarray  # activations offloaded to pinned host memory (costmodel.offload)
    optimizer_s: np.ndarray
    bubble_s: np.ndarray
    gemm_efficiency: np.ndarray
    collectives: tuple[CollectiveArrays, ...]
    step_time_s: np.ndarray
    tokens_per_step: int
    num_gpus: int
    placement: Placement

    @property
    def peak_stage(self) -> np.ndarray:
        """Index into STAGES of the stage with the most bytes."""
        totals = np.stack([self.stages[s].total for s in STAGES])
        return np.argmax(totals, axis=0)

    def peak_part(self, part: str) -> np.ndarray:
        vals = np.stack([getattr(self.stages[s], part) for s in STAGES])
        return np.take_along_axis(vals, self.peak_stage[None, :], axis=0)[0]


def nic_busy_of(g: Mesh, layers: StageLayers, tensor: TensorComm,
                context: ContextComm, expert: ExpertComm, p2p: CollectiveArrays
                ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds each GPU's NIC streams the other groups' traffic during one micro-batch's
    forward and backward of the largest stage: the per-layer TP, CP and EP collectives of the
    groups that cross the network (what of them is on the critical path: the overlapped
    rest stays inside the NVLink domain in practice) and the pipeline's one send and receive
    where a hop leaves the domain."""
    n = layers.largest
    on = {name: (g.placement.span(name).crosses_network).astype(float)
          for name in ("tp", "cp", "ep")}
    hop = np.where(g.pp_crosses_network & (g.pp > 1),
                   p2p.time_s / np.maximum(2.0 * g.micro_batches * g.vpp, 1.0), 0.0)
    fwd = n * (on["tp"] * tensor.layer_exposed_s + on["cp"] * context.exposed_fwd_s
               + on["ep"] * expert.average_layer_s) + hop
    bwd = n * (on["tp"] * tensor.layer_exposed_bwd_s + on["cp"] * context.exposed_bwd_s
               + on["ep"] * expert.average_bwd_s) + hop
    return fwd, bwd


def plan_memory(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays
                ) -> tuple[Mesh, StageLayers, MemoryCoefficients, dict[str, StageBytes]]:
    """The plans' mesh, stage split, memory coefficients and every stage's peak bytes: the
    memory side of :func:`evaluate`, which prices no time."""
    g = mesh_of(cluster, tr, p)
    balance = head_balance(model) if tr.framework.pp.pp_cost_balance else None
    layers = stage_layers(model.layers, p, balance)
    co, stages = step_memory(model, cluster, tr, p, layers, g.micro_batches)
    return g, layers, co, stages


def evaluate(model: ModelSpec, cluster: ClusterSpec, tr: Training, p: PlanArrays) -> StepArrays:
    """step = m x (slowest stage's compute + exposed TP/CP/EP communication per micro-batch)
    + bubble + exposed pipeline p2p + exposed data-parallel traffic + optimizer, the compute
    that hidden communication slows (its kernels hold SMs), and the allocator's stalls."""
    g, layers, co, stages = plan_memory(model, cluster, tr, p)
    m = g.micro_batches
    lt = layer_times(model, cluster, tr, p)

    tensor = tensor_parallel(model, cluster, tr, g, lt)
    context = context_parallel(model, tr, g, lt)
    expert = expert_parallel(model, cluster, tr, g, lt)
    # per layer, what of their communication stays on one micro-batch's critical path
    comm_fwd = tensor.layer_exposed_s + context.exposed_fwd_s + expert.average_layer_s
    comm_bwd = tensor.layer_exposed_bwd_s + context.exposed_bwd_s + expert.average_bwd_s
    mtp = mtp_stage(model, cluster, tr, p, lt, tensor, context, expert)
    per_mb = stage_times(p, layers, lt, comm_fwd, comm_bwd, lt.host_fwd_s + tensor.host_fwd_s,
                         tensor.vocab_s, g.synchronous, mtp, logits_hops(model, tr, g, layers))
    bubble = bubble_time(per_mb, g, layers)
    p2p = point_to_point(model, tr, g, layers, lt)
    tied = shared_embedding_sync(model, tr, g, co.embed_params)
    grads, params = data_parallel(tr, g, co, layers, lt,
                                  nic_busy_of(g, layers, tensor, context, expert, p2p))
    optimizer_s = (optimizer_time(co, layers, p, cluster, tr)
                   + grad_accumulation_time(co, layers, m, p, cluster, tr))

    compute_s = m * per_mb.at_slowest(per_mb.compute_s)
    step = (compute_s + m * per_mb.at_slowest(per_mb.comm_s) + bubble + p2p.exposed_s
            + sum(c.exposed_s for c in (*grads, *params, tied)) + optimizer_s)
    tp_collectives = tensor.collectives(g, model.layers, per_mb.at_slowest(tensor.vocab_s),
                                        per_mb.at_slowest(tensor.vocab_sides))
    ep = expert.collective(g, model.layers)
    nccl = (context.collective(g, model.layers), ep, p2p, tied, *grads, *params)
    # activation offloading's copies, on a host link the NIC's traffic may share for the step
    offload = offload_copies(cluster, co, p, lt, m, network_busy_s(nccl, tp_collectives), step)
    step = step + offload.exposed_s
    collectives = (*tp_collectives, *nccl, offload)  # offload's copy engines hold no SMs
    # hidden NCCL traffic slows the kernels it runs beside (counted as compute). Not TP's:
    # overlapped, it moves through Transformer Engine's userbuffers or PyTorch's symmetric
    # memory by copy engine (ring exchange at num_sm=1 in Megatron-Bridge's
    # TransformerLayerTPOverlapCfg), and unoverlapped it hides behind nothing. Nor EP's: its
    # exposed time holds what its kernels cost the compute of each window it hides in
    # (costmodel.parallel.expert.lapped)
    contention = (0.0 * step if g.synchronous else contention_time(
        tuple(c for c in nccl if c is not ep), compute_s, cluster.gpu.efficiency.comm_sm_share))
    step = step + contention
    stall = allocator_stall(step, stages, cluster, tr)  # the stream waits: counted as compute
    compute_s = compute_s + contention + stall
    step = step + stall

    tokens, n_gpus = tr.tokens_per_step, cluster.num_gpus
    model_flops = model_flops_per_token(model, tr.seq_len) * tokens / n_gpus
    causal_share = (model_flops_per_token(model, tr.seq_len, causal=True)
                    / model_flops_per_token(model, tr.seq_len))
    return StepArrays(
        stages=stages, stage_layers={st: layers.of(st) for st in STAGES},
        stage_compute_s=per_mb.compute_s, stage_comm_s=per_mb.comm_s,
        usable_bytes=cluster.gpu.usable_bytes, model_flops=np.full_like(step, model_flops),
        causal_flops_share=causal_share,
        hardware_flops=hardware_flops(model, cluster, tr, p, layers, model_flops),
        compute_s=compute_s, recompute_s=m * per_mb.at_slowest(per_mb.recompute_s),
        contention_s=contention, stall_s=stall, host_bytes=host_bytes(co, p, m),
        optimizer_s=optimizer_s, bubble_s=bubble, gemm_efficiency=lt.gemm_efficiency,
        collectives=collectives, step_time_s=step, tokens_per_step=tokens, num_gpus=n_gpus,
        placement=g.placement,
    )
