"""The framework profile: its groups by concern, the memory model, and the flat switch names
that frameworks.yaml, a study, a plan file and a measured row's release use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from costmodel.errors import SpecError
from costmodel.framework.layer import Activations, Attention, Kernels, Numerics
from costmodel.framework.parallel import DataParallel, Moe, Pipeline, TensorParallel
from costmodel.memory_model import MemoryModel

# the groups of a profile, by attribute name
GROUPS: dict[str, type] = {"numerics": Numerics, "dp": DataParallel, "tp": TensorParallel,
                           "pp": Pipeline, "attention": Attention, "kernels": Kernels,
                           "activations": Activations, "moe": Moe}


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkProfile:
    """How a training framework behaves: its switches, by concern, and its memory model.

    Built from ``hardware_catalog/frameworks.yaml`` (``framework_profile`` there), never from
    defaults written here. A switch is read as ``training.framework.<group>.<switch>``.
    """

    numerics: Numerics
    """Bytes of weights, gradients, optimizer states and activations; fp8's casts."""
    dp: DataParallel
    """Data parallelism and ZeRO."""
    tp: TensorParallel
    """Tensor and sequence parallelism."""
    pp: Pipeline
    """Pipeline parallelism."""
    attention: Attention
    """The attention kernel and CP's exchange."""
    kernels: Kernels
    """The loss, elementwise kernels, host issue cost and CUDA graphs."""
    activations: Activations
    """Recompute and activation offloading."""
    moe: Moe
    """Mixture-of-experts layers."""
    multi_token_prediction: bool
    """The framework builds multi-token prediction modules (Megatron-Core's
    ``--mtp-num-layers``; ``megatron/core/transformer/multi_token_prediction.py``): rule
    ``mtp``."""
    memory_model: MemoryModel
    """The calibrated memory model: the PyTorch allocator's numbers with the framework's own
    activation and logits footprint (``costmodel/memory_model.py``)."""

    @classmethod
    def from_switches(cls, switches: Mapping[str, Any]) -> FrameworkProfile:
        """A profile from flat ``switch: value`` pairs, every switch given (and a
        ``memory_model``, a :class:`MemoryModel` or its fields): the names are those of
        :func:`switch_names`."""
        unknown = sorted(set(switches) - set(SWITCH_GROUP) - {"memory_model"})
        if unknown:
            raise SpecError(f"training.{unknown[0]}: not a framework switch (valid: "
                            f"{', '.join(sorted(SWITCH_GROUP))})")
        missing = [name for name in (*SWITCH_GROUP, "memory_model") if name not in switches]
        if missing:
            raise SpecError(f"a framework profile needs every switch, but got none for "
                            f"{', '.join(missing)}")
        mm = switches["memory_model"]
        groups = {group: kind(**{f.name: switches[f.name] for f in fields(kind)})
                  for group, kind in GROUPS.items()}
        return cls(**groups,  # type: ignore[arg-type]
                   multi_token_prediction=switches["multi_token_prediction"],
                   memory_model=mm if isinstance(mm, MemoryModel) else MemoryModel(**mm))

    def switches(self) -> dict[str, Any]:
        """Every switch by its flat name, in group order (not the memory model)."""
        out: dict[str, Any] = {}
        for group in GROUPS:
            part = getattr(self, group)
            out.update({f.name: getattr(part, f.name) for f in fields(part)})
        out["multi_token_prediction"] = self.multi_token_prediction
        return out

    def switch(self, name: str) -> Any:
        """One switch by its flat name."""
        group = SWITCH_GROUP[name]
        return getattr(getattr(self, group) if group else self, name)

    def with_switches(self, **changes: Any) -> FrameworkProfile:
        """This profile with some switches (by flat name) or its memory model changed."""
        unknown = sorted(set(changes) - set(SWITCH_GROUP) - {"memory_model"})
        if unknown:
            raise SpecError(f"training.{unknown[0]}: not a framework switch (valid: "
                            f"{', '.join(sorted(SWITCH_GROUP))})")
        top = {k: v for k, v in changes.items() if not SWITCH_GROUP.get(k)}
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if SWITCH_GROUP.get(name):
                by_group.setdefault(SWITCH_GROUP[name], {})[name] = value
        parts = {g: replace(getattr(self, g), **kw) for g, kw in by_group.items()}
        return replace(self, **parts, **top)


# each switch's group ("" for the profile's own fields)
SWITCH_GROUP: dict[str, str] = {
    **{f.name: group for group, kind in GROUPS.items() for f in fields(kind)},
    "multi_token_prediction": ""}


def switch_names() -> tuple[str, ...]:
    """Every switch's flat name (frameworks.yaml's keys, beside ``memory_model``)."""
    return tuple(SWITCH_GROUP)


assert len(SWITCH_GROUP) == sum(len(fields(kind)) for kind in GROUPS.values()) + 1, \
    "a switch name is unique across the groups"
