"""A cluster's calibration file (``tcf-search calibrate --nccl-tests ... -o my-cluster.yaml``): the
collective links fitted on its own nccl-tests output, which a study anchors on with
``cluster.calibration: my-cluster.yaml`` (a path relative to the study file) or ``--calibration``.
Written and read here only, so the format is declared once (``LINK_KEYS``,
``calibration_yaml``, ``load_calibration``).
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
from search.inputs.yamlinput import load_yaml

FORMAT = "tcf-search cluster calibration 1"
MAX_CALIBRATION_BYTES = 4 * MIB
# the fitted figures, each documented on costmodel.MeasuredLinks, and the all-to-all's ratio to
# the ring's bandwidth (Efficiency.all_to_all_bw_ratio: costmodel/parallel/expert.py reads it)
LINK_KEYS = ("nvlink_bw_bytes_per_s", "network_bw_bytes_per_s", "nvlink_step_latency_s",
             "network_step_latency_s", "p2p_network_bw_bytes_per_s")
RATIO_KEY = "all_to_all_bw_ratio"


class CalibrationError(TcfError):
    """A cluster calibration file that cannot be read or does not hold what calibrate writes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterCalibration:
    """What a calibration file holds: the measured links, the all-to-all's ratio to the ring's
    bandwidth (0: not measured) and what they rest on."""

    links: MeasuredLinks
    all_to_all_bw_ratio: float = 0.0
    files: tuple[str, ...] = ()
    date: str = ""
    device: str = ""

    @property
    def anchor(self) -> str:
        """One phrase for the reports: what the answer is anchored on."""
        n = len(self.files)
        return (f"anchored on {n} nccl-test{'s' if n != 1 else ''} of this cluster "
                f"({', '.join(self.files)}; {self.date})")


def calibration_yaml(cal: ClusterCalibration, fits: list[dict[str, Any]]) -> str:
    """The calibration file's text (YAML through its own writer)."""
    links = {k: float(getattr(cal.links, k)) for k in LINK_KEYS}
    links[RATIO_KEY] = float(cal.all_to_all_bw_ratio)
    doc = {"format": FORMAT, "measured_by": "nccl-tests", "date": cal.date,
           "device": cal.device, "files": list(cal.files), "links": links, "fits": fits}
    head = ("# The cluster's collective links, fitted on its nccl-tests output the way the cost\n"
            "# model prices each collective (tcf-search calibrate --nccl-tests). Anchor a study\n"
            "# on it: cluster.calibration: <this file>. A figure of 0 was not measured.\n")
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
    files = doc.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise CalibrationError(f"{where}: files must list the nccl-tests files it was fitted on")
    ratio = values.pop(RATIO_KEY)
    try:
        links = MeasuredLinks(**values)  # type: ignore[arg-type]
    except SpecError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    cal = ClusterCalibration(links=links, all_to_all_bw_ratio=ratio, files=tuple(files),
                             date=str(doc.get("date", "")), device=str(doc.get("device", "")))
    return dataclasses.replace(cal, links=dataclasses.replace(links, source=cal.anchor))


def anchored(cluster: ClusterSpec, cal: ClusterCalibration) -> ClusterSpec:
    """``cluster`` priced on its own measured links: the links replace the family's fractions
    and latencies (``costmodel.comm.link_of``), the all-to-all's measured ratio the family's."""
    gpu = cluster.gpu
    if cal.all_to_all_bw_ratio > 0:
        gpu = dataclasses.replace(gpu, efficiency=dataclasses.replace(
            gpu.efficiency, all_to_all_bw_ratio=cal.all_to_all_bw_ratio))
    return dataclasses.replace(cluster, gpu=gpu, links=cal.links)
