"""The efficiency fit itself: least squares on log throughput over groups of measured runs,
the parameters' bounds, and the weights that keep one source from outvoting the others. The
dense stages (fit.py) and the MoE stage (moe_fit.py) both call :func:`fit_efficiency`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from costmodel.specs import Efficiency
from tcf_search.calibration.dataset import Group, predict_groups, weigh_alike, with_training
from tcf_search.calibration.memory_fit import covered, to_unit, unit

EFF_PARAMS = ("attention_peak_fraction", "memory_bw_fraction", "collective_overhead_s",
              "nvlink_bw_fraction", "network_bw_fraction", "network_step_latency_s")
# fitted as part of the nanotron profile (hardware_catalog/frameworks.yaml), not of the GPU
TRAINING_PARAMS = ("host_overhead_s", "pp_tp_step_overhead_s")
EFF_BOUNDS = {"gemm_peak_fraction": (0.3, 0.95), "gemm_half_size": (1.0, 4096.0),
              "attention_peak_fraction": (0.05, 0.9),
              "flash1_attention_peak_fraction": (0.05, 0.9), "memory_bw_fraction": (0.2, 1.0),
              "host_overhead_s": (1e-6, 5e-4), "collective_overhead_s": (1e-6, 1e-3),
              "pp_tp_step_overhead_s": (1e-6, 2e-3), "nvlink_bw_fraction": (0.1, 1.0),
              "network_bw_fraction": (0.05, 1.0), "fp8_gemm_peak_fraction": (0.2, 0.95),
              # one ring step across the network: an RDMA write and its flag, 1 us to 1 ms
              "network_step_latency_s": (1e-6, 1e-3),
              "flash3_attention_peak_fraction": (0.05, 0.9),
              # read bf16 and write fp8 (3) up to several passes of cast, transpose and amax
              "fp8_cast_bytes_per_element": (3.0, 24.0),
              # the EP all-to-all over the ring collectives' bandwidth (moe_fit.py)
              "all_to_all_bw_ratio": (0.1, 3.0)}
FABRIC_PREFIX = "fabric:"  # a fitted parameter that is a fabric's network fraction
FABRIC_STEP_PREFIX = "fabric_step:"  # ... and one that is its ring step's latency


def fabric_values(values: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The fabrics' fitted network fractions and ring steps among fitted ``values``."""
    return ({k.removeprefix(FABRIC_PREFIX): v for k, v in values.items()
             if k.startswith(FABRIC_PREFIX)},
            {k.removeprefix(FABRIC_STEP_PREFIX): v for k, v in values.items()
             if k.startswith(FABRIC_STEP_PREFIX)})


def with_fabrics(groups: list[Group], fractions: dict[str, float],
                 steps: dict[str, float] | None = None) -> list[Group]:
    """Groups on a fabric of ``fractions`` (``steps``) get that network fraction (ring step)."""
    steps = steps or {}

    def on(g: Group) -> Group:
        fid = g.cluster.fabric
        if fid not in fractions and fid not in steps:
            return g
        cluster = g.cluster
        if fid in fractions:
            cluster = replace(cluster, network_bw_fraction=fractions[fid])
        if fid in steps:
            cluster = replace(cluster, network_step_latency_s=steps[fid])
        return replace(g, cluster=cluster)
    return [on(g) for g in groups]


def _is_fabric(name: str) -> bool:
    return name.startswith((FABRIC_PREFIX, FABRIC_STEP_PREFIX))


def fit_efficiency(frame: pd.DataFrame, groups: list[Group], rows: pd.Series, family: str,
                   start: Efficiency, params: tuple[str, ...] = EFF_PARAMS,
                   framework: str = "", start_values: dict[str, float] | None = None,
                   ) -> tuple[Efficiency, dict[str, float]]:
    """Least squares on log throughput (Cauchy loss: a few pathological runs must not steer
    it). TRAINING_PARAMS belong to ``framework``'s profile, ``fabric:<id>`` to that fabric's
    network fraction (hardware_catalog/fabrics.yaml)."""
    measured = frame["tokens_per_sec_per_gpu"].to_numpy()
    idx = covered(groups, rows)
    # a row without a measured throughput has no residual: say which, rather than let scipy
    # stop at "Residuals are not finite in the initial point" (the selection is the bug)
    unmeasured = idx[~(measured[idx] > 0)]
    if unmeasured.size:
        raise ValueError(f"{family} fit: rows without tokens_per_sec_per_gpu selected: "
                         f"{frame['case_id'].to_numpy()[unmeasured].tolist()}")
    weight = source_weights(frame, idx)
    fam_groups = [g for g in groups if g.cluster.gpu.family == family
                  and np.isin(g.index, idx).any()]
    values = {**dataclasses.asdict(start), **(start_values or {})}
    for name in params:
        if name.startswith(FABRIC_PREFIX):
            values.setdefault(name, start.network_bw_fraction)
        elif name.startswith(FABRIC_STEP_PREFIX):
            values.setdefault(name, start.network_step_latency_s)
    bounds = {**EFF_BOUNDS,
              **{n: EFF_BOUNDS["network_bw_fraction"] for n in params
                 if n.startswith(FABRIC_PREFIX)},
              **{n: EFF_BOUNDS["network_step_latency_s"] for n in params
                 if n.startswith(FABRIC_STEP_PREFIX)}}
    own = TRAINING_PARAMS

    def split(x: np.ndarray) -> tuple[Efficiency, list[Group], dict[str, float]]:
        v = unit(x, params, bounds)
        tr = {k: val for k, val in v.items() if k in TRAINING_PARAMS}
        eff = replace(start, **{k: val for k, val in v.items()  # type: ignore[arg-type]
                                if k not in own and not _is_fabric(k)})
        g = with_training(fam_groups, framework, **tr) if tr else fam_groups
        return eff, with_fabrics(g, *fabric_values(v)), v

    def residuals(x: np.ndarray) -> np.ndarray:
        eff, g, _ = split(x)
        pred = predict_groups(g, len(frame), {family: eff})
        return weight * np.log(pred["tokens_per_s_per_gpu"][idx] / measured[idx])

    x0 = to_unit(values, params, bounds)
    sol = least_squares(residuals, x0, bounds=(0.0, 1.0), loss="cauchy", f_scale=0.1,
                        diff_step=1e-3, max_nfev=int(os.environ.get("TCF_FIT_NFEV", "300")))
    eff, _, v = split(sol.x)
    return eff, {k: val for k, val in v.items() if k not in dataclasses.asdict(start)}


def source_weights(frame: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """Each source's rows weigh as much together as another's: the Playbook's 845 runs of one
    sequence length must not outvote the runs that tell terms apart it cannot."""
    src = frame["source"].to_numpy()[idx]
    return np.sqrt(weigh_alike(src) * len(idx) / np.unique(src).size)
