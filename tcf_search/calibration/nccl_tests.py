"""``tcf-search calibrate --nccl-tests FILE...``: read the standard output of NVIDIA's nccl-tests
(or RCCL's rccl-tests, the same format) and fit the cluster's links the way the cost model
prices a collective (:mod:`costmodel.comm`).

The format, as nccl-tests prints it (github.com/NVIDIA/nccl-tests, ``src/util.cu``:
``writeDeviceReport``, ``writeResultHeader``, ``writeBenchmarkLinePreamble``/``Body``,
``writeResultFooter``): a ``# Collective test starting: all_reduce_perf`` line (newer releases;
else the file's name says which test), one ``#  Rank  0 Group  0 Pid 1234 on host-a device  0
[...] NVIDIA H100 80GB HBM3`` line per rank (its host), a column header ``# size count type
redop root time algbw busbw #wrong time algbw busbw #wrong`` (out of place, then in place; older
releases lack ``root``), one row per size (bytes; time in microseconds, averaged over the
iterations and the ranks: ``src/common.cu``), then ``# Avg bus bandwidth : X``. The size is the
whole buffer: the gathered one for all-gather, the reduced one for reduce-scatter, each rank's
send buffer for all-to-all (``doc/PERFORMANCE.md``; ``src/alltoall.cu``); sendrecv sends it to
the next rank (``src/sendrecv.cu``).

The fit. Every collective time of :mod:`costmodel.comm` is linear in the inverse bandwidths
and the per-step latencies of its links, given the group (n ranks, k per NVLink domain; a host
is a domain here): the coefficients are read off ``costmodel.comm`` itself, on unit links, so
the fit prices each row exactly as a study will. Weighted least squares on relative error
(so the small sizes fix the latency, the large ones the bandwidth), bounded at zero:

- NVLink's bandwidth and ring-step latency from the single-host all-reduce / all-gather /
  reduce-scatter files; the network's from the multi-host ones (given NVLink's: a single-host
  file, else ``--gpu``'s catalogued figures stand in, and are not written);
- the all-to-all's ratio to the ring's bandwidth (``Efficiency.all_to_all_bw_ratio``, the form
  the cost model prices an EP all-to-all in) from the alltoall files;
- the network point-to-point bandwidth from multi-host sendrecv files.

nccl-tests times back-to-back launches with CUDA events, so what it measures has no per-call
host overhead: the fit sets ``collective_overhead_s`` to zero and the cost model keeps the
family's on top (the host waiting on a collective in a training step).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar, nnls

from costmodel import comm
from costmodel.comm import Link
from costmodel.errors import TcfError
from costmodel.specs import MeasuredLinks
from search.inputs import ClusterCalibration, read_input

MAX_FILE_BYTES = 64 * 2**20
RINGS = ("all_reduce", "all_gather", "reduce_scatter")
# longest names first: a file name is searched for them in this order
COLLECTIVES = ("reduce_scatter", "all_reduce", "all_gather", "alltoall", "sendrecv")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+"
                   r"(\d+)\s+\[[^\]]*\]\s*(.*)$")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


class NcclTestsError(TcfError):
    """An nccl-tests file that cannot be read, or a set of them the fit cannot use; the message
    names the file and the line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTest:
    """One nccl-tests run: its collective, ranks and hosts, and its rows (size in bytes, time in
    seconds: the mean of the out-of-place and in-place times)."""

    path: Path
    collective: str
    ranks: int
    hosts: int
    device: str
    sizes: np.ndarray
    times_s: np.ndarray

    @property
    def per_host(self) -> int:
        return self.ranks // self.hosts

    def describe(self) -> str:
        return (f"{self.path.name}: {self.collective}, {self.ranks} ranks on {self.hosts} "
                f"host{'s' if self.hosts > 1 else ''}, {len(self.sizes)} sizes")


def _collective(name: str) -> str | None:
    name = name.lower()
    return next((c for c in COLLECTIVES if c in name), None)


