"""A cluster's calibration file (``tcf-search calibrate --nccl-tests ... -o my-cluster.yaml``): the
collective links fitted on its own nccl-tests output, which a study anchors on with
``cluster.calibration: my-cluster.yaml`` (a path relative to the study file) or ``--calibration``.
The same file may carry measured anchors (``tcf-search calibrate --measured ...``,
``tcf_search.calibration.anchor``): the scales its measured training steps fitted on the SKU
family's efficiencies (``MeasuredAnchor``), and the runs they rest on. Written and read here
only, so the format is declared once (``LINK_KEYS``, ``ANCHOR_KEYS``, ``calibration_yaml``,
``load_calibration``, ``anchored``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from costmodel.errors import TcfError
from costmodel.specs import ClusterSpec, MeasuredLinks, SpecError
from search.inputs.files import MIB, read_input
from search.inputs.layout_transfer import Transfer
from search.inputs.yamlinput import load_yaml

FORMAT = "tcf-search cluster calibration 1"
MAX_CALIBRATION_BYTES = 4 * MIB
# the fitted figures, each documented on costmodel.MeasuredLinks, and the all-to-all's ratio to
# the ring's bandwidth (Efficiency.all_to_all_bw_ratio: costmodel/parallel/expert.py reads it)
LINK_KEYS = ("nvlink_bw_bytes_per_s", "network_bw_bytes_per_s", "nvlink_step_latency_s",
             "network_step_latency_s", "p2p_network_bw_bytes_per_s")
RATIO_KEY = "all_to_all_bw_ratio"
# what measured steps refit (MeasuredAnchor): a scale on the family's tensor-core kernel
# fractions (bf16/fp16 and fp8 GEMM, both attention generations) and one on the network's
# bus-bandwidth fraction (1: not fitted)
ANCHOR_KEYS = ("compute_scale", "network_scale")
COMPUTE_FIELDS = ("gemm_peak_fraction", "fp8_gemm_peak_fraction", "attention_peak_fraction",
                  "flash3_attention_peak_fraction")
# a run's fields kept in the file: where it came from and what the interval's check matches on
RUN_KEYS = ("file", "model_name", "model", "gpu", "num_gpus", "plan", "measured_tokens_per_s",
            "family_tokens_per_s", "anchored_tokens_per_s", "layout",
            # what the run says of its cluster (search.inputs.anchor_tails); optional
            "cluster_tokens_per_s", "cluster_share")


class CalibrationError(TcfError):
    """A cluster calibration file that cannot be read or does not hold what calibrate writes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredAnchor:
    """What a cluster's measured training steps refit (``calibrate --measured``).

    compute_scale: the cluster's tensor-core kernels (``COMPUTE_FIELDS``) against the SKU
        family's fit: each fraction is multiplied by it, never past 1.
    network_scale: the network's collective bus bandwidth against the family's (or the
        fabric's) fraction; 1 where the runs cannot identify it.
    fitted: the names of the scales the runs identified.
    runs: each run's file, model, cluster, plan and tokens/s (measured, the family's model,
        anchored) and its layout's coordinates (``layout_transfer.FEATURES``): what the
        anchored interval's check matches a study on, and what a plan's distance is to.
    transfer: how far a run's residual carries to another layout of its group
        (``layout_transfer.Transfer``), as the fit used it; None: not recorded (the runs then
        move a plan by the cluster-wide scales only).
    """

    compute_scale: float = 1.0
    network_scale: float = 1.0
    fitted: tuple[str, ...] = ()
    runs: tuple[dict[str, Any], ...] = ()
    transfer: Transfer | None = None

    def __post_init__(self) -> None:
        for key in ANCHOR_KEYS:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise SpecError(f"measured.{key} must be a number > 0, but got {v!r}")

    def describe(self) -> str:
        scales = [f"{k.removesuffix('_scale')} x{getattr(self, k):.3f}" for k in self.fitted]
        return ", ".join(scales) or "nothing fitted"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterCalibration:
    """What a calibration file holds: the measured links, the all-to-all's ratio to the ring's
    bandwidth (0: not measured), the measured anchors and what they rest on."""

    links: MeasuredLinks
    all_to_all_bw_ratio: float = 0.0
    files: tuple[str, ...] = ()
    date: str = ""
    device: str = ""
    measured: MeasuredAnchor | None = None
    measured_files: tuple[str, ...] = ()

    @property
    def anchor(self) -> str:
        """One phrase for the reports: what the answer is anchored on."""
        n = len(self.files)
        runs = len(self.measured.runs) if self.measured else 0
        parts = ([f"{runs} measured run{'s' if runs != 1 else ''}"] if runs else []) + (
            [f"{n} nccl-test{'s' if n != 1 else ''}"] if n else [])
        shown = [*self.measured_files, *self.files]
        fitted = f": {self.measured.describe()}" if self.measured else ""
        return (f"anchored on {' and '.join(parts)} of this cluster ({', '.join(shown)}; "
                f"{self.date}){fitted}")


