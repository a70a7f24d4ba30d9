"""Published training runs that are not in measured_runs.csv, as ``bench_external.py`` reads
them: each table as its source gives it (layouts, batch, published throughput). Data only."""

from __future__ import annotations

import sys
from pathlib import Path

# (label, GPUs, cp, dp, seq_len, sequences per step, published model TFLOP/s per GPU)
LLAMA3_405B = (
    ("8,192 GPUs, seq 8k", 8192, 1, 64, 8192, 2048, 430.0),
    ("16,384 GPUs, seq 8k", 16384, 1, 128, 8192, 2048, 400.0),
    ("16,384 GPUs, CP16, seq 128k", 16384, 16, 8, 131072, 128, 380.0),
)

# (preset, GPUs, sequences per step, tp, pp, cp, vpp, first/last stage layers (0: even),
#  published tokens/s per GPU)
MEGATRON_FP8 = (
    ("llama3-8b", 8, 128, 1, 1, 2, 1, 0, 13812.0),
    ("llama3-70b", 64, 128, 4, 8, 1, 5, 0, 1621.0),
    ("llama3.1-405b", 1024, 512, 8, 8, 2, 8, 15, 315.0),
)

# (table, label, preset, GPUs, seq_len, tp, pp, vpp, cp, fsdp, micro-batch, global batch,
#  recompute, fp8, compile, published tokens/s per GPU, published GiB). Under PP the micro-batch
#  is the local batch over torchtitan's number of micro-batches, which defaulted to the PP degree
#  when the table was measured (torchtitan@ba24697, parallelisms/pipelining_utils.py:
#  n_microbatches = pipeline_parallel_degree): Table 5's local batch of 32 runs 8 micro-batches
#  of 4, Table 6's local batch of 8 runs 8 of 1.
TORCHTITAN = (
    ("1", "8B FSDP8", "llama3-8b", 8, 8192, 1, 1, 1, 1, 8, 2, 16, "selective", False, False,
     5762.0, 82.4),
    ("1", "8B FSDP8 +compile", "llama3-8b", 8, 8192, 1, 1, 1, 1, 8, 2, 16, "selective", False,
     True, 6667.0, 77.0),
    ("1", "8B FSDP8 +compile+fp8", "llama3-8b", 8, 8192, 1, 1, 1, 1, 8, 2, 16, "selective",
     True, True, 8532.0, 76.8),
    ("3", "8B FSDP128", "llama3-8b", 128, 8192, 1, 1, 1, 1, 128, 2, 256, "selective", False,
     False, 5605.0, 67.0),
    ("3", "8B FSDP128 +compile+fp8", "llama3-8b", 128, 8192, 1, 1, 1, 1, 128, 2, 256,
     "selective", True, True, 8380.0, 61.8),
    ("2", "8B FSDP8 CP1 32k", "llama3-8b", 8, 32768, 1, 1, 1, 1, 8, 1, 8, "full", True, True,
     3890.0, 83.9),
    ("2", "8B FSDP4 CP2 64k", "llama3-8b", 8, 65536, 1, 1, 1, 2, 4, 1, 4, "full", True, True,
     2540.0, 84.2),
    ("2", "8B FSDP2 CP4 128k", "llama3-8b", 8, 131072, 1, 1, 1, 4, 2, 1, 2, "full", True, True,
     1071.0, 84.0),
    ("2", "8B FSDP1 CP8 256k", "llama3-8b", 8, 262144, 1, 1, 1, 8, 1, 1, 1, "full", True, True,
     548.0, 84.5),
    ("4", "70B FSDP32 TP8", "llama3-70b", 256, 8192, 8, 1, 1, 1, 32, 16, 512, "full", True,
     True, 829.0, 71.9),
    ("5", "405B FSDP8 TP8 PP8 1F1B", "llama3.1-405b", 512, 8192, 8, 8, 1, 1, 8, 4, 256, "full",
     True, True, 100.0, 82.5),
    ("5", "405B ... interleaved", "llama3.1-405b", 512, 8192, 8, 8, 2, 1, 8, 4, 256, "full",
     True, True, 128.0, 72.7),
    ("6", "405B FSDP8 CP1 32k", "llama3.1-405b", 512, 32768, 8, 8, 1, 1, 8, 1, 64, "full", True,
     True, 76.0, 75.3),
    ("6", "405B FSDP4 CP2 64k", "llama3.1-405b", 512, 65536, 8, 8, 1, 2, 4, 1, 32, "full", True,
     True, 47.0, 75.9),
    ("6", "405B FSDP2 CP4 128k", "llama3.1-405b", 512, 131072, 8, 8, 1, 4, 2, 1, 16, "full",
     True, True, 31.0, 77.1),
    ("6", "405B FSDP1 CP8 256k", "llama3.1-405b", 512, 262144, 8, 8, 1, 8, 1, 1, 8, "full",
     True, True, 16.0, 84.9),
)

