"""``tcf-search calibrate``: measure this machine's "device" (a GPU, or one CPU rank) and write it
as a catalog entry, every number sourced "measured by tcf-search calibrate on <host> <date>".

What is measured, and which field it sets:

- (on CPU, on every rank at once, as the ranks of a run share the caches and the DRAM)
  GEMM throughput over square sizes x: fitted to ``A * x / (x + h)`` (the cost model's GEMM
  saturation curve): ``peak_flops_*`` = A (the large-GEMM asymptote, so
  ``gemm_peak_fraction`` = 1) and ``gemm_half_size`` = h. On CPU the dtype is fp32, the one
  CPU validation runs compute in.
- a large copy: ``hbm_bw_bytes_per_s``; an elementwise add against it: ``memory_bw_fraction``.
- a one-element op: ``kernel_overhead_s``. Causal SDPA: ``attention_peak_fraction``.
- all-reduce over ``ranks`` processes (gloo on CPU, NCCL on GPU), sizes 16 KiB..16 MiB, fitted
  to ``t = c + bytes * 2(n-1)/n / bw``: ``intra_node_bw_bytes_per_s`` = bw (so
  ``nvlink_bw_fraction`` = 1), ``intra_node_latency_s`` from a small send/recv, and
  ``collective_overhead_s`` = what of c the ring steps' latency does not explain. One host has
  no network: the network fields repeat the intra-node ones (noted).
- the validation harness's own decoder layers, TP over the ranks with sequence parallel
  (DTensor), against the same layers unsharded, at a width where compute is negligible: the
  excess per layer (forward and backward) less the time of its eight small SP collectives is the
  host cost of DTensor; ``dtensor_op_overhead_s`` spreads it over the layer's tensor ops as the
  cost model counts them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodel.errors import TcfError
from costmodel.specs import Efficiency, GpuSpec
from search.inputs import MIB, load_yaml, read_input, shown

GIB = 2**30
GEMM_SIZES = (64, 128, 256, 512, 1024)
COLLECTIVE_BYTES = tuple(2**k for k in range(14, 25, 2))


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A catalog entry: the GpuSpec, a source per field, and the raw measurements."""

    gpu: GpuSpec
    sources: dict[str, str]
    notes: str = ""
    measurements: dict[str, Any] = field(default_factory=dict)


def stamp() -> str:
    return (f"measured by tcf-search calibrate on {platform.node() or 'localhost'} "
            f"{datetime.date.today().isoformat()}")


def fit_saturation(sizes: list[float], flops_per_s: list[float]) -> tuple[float, float]:
    """(A, h) of ``f(x) = A x / (x + h)`` by least squares on 1/f = 1/A + (h/A)(1/x)."""
    x, y = 1.0 / np.asarray(sizes, float), 1.0 / np.asarray(flops_per_s, float)
    slope, intercept = np.polyfit(x, y, 1)
    if intercept <= 0:  # no saturation seen: the largest size is the asymptote
        return float(max(flops_per_s)), 1.0
    half = float(max(slope / intercept, 1.0))
    if half > max(sizes):
        # a half-saturation size beyond every size measured extrapolates an asymptote that
        # was never seen (noisy timings make it explode): hold h at the largest size and take
        # A from the measurements through the curve
        half = float(max(sizes))
        f, s = np.asarray(flops_per_s, float), np.asarray(sizes, float)
        return float(np.median(f * (s + half) / s)), half
    return float(1.0 / intercept), half


def fit_bandwidth(sizes: list[float], seconds: list[float], n: int) -> tuple[float, float]:
    """(bus bandwidth, fixed cost) of ``t = c + bytes * 2(n-1)/n / bw`` (ring all-reduce)."""
    x = np.asarray(sizes, float) * 2 * (n - 1) / n
    slope, intercept = np.polyfit(x, np.asarray(seconds, float), 1)
    return float(1.0 / max(slope, 1e-15)), float(max(intercept, 0.0))