def calibration_yaml(cal: ClusterCalibration, fits: list[dict[str, Any]]) -> str:
    """The calibration file's text (YAML through its own writer)."""
    links = {k: float(getattr(cal.links, k)) for k in LINK_KEYS}
    links[RATIO_KEY] = float(cal.all_to_all_bw_ratio)
    by = [*(["nccl-tests"] if cal.files else []), *(["measured runs"] if cal.measured else [])]
    doc: dict[str, Any] = {"format": FORMAT, "measured_by": " and ".join(by), "date": cal.date,
                           "device": cal.device, "files": list(cal.files), "links": links,
                           "fits": fits}
    if cal.measured is not None:
        m = cal.measured
        doc["measured"] = {"files": list(cal.measured_files),
                           **{k: float(getattr(m, k)) for k in ANCHOR_KEYS},
                           "fitted": list(m.fitted), "runs": [dict(r) for r in m.runs]}
        if m.transfer is not None:
            doc["measured"]["transfer"] = m.transfer.to_dict()
    head = ("# The cluster's collective links, fitted on its nccl-tests output the way the cost\n"
            "# model prices each collective (tcf-search calibrate --nccl-tests), and/or the\n"
            "# scales its measured training steps fitted on the family's efficiencies\n"
            "# (tcf-search calibrate --measured). Anchor a study on it: cluster.calibration:\n"
            "# <this file>. A figure of 0 was not measured; a scale of 1 was not fitted.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=100)


def load_calibration(path: Path) -> ClusterCalibration:
    """The calibration file at ``path``; a :class:`CalibrationError` naming the field if it is
    not one calibrate wrote."""
    where = str(path)
    try:
        doc = load_yaml(read_input(path, "cluster.calibration", MAX_CALIBRATION_BYTES)
                        .decode("utf-8"), where)
    except UnicodeDecodeError:
        raise CalibrationError(f"{where}: not UTF-8 text") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f"{where}: not a cluster calibration written by tcf-search "
                               f"calibrate --nccl-tests (format: {FORMAT!r} missing)")
    raw = doc.get("links")
    if not isinstance(raw, dict) or set(raw) - {*LINK_KEYS, RATIO_KEY}:
        raise CalibrationError(f"{where}: links must map {', '.join((*LINK_KEYS, RATIO_KEY))} "
                               f"to numbers")
    values: dict[str, float] = {}
    for key in (*LINK_KEYS, RATIO_KEY):
        v = raw.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0:
            raise CalibrationError(f"{where}: links.{key} must be a number >= 0, but got {v!r}")
        values[key] = float(v)
    measured, measured_files = _measured(doc.get("measured"), where)
    files = doc.get("files")
    if not isinstance(files, list) or not (files or measured) \
            or not all(isinstance(f, str) for f in files):
        raise CalibrationError(f"{where}: files must list the nccl-tests files it was fitted on")
    ratio = values.pop(RATIO_KEY)
    try:
        links = MeasuredLinks(**values)  # type: ignore[arg-type]
    except SpecError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    cal = ClusterCalibration(links=links, all_to_all_bw_ratio=ratio, files=tuple(files),
                             date=str(doc.get("date", "")), device=str(doc.get("device", "")),
                             measured=measured, measured_files=measured_files)
    return dataclasses.replace(cal, links=dataclasses.replace(links, source=cal.anchor))


