"""NeMo's long-sequence table (``published_runs.NEMO_LONG_SEQUENCE``) against the calibrated
cost model, after the fact: nothing here is fitted. Context parallelism from 2 to 32 ranks at
32k to 1M tokens, the ring crossing the network from 128k on.

Llama 2 7B (Touvron et al., 2023: 32 layers, hidden 4096, SwiGLU 11,008, 32 heads without
grouped queries, a 32,000-token vocabulary, untied) in FP8 on DGX-H100, with the nemo profile
(Transformer Engine's ring, ``cp_comm`` ring; cuDNN fused attention, which Transformer Engine
runs under context parallelism since 94f54d71, 2024-01) and the table's layouts, micro-batch 1,
the distributed optimizer; the table gives no recompute, so each row takes the fastest mode that
fits, as ``predict`` does.

The table's attention term grows from 14% of its FLOPs at 4k to 98% at 1M, so its long rows
measure the release's attention kernel as much as context parallelism. Each row therefore also
gives the attention efficiency (the fraction of the dense bf16 peak the fitted
``flash3_attention_peak_fraction`` stands for) at which the model would match it: the one
unknown solved for that row alone, by bisection, and kept nowhere. Were context parallelism
priced too kindly, that efficiency would fall as CP grows and the ring leaves the node; level
across the CP rows, the CP terms hold and the offset is the kernel of the release (March 2024).
"""

from __future__ import annotations

from dataclasses import replace

from published_runs import NEMO_LONG_SEQUENCE

from costmodel import ClusterSpec, ModelSpec, Plan, SpecError, StepEstimate, Training, estimate
from hardware_catalog import get_gpu
from hardware_catalog.fabrics import fabric_fraction
from search.inputs.specs import training_spec

LLAMA2_7B = ModelSpec(name="llama2-7b", layers=32, hidden=4096, ffn_hidden=11008, heads=32,
                      kv_heads=32, vocab=32000)
ATTENTION_HEAVY = 0.5  # rows whose attention term is at least this share of the FLOPs


def nemo_flops_per_token(m: ModelSpec, seq: int) -> tuple[float, float]:
    """NeMo's Llama 2 model FLOPs per token of the time (whole s x s scores), and the attention
    term's share of them."""
    terms = (12 + 12 * m.kv_heads / m.heads + 18 * m.ffn_hidden / m.hidden
             + 6 * m.vocab / (m.layers * m.hidden))
    attention = 12 * seq / m.hidden
    return m.layers * m.hidden**2 * (terms + attention), attention / (terms + attention)


def _fastest(cluster: ClusterSpec, plan: Plan, training: Training) -> tuple[Plan, StepEstimate]:
    """The plan with the fastest recompute mode that fits (the least memory when none does)."""
    modes = []
    for rec in ("none", "selective", "full"):
        p = replace(plan, recompute=rec)
        try:
            modes.append((p, estimate(LLAMA2_7B, cluster, p, training)))
        except SpecError:
            continue
    fitting = [m for m in modes if m[1].memory.fits]
    return (max(fitting, key=lambda m: m[1].tokens_per_s_per_gpu) if fitting
            else min(modes, key=lambda m: m[1].memory.peak_bytes))


def implied_attention(cluster: ClusterSpec, plan: Plan, training: Training,
                      published: float, lo: float = 0.05, hi: float = 0.95) -> float | None:
    """The attention efficiency at which the model gives ``published`` tokens/s per GPU on this
    plan, every other parameter as fitted; None outside [lo, hi]."""
    def tok(f: float) -> float:
        gpu = cluster.gpu
        eff = replace(gpu.efficiency, flash3_attention_peak_fraction=f)
        c = replace(cluster, gpu=replace(gpu, efficiency=eff))
        return estimate(LLAMA2_7B, c, plan, training).tokens_per_s_per_gpu
    if not tok(lo) <= published <= tok(hi):
        return None
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tok(mid) < published else (lo, mid)
    return 0.5 * (lo + hi)


def long_sequence_table() -> list[float]:
    gpu = get_gpu("h100-sxm-80gb")
    fitted = gpu.efficiency.flash3_attention_peak_fraction
    print("\nNeMo long-sequence table (docs/source/performance/performance_long_sequence.md), "
          "Llama 2 7B, nemo profile, fp8, infiniband")
    print(f"{'seq':>6}{'GPUs':>6}  {'layout':<17}{'attn':>6}{'published':>11}{'predicted':>11}"
          f"{'error':>8}  recompute  attention eff. to match")
    errors, implied = [], []
    for seq_k, gpus, batch, tp, pp, dp, cp, tflops in NEMO_LONG_SEQUENCE:
        seq = seq_k * 1024
        flops, attn_share = nemo_flops_per_token(LLAMA2_7B, seq)
        published = tflops * 1e12 / flops
        training = training_spec(framework="nemo", precision="fp8", seq_len=seq,
                                 global_batch=batch)
        cluster = ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=8, fabric="infiniband",
                              network_bw_fraction=fabric_fraction("infiniband"))
        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=1, zero_stage=1,
                    sequence_parallel=tp > 1)
        chosen, est = _fastest(cluster, plan, training)
        tok = est.tokens_per_s_per_gpu
        errors.append(tok / published - 1)
        f = implied_attention(cluster, chosen, training, published)
        if f is not None and attn_share >= ATTENTION_HEAVY and cp > 1:
            implied.append(f)
        layout = f"tp{tp} pp{pp} dp{dp} cp{cp}"
        fits = "" if est.memory.fits else " *"
        print(f"{seq_k:>5}k{gpus:>6}  {layout:<17}{attn_share:>6.0%}{published:>11,.0f}"
              f"{tok:>11,.0f}{errors[-1]:>+8.0%}  {chosen.recompute:<9}{fits}  "
              + (f"{f:.3f}" if f is not None else "out of range"))
    print(f"tokens/s per GPU (published TFLOP/s over NeMo's formula); mean absolute error "
          f"{sum(map(abs, errors)) / len(errors):.1%} on {len(errors)} rows; attn = the attention "
          "term's share of the FLOPs; * = predicted not to fit")
    if implied:
        print(f"attention efficiency to match, CP rows with attention >= {ATTENTION_HEAVY:.0%} of "
              f"the FLOPs ({len(implied)}): {min(implied):.3f}-{max(implied):.3f} "
              f"(fitted on measured_runs.csv: {fitted:.3f})")
    return errors
