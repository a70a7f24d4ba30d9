"""Peak memory of one training step from PyTorch's own memory trackers.

``torch.distributed._tools.mem_tracker.MemTracker`` (and its FSDP2 subclass ``FSDPMemTracker``)
is a ``TorchDispatchMode`` that attributes every tensor storage to a category — parameters,
gradients, optimizer states, activations, temporaries — and records the per-device peak. It
counts tensor bytes, not the allocator's caching or the runtime's own memory, which is what the
cost model predicts too. It runs on real tensors (a CPU run) and on fake tensors (memory-only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# Tracker categories (both trackers' names) → the cost model's memory parts.
PARTS: dict[str, str] = {
    "Parameter": "weights", "Sharded Param": "weights",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations",
    "Unsharded Param": "gathered", "Unsharded Grad": "gathered",
    "All Gather": "gathered", "Reduce Scatter": "gathered",
    "Temp": "temp", "Buffer": "other", "Inputs": "other", "Other": "other",
}
TOTAL = "Total"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMemory:
    """``parts``: the tracker's categories at the step's peak. ``maxima``: each category's own
    maximum over the step (gradients peak at the optimizer step, activations in backward).
    ``layer_activations``: the largest "Activation" total outside the output head and loss, so
    that it holds what a cost model calls activations (stored layer tensors, in-flight
    micro-batches, the layer being recomputed) and not the logits."""

    loss: float
    peak_bytes: float
    parts: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    layer_activations: float = float("nan")
    source: str = ""
    notes: list[str] = field(default_factory=list)


def to_parts(categories: dict[str, float]) -> dict[str, float]:
    """Sum raw tracker categories into weights/grads/optimizer/activations/gathered/temp/other."""
    out: dict[str, float] = {}
    for name, value in categories.items():
        if name == TOTAL:
            continue
        part = PARTS.get(name, "other")
        out[part] = out.get(part, 0.0) + value
    return out


_NESTED = "<micro-batch>"


def _as_nested(parents: set[str], call: Callable[[], Any]) -> Any:
    """Both trackers take a second top-level forward of a module (parents == {"Global"}) for a
    new iteration and refuse it, but micro-batches call the same chunk several times in one
    step. A placeholder parent during the check makes such a call read as a nested one; the
    per-device peak, which is all we read, is unaffected."""
    parents.add(_NESTED)
    try:
        return call()
    finally:
        parents.discard(_NESTED)


def _update_global_peak(tracker: Any) -> None:
    """The trackers also keep a peak per module, walking every tracked module after every op
    (most of their cost on a 32-layer model); only per-device totals are kept here."""
    for dev, snap in tracker._curr_mem_snap.items():
        if tracker._peak_mem.get(dev, 0) < snap[TOTAL]:
            tracker._peak_mem[dev] = snap[TOTAL]
            tracker._peak_mem_snap[dev] = dict(snap)
        maxima = tracker.tcf_maxima.setdefault(dev, {})
        for cat, value in snap.items():
            name = getattr(cat, "value", str(cat))
            if value > maxima.get(name, 0):
                maxima[name] = value
            if name == "Activation" and not tracker.tcf_in_head[0] \
                    and value > tracker.tcf_layer_act.get(dev, 0):
                tracker.tcf_layer_act[dev] = value


def _watch_head(chunks: list[nn.Module], in_head: list[bool]) -> list[Any]:
    """Flag the window from the output head's forward to the end of its backward."""
    handles: list[Any] = []

    def enter(*_: Any) -> None:
        in_head[0] = True

    def leave(*_: Any) -> None:
        in_head[0] = False

    for chunk in chunks:
        for name, module in chunk.named_modules():
            if name.split(".")[-1] == "output":
                handles.append(module.register_forward_pre_hook(enter))
                handles.append(module.register_full_backward_hook(leave))
    return handles


def make_tracker(chunks: list[nn.Module], optimizer: torch.optim.Optimizer) -> Any:
    """FSDPMemTracker for a single FSDP2-sharded chunk (it tells sharded from gathered
    parameters); the generic MemTracker otherwise. Both accept several micro-batches."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    class MicroBatchMemTracker(MemTracker):
        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            _as_nested(self._mod_tracker.parents,
                       lambda: super(MicroBatchMemTracker, self)._pre_fw_hook(module, inputs))

        def _update_peak_stats(self, peak_state: Any) -> None:
            _update_global_peak(self)

    class MicroBatchFSDPMemTracker(FSDPMemTracker):
        def _update_peak_stats(self, peak_state: Any) -> None:
            _update_global_peak(self)

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def nested(*args: Any, **kwargs: Any) -> Any:
                return _as_nested(self._mod_tracker.parents, lambda: inner(*args, **kwargs))
            return nested

    tracker: Any
    if len(chunks) == 1 and isinstance(chunks[0], FSDPModule) \
            and type(chunks[0]).__name__.startswith("FSDP"):
        tracker = MicroBatchFSDPMemTracker(chunks[0], optimizer)
    else:
        tracker = MicroBatchMemTracker()
        tracker.track_external(*chunks, optimizer)
    tracker.tcf_maxima = {}
    tracker.tcf_layer_act = {}
    tracker.tcf_in_head = [False]
    return tracker


def peak_snapshot(tracker: Any) -> dict[str, float]:
    """The tracker's peak snapshot of the device with the largest peak, keyed by category."""
    snaps = tracker.get_tracker_snapshot("peak")
    if not snaps:
        return {}
    device_snap = max(snaps.values(), key=lambda s: s.get(TOTAL, 0))
    return {getattr(k, "value", str(k)): float(v) for k, v in device_snap.items()}


def measure_step(stepper: Any, chunks: list[nn.Module], optimizer: torch.optim.Optimizer, *,
                 step: int, track: bool) -> StepMemory:
    """Run one step, under a tracker when ``track``; the step's loss comes back either way."""
    if not track:
        return StepMemory(loss=stepper.step(step), peak_bytes=float("nan"))
    tracker = make_tracker(chunks, optimizer)
    handles = _watch_head(chunks, tracker.tcf_in_head)
    try:
        with tracker:
            loss = stepper.step(step)
    finally:
        for handle in handles:
            handle.remove()
    categories = peak_snapshot(tracker)
    maxima: dict[str, float] = max(tracker.tcf_maxima.values(),
                                   key=lambda m: m.get(TOTAL, 0), default={})
    layer_act = max(tracker.tcf_layer_act.values(), default=float("nan"))
    return StepMemory(loss=loss, peak_bytes=categories.get(TOTAL, float("nan")),
                      parts=categories, maxima={k: float(v) for k, v in maxima.items()},
                      layer_activations=float(layer_act),
                      source=f"{type(tracker).__mro__[1].__name__} (tensor bytes)")
