"""Megatron-Bridge's performance recipes as each release ran them: the switches a published row
of its performance summary (and of Megatron-LM's FP8 table, which follows NeMo's scripts) runs
with, read from the release's code and cited beside each table. Facts, not fitted; read by
``bench_external.py`` and ``bench_blackwell_skus.py``.

A row the shared measured file holds (25.11 and 26.04.01 on DGX-H100 and DGX-B200) runs what
``hardware_catalog/frameworks.yaml`` ``release_switches: megatron-bridge`` says, the facts
``tcf-search predict`` gives those rows (:func:`bridge_facts`); the tables below hold only the
rows that file lacks (25.09, GB200), so a fact is written once.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_runs import BRIDGE_REGRESSIONS  # noqa: E402

from costmodel.mapping import counted_split  # noqa: E402
from costmodel.plan_fields import PLAN_KEYS  # noqa: E402
from costmodel.specs import Recompute, Training  # noqa: E402
from hardware_catalog.frameworks import load_profiles, release_key, release_switches  # noqa: E402
from search.inputs.measured import MODEL_OWN, SPLIT_COLUMNS, TRAINING_OWN  # noqa: E402
from search.inputs.presets import PRESETS  # noqa: E402

SOURCE = "megatron-bridge"
# each preset's name in the summary's Model column (the measured file's model_name), which
# frameworks.yaml keys a row by (release_key)
TABLE_MODELS = {"llama3-8b": "LLAMA3_8B", "llama3-70b": "LLAMA3_70B",
                "llama3.1-405b": "LLAMA3.1_405B", "deepseek-v3": "DeepSeekV3",
                "qwen3-30b-a3b": "Qwen3_30B_a3B", "qwen3-235b-a22b": "Qwen3_235B_a22B",
                "gpt-oss-120b": "GPT OSS 120B"}


def bridge_facts(release: str, system: str, preset: str,
                 precision: str = "fp8") -> dict[str, object] | None:
    """What frameworks.yaml says the row (release, system, preset) ran, Training switches and
    plan fields alike, as ``predict`` reads it for the measured file's row; None for a row it
    does not list (the tables below hold those)."""
    detail = f"section {release} {system}"
    model = TABLE_MODELS.get(preset, preset)
    if release_key(detail, model) not in load_profiles()["release_switches"][SOURCE]:
        return None
    return release_switches(SOURCE, detail, model, precision)


def training_facts(facts: dict[str, object]) -> dict[str, object]:
    """The Training switches of :func:`bridge_facts` (its plan and model fields and its split
    flags left out: the preset is the model)."""
    return {k: v for k, v in facts.items()
            if k not in PLAN_KEYS and k not in MODEL_OWN and k not in SPLIT_COLUMNS}


def plan_facts(release: str, system: str, preset: str, layers: int,
               pp: int) -> dict[str, object]:
    """The plan fields a listed row's release sets beside its recompute mode (modules, partial
    full recompute, sequence parallelism, the first and last ranks' layers: given, or counted
    where the recipe counts the embedding and the loss as layers, as ``case_from_row`` reads
    them; the MoE dispatch is the training's, moe_switches'); {} for a row not listed."""
    facts = bridge_facts(release, system, preset) or {}
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in facts.items()
           if k in PLAN_KEYS and k != "recompute" and k not in TRAINING_OWN}
    emb, loss = (bool(facts.get(k)) for k in SPLIT_COLUMNS[2:])
    if emb or loss:
        out["first_stage_layers"], out["last_stage_layers"] = counted_split(layers, pp, emb,
                                                                            loss)
    return out


# Megatron-LM's FP8 recipe switches (examples/llama/train_llama3_8b_h100_fp8.sh:
# --grad-reduce-in-bf16, --fp8-param-gather), taken for every Megatron fp8 run below
MEGATRON_FP8_RECIPE = {"grad_dtype_bytes": 2, "fp8_param_gather": True}
# Megatron-Bridge's Llama 3 70B and 405B recipes overlap TP communication with the GEMMs
# (Transformer Engine userbuffers: CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=
# userbuffers_*) in src/megatron/bridge/recipes/llama/h100/llama3.py and the perf_recipes on
# B200/GB200); Megatron-LM's FP8 table says it follows NeMo's performance scripts, whose recipes
# these are. The 8B recipes run TP 1; the MoE recipes are left at the profile's default.
TP_OVERLAP_PRESETS = frozenset({"llama3-70b", "llama3.1-405b"})
# The MoE rows at TP > 1 whose recipe overlaps TP communication: 25.09's run_script.py (v0.1.0rc4
# and 8d5764fd3, whose TP 2 layout the table's Qwen3-235B GB200 row ran) builds every Qwen3
# recipe with CommOverlapConfig(tp_comm_overlap=True), which src/megatron/bridge/training/
# comm_overlap.py keeps at TP >= 2 with sequence parallel (the default userbuffers config). The
# others keep it off: DeepSeek-V3's (recipes/deepseek/deepseek_v3.py:
# CommOverlapConfig(tp_comm_overlap=False)) and, in frameworks.yaml, the rows it lists
# (25.11's and 26.04.01's Qwen3-235B H100 recipes: tp_comm_overlap=False).
TP_OVERLAP_MOE_ROWS = frozenset({("25.09", "DGX-GB200", "qwen3-235b-a22b")})
# The fp8 recipe each MoE row ran (the tables' Precision column; in 25.09 the number outside the
# parentheses): per-tensor current scaling ("cs") but for 25.11's Qwen3-30B-A3B on B200 and
# GB200, MXFP8 ("mx", helpers.py get_precision_config "fp8_mx": bf16_with_mxfp8_mixed). The
# model has one fp8 (its fitted casts and GEMM fraction): the column says which rows differ.
FP8_MX_ROWS = frozenset({("25.11", "DGX-B200", "qwen3-30b-a3b"),
                         ("25.11", "DGX-GB200", "qwen3-30b-a3b")})
# The flex dispatcher's backend (printed; the model's flex is one fused dispatch whatever it is)
DAGGER = "\u2020"  # marks a row of an acknowledged regression (BRIDGE_REGRESSIONS)
FLEX_BACKENDS = {("25.09", "DGX-H100"): "deepep", ("25.11", "DGX-GB200"): "hybridep",
                 ("26.04.01", "DGX-H100"): "hybridep"}




# The MoE recipes' dispatch as each release's Megatron-Bridge performance scripts set it, for the
# releases and systems frameworks.yaml does not list (facts from the code of the release, not
# fitted; all run --moe-permute-fusion: the Qwen3 providers' and the DeepSeek-V3 recipe's
# default). 25.09 (v0.1.0rc4 scripts/performance/run_script.py): Qwen3 everywhere and DeepSeek-V3
# on B200/GB200 drop tokens at capacity factor 1.0 with padding (apply_moe_token_drop) under the
# alltoall dispatcher, DeepSeek-V3 there with its shared expert overlapped with the dispatch
# (moe_shared_expert_overlap; Qwen3 has none); DeepSeek-V3 on H100 runs DeepEP (flex) with
# force-balanced routing and the EP all-to-all overlapped (overlap_moe_expert_parallel_comm,
# "A2A_1F1B"). Every one is balanced by construction (force-balanced or padded to capacity); the
# padded ones need no device-to-host sync in the dispatcher (moe_pad_to_capacity), the
# force-balanced ones do. 25.11 on GB200 (Qwen3-30B-A3B): dropless with force-balanced routing
# (set_qwen3_common_configs), HybridEP (moe_flex_dispatcher_backend="hybridep", which
# src/megatron/bridge/training/flex_dispatcher_backend.py applies on GB200), no overlap. The 25.11
# and 26.04.01 DGX-H100 and DGX-B200 rows: frameworks.yaml (bridge_facts), per row.
MOE_RECIPES: dict[tuple[str, str], dict[str, object]] = {
    ("25.09", "DGX-H100"): {"moe_dispatcher": "flex", "moe_a2a_overlap": True},
    ("25.11", "DGX-GB200"): {"moe_dispatcher": "flex", "moe_a2a_overlap": False},
    ("25.09", "DGX-B200"): {"moe_dispatcher": "alltoall", "moe_a2a_overlap": False,
                            "moe_shared_expert_overlap": True, "moe_pad_to_capacity": True},
    ("25.09", "DGX-GB200"): {"moe_dispatcher": "alltoall", "moe_a2a_overlap": False,
                             "moe_shared_expert_overlap": True, "moe_pad_to_capacity": True},
}

# CUDA graphs as each release's performance scripts set them, for the rows frameworks.yaml does
# not list (facts from the release's code; a row not listed runs eagerly). 25.09 (v0.1.0rc4
# scripts/performance/configs/*/*.yaml, the perf_matrix's cuda_graphs, which utils/helpers.py
# set_cuda_graph_overrides sets as model.enable_cuda_graph): on for Llama 3 8B on B200,
# Qwen3-30B-A3B on B200 and GB200 and Qwen3-235B-A22B on GB200; off for every H100 row,
# DeepSeek-V3, Llama 3 70B and 405B, and Llama 3 8B on GB200 at per-tensor fp8. The release pins
# megatron-core 0.14, whose enable_cuda_graph is the local CudaGraphManager over the whole
# TransformerLayer (scope "full", megatron/core/transformer/transformer_layer.py) and refuses any
# recompute (transformer_config.py: "CUDA graphs not supported with activation recomputation"),
# so those rows recompute nothing. 25.11 (v0.2.2 scripts/performance/configs/*/
# workload_base_configs.py): Qwen3-30B-A3B on GB200 (FP8_MX) captures ["moe_router",
# "moe_preprocess"] with transformer_engine. The 25.11 and 26.04.01 DGX-H100 and DGX-B200 rows:
# frameworks.yaml (bridge_facts).
WHOLE_LAYER: dict[str, object] = {"cuda_graph_impl": "local", "cuda_graph_scope": ()}
ROUTER_GRAPHS: dict[str, object] = {"cuda_graph_impl": "transformer_engine",
                                    "cuda_graph_scope": ("moe_router", "moe_preprocess")}
GRAPH_RECIPES: dict[tuple[str, str, str], dict[str, object]] = {
    ("25.09", "DGX-B200", "llama3-8b"): WHOLE_LAYER,
    ("25.09", "DGX-B200", "qwen3-30b-a3b"): WHOLE_LAYER,
    ("25.09", "DGX-GB200", "qwen3-30b-a3b"): WHOLE_LAYER,
    ("25.09", "DGX-GB200", "qwen3-235b-a22b"): WHOLE_LAYER,
    ("25.11", "DGX-GB200", "qwen3-30b-a3b"): ROUTER_GRAPHS,
}


def graph_switches(release: str, system: str, preset: str) -> dict[str, object]:
    facts = bridge_facts(release, system, preset)
    if facts is not None:
        return {k: v for k, v in facts.items() if k.startswith("cuda_graph_")}
    return dict(GRAPH_RECIPES.get((release, system, preset), {}))


def recompute_modes(release: str, graphs: dict[str, object],
                    preset: str = "", system: str = "") -> tuple[Recompute, ...]:
    """The recompute modes a row may run: the release's (frameworks.yaml) where it is listed;
    none under Megatron-Core 0.14's graphs (25.09) and in every Qwen3 recipe; selective where
    the recipe names its modules (RECIPE_RECOMPUTE, run as recompute_modules:
    recompute_switches); else any of the model's modes."""
    facts = bridge_facts(release, system, preset) or {}
    if "recompute" in facts:
        return (facts["recompute"],)  # type: ignore[return-value]
    if (graphs and release == "25.09") or preset.startswith("qwen3"):
        return ("none",)
    if (preset, system) in RECIPE_RECOMPUTE:
        return ("selective",)
    return ("none", "selective", "full")


