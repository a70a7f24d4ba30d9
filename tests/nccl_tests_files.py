"""nccl-tests output files made from a known model of a cluster, in the format nccl-tests prints
(github.com/NVIDIA/nccl-tests, src/util.cu: writeDeviceReport, writeResultHeader,
writeBenchmarkLinePreamble / writeBenchmarkLineBody with getFloatStr's widths,
writeResultFooter; bus bandwidths by doc/PERFORMANCE.md's factors).

The known model: a hierarchical ring (each GPU has its own NIC), the rule NCCL's bus bandwidth
is defined by: an all-gather of S bytes over n ranks, k per host on H hosts, moves
S(k-1)/k on NVLink and S(H-1)/H/k on the network per GPU, each at its link's bus bandwidth, and
waits n - 1 ring steps; an all-reduce does it twice; an all-to-all sends S(k-1)/n on NVLink and
S(n-k)/n on the network concurrently at ``A2A`` of those bandwidths and waits one step; a
sendrecv across hosts streams S at ``P2P`` and waits one network step.
"""

from __future__ import annotations

import math
from pathlib import Path

NV = 360e9  # NVLink bus bandwidth per GPU, bytes/s
NET = 42e9  # network bus bandwidth per GPU
NV_STEP = 2.5e-6  # one ring step on NVLink, s
NET_STEP = 9e-6  # one ring step across the network
A2A = 0.8  # the all-to-all's bandwidth over the ring's
P2P = 46e9  # one send/receive pair across the network

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
              "sendrecv": lambda n: 1.0}


def true_time_s(collective: str, size: float, hosts: int, per_host: int) -> float:
    n, k, h = hosts * per_host, per_host, hosts
    if collective in ("all_reduce", "all_gather", "reduce_scatter"):
        passes = 2 if collective == "all_reduce" else 1
        if h == 1:
            return passes * (size * (n - 1) / n / NV + (n - 1) * NV_STEP)
        return passes * (size * ((k - 1) / k / NV + (h - 1) / h / k / NET) + (n - 1) * NET_STEP)
    if collective == "alltoall":
        step = NET_STEP if h > 1 else NV_STEP
        return max(size * (k - 1) / n / (NV * A2A), size * (n - k) / n / (NET * A2A)) + step
    assert collective == "sendrecv"
    return size / P2P + NET_STEP if h > 1 else size / NV + NV_STEP


def _float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: two decimals, fewer where the width runs out."""
    for spec in (".2f", ".1f", ".0f"):
        text = f"{value:{width}{spec}}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}"


def output(collective: str, hosts: int, per_host: int, *, noise: float = 0.01,
           min_bytes: int = 8, max_bytes: int = 8 << 30) -> str:
    """The stdout of ``mpirun -np <hosts*per_host> -N <per_host> ./build/<collective>_perf -b
    8 -e 8G -f 2 -g 1`` on the known cluster; times off the model by up to ``noise``
    (a fixed pattern, so the file is the same every run)."""
    n = hosts * per_host
    program = f"{collective}_perf"
    lines = ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
             f"# Collective test starting: {program}",
             f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) "
             "warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0",
             "#", "# Using devices"]
    for rank in range(n):
        host, dev = f"node-{rank // per_host:02d}", rank % per_host
        lines.append(f"#  Rank {rank:2d} Group {0:2d} Pid {4000 + rank:6d} on {host:>10s} "
                     f"device {dev:2d} [{0:04x}:{0x18 + dev:02x}:{0:02x}] NVIDIA H100 80GB HBM3")
    lines += ["#", f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           "
              "out-of-place                       in-place          ",
              f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  "
              f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  "
              f"{'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} ",
              f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  "
              f"{'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  "
              f"{'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s} "]
    redop = "sum" if collective in ("all_reduce", "reduce_scatter") else "none"
    size, i, busbws = min_bytes, 0, []
    while size <= max_bytes:
        row = f"{size:12d}  {size // 4:12d}  {'float':>8s}  {redop:>6s}  {-1:6d}"
        for place in (0, 1):
            wiggle = 1.0 + noise * math.sin(1.7 * i + 0.9 * place)
            t = true_time_s(collective, size, hosts, per_host) * wiggle
            algbw = size / t / 1e9
            busbw = algbw * BUS_FACTOR[collective](n)
            busbws.append(busbw)
            row += (f"  {_float(t * 1e6, 7)}  {_float(algbw, 6)}  {_float(busbw, 6)}  "
                    f"{0:6g}")
        lines.append(row)
        size, i = size * 2, i + 1
    lines += ["# Out of bounds values : 0 OK",
              f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):g} ", "#",
              f"# Collective test concluded: {program}", "#", ""]
    return "\n".join(lines)


def write_set(folder: Path) -> list[Path]:
    """2 nodes x 8 GPUs: all_reduce, all_gather, alltoall; one node: all_reduce."""
    files = []
    for collective, hosts in (("all_reduce", 2), ("all_gather", 2), ("alltoall", 2),
                              ("all_reduce", 1)):
        path = folder / f"{collective}_{hosts}x8.txt"
        path.write_text(output(collective, hosts, 8))
        files.append(path)
    return files
