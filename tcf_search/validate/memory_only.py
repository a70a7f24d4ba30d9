"""Memory-only validation with no GPU: one rank of a real-size plan, on fake tensors and a fake
process group, under PyTorch's memory tracker.

``FakeTensorMode`` gives every tensor a shape, dtype and device but no storage, so a Llama 3 70B
stage costs no RAM; the ``"fake"`` backend (``torch.testing._internal.distributed.fake_pg``)
answers every collective locally, so one process plays one rank of a 64-GPU job. The parallel
layout, the pipeline schedule and the optimizer are the real PyTorch code paths of a GPU run,
in the GPU's precision (bf16 compute, fp32 master parameters, gradients and AdamW states), so
what the tracker sees is what that rank would allocate, minus allocator caching and the runtime.

The first step is run untracked: it creates the optimizer states and fills DTensor's sharding
propagation cache, whose first-time metadata computations would otherwise be counted as
full-size tensors.

Run ``python -m tcf_search.validate.memory_only CONFIG.json OUT.json`` for a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel.specs import ModelSpec, Plan, Training
from tcf_search.validate.config import check_supported


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOnlyResult:
    """Tracker peak of one rank, in bytes. ``categories``: the tracker's own names;
    ``parts``: summed into the cost model's parts (see ``memory.PARTS``)."""

    rank: int
    stage_id: int
    layers: int  # layers on this rank
    peak_bytes: float
    categories: dict[str, float]  # at the peak
    parts: dict[str, float]  # at the peak, summed into the cost model's parts
    maxima: dict[str, float]  # each category's own maximum over the step
    layer_activations: float  # see memory.StepMemory
    param_bytes: float  # this rank's parameter storage, counted directly
    param_count: int  # this rank's parameter elements
    wall_s: float
    source: str = "FSDPMemTracker/MemTracker on FakeTensorMode + fake process group"
    notes: list[str] = field(default_factory=list)


Action = tuple[str, int, int]  # ("F" | "B", stage id, micro-batch)