def recompute_switches(preset: str, system: str, release: str = "") -> dict[str, object]:
    """The recipe's --recompute-modules where it names them: the release's (frameworks.yaml)
    where it is listed, else RECIPE_RECOMPUTE."""
    facts = bridge_facts(release, system, preset)
    if facts is not None:
        modules = facts.get("recompute_modules")
        return {"recompute_modules": tuple(modules)} if modules else {}  # type: ignore[arg-type]
    recipe = RECIPE_RECOMPUTE.get((preset, system))
    return {"recompute_modules": tuple(recipe.split("+"))} if recipe else {}


# The GB200 dense recipes of 25.09 offload activations to the Grace CPU's memory instead of
# recomputing them (v0.1.0rc4 scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml,
# gb200 fp8_cs: mbs 2, Megatron-FSDP, cpu_offloading_num_layers 40 of 80;
# configs/llama31/llama31_405b_llm_pretrain.yaml, gb200 fp8: cpu_offloading_num_layers 95 of 126).
# Megatron-Core's cpu_offloading needs pp 1 and no recompute (transformer_config.py). The cost
# model has no CPU offloading: these rows are printed with what it gives without recompute.
RECIPE_OFFLOAD: dict[tuple[str, str], int] = {
    ("llama3-70b", "DGX-GB200"): 40, ("llama3.1-405b", "DGX-GB200"): 95}


