"""One rank of a validation run: ``python -m tcf_search.validate.worker CONFIG.json OUT_DIR``.

Reads the torchrun environment contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so the same module runs under ``torchrun`` on a GPU machine and
under ``tcf_search.validate.launch`` on CPU. Writes ``rank-<r>.json`` (a ``RankReport``) or
``failed-<r>.json`` (outcome and error) into OUT_DIR, and exits 0, 3 (out of memory) or 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tcf_search.validate.config import RankReport, RunConfig

if TYPE_CHECKING:
    import torch

EXIT_OOM = 3
# Full, exactly seeded weights are built on every rank up to this size; past it each rank
# initialises only its own shard (numerics then differ between layouts, which is fine at scale).
FULL_INIT_MAX_PARAMS = 200_000_000


def _chunk_builder(cfg: RunConfig, device: torch.device) -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    from tcf_search.validate.model import Decoder, init_weights
    from tcf_search.validate.parallel import stage_layers

    plan, m = cfg.plan, cfg.model
    ranges = stage_layers(m.layers, plan)
    n_stages = len(ranges)
    full_init = _param_estimate(cfg) <= FULL_INIT_MAX_PARAMS

    def build(stage_id: int) -> Decoder:
        with torch.device("cpu" if full_init else "meta"):
            chunk = Decoder(m, cfg.training.seq_len)
        chunk.keep_stage(ranges[stage_id], first=stage_id == 0, last=stage_id == n_stages - 1)
        if full_init:
            init_weights(chunk, cfg.seed)
            chunk.to(device)
        return chunk

    def materialize(module: nn.Module) -> None:
        if full_init:
            return
        module.to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(cfg.seed + dist.get_rank())
        with torch.no_grad():
            for p in module.parameters():
                local = p.to_local() if hasattr(p, "to_local") else p
                if local.dim() == 1:
                    local.fill_(1.0)
                else:
                    local.normal_(0.0, 0.02, generator=gen)
        for sub in module.modules():
            if isinstance(sub, Decoder):
                sub.reset_rope()

    return build, materialize


def _param_estimate(cfg: RunConfig) -> int:
    m = cfg.model
    per_layer = 4 * m.hidden * m.heads * m.d_head + 3 * m.hidden * m.ffn_hidden
    return m.layers * per_layer + 2 * m.vocab * m.hidden


def _limit_heap(limit_bytes: int) -> None:
    """Cap this process's data segment at its current RSS plus ``limit_bytes`` so that a CPU run
    meets a real allocation failure, as a GPU would at its HBM size."""
    if limit_bytes <= 0:
        return
    # RLIMIT_DATA counts the data segment and private mappings (VmData), not the RSS
    used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    used = int(line.split()[1]) * 1024
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_DATA, (used + limit_bytes, resource.RLIM_INFINITY))


def _inject(cfg: RunConfig, rank: int) -> None:
    """The test hook: fail the last rank before it does anything (so that the test is fast);
    the other ranks then wait for it in the rendezvous, as they would in a collective."""
    if cfg.fault == "none" or rank != cfg.world_size - 1:
        return
    if cfg.fault == "crash":
        raise RuntimeError("injected crash (fault='crash')")
    if cfg.fault == "hang":
        time.sleep(10**6)
    if cfg.fault == "oom":
        raise MemoryError("injected out-of-memory (fault='oom')")


def run_rank(cfg: RunConfig, out_dir: Path) -> RankReport:
    rank = int(os.environ["RANK"])
    _inject(cfg, rank)
    # FSDP2 warns that the root returns a view (the logits); nothing here modifies it in place.
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    import torch
    import torch.distributed as dist

    from tcf_search.validate.memory import measure_step
    from tcf_search.validate.parallel import build_mesh, parallelize, uses_ddp
    from tcf_search.validate.steps import Stepper

    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size))
    if cfg.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        backend = "gloo"
    dist.init_process_group(backend, timeout=timedelta(minutes=10))
    mesh = build_mesh(cfg.plan, device.type)
    low_precision = cfg.device == "cuda" and cfg.training.precision in ("bf16", "fp8")
    dtype = torch.bfloat16 if low_precision else None
    build, materialize = _chunk_builder(cfg, device)
    par = parallelize(cfg.plan, mesh, build, materialize, param_dtype=dtype)
    # FSDP2 casts parameters itself (MixedPrecisionPolicy); DDP needs autocast.
    stepper = Stepper(par=par, plan=cfg.plan, training=cfg.training, vocab=cfg.model.vocab,
                      device=device, autocast_dtype=dtype if uses_ddp(cfg.plan) else None,
                      seed=cfg.seed)
    _limit_heap(cfg.memory_limit_bytes)

    losses = [stepper.step(step) for step in range(cfg.warmup)]
    mem = measure_step(stepper, par.chunks, par.optimizer, step=cfg.warmup,
                       track=cfg.track_memory and cfg.device == "cpu")
    losses.append(mem.loss)
    if cfg.device == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    for step in range(cfg.warmup + 1, cfg.warmup + 1 + cfg.steps):
        _sync(device)
        start = time.perf_counter()
        losses.append(stepper.step(step))
        _sync(device)
        times.append(time.perf_counter() - start)
    peak, reserved, parts, source = mem.peak_bytes, 0.0, mem.parts, mem.source
    if cfg.device == "cuda":
        peak = float(max(peak, torch.cuda.max_memory_allocated(device)))
        reserved = float(torch.cuda.max_memory_reserved(device))
        source = "cuda_max_memory_allocated"
    report = RankReport(
        rank=rank, step_times_s=times, losses=losses, peak_bytes=peak, reserved_bytes=reserved,
        rss_peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
        memory_parts=parts, memory_maxima=mem.maxima,
        layer_activation_bytes=mem.layer_activations, memory_source=source,
        notes=par.notes + mem.notes)
    dist.barrier()
    dist.destroy_process_group()
    return report


def _sync(device: torch.device) -> None:
    import torch
    import torch.distributed as dist
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "can't allocate memory" in text or "not enough memory" in text


def main(argv: list[str]) -> int:
    if sys.platform.startswith("linux"):
        # A rank dies with its launcher, even a SIGKILLed one: no orphan holds a port or a core.
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != int(os.environ.get("TCF_LAUNCHER_PID", os.getppid())):
            return 1  # the launcher died before this rank got here
    cfg_path, out_dir = Path(argv[0]), Path(argv[1])
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = RunConfig.from_json(cfg_path.read_text())
        report = run_rank(cfg, out_dir)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the plan's outcome
        oom = _is_oom(exc)
        failure = {"rank": rank, "outcome": "oom" if oom else "crash",
                   "error": f"{type(exc).__name__}: {exc}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
        (out_dir / f"failed-{rank}.json").write_text(json.dumps(failure))
        return EXIT_OOM if oom else 1
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(dataclasses.asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