def pipeline_actions(plan: Plan, n_micro: int, pp_rank: int) -> list[Action]:
    """The compute order of one pipeline rank.

    GPipe: all forwards, then all backwards. 1F1B: ``min(n, pp - rank)`` warm-up forwards (as
    ``torch.distributed.pipelining.Schedule1F1B``), then one backward / one forward, then the
    remaining backwards. Interleaved: Narayanan et al. (SC21, sec. 2.2) with
    ``(pp - rank - 1) * 2 + (vpp - 1) * pp`` warm-up forwards over virtual chunks.
    """
    pp, vpp = plan.pp, plan.vpp
    if plan.schedule == "gpipe":
        return [("F", pp_rank, m) for m in range(n_micro)] + \
               [("B", pp_rank, m) for m in range(n_micro)]
    if plan.schedule == "1f1b":
        fwd = [("F", pp_rank, m) for m in range(n_micro)]
        bwd = [("B", pp_rank, m) for m in range(n_micro)]
        warmup = min(n_micro, pp - pp_rank)
    else:
        total = n_micro * vpp

        def chunk(k: int, forward: bool) -> tuple[int, int]:
            c = (k // pp) % vpp
            c = c if forward else vpp - 1 - c
            return pp_rank + c * pp, (k // (pp * vpp)) * pp + k % pp

        fwd = [("F", *chunk(k, True)) for k in range(total)]
        bwd = [("B", *chunk(k, False)) for k in range(total)]
        warmup = min(total, (pp - pp_rank - 1) * 2 + (vpp - 1) * pp + 1)
    actions = fwd[:warmup]
    for i in range(len(fwd) - warmup):
        actions += [bwd[i], fwd[warmup + i]]
    return actions + bwd[len(fwd) - warmup:]


@dataclass(slots=True, kw_only=True)
class EmulatedPipeline:
    """Runs one pipeline rank's compute in schedule order, with the neighbours' activations and
    gradients made up (a fake process group cannot carry them). Stored activations, the in-flight
    micro-batches and hence the peak are those of the real schedule."""

    par: Any
    plan: Plan
    training: Training
    model: ModelSpec
    act_dtype: Any

    def step(self, step: int) -> float:
        import torch

        from tcf_search.validate.config import micro_batches
        from tcf_search.validate.steps import cross_entropy

        p, n_micro = self.plan, micro_batches(self.plan, self.training)
        n_stages, mb, s = p.pp * p.vpp, p.micro_batch, self.training.seq_len
        chunks = dict(zip(self.par.stage_ids, self.par.chunks, strict=True))
        pp_rank = self.par.mesh["pp"].get_local_rank()
        local_s = s // p.tp if p.sequence_parallel else s
        pending: dict[tuple[int, int], torch.Tensor] = {}
        for kind, stage_id, micro in pipeline_actions(p, n_micro, pp_rank):
            if kind == "B":
                out = pending.pop((stage_id, micro))
                if out.dim() == 0:
                    out.backward()
                else:
                    out.backward(torch.empty_like(out))
                continue
            if stage_id == 0:
                x = torch.randint(0, self.model.vocab, (mb, s))
            else:
                x = torch.empty(mb, local_s, self.model.hidden, dtype=self.act_dtype,
                                requires_grad=True)
            out = chunks[stage_id](x)
            if stage_id == n_stages - 1:
                labels = torch.randint(0, self.model.vocab, (mb, s))
                out = cross_entropy(out, labels) / n_micro
            pending[(stage_id, micro)] = out
        self.par.optimizer.step()
        self.par.optimizer.zero_grad(set_to_none=True)
        return float("nan")


def rank_for_stage(plan: Plan, pp_rank: int) -> int:
    """The global rank of (pp_rank, dp_rank=0, tp_rank=0) in the ("pp", "dp", "tp") mesh."""
    return pp_rank * plan.dp * plan.tp


def measure_memory(model: ModelSpec, plan: Plan, training: Training, *, pp_rank: int = 0,
                   steps: int = 1) -> MemoryOnlyResult:
    """Peak memory of one rank of ``plan`` (the first rank of pipeline rank ``pp_rank``)."""
    check_supported(model, plan, training, "cpu")
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tcf_search.validate.memory import measure_step, to_parts
    from tcf_search.validate.model import Decoder
    from tcf_search.validate.parallel import build_mesh, parallelize, stage_layers
    from tcf_search.validate.steps import Stepper

    start = time.perf_counter()
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    rank = rank_for_stage(plan, pp_rank)
    dist.init_process_group("fake", rank=rank, world_size=plan.world_size, store=FakeStore())
    try:
        mesh = build_mesh(plan, "cpu")
        ranges = stage_layers(model.layers, plan)
        low = torch.bfloat16 if training.precision in ("bf16", "fp8") else torch.float16

        def build(stage_id: int) -> Decoder:
            chunk = Decoder(model, training.seq_len)
            return chunk.keep_stage(ranges[stage_id], first=stage_id == 0,
                                    last=stage_id == len(ranges) - 1)

        mode = FakeTensorMode()

        def build_fake(stage_id: int) -> Decoder:
            with mode:
                return build(stage_id)

        # Outside the mode: FSDP2 over a TP mesh builds device meshes from real tensors, while
        # the fake parameters carry their mode with them.
        par = parallelize(plan, mesh, build_fake, lambda chunk: None, fake=True, param_dtype=low)
        with mode:
            stepper: Any
            if plan.pp > 1:
                stepper = EmulatedPipeline(par=par, plan=plan, training=training, model=model,
                                           act_dtype=low)
            else:
                stepper = Stepper(par=par, plan=plan, training=training, vocab=model.vocab,
                                  device=torch.device("cpu"), seed=0, fake=True,
                                  autocast_dtype=None)
            for step in range(steps):
                stepper.step(step)
            mem = measure_step(stepper, par.chunks, par.optimizer, step=steps, track=True)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in par.parameters()]
        param_bytes = float(sum(t.numel() * t.element_size() for t in local))
        param_count = sum(t.numel() for t in local)
        n_layers = sum(len(ranges[s]) for s in par.stage_ids)
        return MemoryOnlyResult(
            rank=rank, stage_id=par.stage_ids[0], layers=n_layers, peak_bytes=mem.peak_bytes,
            categories=mem.parts, parts=to_parts(mem.parts), maxima=mem.maxima,
            layer_activations=mem.layer_activations, param_bytes=param_bytes,
            param_count=param_count, wall_s=time.perf_counter() - start,
            notes=par.notes)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    raw = json.loads(Path(argv[0]).read_text())
    training = Training.from_dict(raw["training"])
    result = measure_memory(ModelSpec(**raw["model"]), Plan(**raw["plan"]), training,
                            pp_rank=int(raw.get("pp_rank", 0)))
    Path(argv[1]).write_text(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