# What the MoE recipes recompute (facts from each release's scripts, printed beside the chosen
# mode): Qwen3 none in every release (25.09 configs/qwen3/*.yaml recompute_granularity: null;
# 25.11 and 26.04 configs/qwen*/qwen3_llm_pretrain.py set_qwen3_common_configs), which the
# Qwen3 rows run (recompute_modes); DeepSeek-V3 in 25.09 (run_script.py) the selective modules
# mla_up_proj and mlp (the dense layers' MLP) on H100, mla_up_proj on B200 and GB200, which
# those rows run (recompute_switches: Megatron-Core's recompute_modules).
RECIPE_RECOMPUTE: dict[tuple[str, str], str] = {
    ("deepseek-v3", "DGX-H100"): "mla_up_proj+mlp", ("deepseek-v3", "DGX-B200"): "mla_up_proj",
    ("deepseek-v3", "DGX-GB200"): "mla_up_proj"}


def recipe_recompute(preset: str, system: str, release: str = "") -> str:
    facts = bridge_facts(release, system, preset) or {}
    if "recompute" in facts:
        modules = facts.get("recompute_modules") or ()
        return "+".join(modules) if modules else str(facts["recompute"])  # type: ignore[arg-type]
    return RECIPE_RECOMPUTE.get((preset, system), "none" if preset.startswith("qwen3") else "?")