def _measured(raw: Any, where: str) -> tuple[MeasuredAnchor | None, tuple[str, ...]]:
    """The ``measured:`` block (absent: None)."""
    if raw is None:
        return None, ()
    if not isinstance(raw, dict) or set(raw) - {*ANCHOR_KEYS, "fitted", "runs", "files",
                                                "transfer"}:
        raise CalibrationError(f"{where}: measured must map {', '.join(ANCHOR_KEYS)}, fitted, "
                               f"runs, files and transfer")
    runs, fitted, files = raw.get("runs"), raw.get("fitted", []), raw.get("files", [])
    if not isinstance(runs, list) or not runs or not all(
            isinstance(r, dict) and not set(r) - set(RUN_KEYS) for r in runs):
        raise CalibrationError(f"{where}: measured.runs must list the runs it was fitted on, "
                               f"each with {', '.join(RUN_KEYS)}")
    for r in runs:
        for key in ("measured_tokens_per_s", "family_tokens_per_s", "anchored_tokens_per_s",
                    "cluster_tokens_per_s", "cluster_share"):
            v = r.get(key, 1.0)
            share = key == "cluster_share"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    0.0 <= v <= 1.0 if share else 0.0 < v < 1e12):
                raise CalibrationError(f"{where}: measured.runs[].{key} must be a number "
                                       + ("from 0 to 1" if share else "> 0")
                                       + f", but got {v!r}")
    if not isinstance(fitted, list) or set(fitted) - set(ANCHOR_KEYS):
        raise CalibrationError(f"{where}: measured.fitted must list some of "
                               f"{', '.join(ANCHOR_KEYS)}, but got {fitted!r}")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise CalibrationError(f"{where}: measured.files must list file names")
    try:
        anchor = MeasuredAnchor(**{k: raw.get(k, 1.0) for k in ANCHOR_KEYS},
                                fitted=tuple(fitted), runs=tuple(runs),
                                transfer=_transfer(raw.get("transfer"), where))
    except SpecError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    return anchor, tuple(files)


def _transfer(raw: Any, where: str) -> Transfer | None:
    """The ``measured.transfer`` block (absent: None)."""
    if raw is None:
        return None
    ok = isinstance(raw, dict) and all(
        isinstance(raw.get(k), (int, float)) and not isinstance(raw.get(k), bool)
        for k in ("far", "near", "decay"))
    if ok and 0 <= raw["far"] <= raw["near"] < 1 and raw["decay"] > 0:
        return Transfer(far=float(raw["far"]), near=float(raw["near"]),
                        decay=float(raw["decay"]), basis=str(raw.get("basis", "")))
    raise CalibrationError(f"{where}: measured.transfer must map far, near and decay to "
                           f"numbers with 0 <= far <= near < 1 and decay > 0, but got {raw!r}")


def anchored(cluster: ClusterSpec, cal: ClusterCalibration) -> ClusterSpec:
    """``cluster`` priced on its own measurements: the links replace the family's fractions
    and latencies (``costmodel.comm.link_of``), the all-to-all's measured ratio the family's,
    and measured steps' scales multiply the family's kernel fractions and the network's."""
    gpu = cluster.gpu
    eff = gpu.efficiency
    if cal.all_to_all_bw_ratio > 0:
        eff = dataclasses.replace(eff, all_to_all_bw_ratio=cal.all_to_all_bw_ratio)
    network = cluster.network_bw_fraction
    m = cal.measured
    if m is not None:
        s = m.compute_scale
        eff = dataclasses.replace(eff, **{k: min(getattr(eff, k) * s, 1.0)  # type: ignore
                                          for k in COMPUTE_FIELDS},
                                  source=f"{eff.source}; {cal.anchor}")
        if m.network_scale != 1.0:
            base = eff.network_bw_fraction if network is None else network
            network = min(base * m.network_scale, 1.0)
    if eff is not gpu.efficiency:
        gpu = dataclasses.replace(gpu, efficiency=eff)
    return dataclasses.replace(cluster, gpu=gpu, links=cal.links, network_bw_fraction=network)


def model_key(model: Any) -> dict[str, int]:
    """The shape a measured run's model is matched on (a ModelSpec's)."""
    return {k: int(getattr(model, k)) for k in ("layers", "hidden", "ffn_hidden", "heads",
                                                 "kv_heads", "vocab", "moe_experts")}


def anchor_matches(cal: ClusterCalibration | None, model: Any, cluster: ClusterSpec) -> bool:
    """Whether a study of ``model`` on ``cluster`` is what ``cal``'s measured runs checked: the
    same model shape on the same GPU and GPU count as one of its runs (the groups whose
    leave-one-in residuals bound the anchored interval: benchmarks/bench_anchor.py)."""
    if cal is None or cal.measured is None:
        return False
    key = model_key(model)
    return any(r.get("model") == key and r.get("gpu") == cluster.gpu.id
               and int(r.get("num_gpus", 0)) == cluster.num_gpus for r in cal.measured.runs)
