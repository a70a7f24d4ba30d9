"""Published runs that are not in measured_runs.csv, predicted by the calibrated cost model.

    python benchmarks/bench_external.py

Nothing here is fitted: the model's parameters come from ``python -m tcf_search.fit`` on the
measured file alone. These rows check how the model carries over to scales and schedules the
file does not have (16k GPUs, interleaved 1F1B, context parallel at 128k tokens).

Llama 3 405B, Dubey et al. (2024), "The Llama 3 Herd of Models", Table 4: BF16 on H100 SXM
80 GB, 126 layers with one fewer on the first and the last pipeline stage, TP8 x PP16, global
batch 16M tokens, model TFLOP/s per GPU as published. Its FSDP shards optimizer states and
gradients but keeps the parameters after the forward: ZeRO-2 here. It uses an interleaved schedule
but does not give the number of chunks, so each row is printed for v = 1, 2, 4 and 8; nor does
it say which activations it recomputes, so the plans recompute nothing and the table reports
whether the model thinks that fits.

Megatron-LM's FP8 table (NVIDIA/Megatron-LM, examples/llama/README.md, "FP8 Performance"):
Llama 3 8B, 70B and 405B on H100 at 8k tokens, FP8 (Transformer Engine, hybrid recipe), with the
layouts it gives (TP, PP, CP, virtual stages, micro-batch 1) and its tokens/s per GPU. The 405B
layout splits 126 layers over 8 x 8 chunks with the embedding and the loss each counted as a
layer, so its first and last stages hold 15 layers here. Switches the table does not give
(TP communication overlap, FP8 parameter gathering) keep the generic profile's defaults.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import ClusterSpec, Plan, Training, estimate  # noqa: E402
from hardware_catalog import get_gpu  # noqa: E402
from search.presets import PRESETS  # noqa: E402
from tcf_search.profiles import framework_settings  # noqa: E402

# (label, GPUs, cp, dp, seq_len, sequences per step, published model TFLOP/s per GPU)
LLAMA3_405B = (
    ("8,192 GPUs, seq 8k", 8192, 1, 64, 8192, 2048, 430.0),
    ("16,384 GPUs, seq 8k", 16384, 1, 128, 8192, 2048, 400.0),
    ("16,384 GPUs, CP16, seq 128k", 16384, 16, 8, 131072, 128, 380.0),
)
CHUNKS = (1, 2, 4, 8)
# (preset, GPUs, sequences per step, tp, pp, cp, vpp, first/last stage layers (0: even),
#  published tokens/s per GPU)
MEGATRON_FP8 = (
    ("llama3-8b", 8, 128, 1, 1, 2, 1, 0, 13812.0),
    ("llama3-70b", 64, 128, 4, 8, 1, 5, 0, 1621.0),
    ("llama3.1-405b", 1024, 512, 8, 8, 2, 8, 15, 315.0),
)


def megatron_fp8() -> None:
    gpu = get_gpu("h100-sxm-80gb")
    settings = framework_settings("generic", "fp8")
    print("\nMegatron-LM FP8 table (examples/llama/README.md), generic profile, fp8")
    print(f"{'run':<28}{'published':>11}{'predicted':>11}{'error':>8}{'peak GiB':>10}")
    errs = []
    for preset, gpus, batch, tp, pp, cp, vpp, edge, published in MEGATRON_FP8:
        # the recipe's own switches (train_llama3_8b_h100_fp8.sh): --grad-reduce-in-bf16 and
        # --fp8-param-gather; the table's larger runs are taken to use the same recipe
        training = replace(Training(seq_len=8192, global_batch=batch, precision="fp8"),
                           **settings, grad_dtype_bytes=2, fp8_param_gather=True)
        dp = gpus // (tp * pp * cp)
        plan = Plan(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch=1, zero_stage=1,
                    sequence_parallel=tp > 1, first_stage_layers=edge, last_stage_layers=edge)
        est = estimate(PRESETS[preset], ClusterSpec(gpu=gpu, num_gpus=gpus), plan, training)
        tok = est.tokens_per_s_per_gpu
        errs.append(abs(tok / published - 1))
        fits = "" if est.memory.fits else " *"
        print(f"{f'{preset} on {gpus}':<28}{published:>11,.0f}{tok:>11,.0f}"
              f"{tok / published - 1:>+8.0%}{est.memory.peak_bytes / 2**30:>10.1f}{fits}")
    print(f"tokens/s per GPU; mean absolute error {sum(errs) / len(errs):.1%}; * = predicted "
          "not to fit 80 GB")


def main() -> int:
    model = PRESETS["llama3.1-405b"]
    gpu = get_gpu("h100-sxm-80gb")
    settings = framework_settings("generic", "bf16")
    print("Llama 3 405B (Dubey et al., 2024, Table 4), generic (Megatron-LM-like) profile")
    print(f"{'run':<30}{'published':>10}" + "".join(f"{f'v={v}':>16}" for v in CHUNKS))
    errors = []
    for label, gpus, cp, dp, seq, batch, published in LLAMA3_405B:
        cluster = ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=8)
        training = replace(Training(seq_len=seq, global_batch=batch, precision="bf16"),
                           **settings)
        cells = []
        for v in CHUNKS:
            plan = Plan(tp=8, pp=16, cp=cp, dp=dp, vpp=v, micro_batch=1, zero_stage=2,
                        sequence_parallel=True, first_stage_layers=7, last_stage_layers=7)
            est = estimate(model, cluster, plan, training)
            tflops = est.model_tflops_per_gpu
            errors.append((v, tflops / published - 1))
            fits = "" if est.memory.fits else "*"
            cells.append(f"{tflops:>9.0f} ({tflops / published - 1:+.0%}){fits}")
        print(f"{label:<30}{published:>10.0f}" + "".join(f"{c:>16}" for c in cells))
    print("model TFLOP/s per GPU (error vs published); * = predicted not to fit 80 GB without "
          "recompute")
    for v in CHUNKS:
        errs = [abs(e) for c, e in errors if c == v]
        print(f"v={v}: mean absolute error {sum(errs) / len(errs):.1%}")
    megatron_fp8()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
