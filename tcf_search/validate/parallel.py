"""Lay a plan onto the decoder with PyTorch-native parallelism, in torchtitan's order:
pipeline split → tensor parallel (DTensor, optional sequence parallel) → recompute → data
parallel (DDP, FSDP2 ``fully_shard`` or FSDP2 ``replicate``).

ZeRO stages map to PyTorch as follows (the closest native behaviour, stated so the comparison
with the model is read right):

====  ===================================================================================
0     DDP (tp=1) or FSDP2 ``replicate`` over the dp mesh (tp>1; DDP does not take DTensors)
1     DDP + ``ZeroRedundancyOptimizer`` (tp=1); with tp>1 as stage 0, noted in the result
2     FSDP2 ``fully_shard(reshard_after_forward=False)``: parameters stay gathered from
      forward to backward, gradients and optimizer states are sharded
3     FSDP2 ``fully_shard(reshard_after_forward=True)``
====  ===================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from costmodel.mapping import chunk_counts, stage_counts
from costmodel.specs import Plan
from tcf_search.validate.model import Attention, Block, Decoder


@dataclass(slots=True, kw_only=True)
class Parallelized:
    """This rank's model chunks (one, or ``vpp`` with the interleaved schedule) and optimizer."""

    chunks: list[nn.Module]
    stage_ids: list[int]
    optimizer: torch.optim.Optimizer
    mesh: DeviceMesh
    notes: list[str] = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_ids

    def parameters(self) -> Iterator[nn.Parameter]:
        for chunk in self.chunks:
            yield from chunk.parameters()


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    return init_device_mesh(device_type, (plan.pp, plan.dp, plan.cp, plan.tp),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))


def data_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The ranks that average gradients: data parallel, and context parallel on top (each CP
    rank holds another part of the same sequences)."""
    if plan.cp == 1:
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def apply_context_parallel(model: Decoder, cp_mesh: DeviceMesh) -> None:
    """Each rank of the CP group holds one contiguous chunk of every sequence; attention
    all-gathers K and V along the sequence (see ``Attention``)."""
    rank, size = cp_mesh.get_local_rank(), cp_mesh.size()
    model.cp_rank, model.cp_size = rank, size
    for block in blocks(model):
        attention = block.get_submodule("attention")
        assert isinstance(attention, Attention)
        attention.cp_group = cp_mesh.get_group()
        attention.cp_rank, attention.cp_size = rank, size


def stage_layers(layers: int, plan: Plan) -> list[range]:
    """Layer ids of each virtual stage, in stage order, as the launchers place them: the ranks'
    counts by ``costmodel.mapping.stage_counts`` (pinned first/last stages, the other ranks a
    layer apart at most, with or without interleaving) cut into chunks by ``chunk_counts``; a
    split that is not whole gives the earliest stages one layer more."""
    ranks = stage_counts(layers, plan.pp, plan.first_stage_layers or 0,
                         plan.last_stage_layers or 0, near_even=True)
    if ranks and all(n >= plan.vpp for n in ranks):
        sizes = list(chunk_counts(ranks, plan.vpp))
    else:
        base, rest = divmod(layers, plan.pp * plan.vpp)
        sizes = [base + (i < rest) for i in range(plan.pp * plan.vpp)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def rank_stage_ids(pp_rank: int, plan: Plan) -> list[int]:
    """Virtual stages of one pipeline rank: looped placement (stage ``pp_rank + k*pp``)."""
    return [pp_rank + k * plan.pp for k in range(plan.vpp)]


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer layers of a decoder chunk, in order."""
    return list(model.get_submodule("layers").children())


def loss_parallel_on(plan: Plan) -> bool:
    """Whether the LM head keeps its logits sharded over the vocabulary and the loss runs on
    the shards (``loss_parallel``, torchtitan's default with TP). Only without a pipeline: the
    pipelining stages hand plain tensors to their loss function."""
    return plan.tp > 1 and plan.pp == 1


