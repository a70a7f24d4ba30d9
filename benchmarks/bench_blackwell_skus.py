"""GB200 over B200: the published Megatron-Bridge ratio beside the model's, factor by factor.

    python benchmarks/bench_blackwell_skus.py

For each pair of Megatron-Bridge rows (one release) that run one model on 8 GPUs of DGX-B200 and of
DGX-GB200 with the same layout (benchmarks/published_runs.py BRIDGE), the model's GB200/B200
tokens/s ratio is split into a chain of swaps from the B200 row to the GB200 row, each swap one
input: the recipe (micro-batch, CUDA graphs, dispatcher: what differs in the rows' switches),
then the GPU's tensor peaks, then its HBM bandwidth, then everything else of the catalog entry
(NVLink, NIC, NVLink domain, memory reserve, gpus_per_node 4 vs 8). The product of the factors is
the model's ratio. Of the recipe factor, the per-kernel and per-collective fixed costs and the
GEMMs' size saturation are shown as what the recipe factor becomes with each set to zero (or to
1 for gemm_half_size). Nothing is fitted or tuned here.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridge_recipes import (  # noqa: E402
    MEGATRON_FP8_RECIPE,
    graph_switches,
    moe_switches,
    recipe_switches,
)
from published_runs import BRIDGE, BRIDGE_SYSTEMS  # noqa: E402

from costmodel import ClusterSpec, GpuSpec, Plan, estimate  # noqa: E402
from hardware_catalog import get_gpu  # noqa: E402
from hardware_catalog.fabrics import fabric_fraction  # noqa: E402
from search.inputs.presets import PRESETS  # noqa: E402
from search.inputs.specs import training_spec  # noqa: E402

PEAKS = ("peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp8")
OVERHEADS = {"kernel_overhead_s=0": {"kernel_overhead_s": 0.0},
             "collective_overhead_s=0": {"collective_overhead_s": 0.0},
             "gemm_half_size=1": {"gemm_half_size": 1.0}}


def tokens(row: tuple, gpu: GpuSpec, per_node: int) -> float:
    """The row's recipe (its system's switches) as bench_external prices it, recompute none
    (what these rows' CUDA graphs allow), on ``gpu`` with ``per_node`` GPUs a node."""
    release, system, preset, gpus, batch, mb, seq, fsdp, tp, pp, cp, vp, ep, _ = row
    model = PRESETS[preset]
    training = training_spec(
        framework="megatron", precision="fp8", seq_len=seq, global_batch=batch,
        switches={**MEGATRON_FP8_RECIPE, **recipe_switches(preset, tp),
                  **moe_switches(release, system, model.is_moe, preset),
                  **graph_switches(release, system, preset)})
    cluster = ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=per_node,
                          fabric="infiniband", network_bw_fraction=fabric_fraction("infiniband"))
    plan = Plan(tp=tp, pp=pp, cp=cp, dp=gpus // (tp * pp * cp), ep=ep, vpp=vp, micro_batch=mb,
                zero_stage=3 if fsdp else 1, sequence_parallel=tp > 1)
    return estimate(model, cluster, plan, training).tokens_per_s_per_gpu


def pairs() -> list[tuple[tuple, tuple]]:
    rows = {(r[0], r[1], r[2]): r for r in BRIDGE if r[3] == 8}
    return [(rows[(rel, "DGX-B200", p)], rows[(rel, "DGX-GB200", p)])
            for rel, sys_, p in rows if sys_ == "DGX-B200" and (rel, "DGX-GB200", p) in rows]


def decompose(b_row: tuple, g_row: tuple) -> None:
    b200, gb200 = get_gpu(BRIDGE_SYSTEMS["DGX-B200"][0]), get_gpu(BRIDGE_SYSTEMS["DGX-GB200"][0])
    peaks = replace(b200, **{k: getattr(gb200, k) for k in PEAKS})
    peaks_hbm = replace(peaks, hbm_bw_bytes_per_s=gb200.hbm_bw_bytes_per_s)
    # the GB200 row's recipe on B200 (8 a node), then the GPU swapped input by input
    chain = [("B200 row", tokens(b_row, b200, 8)),
             ("recipe (micro-batch, graphs, dispatcher)", tokens(g_row, b200, 8)),
             ("tensor peaks", tokens(g_row, peaks, 8)),
             ("HBM bandwidth", tokens(g_row, peaks_hbm, 8)),
             ("rest (NVLink, NIC, domain, reserve, 4 a node)", tokens(g_row, gb200, 4))]
    published = g_row[-1] / b_row[-1]
    print(f"\n{b_row[0]} {b_row[2]}: micro-batch {b_row[5]} on B200, {g_row[5]} on GB200")
    print(f"  published {g_row[-1]:,.0f} / {b_row[-1]:,.0f} = {published:.3f}; model "
          f"{chain[-1][1]:,.0f} / {chain[0][1]:,.0f} = {chain[-1][1] / chain[0][1]:.3f}")
    for (_, before), (label, after) in zip(chain, chain[1:], strict=False):
        print(f"  x {after / before:.3f}  {label}")
    for label, kw in OVERHEADS.items():
        gpu = replace(b200, efficiency=replace(b200.efficiency, **kw))
        factor = tokens(g_row, gpu, 8) / tokens(b_row, gpu, 8)
        print(f"    recipe factor with {label}: {factor:.3f}")


def main() -> int:
    print("GB200 / B200 tokens/s per GPU, Megatron-Bridge rows on 8 GPUs (fp8)")
    for b_row, g_row in pairs():
        decompose(b_row, g_row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