def _timeit(fn: Any, repeat: int, sync: Any) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_compute(device: str, threads: int, quick: bool) -> dict[str, Any]:
    """GEMM, memory bandwidth, kernel overhead and attention, in this process."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    repeat = 3 if quick else 7
    sizes: tuple[int, ...] = GEMM_SIZES[:-1] if quick and device == "cpu" else GEMM_SIZES
    if device == "cuda":
        sizes = (256, 512, 1024, 2048, 4096, 8192)
    gemm: dict[int, float] = {}
    for n in sizes:
        a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
        t = _timeit(lambda a=a, b=b: a @ b, repeat, sync)
        gemm[n] = 2.0 * n**3 / t
    elems = (2**24 if device == "cpu" else 2**28) // (4 if quick else 1)
    x, y, z = (torch.empty(elems, device=dev, dtype=torch.float32) for _ in range(3))
    x.normal_()
    y.normal_()
    copy_bw = 2 * 4 * elems / _timeit(lambda: z.copy_(x), repeat, sync)
    add_bw = 3 * 4 * elems / _timeit(lambda: torch.add(x, y, out=z), repeat, sync)
    one = torch.ones(1, device=dev)
    out = torch.empty(1, device=dev)
    calls = 2000

    def tiny_ops() -> None:
        for _ in range(calls):
            torch.add(one, one, out=out)

    kernel_s = _timeit(tiny_ops, 3, sync) / calls
    s, heads, d = (512, 8, 64) if device == "cpu" else (4096, 32, 128)
    q, k, v = (torch.randn(1, heads, s, d, device=dev, dtype=dtype) for _ in range(3))
    attn_s = _timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeat,
                     sync)
    attn_flops = 4.0 * s * (s / 2) * heads * d / attn_s
    return {"dtype": str(dtype).removeprefix("torch."), "threads": threads,
            "gemm_flops_per_s": gemm, "copy_bytes_per_s": copy_bw, "add_bytes_per_s": add_bw,
            "kernel_overhead_s": kernel_s, "attention_flops_per_s": attn_flops}


def _collective_worker(out_path: str, device: str, quick: bool) -> None:
    """One rank of the collective benchmark (run by ``spawn_ranks``)."""
    import resource

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(dev)) if device == "cuda" else (lambda: None)
    compute = None
    if device == "cpu":  # every rank at once: the ranks of a run share caches and DRAM
        dist.barrier()
        threads = max(1, (os.cpu_count() or 1) // dist.get_world_size())
        compute = measure_compute(device, threads, quick)
    repeat = 3 if quick else 7
    times = {}
    for size in COLLECTIVE_BYTES:
        buf = torch.ones(size // 4, device=dev)
        times[size] = _timeit(lambda buf=buf: dist.all_reduce(buf), repeat, sync)
    small = torch.ones(1, device=dev)
    p2p_calls = 50

    def ping() -> None:
        for _ in range(p2p_calls):
            if rank == 0:
                dist.send(small, 1)
                dist.recv(small, 1)
            elif rank == 1:
                dist.recv(small, 0)
                dist.send(small, 0)

    p2p_s = _timeit(ping, 3, sync) / (2 * p2p_calls)
    dtensor_s = _dtensor_op_overhead(dev, sync)
    runtime_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        runtime_bytes = total - free
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps({
            "all_reduce_s": times, "p2p_s": p2p_s, "runtime_bytes": runtime_bytes,
            "dtensor_op_overhead_s": dtensor_s, "compute": compute,
            "world": dist.get_world_size()}))
    dist.destroy_process_group()


def _dtensor_op_overhead(dev: Any, sync: Any) -> float:
    """Host time per tensor op that DTensor adds to a TP layer (see the module docstring): the
    harness's decoder layers with TP+SP over this process group, forward and backward, against
    the same layers unsharded and against the layers' SP collectives alone."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from costmodel.kernels import BWD_HOST_FACTOR
    from costmodel.parallel.tensor import DTENSOR_OPS_PER_LAYER_FWD
    from costmodel.specs import ModelSpec
    from tcf_search.validate.model import Decoder
    from tcf_search.validate.parallel import apply_tensor_parallel

    world = int(os.environ["WORLD_SIZE"])
    layers, seq, width = 4, 8 * world, 16 * world
    spec = ModelSpec(name="dtensor-probe", layers=layers, hidden=width, ffn_hidden=2 * width,
                     heads=world, kv_heads=world, vocab=64)

    def stack() -> Any:
        torch.manual_seed(0)
        return Decoder(spec, seq).keep_stage(range(layers), first=False, last=False).to(dev)

    def step(model: Any, x: Any) -> None:
        model(x).sum().backward()

    plain = stack()
    sharded = stack()
    apply_tensor_parallel(sharded, init_device_mesh(dev.type, (world,)), True)
    full = torch.randn(1, seq, width, device=dev, requires_grad=True)
    local = torch.randn(1, seq // world, width, device=dev, requires_grad=True)
    shard = torch.ones(seq // world * width, device=dev)
    gathered = [torch.empty_like(shard) for _ in range(world)]

    def collectives() -> None:  # per layer: 2 all-gathers + 2 reduce-scatters each way
        for _ in range(8 * layers):
            dist.all_gather(gathered, shard)

    t_plain = _timeit(lambda: step(plain, full), 7, sync)
    t_tp = _timeit(lambda: step(sharded, local), 7, sync)
    t_comm = _timeit(collectives, 7, sync)
    per_layer = max(t_tp - t_plain - t_comm, 0.0) / layers
    return per_layer / (DTENSOR_OPS_PER_LAYER_FWD * (1.0 + BWD_HOST_FACTOR))


def measure_collectives(device: str, ranks: int, quick: bool) -> dict[str, Any]:
    from tcf_search.validate.launch import spawn_ranks

    work = Path(tempfile.mkdtemp(prefix="tcf-calibrate-"))
    out = work / "collectives.json"
    cmd = [sys.executable, "-m", "tcf_search.calibration.device", "--collective-worker",
           str(out), device, "quick" if quick else "full"]
    codes, timed_out, _ = spawn_ranks(cmd, ranks, work, timeout_s=300.0)
    if timed_out or any(codes) or not out.exists():
        log = (work / "log-0.txt").read_text(errors="replace")[-800:]
        raise RuntimeError(f"collective benchmark failed (exit codes {codes}): {log}")
    raw = json.loads(out.read_text())
    raw["all_reduce_s"] = {int(k): v for k, v in raw["all_reduce_s"].items()}
    if raw.get("compute"):
        raw["compute"]["gemm_flops_per_s"] = {int(k): v for k, v in
                                              raw["compute"]["gemm_flops_per_s"].items()}
    return dict(raw)


def machine_memory_bytes(device: str, ranks: int) -> float:
    if device == "cuda":
        import torch
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / ranks


def measure_machine(*, device: str = "cpu", ranks: int = 2, quick: bool = False) -> Entry:
    """Run every micro-benchmark and assemble the entry."""
    threads = max(1, (os.cpu_count() or 1) // ranks) if device == "cpu" else 1
    coll = measure_collectives(device, ranks, quick)
    # CPU ranks compute side by side in a run, so they are measured side by side (in the
    # collective workers); a GPU's own kernels do not contend with the other GPUs'
    comp = coll.get("compute") or measure_compute(device, threads, quick)
    sizes = sorted(comp["gemm_flops_per_s"])
    peak, half = fit_saturation(sizes, [comp["gemm_flops_per_s"][n] for n in sizes])
    ar_sizes = sorted(coll["all_reduce_s"])
    bw, fixed = fit_bandwidth(ar_sizes, [coll["all_reduce_s"][s] for s in ar_sizes], ranks)
    latency = coll["p2p_s"]
    overhead = max(fixed - 2 * (ranks - 1) * latency, 1e-7)
    where = stamp()
    dtype = comp["dtype"]
    eff = Efficiency(
        gemm_peak_fraction=1.0, gemm_half_size=half,
        attention_peak_fraction=min(comp["attention_flops_per_s"] / peak, 1.0),
        memory_bw_fraction=min(comp["add_bytes_per_s"] / comp["copy_bytes_per_s"], 1.0),
        kernel_overhead_s=comp["kernel_overhead_s"], collective_overhead_s=overhead,
        nvlink_bw_fraction=1.0, network_bw_fraction=1.0, p2p_network_bw_fraction=1.0,
        dtensor_op_overhead_s=float(coll.get("dtensor_op_overhead_s", 0.0)), source=where)
    is_cpu = device == "cpu"
    gpu = GpuSpec(
        id="cpu-local" if is_cpu else "cuda-local",
        name=f"{platform.processor() or platform.machine()} ({ranks} ranks, {threads} threads "
             f"each)" if is_cpu else _cuda_name(),
        family="cpu" if is_cpu else "local",
        peak_flops_bf16=peak, peak_flops_fp16=peak, peak_flops_fp8=peak,
        hbm_bytes=machine_memory_bytes(device, ranks), hbm_bw_bytes_per_s=comp["copy_bytes_per_s"],
        intra_node_bw_bytes_per_s=bw, intra_node_domain_size=ranks, network_bw_bytes_per_s=bw,
        intra_node_latency_s=latency, network_latency_s=latency,
        memory_reserve_bytes=float(coll["runtime_bytes"]), efficiency=eff)
    sources = {
        "peak_flops_bf16": f"{where}: {dtype} GEMM asymptote A of A*x/(x+h) fitted over "
                           f"square sizes {sizes}",
        "peak_flops_fp16": f"{where}: not measured separately; the {dtype} figure",
        "peak_flops_fp8": f"{where}: not measured (no fp8 GEMM here); the {dtype} figure",
        "hbm_bytes": f"{where}: physical memory / {ranks} ranks" if is_cpu
                     else f"{where}: torch.cuda total_memory",
        "hbm_bw_bytes_per_s": f"{where}: fp32 copy of {4 * 2**24 // 2**20} MiB class buffers",
        "intra_node_bw_bytes_per_s": f"{where}: ring all-reduce bus bandwidth over {ranks} "
                                     f"ranks, sizes {ar_sizes[0]}..{ar_sizes[-1]} bytes",
        "intra_node_domain_size": f"{where}: ranks on this host",
        "network_bw_bytes_per_s": f"{where}: one host, no network; the intra-node figure",
        "intra_node_latency_s": f"{where}: one-way time of a 4-byte send/recv",
        "network_latency_s": f"{where}: one host, no network; the intra-node figure",
        "memory_reserve_bytes": f"{where}: " + ("max RSS of a rank after import and "
                                                "init_process_group (runtime)" if is_cpu else
                                                "device memory in use after init"),
    }
    return Entry(gpu=gpu, sources=sources, measurements={"compute": comp, "collectives": coll},
                 notes=f"A {'CPU rank' if is_cpu else 'GPU'} of this machine as the cost model "
                       f"sees it. Efficiency: {where}.")


def _cuda_name() -> str:
    import torch
    return str(torch.cuda.get_device_name(0))


def catalog_yaml(entry: Entry) -> str:
    """The entry in the catalog's file shape (``{value, source}`` per field) plus an
    ``efficiency`` block and the raw ``measurements`` as a comment-free appendix."""
    g = entry.gpu
    doc: dict[str, Any] = {"id": g.id, "name": g.name, "family": g.family, "notes": entry.notes}
    for f in dataclasses.fields(GpuSpec):
        if f.name in ("id", "name", "family", "efficiency"):
            continue
        value = getattr(g, f.name)
        doc[f.name] = {"value": value, "source": entry.sources.get(f.name, stamp())}
    # its own figures, not the family's measured cluster's fabric they were read from
    doc["efficiency"] = {k: v for k, v in dataclasses.asdict(g.efficiency).items()
                         if k != "network_fabric"}
    doc["measurements"] = json.loads(json.dumps(entry.measurements, default=str))
    return yaml.safe_dump(doc, sort_keys=False, width=100)


class EntryError(TcfError):
    """A ``--gpu-file`` is not a catalog entry as :func:`catalog_yaml` writes it."""


def load_entry(path: Path) -> Entry:
    """Read back what :func:`catalog_yaml` wrote (a regular file of at most 4 MiB, YAML with
    bounded aliases); anything else is one :class:`EntryError` line."""
    try:
        doc = load_yaml(read_input(Path(path), "--gpu-file", 4 * MIB).decode("utf-8"),
                        "--gpu-file")
        return _entry(doc)
    except UnicodeDecodeError:
        raise EntryError(f"--gpu-file: {path} is not UTF-8 text") from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, TcfError):
            raise EntryError(str(exc)) from None
        raise EntryError(f"--gpu-file: {path} is not a catalog entry written by calibrate "
                         f"({type(exc).__name__}: {shown(str(exc))})") from None


def _entry(doc: Any) -> Entry:
    numeric = {f.name for f in dataclasses.fields(GpuSpec)} - {"id", "name", "family",
                                                                "efficiency"}
    values: dict[str, Any] = {}
    for name in numeric:
        item = doc[name]
        values[name] = item["value"] if "value" in item else item["value_gib"] * GIB
    values["intra_node_domain_size"] = int(values["intra_node_domain_size"])
    eff = Efficiency(**doc.get("efficiency", {}))
    gpu = GpuSpec(id=doc["id"], name=doc["name"], family=doc["family"], efficiency=eff,
                  **values)
    return Entry(gpu=gpu, sources={k: doc[k]["source"] for k in numeric},
                 notes=doc.get("notes", ""), measurements=doc.get("measurements", {}))


if __name__ == "__main__" and sys.argv[1:2] == ["--collective-worker"]:
    _collective_worker(sys.argv[2], sys.argv[3], sys.argv[4] == "quick")