def moe_switches(release: str, system: str, is_moe: bool, preset: str = "") -> dict[str, object]:
    if not is_moe:
        return {}
    facts = bridge_facts(release, system, preset)
    if facts is not None:
        return {k: v for k, v in facts.items() if k.startswith("moe_")}
    # --moe-router-fusion: every release's MoE recipes (25.09 configs/*/*.yaml
    # moe_router_fusion: true; 25.11 and 26.04 set_qwen3_common_configs)
    return {"moe_permute_fusion": True, "moe_router_fusion": True, "moe_load_imbalance": 1.0,
            **MOE_RECIPES.get((release, system), {})}


def recipe_switches(preset: str, tp: int, row: tuple[str, str] = ("", "")) -> dict[str, object]:
    """TP overlap where the recipe of the preset (or of the MoE row: release, system) runs it:
    the release's (frameworks.yaml) where the row is listed, else the rules above."""
    facts = bridge_facts(*row, preset) if row[0] else None
    if facts is not None and "tp_comm_overlap" in facts:
        on = bool(facts["tp_comm_overlap"])
    else:
        on = preset in TP_OVERLAP_PRESETS or (*row, preset) in TP_OVERLAP_MOE_ROWS
    return {"tp_comm_overlap": True} if on and tp > 1 else {}


def model_has_shared(preset: str) -> bool:
    return PRESETS[preset].moe_shared_experts > 0


def moe_label(release: str, system: str, preset: str, training: Training) -> str:
    """The row's MoE recipe in a few words: dispatcher (flex's backend), A2A or shared-expert
    overlap, padding to capacity or dropless, the fp8 recipe, and the #1998 mark."""
    tr = training
    disp = (f"flex:{FLEX_BACKENDS.get((release, system), '?')}"
            if tr.framework.moe.moe_dispatcher == "flex" else tr.framework.moe.moe_dispatcher)
    shared = model_has_shared(preset) and tr.framework.moe.moe_shared_expert_overlap
    parts = [disp + ("+a2a-overlap" if tr.framework.moe.moe_a2a_overlap else "")
             + ("+shared-overlap" if shared else ""),
             "pad" if tr.framework.moe.moe_pad_to_capacity else "dropless",
             "mx" if (release, system, preset) in FP8_MX_ROWS else "cs"]
    return " ".join(parts) + (f" {DAGGER}" if (release, system, preset) in BRIDGE_REGRESSIONS
                              else "")
