"""Numbers that parse but no real setup has: an override in the wrong unit (400 meant as Gb/s,
given as bytes/s), a model whose head dimension is not whole. Each is one ``warning:`` line
naming the field and the plausible range; a shape the study's framework refuses is an error."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from costmodel.specs import ModelSpec
from hardware_catalog import load_catalog
from hardware_catalog.catalog import NUMERIC_FIELDS
from hardware_catalog.frameworks import is_megatron_core
from search.inputs.study import StudyError

# An override further than this from every catalog part's value (either way) is most likely in
# another unit: bits for bytes (8x) or giga for unity (1e9x) are each far outside; a real part
# a generation apart stays within it (the catalog spans 0.7 GB/s to 900 GB/s of NVLink already).
FACTOR = 100.0


@functools.cache
def catalog_ranges() -> dict[str, tuple[float, float]]:
    """Each numeric field's smallest and largest positive value over the catalog's parts
    (hardware_catalog/*.yaml, the CPU entry included)."""
    out: dict[str, tuple[float, float]] = {}
    for field in NUMERIC_FIELDS:
        values = [float(getattr(g, field)) for g in load_catalog().values()
                  if float(getattr(g, field)) > 0]
        if values:
            out[field] = (min(values), max(values))
    return out


def override_warnings(overrides: Mapping[str, Any], where: str = "cluster.overrides"
                      ) -> list[str]:
    """One line per numeric override below 1/FACTOR of the smallest or above FACTOR times the
    largest value of that field over the catalog."""
    lines = []
    for key, value in overrides.items():
        rng = catalog_ranges().get(key)
        if rng is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        lo, hi = rng
        if lo / FACTOR <= value <= hi * FACTOR:
            continue
        side = "below 1/100 of the smallest" if value < lo / FACTOR else "above 100x the largest"
        lines.append(f"{where}.{key}: {value:g} is {side} value of any part in the catalog "
                     f"(plausible: {lo / FACTOR:.3g} to {hi * FACTOR:.3g}; the catalog holds "
                     f"{lo:.3g} to {hi:.3g}); check the unit")
    return lines


def model_shape(model: ModelSpec, framework: str, where: str = "model") -> list[str]:
    """A head dimension that is not whole (hidden % heads, no head_dim given): Megatron-LM
    refuses it (arguments.py asserts hidden_size % num_attention_heads == 0 when kv_channels is
    not given), so a Megatron-Core study is refused; other frameworks floor it (Hugging Face and
    torchtitan take hidden // heads), which the warning says. (kv_heads not dividing heads is
    refused by the model itself: no framework groups the queries.)"""
    if model.head_dim or model.hidden % model.heads == 0:
        return []
    h, a = model.hidden, model.heads
    below, above = h // a * a, (h // a + 1) * a
    text = (f"{where}.hidden: hidden % heads == 0 must hold for a whole head dimension "
            f"(got hidden={h}, heads={a}: head dim {h / a:.4g}); plausible: a multiple of "
            f"{a} such as {below} or {above}, or give head_dim")
    if is_megatron_core(framework):
        raise StudyError(f"{text} (Megatron-LM asserts it without --kv-channels)")
    return [f"{text}; the {framework!r} profile floors the head dimension to {h // a}, "
            f"as the cost model does"]