def apply_tensor_parallel(model: Decoder, tp_mesh: DeviceMesh, sequence_parallel: bool,
                          loss_parallel: bool = False) -> None:
    """Megatron's layout in DTensor terms (Shoeybi et al., 2019; Korthikanti et al., 2022):
    QKV and gate/up column-parallel, output and down projections row-parallel; with sequence
    parallel the norms and residual stream are sharded along the sequence (dim 1).

    With sequence parallel, pipeline stages pass each other the local sequence shard (tp rank i
    to tp rank i), which ``SequenceParallel`` on the next stage's first norm reads as Shard(1).
    """
    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        # vocabulary-parallel loss: logits stay sharded on the vocabulary (a DTensor); else
        # every rank gathers the full logits
        top["output"] = (ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                         use_local_output=False) if loss_parallel
                         else ColwiseParallel(input_layouts=seq, output_layouts=Replicate()))
    parallelize_module(model, tp_mesh, top)  # type: ignore[arg-type]
    for block in blocks(model):
        plan: dict[str, object] = {
            "attention": PrepareModuleInput(input_layouts=(seq, None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.feed_forward.w3 is not None:  # type: ignore[union-attr]
            plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]


def apply_recompute(model: Decoder, plan: Plan) -> None:
    """Full recompute of the first ``recompute_layers`` layers of the stage (0 = all)."""
    layers = [b for b in blocks(model) if isinstance(b, Block)]
    if plan.recompute == "full":
        n = plan.recompute_layers or len(layers)
        for block in layers[:n]:
            block.recompute = "full"
    elif plan.recompute == "selective":
        for block in layers:
            block.recompute = "selective"


def apply_data_parallel(model: nn.Module, dp_mesh: DeviceMesh, plan: Plan,
                        param_dtype: torch.dtype | None, notes: list[str], *,
                        ddp: bool = True) -> nn.Module:
    """Wrap one model chunk for data parallelism; see the module docstring for the mapping.
    ``ddp=False`` uses FSDP2 ``replicate`` where DDP would go (DDP's C++ reducer needs real
    storage, so fake tensors take this path)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # A block's input is already in the compute dtype (the previous unit's output); casting its
    # other inputs, the shared fp32 RoPE tables, would make a bf16 copy per block call that a
    # checkpointed block keeps until its backward (4 MiB per layer and micro-batch at seq 8192).
    block_mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                    cast_forward_inputs=False)
    if plan.zero_stage >= 2:
        reshard = plan.zero_stage == 3
        for block in blocks(model):
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=block_mp)
        # The root unit (embedding, norm, head) stays gathered after forward, as torchtitan does:
        # backward needs it first.
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=mp)
        return model
    if plan.dp * plan.cp == 1:
        if param_dtype is None:
            return model
        # A one-rank FSDP2 unit is PyTorch's mixed-precision wrapper: fp32 parameters, bf16
        # copies made per layer for compute. Autocast would instead keep a bf16 copy of every
        # weight alive from forward to backward.
        for block in blocks(model):
            fully_shard(block, mesh=dp_mesh, mp_policy=block_mp)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=mp)
        return model
    if plan.tp == 1 and ddp:
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, process_group=dp_mesh.get_group())
    from torch.distributed._composable.replicate_with_fsdp import replicate
    if plan.zero_stage == 1:
        notes.append("zero_stage=1 runs as FSDP2 replicate here (optimizer not sharded)")
    for block in blocks(model):
        replicate(block, mesh=dp_mesh, mp_policy=block_mp)
    replicate(model, mesh=dp_mesh, mp_policy=mp)
    return model


def build_optimizer(params: list[nn.Parameter], plan: Plan, dp_mesh: DeviceMesh,
                    lr: float, fake: bool = False) -> torch.optim.Optimizer:
    """AdamW; ZeRO-1 shards its states over the data-parallel group."""
    if uses_ddp(plan, fake) and plan.zero_stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_mesh.get_group(), lr=lr)
    # Without sequence parallel (and without FSDP) the norm weights stay plain tensors next to
    # DTensors, which the fused and multi-tensor kernels refuse to mix.
    mixed = plan.tp > 1 and not plan.sequence_parallel
    if mixed:
        return torch.optim.AdamW(params, lr=lr, foreach=False)
    return torch.optim.AdamW(params, lr=lr, fused=True)


def uses_ddp(plan: Plan, fake: bool = False) -> bool:
    return plan.zero_stage < 2 and plan.dp * plan.cp > 1 and plan.tp == 1 and not fake


def parallelize(plan: Plan, mesh: DeviceMesh, build_chunk: Callable[[int], Decoder],
                materialize: Callable[[nn.Module], None], *, param_dtype: torch.dtype | None,
                lr: float = 1e-3, fake: bool = False) -> Parallelized:
    """Build this rank's chunks with ``build_chunk(stage_id)`` and lay the plan on.

    ``materialize`` turns a chunk built on the meta device into real tensors: after sharding
    for FSDP2 (each rank allocates only its shard), before wrapping for DDP (which broadcasts
    real parameters). It is a no-op for chunks built materialized.
    """
    pp_rank = mesh["pp"].get_local_rank()
    stage_ids = rank_stage_ids(pp_rank, plan)
    notes: list[str] = []
    chunks: list[nn.Module] = []
    grad_mesh = data_mesh(mesh, plan)
    for stage_id in stage_ids:
        chunk = build_chunk(stage_id)
        if plan.tp > 1:
            apply_tensor_parallel(chunk, mesh["tp"], plan.sequence_parallel,
                                  loss_parallel_on(plan))
        if plan.cp > 1:
            apply_context_parallel(chunk, mesh["cp"])
        apply_recompute(chunk, plan)
        if uses_ddp(plan, fake):
            materialize(chunk)
        wrapped = apply_data_parallel(chunk, grad_mesh, plan, param_dtype, notes, ddp=not fake)
        if not uses_ddp(plan, fake):
            materialize(wrapped)
        chunks.append(wrapped)
    params = [p for c in chunks for p in c.parameters()]
    optimizer = build_optimizer(params, plan, grad_mesh, lr, fake)
    return Parallelized(chunks=chunks, stage_ids=stage_ids, optimizer=optimizer, mesh=mesh,
                        notes=notes)
