"""Validation benchmark: predicted against measured on this machine.

1. Calibrate this CPU (2 gloo ranks) into a catalog entry (or read one with --gpu-file).
2. The tiny CPU study's model (preset ``tiny``, seq 256, 16 sequences a step) under DP2,
   TP2+SP, PP2 (1F1B) and FSDP2: real runs, step time and tracked peak memory against the cost
   model's prediction on the calibrated entry; Spearman before and after refitting.
3. Memory-only: Llama 3 8B FSDP on 8 fake ranks and Llama 3 70B TP8 x PP4 (first stage),
   tracker against the cost model per memory part (PyTorch layout, see
   tcf_search.validate.agreement).

    python benchmarks/bench_validate.py [--gpu-file cpu-local.yaml] [--skip-real] [--skip-memory]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate  # noqa: E402
from hardware_catalog import get_gpu  # noqa: E402
from search.inputs.planfile import PlanFile  # noqa: E402
from search.inputs.presets import get_preset  # noqa: E402
from search.inputs.specs import training_spec  # noqa: E402
from tcf_search.calibration.device import Entry, load_entry, measure_machine  # noqa: E402
from tcf_search.calibration.refit import fit_efficiency  # noqa: E402
from tcf_search.validate.agreement import (  # noqa: E402
    PARTS,
    measured_parts,
    part_errors,
    predicted_parts,
    spearman,
)
from tcf_search.validate.config import RunConfig, as_run  # noqa: E402
from tcf_search.validate.launch import launch  # noqa: E402

MIB, GIB = 2**20, 2**30
TINY_PLANS = {
    "DP2": Plan(dp=2, micro_batch=4),
    "TP2+SP": Plan(tp=2, sequence_parallel=True, micro_batch=4),
    "PP2 1F1B": Plan(pp=2, micro_batch=4),
    "FSDP2": Plan(dp=2, zero_stage=3, micro_batch=4),
}


def real_runs(entry: Entry, steps: int) -> None:
    # the harness is PyTorch-native (FSDP2, DTensor TP/SP, pipelining): the torchtitan profile
    model = get_preset("tiny")
    # and on CPU it runs without autocast: fp32 activations
    training = as_run(training_spec(framework="torchtitan", precision="bf16", seq_len=256,
                                    global_batch=16), "cpu")
    cluster = ClusterSpec(gpu=entry.gpu, num_gpus=2, gpus_per_node=2)
    print(f"\n== tiny CPU study: {model.name}, seq 256, 16 sequences/step, 2 gloo ranks, "
          f"{steps} timed steps (fp32 on CPU) ==")
    print(f"{'plan':<10} {'pred s':>8} {'meas s':>8} {'err':>6} {'pred MiB':>9} "
          f"{'meas MiB':>9} {'loss0':>7} {'wall s':>6}")
    pred, meas, plan_files = [], [], []
    for name, plan in TINY_PLANS.items():
        est = estimate(model, cluster, plan, training)
        fp32 = predicted_parts(model, cluster, plan, training)  # activations in fp32 already
        pred_mib = (fp32["weights"] + fp32["grads"] + fp32["optimizer"]
                    + fp32["activations"]) / MIB
        r = launch(RunConfig(model=model, plan=plan, training=training, steps=steps, warmup=1),
                   timeout_s=600)
        if r.outcome != "ok":
            print(f"{name:<10} {est.step_time_s:8.3f} {'-':>8} {r.outcome}: {r.error[:200]}")
            continue
        parts = measured_parts(r.memory_maxima, r.layer_activation_bytes)
        meas_mib = sum(parts[k] for k in PARTS) / MIB
        print(f"{name:<10} {est.step_time_s:8.3f} {r.step_time_s:8.3f} "
              f"{100 * (r.step_time_s / est.step_time_s - 1):+5.0f}% {pred_mib:9.1f} "
              f"{meas_mib:9.1f} {r.loss_first:7.3f} {r.wall_s:6.1f}")
        pred.append(est.step_time_s)
        meas.append(r.step_time_s)
        plan_files.append(PlanFile(study="tiny-cpu", model=model, gpu=entry.gpu.id, num_gpus=2,
                                   gpus_per_node=2, training=training, plan=plan))
    if len(meas) < 2:
        return
    print(f"Spearman (step time), calibrated entry: {spearman(pred, meas):+.3f}")
    import numpy as np
    eff = fit_efficiency(plan_files, np.asarray(meas), entry)
    refit = Entry(gpu=__import__("dataclasses").replace(entry.gpu, efficiency=eff),
                  sources=entry.sources)
    after = [estimate(pf.model, ClusterSpec(gpu=refit.gpu, num_gpus=2, gpus_per_node=2),
                      pf.plan, training).step_time_s for pf in plan_files]
    errors = [abs(math.log(a / m)) for a, m in zip(after, meas, strict=True)]
    print(f"after refit (gemm_peak_fraction={eff.gemm_peak_fraction:.3g}, kernel_overhead_s="
          f"{eff.kernel_overhead_s:.3g}, collective_overhead_s={eff.collective_overhead_s:.3g}):"
          f" Spearman {spearman(after, meas):+.3f}, mean |log error| "
          f"{sum(errors) / len(errors):.3f} (in-sample: fitted on these runs)")
    if len(meas) < 3:
        return
    # out of sample: each plan predicted by a refit on the other runs only
    loo = []
    for i, pf in enumerate(plan_files):
        rest = [j for j in range(len(plan_files)) if j != i]
        e_i = fit_efficiency([plan_files[j] for j in rest], np.asarray(meas)[rest], entry)
        gpu_i = __import__("dataclasses").replace(entry.gpu, efficiency=e_i)
        loo.append(estimate(pf.model, ClusterSpec(gpu=gpu_i, num_gpus=2, gpus_per_node=2),
                            pf.plan, training).step_time_s)
    loo_err = [abs(math.log(a / m)) for a, m in zip(loo, meas, strict=True)]
    print(f"leave-one-out refit: Spearman {spearman(loo, meas):+.3f}, mean |log error| "
          f"{sum(loo_err) / len(loo_err):.3f}")


LLAMA3_8B = ModelSpec(name="llama3-8b", layers=32, hidden=4096, ffn_hidden=14336, heads=32,
                      kv_heads=8, vocab=128256)
LLAMA3_70B = ModelSpec(name="llama3-70b", layers=80, hidden=8192, ffn_hidden=28672, heads=64,
                       kv_heads=8, vocab=128256)


def harness_training(*, seq_len: int, global_batch: int) -> Training:
    """The harness is PyTorch-native (FSDP2, DTensor TP/SP, pipelining): the torchtitan
    profile, in bf16 as the memory-only runs are."""
    return training_spec(framework="torchtitan", precision="bf16", seq_len=seq_len,
                         global_batch=global_batch)


def memory_only_cases() -> None:
    from tcf_search.validate.memory_only import measure_memory

    h100 = get_gpu("h100-sxm-80gb")
    cases = [
        ("Llama 3 8B, FSDP (ZeRO-3) on 8 ranks, seq 8192, full recompute", LLAMA3_8B,
         Plan(dp=8, zero_stage=3, micro_batch=1, recompute="full"),
         harness_training(seq_len=8192, global_batch=8), 8),
        ("Llama 3 70B, TP8+SP x PP4 (1F1B) stage 0, seq 8192, full recompute", LLAMA3_70B,
         Plan(tp=8, pp=4, micro_batch=1, sequence_parallel=True, recompute="full"),
         harness_training(seq_len=8192, global_batch=4), 32),
    ]
    for title, model, plan, training, n in cases:
        start = time.perf_counter()
        r = measure_memory(model, plan, training)
        measured = measured_parts(r.maxima, r.layer_activations)
        predicted = predicted_parts(model, ClusterSpec(gpu=h100, num_gpus=n), plan, training)
        errors = part_errors(measured, predicted)
        print(f"\n== memory-only: {title} ({time.perf_counter() - start:.0f} s) ==")
        print(f"{'part':<12} {'tracker GiB':>11} {'model GiB':>10} {'error':>7}")
        for k in PARTS:
            print(f"{k:<12} {measured[k] / GIB:11.3f} {predicted[k] / GIB:10.3f} "
                  f"{100 * errors[k]:+6.1f}%")
        print(f"tracker peak {r.peak_bytes / GIB:.2f} GiB (all categories at one instant)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-file", type=Path, help="a calibrated entry (skip calibration)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if not args.skip_real:
        start = time.perf_counter()
        entry = load_entry(args.gpu_file) if args.gpu_file else measure_machine(quick=True)
        g, e = entry.gpu, entry.gpu.efficiency
        print(f"calibration ({time.perf_counter() - start:.0f} s): GEMM "
              f"{g.peak_flops_bf16 / 1e9:.1f} GFLOP/s (half size {e.gemm_half_size:.0f}), memory "
              f"{g.hbm_bw_bytes_per_s / GIB:.1f} GiB/s, all-reduce bus "
              f"{g.intra_node_bw_bytes_per_s / GIB:.2f} GiB/s, p2p latency "
              f"{g.intra_node_latency_s * 1e6:.0f} us, collective overhead "
              f"{e.collective_overhead_s * 1e6:.0f} us, kernel overhead "
              f"{e.kernel_overhead_s * 1e6:.1f} us")
        real_runs(entry, args.steps)
    if not args.skip_memory:
        memory_only_cases()


if __name__ == "__main__":
    main()
