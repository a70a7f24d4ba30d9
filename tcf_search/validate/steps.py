"""One optimizer step of a parallelized decoder on synthetic tokens: plain gradient accumulation
without a pipeline, a ``torch.distributed.pipelining`` schedule with one."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from costmodel.specs import Plan, Training
from tcf_search.validate.config import micro_batches
from tcf_search.validate.parallel import Parallelized, loss_parallel_on


def synthetic_batch(training: Training, vocab: int, seed: int, step: int) -> torch.Tensor:
    """The global batch of token ids (global_batch, seq_len + 1), identical on every rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    return torch.randint(0, vocab, (training.global_batch, training.seq_len + 1), generator=gen)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@dataclass(slots=True, kw_only=True)
class Stepper:
    """Runs steps for one rank. ``step`` returns the global mean loss, equal on all ranks."""

    par: Parallelized
    plan: Plan
    training: Training
    vocab: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    seed: int
    fake: bool = False  # memory-only mode: tensors have no values, so no loss to read
    schedule: object | None = None

    def __post_init__(self) -> None:
        if self.plan.pp > 1:
            self.schedule = self._build_schedule()

    def _build_schedule(self) -> object:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )
        pp_group = self.par.mesh["pp"].get_group()
        n_stages = self.plan.pp * self.plan.vpp
        stages: list[Any] = [PipelineStage(chunk, stage_id, n_stages, self.device, group=pp_group)
                  for chunk, stage_id in zip(self.par.chunks, self.par.stage_ids, strict=True)]
        n_micro = micro_batches(self.plan, self.training)
        if self.plan.schedule == "interleaved":
            return ScheduleInterleaved1F1B(stages, n_micro, loss_fn=cross_entropy)
        cls = ScheduleGPipe if self.plan.schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_micro, loss_fn=cross_entropy)

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = synthetic_batch(self.training, self.vocab, self.seed, step)
        dp_rank = self.par.mesh["dp"].get_local_rank()
        per_rank = self.training.global_batch // self.plan.dp
        mine = tokens[dp_rank * per_rank:(dp_rank + 1) * per_rank].to(self.device)
        inputs, labels = mine[:, :-1], mine[:, 1:]
        if self.plan.cp > 1:  # this context-parallel rank's chunk of every sequence
            chunk = self.training.seq_len // self.plan.cp
            cp_rank = self.par.mesh["cp"].get_local_rank()
            inputs = inputs[:, cp_rank * chunk:(cp_rank + 1) * chunk]
            labels = labels[:, cp_rank * chunk:(cp_rank + 1) * chunk]
        return inputs.contiguous(), labels.contiguous()

    def step(self, step: int) -> float:
        inputs, labels = self.local_batch(step)
        with self._autocast():
            loss = self._pipeline(inputs, labels) if self.schedule else self._accumulate(
                inputs, labels)
        self.par.optimizer.step()
        self.par.optimizer.zero_grad(set_to_none=True)
        return self._global_mean(loss)

    def _accumulate(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        model = self.par.chunks[0]
        n_micro = micro_batches(self.plan, self.training)
        mb = self.plan.micro_batch
        total = torch.zeros((), device=self.device)
        sharded_loss = loss_parallel_on(self.plan)
        for i in range(n_micro):
            last = i == n_micro - 1
            with _no_sync(model, enabled=not last), _loss_parallel(sharded_loss):
                loss = cross_entropy(model(inputs[i * mb:(i + 1) * mb]),
                                     labels[i * mb:(i + 1) * mb]) / n_micro
                loss.backward()
            if isinstance(loss, DTensor):  # the vocabulary-parallel loss is replicated
                loss = loss.full_tensor()
            total += loss.detach()
        return total

    def _pipeline(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        assert self.schedule is not None
        n_stages = self.plan.pp * self.plan.vpp
        holds_last = n_stages - 1 in self.par.stage_ids
        args = (inputs,) if self.par.is_first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": labels, "losses": losses} if holds_last else {}
        # return_outputs=False: the last stage would otherwise keep every micro-batch's logits.
        self.schedule.step(*args, return_outputs=False, **kwargs)  # type: ignore[attr-defined]
        return torch.stack(losses).mean().detach() if holds_last else None

    def _global_mean(self, loss: torch.Tensor | None) -> float:
        """Ranks that hold the last stage have a loss (dp*cp*tp of them, each over as many
        tokens); average over them."""
        if self.fake:
            return float("nan")
        value = loss if loss is not None else torch.zeros((), device=self.device)
        value = value.float().reshape(1).clone()
        dist.all_reduce(value)
        return float(value.item()) / (self.plan.dp * self.plan.cp * self.plan.tp)


def _loss_parallel(enabled: bool) -> contextlib.AbstractContextManager[object]:
    """Cross-entropy on vocabulary-sharded logits, forward and backward."""
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()  # type: ignore[no-any-return]


def _no_sync(model: nn.Module, *, enabled: bool) -> contextlib.AbstractContextManager[object]:
    """Skip DDP's gradient all-reduce on all but the last micro-batch (FSDP2 reduce-scatters
    every micro-batch, as torchtitan does, to keep gradients sharded)."""
    no_sync = getattr(model, "no_sync", None)
    if enabled and no_sync is not None and not hasattr(model, "reshard"):
        return no_sync()  # type: ignore[no-any-return]
    return contextlib.nullcontext()
