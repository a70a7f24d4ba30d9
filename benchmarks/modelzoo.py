"""The Megatron-Core MoE team's own benchmark table (yanring/Megatron-MoE-ModelZoo at e8650517,
best_practice/qwen3/readme.md, "Performance Results", H100), predicted after the fact by the code
``tcf-search predict`` runs: nothing here is fitted, and the rows are in no calibration.

Qwen3-235B-A22B in bf16 on 256 H100 (32 nodes, InfiniBand 8 x 50 GB/s), sequence 4096, global
batch 2048, expert TP 1 (model_configs/benchmarking/Qwen3-235B-A22B.yaml), five layouts and
dispatchers the table gives with their step times: tokens/s per GPU = 2048 x 4096 / 256 / step.
What every row ran is ``frameworks.yaml`` ``release_switches: megatron-moe-modelzoo`` (read as
the measured file's rows are, by source, document commit and model); what differs by row is in
its cells: the dispatcher (DeepEP: flex; A2A: alltoall), the EP all-to-all overlapped with the
other micro-batch ("+1f1b overlap": --overlap-moe-expert-parallel-comm, sbatch_benchmarking.sh
A2A_OVERLAP=1), ZeRO-3 for its FSDP row (Megatron-FSDP), the recompute it names ("norm, act":
selective, modules layernorm and moe_act). The table's other H100 rows (long context) recompute
whole MoE layers (--recompute-modules moe), which the model does not price, and its GB200 and
GB300 rows run CUDA-graph scopes and activation offloading that differ by row: left out.

Two of the table's rows are one layout with and without the overlap, so their ratio measures
the overlap alone: printed beside the model's ratio.
"""

from __future__ import annotations

import statistics

import pandas as pd

from tcf_search.calibration.predict import predict_frame

SOURCE = "megatron-moe-modelzoo"
DETAIL = ("yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md "
          "@e8650517d60d71ab73fc6b3b0388cac4ba435181 (Performance Results, H100)")
QWEN3_235B = {"model_name": "Qwen3-235B-A22B", "layers": 94, "hidden": 4096, "ffn_hidden": 1536,
              "heads": 64, "kv_heads": 4, "vocab": 151936, "seq_len": 4096, "ffn_type": "swiglu",
              "tied_embeddings": "false", "moe_experts": 128, "moe_topk": 8,
              "moe_ffn_hidden": 1536, "moe_shared_experts": 0}
GPUS, BATCH, SEQ = 256, 2048, 4096

# (label, dispatcher, tp, pp, vpp, ep, micro-batch, overlap, ZeRO stage, recompute, modules,
#  expert TP where it differs from the derived one, published step time in s)
ROWS = (
    ("DeepEP TP2 PP8 VP4 EP32", "flex", 2, 8, 4, 32, 1, "off", 1, "selective",
     "layernorm+moe_act", "", 19.7),
    ("DeepEP ... +1f1b overlap", "flex", 2, 8, 4, 32, 1, "on", 1, "selective",
     "layernorm+moe_act", "", 17.6),
    ("DeepEP TP2 EP8 FSDP MBS4", "flex", 2, 1, 1, 8, 4, "off", 3, "full", "", "1", 17.6),
    ("A2A TP2 PP32 VP3 EP8", "alltoall", 2, 32, 3, 8, 1, "off", 1, "selective",
     "layernorm+moe_act", "", 24.2),
    ("DeepEP TP4 PP8 VP4 EP8", "flex", 4, 8, 4, 8, 1, "off", 1, "none", "", "1", 29.0),
)


def rows() -> pd.DataFrame:
    """The table as rows of the measured file's schema, measured columns left out."""
    out = []
    for (label, dispatcher, tp, pp, vpp, ep, mb, overlap, zero, rec, modules, etp,
         _step) in ROWS:
        out.append({"case_id": label, "source": SOURCE, "source_detail": DETAIL,
                    **QWEN3_235B, "gpu": "h100-sxm-80gb", "gpus_per_node": 8,
                    "num_gpus": GPUS, "fabric": "infiniband", "tp": tp, "pp": pp, "vpp": vpp,
                    "cp": 1, "ep": ep, "dp": GPUS // (tp * pp), "expert_tp": etp,
                    "micro_batch": mb, "global_batch": BATCH, "zero_stage": zero,
                    "recompute": rec, "recompute_modules": modules,
                    "moe_dispatcher": dispatcher, "moe_a2a_overlap": overlap,
                    "precision": "bf16", "framework": "megatron"})
    return pd.DataFrame(out)


def modelzoo_table() -> list[float]:
    """Print the table against ``predict``; the absolute errors."""
    out = predict_frame(rows())
    print("\nMegatron-MoE-ModelZoo, Qwen3-235B-A22B on 256 H100, bf16 (best_practice/qwen3/"
          "readme.md at e8650517), predict's path, after the fact")
    print(f"{'run':<28}{'published':>11}{'predicted':>11}{'error':>8}  exposed comm s")
    errs, tok = [], {}
    for row, (_, r) in zip(ROWS, out.iterrows(), strict=True):
        label, step = row[0], row[-1]
        published = BATCH * SEQ / GPUS / step
        if pd.isna(r["pred_tokens_per_sec_per_gpu"]):  # refused: say why
            print(f"{label:<28}{published:>11,.0f}  refused: {r['pred_error']}")
            continue
        pred = float(r["pred_tokens_per_sec_per_gpu"])
        tok[label] = (published, pred)
        errs.append(abs(pred / published - 1))
        print(f"{label:<28}{published:>11,.0f}{pred:>11,.0f}{pred / published - 1:>+8.0%}"
              f"  {float(r['pred_time_comm_exposed_s']):.1f}")
    plain, lapped = (tok.get(ROWS[i][0]) for i in (0, 1))
    if plain and lapped:
        print(f"the EP all-to-all overlapped (one layout, +1f1b overlap): measured "
              f"{lapped[0] / plain[0] - 1:+.0%}, predicted {lapped[1] / plain[1] - 1:+.0%}")
    if errs:
        print(f"tokens/s per GPU: median absolute error {statistics.median(errs):.1%}, mean "
              f"{statistics.mean(errs):.1%} on {len(errs)} runs")
    return errs