# Megatron-LM's H100 weak-scaling table (NVIDIA/Megatron-LM README, images/model_table.png):
# (label, heads, hidden, layers, tp, pp, dp, GPUs, batch, published model TFLOP/s per GPU)
MEGATRON_WEAK = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
)

# Megatron-Bridge's performance summary (NVIDIA-NeMo/Megatron-Bridge,
# docs/performance-summary-archive.md; NeMo containers 25.09, 25.11 and 26.04.01), DGX systems,
# FP8: (release, system, preset, GPUs, global batch, micro-batch, seq, FSDP, tp, pp, cp, vp, ep,
# published tokens/s per GPU)
BRIDGE_SYSTEMS = {"DGX-H100": ("h100-sxm-80gb", 8), "DGX-B200": ("b200-180gb", 8),
                  "DGX-GB200": ("gb200-nvl72", 4)}

BRIDGE = (
    ("25.11", "DGX-H100", "llama3-8b", 8, 128, 1, 8192, 8, 1, 1, 1, 1, 1, 14451.0),
    ("25.11", "DGX-H100", "llama3-70b", 64, 128, 1, 8192, 0, 4, 8, 1, 5, 1, 1602.0),
    ("25.11", "DGX-H100", "llama3.1-405b", 1024, 512, 1, 8192, 0, 8, 8, 2, 8, 1, 292.0),
    # the 25.11 recipe's layout (MBS 1, VP 12), not the table's (MBS 2, VP 24): see below
    ("25.11", "DGX-H100", "qwen3-30b-a3b", 16, 512, 1, 4096, 0, 1, 2, 1, 12, 8, 5275.0),
    ("25.11", "DGX-H100", "qwen3-235b-a22b", 256, 2048, 1, 4096, 0, 2, 8, 1, 4, 32, 1575.0),
    ("25.09", "DGX-H100", "deepseek-v3", 1024, 8192, 1, 4096, 0, 2, 8, 1, 4, 64, 1297.0),
    ("26.04.01", "DGX-H100", "qwen3-30b-a3b", 16, 1024, 1, 4096, 0, 1, 1, 1, 1, 16, 8960.0),
    ("25.09", "DGX-B200", "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 1, 29994.0),
    ("25.09", "DGX-B200", "llama3.1-405b", 128, 64, 1, 8192, 0, 4, 8, 2, 8, 1, 664.0),
    ("25.09", "DGX-B200", "deepseek-v3", 256, 2048, 1, 4096, 0, 1, 16, 1, 1, 8, 2265.0),
    ("25.09", "DGX-B200", "qwen3-30b-a3b", 8, 512, 1, 4096, 0, 1, 1, 1, 1, 8, 18066.0),
    # the same layout in 25.11 (FP8-MX), dropless, graphs on the router and preprocess only
    ("25.11", "DGX-B200", "qwen3-30b-a3b", 8, 512, 1, 4096, 0, 1, 1, 1, 1, 8, 9299.0),
    ("25.09", "DGX-GB200", "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 1, 31357.0),
    ("25.09", "DGX-GB200", "llama3-70b", 64, 128, 2, 8192, 64, 1, 1, 1, 1, 1, 3986.0),
    ("25.09", "DGX-GB200", "llama3.1-405b", 128, 64, 1, 8192, 64, 2, 1, 1, 1, 1, 729.0),
    ("25.09", "DGX-GB200", "deepseek-v3", 256, 2048, 1, 4096, 0, 1, 4, 1, 4, 64, 3454.0),
    ("25.09", "DGX-GB200", "qwen3-30b-a3b", 8, 512, 4, 4096, 0, 1, 1, 1, 1, 8, 22775.0),
    ("25.11", "DGX-GB200", "qwen3-30b-a3b", 8, 512, 4, 4096, 0, 1, 1, 1, 1, 8, 23766.0),
    ("25.09", "DGX-GB200", "qwen3-235b-a22b", 64, 1024, 1, 4096, 0, 2, 1, 1, 1, 64, 4452.0),
)

# layers that do not split evenly over pp x vp chunks: Megatron counts the embedding and the loss
# as layers of the first and last stage (Llama 3.1 405B: 126 + 2 over 64 chunks; Qwen3-235B:
# 94 + 2 over 32), or is given a layout. DeepSeek-V3's 61 layers, with its MTP module beside the
# loss in the last virtual stage, as Megatron-Bridge 25.09 lays them out (v0.1.0rc4): on H100
# (pp 8, vp 4) run_script.py's "Et|(tt|)*30mL", 7 / 8 / 6 layers on the first / middle / last
# rank; on B200 (pp 16) and GB200 (pp 4, vp 4) the recipe's map_pp_vp_to_layout
# (src/megatron/bridge/recipes/deepseek/deepseek_v3.py): 16 chunks of E + 4, 14 x 4, 1 + mtp +
# loss, so 4 / 4 / 1 layers on 16 ranks and 16 / 16 / 13 on 4
# Qwen3-30B-A3B on 16 H100 in 25.11: the table gives MBS 2, VP 24 (GA 32), the 25.09 run's
# layout (that release's perf_matrix before a28844195, scripts/performance/configs/qwen3/
# qwen3_30b_a3b_llm_pretrain.yaml at 8d5764fd3: vp 24, fp8_cs mbs 2), while every 25.11 recipe
# (r0.2.0 from 8aed9a229 "cuda graph fine grained scope | hybridEP | a2a overlap", which put
# moe_a2a_overlap=True where micro_batch_size=2 was, to v0.2.2:
# scripts/performance/configs/qwen3/workload_base_configs.py
# QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG) runs pp 2, vp 12 and the default micro-batch 1 (GA
# 64): the BRIDGE row runs the recipe's. 26.02's table gives the recipe's (MBS 1, VP 12).
#
# Rows of a release its maintainers call a regression: Megatron-Bridge issue #1998 (open,
# erhoo82, 2026-01-20): "2X slower performance in QWEN3 30B on H100 and B200 with the dropless
# schedule compared to the token-drop schedule. Basically, the perf in 25.11 is 2X slower than
# 25.09." (25.09's token-drop runs: 10,494 and 18,066 tokens/s per GPU.) 26.02 still ran 5,113
# on H100 (PP 2, VP 12, MBS 1, GBS 1024) and 9,691 on B200 (MBS 1); 26.02.01 ran the same H100
# layout at 9,058 and B200 at MBS 4 with HybridEP at 26,695, so 26.02.01 fixed it. Between the
# two, r0.3.0's perf recipes named DeepEP for Qwen3-30B (#2351, 5c38201c9) and set the flex
# dispatcher where a backend is named (#2393, 6a41745da); which change (or the Megatron-Core
# bump) fixed it the record does not say. 26.04 (v0.4.x QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_
# FP8_CS_V1: HybridEP, EP 16, no A2A overlap) is the 26.04.01 row. The 25.11 GB200 run used
# HybridEP already and did not regress (23,766 vs 22,775).
#
# Megatron-Bridge #1705 (Qwen3-235B B200 MXFP8 regression), fixed by PR #1760 (2025-12-17):
# "MXFP8 step time improved from 20.1s to 16.9s ... Disable moe_a2a_overlap due to CPU overhead
# ... Disable VP for mxfp8": the 25.11 DGX-B200 row (PP 8 VP 2, A2A overlap, GBS 1024) steps in
# 20.05 s, the regressed recipe's time.
#
# The table is the calibration's (tcf_search/calibration/moe_fit.py), written once there: the
# MoE fit leaves these rows out.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tcf_search.calibration.moe_fit import BRIDGE_REGRESSIONS  # noqa: E402, F401 (re-exported)

BRIDGE_EDGES = {("llama3.1-405b", 8): (15, 15), ("qwen3-235b-a22b", 8): (11, 11),
                ("deepseek-v3", 8): (7, 6), ("deepseek-v3", 16): (4, 1),
                ("deepseek-v3", 4): (16, 13)}

# NeMo AutoModel's performance summary (NVIDIA-NeMo/Automodel, docs/performance-summary.md as
# first published, 89e3a9fdd, 2025-10-06), DGX-H100, BF16, with the recipes of
# examples/benchmark/configs/ (qwen3_moe_30b_te_deepep.yaml, deepseek_v3_te_deepep.yaml at
# 79d0ccfdb): TE + DeepEP, mock data, fake balanced gate, activation checkpointing (full),
# sequence 4096. DeepSeek-V3's AutoPipeline (layers_per_stage 2: ceil(61 / 2) + 1 = 32 virtual
# stages, 2 layers each but the last 3, looped over 4 ranks; distributed/pipelining/
# functional.py calculate_virtual_stages, generate_hf_model_fqn_per_model_part) holds 16 / 15 /
# 15 / 15 layers on its ranks. (preset, GPUs, global batch, micro-batch, pp, vp, ep, first and
# last stage layers, published tokens/s per GPU)
AUTOMODEL = (
    ("qwen3-30b-a3b", 8, 512, 4, 1, 1, 8, 0, 0, 11842.0),
    ("deepseek-v3", 256, 512, 1, 4, 8, 64, 16, 15, 1002.0),
    ("deepseek-v3", 1024, 8192, 1, 4, 8, 64, 16, 15, 865.0),
)

# NeMo's long-sequence table (NVIDIA/NeMo, docs/source/performance/performance_long_sequence.md,
# added in 5b47a94c, 2024-10-18): Llama 2 7B in FP8 on DGX-H100, container NeMo 24.03.01, one
# GPU per 1k tokens of sequence, with the context-parallel layout of each length ("With CP":
# TP, PP, DP, CP) and model TFLOP/s per GPU. The TFLOP/s follow NeMo's Llama 2 formula of the
# time (nemo/utils/flops_formulas.py llama2, e.g. at f0bf77bc; its attention term counted the
# whole s x s scores until 6251117f, 2025-08-09, halved them for causal masks), which the bench
# inverts to tokens/s. The page's B200 table (Llama 3 8B, NeMo 25.04) is left out: its layouts
# multiply to a quarter of its GPU counts on every row. (seq in k tokens, GPUs, global batch,
# tp, pp, dp, cp, published model TFLOP/s per GPU)
NEMO_LONG_SEQUENCE = (
    (4, 4, 1024, 1, 1, 4, 1, 768.0),
    (8, 8, 512, 1, 2, 4, 1, 730.0),
    (16, 16, 256, 2, 1, 8, 1, 660.0),
    (32, 32, 128, 2, 1, 8, 2, 610.0),
    (64, 64, 64, 4, 1, 8, 2, 574.0),
    (128, 128, 32, 4, 1, 8, 4, 555.0),
    (256, 256, 16, 4, 1, 8, 8, 549.0),
    (512, 512, 8, 8, 1, 4, 16, 549.0),
    (1024, 1024, 4, 8, 1, 4, 32, 536.0),
)
