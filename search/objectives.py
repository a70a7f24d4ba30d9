"""What a study maximises or minimises, and a plan's predicted metrics in report units."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.placement import mask_groups
from costmodel.result import GIB

SECONDS_PER_DAY = 86400.0

# study metric name -> (metrics key, direction)
OBJECTIVES: dict[str, tuple[str, str]] = {
    "tokens_per_s": ("tokens_per_s_per_gpu", "maximize"),
    "mfu": ("mfu", "maximize"),
    "time_to_train": ("time_to_train_days", "minimize"),
    "cost": ("cost_usd", "minimize"),
    "memory_headroom": ("memory_headroom_gib", "maximize"),
}
METRIC_KEYS = ("tokens_per_s_per_gpu", "mfu", "mfu_causal", "hfu", "model_tflops_per_gpu",
               "step_time_s",
               "time_compute_s", "time_comm_s", "time_comm_exposed_s", "time_bubble_s",
               "time_optimizer_s")
MEMORY_KEYS = ("weights", "grads", "optimizer", "activations", "buffers")


def objective_vector(key: str, out: dict[str, np.ndarray], *, num_gpus: int,
                     token_budget: float | None, price_per_gpu_hour: float | None,
                     headroom_gib: float = 0.0) -> np.ndarray:
    """One metric for every plan in ``estimate_batch`` columns."""
    if key in out:
        return np.asarray(out[key], dtype=float)
    if key == "memory_headroom_gib":
        return (out["usable_bytes"] - out["peak_mem_bytes"]) / GIB - headroom_gib
    days = (token_budget or 0.0) / (out["tokens_per_s_per_gpu"] * num_gpus) / SECONDS_PER_DAY
    if key == "time_to_train_days":
        return np.asarray(days, dtype=float)
    assert key == "cost_usd", key
    return np.asarray(days * 24 * num_gpus * (price_per_gpu_hour or 0.0), dtype=float)


def metrics_from_batch(out: dict[str, np.ndarray], i: int, *, num_gpus: int,
                       headroom_gib: float, token_budget: float | None,
                       price_per_gpu_hour: float | None) -> dict[str, Any]:
    """One plan's predicted metrics from ``estimate_batch`` columns, in report units."""
    m: dict[str, Any] = {k: float(out[k][i]) for k in METRIC_KEYS}
    peak, usable = float(out["peak_mem_bytes"][i]), float(out["usable_bytes"][i])
    m["peak_mem_gib"] = peak / GIB
    m["usable_mem_gib"] = usable / GIB
    m["memory_headroom_gib"] = (usable - peak) / GIB - headroom_gib
    for k in MEMORY_KEYS:
        m[f"mem_{k}_gib"] = float(out[f"mem_{k}_bytes"][i]) / GIB
    m["fits"] = bool(m["memory_headroom_gib"] >= 0)
    m["dominant_challenge"] = dominant_challenge(m)
    if "network_groups_mask" in out:  # the groups that cross the network, e.g. "dp,pp"
        m["network_groups"] = ",".join(mask_groups(int(out["network_groups_mask"][i])))
    if token_budget:
        days = token_budget / (m["tokens_per_s_per_gpu"] * num_gpus) / SECONDS_PER_DAY
        m["time_to_train_days"] = days
        m["gpu_hours"] = days * 24 * num_gpus
        if price_per_gpu_hour:
            m["cost_usd"] = m["gpu_hours"] * price_per_gpu_hour
    return m


def dominant_challenge(m: dict[str, Any]) -> str:
    """As ``StepEstimate.dominant_challenge``: memory if it does not fit, else the largest share
    of the step among compute (with the optimizer), exposed communication and the bubble."""
    if not m["fits"]:
        return "memory"
    shares = {"compute": m["time_compute_s"] + m["time_optimizer_s"],
              "communication": m["time_comm_exposed_s"], "bubble": m["time_bubble_s"]}
    return max(shares, key=lambda k: shares[k])