def parse(path: Path, text: str) -> NcclTest:
    """One nccl-tests output file (see the module docstring); an :class:`NcclTestsError` naming
    ``path:line`` for what is malformed or missing."""
    collective = None
    ranks: dict[int, tuple[str, str]] = {}
    header: list[str] | None = None
    rows: list[tuple[int, float]] = []
    done = False
    last = 0
    for last, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{last}"
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if m := _START.match(line):
                if collective is not None or rows:
                    raise NcclTestsError(f"{where}: a second test starts here; give one "
                                         f"nccl-tests run a file")
                collective = _collective(m.group(1))
                if collective is None:
                    raise NcclTestsError(f"{where}: {m.group(1)} is not a test the cost model "
                                         f"prices ({', '.join(f'{c}_perf' for c in RINGS)}, "
                                         f"alltoall_perf, sendrecv_perf)")
            elif m := _RANK.match(line):
                rank = int(m.group(1))
                if rank in ranks:
                    raise NcclTestsError(f"{where}: rank {rank} is listed twice")
                ranks[rank] = (m.group(4), m.group(6).strip())
            elif "Rank" in line.split()[1:2]:
                raise NcclTestsError(f"{where}: a rank line nccl-tests does not print "
                                     f"(expected '#  Rank N Group G Pid P on HOST device D [..] "
                                     f"NAME')")
            elif {"size", "algbw", "busbw"} <= set(line[1:].split()):
                header = line[1:].split()
            elif line[1:].strip().startswith("Avg bus bandwidth"):
                done = True
            elif (m := re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", line)) and int(m[1]):
                raise NcclTestsError(f"{where}: nccl-tests found {m[1]} values out of bounds "
                                     f"(a failed run)")
            continue
        tokens = line.split()
        if header is None or done or not tokens[0].isdigit():
            continue  # NCCL's own log lines, the launcher's: not nccl-tests' table
        rows.append(_row(tokens, header, where))
    end = f"{path}:{last}"
    if collective is None:
        collective = _collective(path.stem)
        if collective is None:
            raise NcclTestsError(f"{path}:1: cannot tell which nccl-tests binary wrote it: no "
                                 f"'# Collective test starting:' line, and the file name names "
                                 f"none of {', '.join(c + '_perf' for c in COLLECTIVES)}")
    if not ranks:
        raise NcclTestsError(f"{end}: no '#  Rank N ... on HOST device D' lines: the header "
                             f"that says how many ranks ran on which hosts is missing")
    if sorted(ranks) != list(range(len(ranks))):
        raise NcclTestsError(f"{end}: ranks {sorted(ranks)} are not 0..{len(ranks) - 1}: "
                             f"some rank lines are missing")
    if header is None:
        raise NcclTestsError(f"{end}: no column header ('# size count type redop root time "
                             f"algbw busbw #wrong ...'): not nccl-tests output, or cut short")
    if not rows:
        raise NcclTestsError(f"{end}: no rows under the column header (cut short?)")
    if not done:
        raise NcclTestsError(f"{end}: ends before '# Avg bus bandwidth', which nccl-tests "
                             f"prints after its last size: a partial run?")
    hosts: dict[str, int] = {}
    for host, _ in ranks.values():
        hosts[host] = hosts.get(host, 0) + 1
    if len(set(hosts.values())) > 1:
        counts = ", ".join(f"{h}: {c}" for h, c in hosts.items())
        raise NcclTestsError(f"{end}: hosts run different numbers of ranks ({counts}); the fit "
                             f"takes the same GPUs on every host")
    sizes, times = zip(*rows, strict=True)
    return NcclTest(path=path, collective=collective, ranks=len(ranks), hosts=len(hosts),
                    device=ranks[0][1], sizes=np.array(sizes, dtype=float),
                    times_s=np.array(times, dtype=float))


def _row(tokens: list[str], header: list[str], where: str) -> tuple[int, float]:
    """One table row: its size in bytes and the mean of its out-of-place and in-place times."""
    at = [i for i, name in enumerate(header) if name in ("time", "cputime")]
    columns = len([name for name in header if name != "timestamp"])
    if not at or len(tokens) < columns:
        raise NcclTestsError(f"{where}: a row of {len(tokens)} columns under a header of "
                             f"{columns} ({' '.join(header)}): cut short?")
    times = []
    for i in at:
        try:
            t_us = float(tokens[i])
            float(tokens[i + 1]), float(tokens[i + 2])  # algbw, busbw
        except (ValueError, IndexError):
            raise NcclTestsError(f"{where}: time, algbw and busbw must be numbers, but got "
                                 f"{' '.join(tokens[i:i + 3])!r}") from None
        wrong = tokens[i + 3] if i + 3 < len(tokens) else "N/A"
        if header[i + 3:i + 4] == ["#wrong"] and wrong != "N/A":
            try:
                bad = float(wrong)
            except ValueError:
                raise NcclTestsError(f"{where}: #wrong must be a number or N/A, but got "
                                     f"{wrong!r}") from None
            if bad > 0:
                raise NcclTestsError(f"{where}: {wrong} wrong elements: nccl-tests' check failed")
        if not t_us > 0:
            raise NcclTestsError(f"{where}: time must be > 0 microseconds, but got {tokens[i]}")
        times.append(t_us * 1e-6)
    try:
        size = int(tokens[header.index("size")])
    except ValueError:
        raise NcclTestsError(f"{where}: size must be a whole number of bytes, but got "
                             f"{tokens[0]!r}") from None
    return size, float(np.mean(times))


def read(paths: Sequence[Path]) -> list[NcclTest]:
    tests = []
    for path in paths:
        try:
            text = read_input(path, "nccl-tests file", MAX_FILE_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise NcclTestsError(f"{path}:1: not UTF-8 text") from None
        tests.append(parse(path, text))
    return tests


# -- the fit ---------------------------------------------------------------------------------

_ZERO = Link(nvlink_bw=np.inf, network_bw=np.inf, p2p_network_bw=np.inf, nvlink_latency_s=0.0,
             network_latency_s=0.0, call_overhead_s=0.0, domain=1)
# theta: inverse NVLink and network bandwidths, NVLink and network ring-step latencies
_UNIT = (replace(_ZERO, nvlink_bw=1.0), replace(_ZERO, network_bw=1.0),
         replace(_ZERO, nvlink_latency_s=1.0), replace(_ZERO, network_latency_s=1.0))


def _ring_time(t: NcclTest, x: np.ndarray, link: Link) -> np.ndarray:
    n = np.full_like(x, float(t.ranks))
    k = np.full_like(x, float(t.per_host))
    if t.collective == "all_reduce":
        return comm.all_reduce_time(x, n, k, link)
    return comm.gather_time(x, n, k, link)


def _design(t: NcclTest) -> np.ndarray:
    """The coefficients of theta in costmodel.comm's time of each row (linear in theta)."""
    return np.column_stack([_ring_time(t, t.sizes if i < 2 else np.zeros_like(t.sizes), u)
                            for i, u in enumerate(_UNIT)])


def _a2a_time(t: NcclTest, link: Link) -> np.ndarray:
    n = np.full_like(t.sizes, float(t.ranks))
    return comm.all_to_all_time(t.sizes, n, np.full_like(n, float(t.per_host)), link)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    calibration: ClusterCalibration
    fits: list[dict[str, Any]]  # per file: what it is and how well the fitted model prices it
    lines: list[str]


def fit(tests: Sequence[NcclTest], prior: Link | None = None, today: str | None = None) -> Fit:
    """The cluster's links from its nccl-tests (see the module docstring); ``prior``: the
    catalogued links that stand in for a tier no file measures."""
    rings = [t for t in tests if t.collective in RINGS and t.ranks > 1]
    theta, free = _fit_rings(rings, tests, prior)
    link = replace(_ZERO, nvlink_bw=1.0 / theta[0] if theta[0] > 0 else np.inf,
                   network_bw=1.0 / theta[1] if theta[1] > 0 else np.inf,
                   nvlink_latency_s=theta[2], network_latency_s=theta[3])
    fits = [_quality(t, _ring_time(t, t.sizes, link)) for t in rings]
    a2a = [t for t in tests if t.collective == "alltoall" and t.ranks > 1]
    ratio = _fit_all_to_all(a2a, link, free[0] or prior is not None,
                            free[1] or prior is not None)
    scaled = replace(link, nvlink_bw=link.nvlink_bw * ratio, network_bw=link.network_bw * ratio)
    fits += [_quality(t, _a2a_time(t, scaled)) for t in a2a]
    pairs = [t for t in tests if t.collective == "sendrecv" and t.hosts > 1]
    p2p, p2p_fits = _fit_p2p(pairs)
    fits += p2p_fits
    lines = [f"note: {t.path.name}: sendrecv within one host: the cost model prices an NVLink "
             f"hop at the ring's bandwidth, so it fits nothing"
             for t in tests if t.collective == "sendrecv" and t.hosts == 1]
    links = MeasuredLinks(
        nvlink_bw_bytes_per_s=1.0 / theta[0] if free[0] else 0.0,
        network_bw_bytes_per_s=1.0 / theta[1] if free[1] else 0.0,
        # a latency fitted to 0 is still measured (0 in the file means not measured)
        nvlink_step_latency_s=max(theta[2], 1e-9) if free[2] else 0.0,
        network_step_latency_s=max(theta[3], 1e-9) if free[3] else 0.0,
        p2p_network_bw_bytes_per_s=p2p)
    if not (links.nvlink_bw_bytes_per_s or links.network_bw_bytes_per_s or ratio or p2p):
        raise NcclTestsError(f"{tests[0].path}:1: no file measures a link the cost model "
                             f"prices: give all_reduce/all_gather/reduce_scatter files over one "
                             f"host and over several, alltoall or sendrecv across hosts")
    cal = ClusterCalibration(links=links, all_to_all_bw_ratio=ratio,
                             files=tuple(t.path.name for t in tests),
                             date=today or date.today().isoformat(),
                             device=", ".join(sorted({t.device for t in tests})))
    for t, q in zip([*rings, *a2a, *pairs], fits, strict=True):
        lines.append(f"{t.describe()}: fitted times within {100 * q['rms_error']:.1f}% rms "
                     f"(worst {100 * q['max_error']:.1f}%)")
    lines += _summary(links, ratio, prior is not None)
    return Fit(calibration=cal, fits=fits, lines=lines)


def _fit_rings(rings: list[NcclTest], tests: Sequence[NcclTest],
               prior: Link | None) -> tuple[np.ndarray, list[bool]]:
    """theta (inverse NVLink and network bandwidths, their ring-step latencies) and which of
    them the ring files identify: NVLink's from single-host files, the network's from
    multi-host ones; the others stay at ``prior`` (or 0)."""
    one_host = [t for t in rings if t.hosts == 1]
    many = [t for t in rings if t.hosts > 1]
    free = [bool(one_host), bool(many), bool(one_host), bool(many)]
    needs_nvlink = any(t.per_host > 1 for t in tests if t.hosts > 1)
    if many and needs_nvlink and not one_host and prior is None:
        raise NcclTestsError(f"{many[0].path}:1: spans {many[0].hosts} hosts, but no file runs on "
                             f"one host: give a single-host all_reduce/all_gather/reduce_scatter "
                             f"file too (its NVLink phase), or --gpu ID so the catalog's NVLink "
                             f"figure stands in")
    base = prior or _ZERO
    theta = np.array([1.0 / base.nvlink_bw, 1.0 / base.network_bw, base.nvlink_latency_s,
                      base.network_latency_s])
    if not rings:
        return theta, free
    fixed = [not f for f in free]
    a = np.vstack([_design(t) / t.times_s[:, None] for t in rings])
    b = np.ones(len(a)) - a[:, fixed] @ theta[fixed]
    cols = a[:, free]
    scale = np.maximum(np.linalg.norm(cols, axis=0), 1e-300)
    solved, _ = nnls(cols / scale, b)
    theta[free] = solved / scale
    for i, files in ((0, one_host), (1, many)):
        if free[i] and not theta[i] > 0:
            raise NcclTestsError(f"{files[0].path}:1: the times do not grow with the size: no "
                                 f"bandwidth can be fitted")
    return theta, free


def _fit_all_to_all(a2a: list[NcclTest], link: Link, nvlink_known: bool,
                    network_known: bool) -> float:
    """The all-to-all's bandwidth over the ring's on the same links (0: no file)."""
    if not a2a:
        return 0.0
    for t in a2a:
        tier, known = (("network", network_known) if t.hosts > 1 else ("NVLink", nvlink_known))
        if not known:
            raise NcclTestsError(f"{t.path}:1: the cost model prices an all-to-all as a ratio of "
                                 f"the ring's {tier} bandwidth: give an all_reduce or all_gather "
                                 f"file over the same hosts too")

    def loss(log_r: float) -> float:
        r = float(np.exp(log_r))
        scaled = replace(link, nvlink_bw=link.nvlink_bw * r, network_bw=link.network_bw * r)
        return float(sum(np.sum((_a2a_time(t, scaled) / t.times_s - 1.0) ** 2) for t in a2a))
    return float(np.exp(minimize_scalar(loss, bounds=(-5.0, 3.0), method="bounded").x))


def _fit_p2p(pairs: list[NcclTest]) -> tuple[float, list[dict[str, Any]]]:
    """One send/receive pair's network bandwidth (0: no file), as costmodel.comm.p2p_time
    prices it: size / bandwidth + a step."""
    if not pairs:
        return 0.0, []
    x = np.concatenate([t.sizes for t in pairs])
    y = np.concatenate([t.times_s for t in pairs])
    (u, lat), _ = nnls(np.column_stack([x / y, 1.0 / y]), np.ones_like(y))
    if not u > 0:
        raise NcclTestsError(f"{pairs[0].path}:1: the times do not grow with the size: no "
                             f"bandwidth can be fitted")
    return 1.0 / u, [_quality(t, t.sizes * u + lat) for t in pairs]


def _quality(t: NcclTest, predicted: np.ndarray) -> dict[str, Any]:
    err = predicted / t.times_s - 1.0
    return {"file": t.path.name, "collective": t.collective, "ranks": t.ranks, "hosts": t.hosts,
            "sizes": len(t.sizes), "rms_error": round(float(np.sqrt(np.mean(err ** 2))), 4),
            "max_error": round(float(np.max(np.abs(err))), 4)}


def _summary(m: MeasuredLinks, ratio: float, prior: bool) -> list[str]:
    stand_in = "the catalog's --gpu figure stands in" if prior else "the family's stays"
    out = []
    for tier, bw, lat in (("NVLink", m.nvlink_bw_bytes_per_s, m.nvlink_step_latency_s),
                          ("network", m.network_bw_bytes_per_s, m.network_step_latency_s)):
        out.append(f"{tier}: {bw / 1e9:.1f} GB/s bus bandwidth per GPU, {lat * 1e6:.2f} us a "
                   f"ring step" if bw else f"{tier}: not measured ({stand_in})")
    if ratio:
        out.append(f"all-to-all: {ratio:.3f} of the ring's bandwidth")
    if m.p2p_network_bw_bytes_per_s:
        out.append(f"network send/receive: {m.p2p_network_bw_bytes_per_s / 1e9:.1f} GB/s")
    return out
