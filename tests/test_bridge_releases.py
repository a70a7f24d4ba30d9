"""Megatron-Bridge's performance-summary rows run what their release ran: frameworks.yaml
``release_switches: megatron-bridge``, keyed by the row's section (release, system) and its
model, reaches a row through the measured-row path (``row_defaults``, ``case_from_row``), a knob
the release names is not searched by ``predict``, and the benchmarks' recipe tables
(``benchmarks/bridge_recipes.py``) read the same facts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from costmodel.mapping import counted_split
from costmodel.plan_fields import PLAN_KEYS
from hardware_catalog.frameworks import load_profiles, release_key, row_defaults
from search.inputs.measured import case_from_row
from tcf_search.calibration.predict_candidates import candidates

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
DETAIL = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @067f987d "
          "section {release} {system}")
# a few rows in the measured file's schema (made up here, not read from the shared file): the
# published layouts, the architecture columns a row carries
DSV3 = {"model_name": "DeepSeekV3", "layers": 61, "hidden": 7168, "ffn_hidden": 2048,
        "heads": 128, "vocab": 129280, "seq_len": 4096, "moe_experts": 256, "moe_topk": 8,
        "moe_ffn_hidden": 2048, "moe_shared_experts": 1, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "gpu": "b200-180gb", "num_gpus": 256, "tp": 1, "pp": 8, "vpp": 2, "cp": 1, "ep": 32,
        "dp": 32, "zero_stage": 1, "micro_batch": 1, "global_batch": 4096, "precision": "fp8"}
QWEN235 = {"model_name": "Qwen3_235B_a22B", "layers": 94, "hidden": 4096, "ffn_hidden": 1536,
           "heads": 64, "kv_heads": 4, "vocab": 151936, "seq_len": 4096, "moe_experts": 128,
           "moe_topk": 8, "moe_ffn_hidden": 1536, "gpu": "h100-sxm-80gb", "num_gpus": 256,
           "tp": 2, "pp": 8, "vpp": 4, "cp": 1, "ep": 32, "dp": 16, "zero_stage": 1,
           "micro_batch": 1, "global_batch": 2048, "precision": "fp8"}
LLAMA8 = {"model_name": "LLAMA3_8B", "layers": 32, "hidden": 4096, "ffn_hidden": 14336,
          "heads": 32, "kv_heads": 8, "vocab": 128256, "seq_len": 8192, "gpu": "h100-sxm-80gb",
          "num_gpus": 8, "tp": 1, "pp": 1, "cp": 1, "dp": 8, "zero_stage": 3, "micro_batch": 1,
          "global_batch": 128, "precision": "fp8"}


def bridge_row(base: dict[str, object], release: str, system: str) -> dict[str, object]:
    return {**base, "framework": "nemo", "source": "megatron-bridge",
            "source_detail": DETAIL.format(release=release, system=system)}


@pytest.mark.parametrize(("detail", "model", "key"), [
    ("x section 26.04.01 DGX-B200", "DeepSeekV3", "26.04.01 DGX-B200 deepseekv3"),
    ("x section 25.11 DGX-B200", "DeepSeekV3 (w/ MTP)", "25.11 DGX-B200 deepseekv3"),
    ("x section 25.11 DGX-H100", "Qwen3_30B_a3B", "25.11 DGX-H100 qwen3-30b-a3b"),
    ("x section 25.11 DGX-H100", "LLAMA3.1_405B", "25.11 DGX-H100 llama3.1-405b"),
    ("x section 26.04.01 DGX-H100", "GPT OSS 120B", "26.04.01 DGX-H100 gpt-oss-120b"),
    ("NVIDIA/dgxc-benchmarking@8f5cbb37aa grok1/README.md (v25.02)", "Grok", "8f5cbb37 grok1"),
    ("NVIDIA/NeMo docs/source/performance/performance_summary.md @8e3d65dc (24.07 container)",
     "Nemotron-340B", "8e3d65dc nemotron-340b"),
    ("a paper, table 3", "x", ""),
])
def test_release_key(detail: str, model: str, key: str) -> None:
    assert release_key(detail, model) == key


def test_deepseek_v3_on_b200_runs_its_2604_recipe() -> None:
    """DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2: DeepEP with the A2A overlap, TE graphs of
    attention and the router, recompute of mla_up_proj and mlp, the recipe's layout (8 layers
    on the first rank, 5 on the last), bf16 gradients and Adam moments; predict searches none
    of the knobs the release names."""
    case = case_from_row(bridge_row(DSV3, "26.04.01", "DGX-B200"))
    fw, plan = case.training.framework, case.plan
    assert fw.moe.moe_dispatcher == "flex" and fw.moe.moe_a2a_overlap
    assert not fw.moe.moe_shared_expert_overlap and fw.moe.moe_load_imbalance == 1.0
    assert fw.moe.moe_permute_fusion and fw.moe.moe_router_fusion
    assert fw.kernels.cuda_graph_impl == "transformer_engine"
    assert set(fw.kernels.cuda_graph_scope) == {"attn", "moe_router", "moe_preprocess"}
    assert fw.numerics.grad_dtype_bytes == 2 and fw.numerics.optimizer_state_bytes == 2
    assert fw.numerics.fp8_param_gather  # the nemo profile's at fp8, as the mx preset's
    assert plan.recompute == "selective" and plan.recompute_modules == ("mla_up_proj", "mlp")
    assert (plan.first_stage_layers, plan.last_stage_layers) == (8, 5)
    assert {"recompute", "first_stage_layers", "last_stage_layers"} <= case.given
    plans = candidates(case)
    assert plans and {(p.recompute, p.first_stage_layers, p.last_stage_layers)
                      for p in plans} == {("selective", 8, 5)}


def test_a_release_s_model_field_builds_the_mtp_layer_and_costs_the_last_stage() -> None:
    """DeepSeek-V3's recipes build one multi-token prediction layer (mtp_num_layers = 1 at
    both releases): the release's model field reaches the row's model, which a Qwen3 row's does
    not, and the MTP layer and its second head and loss land on the last pipeline rank, so the
    same plan steps slower with it than without (costmodel.mtp)."""
    from dataclasses import replace

    from costmodel import estimate

    for release in ("26.04.01", "25.11"):
        assert case_from_row(bridge_row(DSV3, release, "DGX-B200")).model.mtp_layers == 1
    assert case_from_row(bridge_row(QWEN235, "26.04.01", "DGX-H100")).model.mtp_layers == 0
    case = case_from_row(bridge_row(DSV3, "26.04.01", "DGX-B200"))
    without = replace(case.model, mtp_layers=0)
    step = {m.mtp_layers: estimate(m, case.cluster, case.plan, case.training).step_time_s
            for m in (case.model, without)}
    assert step[1] > step[0]


def test_deepseek_v3_s_leading_dense_layers_are_built_as_its_recipe_builds_them() -> None:
    """Both releases' DeepSeek-V3 keeps its first 3 layers dense at 18,432 wide beside experts of
    2,048 (DeepSeekV3ModelProvider; the row's ffn_hidden is the expert's, by the schema): the
    model the row prices is DeepSeek-V3's 671B (37.6B active) without its MTP layer, where
    61 MoE layers made it 704B; a dense_layers cell the row fills wins."""
    from costmodel.params import active_params, total_params

    for release in ("26.04.01", "25.11"):
        model = case_from_row(bridge_row(DSV3, release, "DGX-B200")).model
        assert (model.moe_dense_layers, model.ffn_hidden, model.expert_ffn_hidden) == (
            3, 18432, 2048)
        assert round(total_params(model) / 1e9) == 671
        assert round(active_params(model) / 1e9, 1) == 37.6
    mine = case_from_row({**bridge_row(DSV3, "26.04.01", "DGX-B200"), "dense_layers": 1,
                          "dense_ffn_hidden": 12288})
    assert (mine.model.moe_dense_layers, mine.model.ffn_hidden,
            mine.model.expert_ffn_hidden) == (1, 12288, 2048)


GPTOSS = {"model_name": "GPT OSS 120B", "layers": 36, "hidden": 2880, "ffn_hidden": 2880,
          "heads": 64, "kv_heads": 8, "vocab": 201088, "seq_len": 4096, "moe_experts": 128,
          "moe_topk": 4, "moe_ffn_hidden": 2880, "gpu": "h100-sxm-80gb", "num_gpus": 64,
          "tp": 1, "pp": 4, "cp": 1, "ep": 8, "dp": 16, "zero_stage": 1, "micro_batch": 1,
          "global_batch": 1280, "precision": "bf16"}


@pytest.mark.parametrize("release", ["26.04.01", "25.11"])
def test_a_release_builds_the_model_its_recipe_builds(release: str) -> None:
    """The table's rows leave head width, QK-norm and attention pattern to optional columns:
    the release's recipe gives them (Qwen3 MoE: heads of 128 dims, not hidden / heads = 64, and
    QK layernorm; gpt-oss: heads of 64 dims, not 45, biases, a 128-token window on every other
    layer and learnable sinks), and the model prices the wider attention: the same Qwen3 row
    steps slower as its recipe builds it than as hidden / heads would have it."""
    from dataclasses import replace

    from costmodel import estimate

    qwen = case_from_row(bridge_row(QWEN235, release, "DGX-H100"))
    assert (qwen.model.d_head, qwen.model.qk_norm) == (128, True)
    oss = case_from_row(bridge_row(GPTOSS, release, "DGX-H100")).model
    assert (oss.d_head, oss.bias, oss.sliding_window, oss.window_skip_freq,
            oss.attention_sinks) == (64, "all", 128, 2, True)
    assert case_from_row(bridge_row(LLAMA8, "25.11", "DGX-H100")).model.d_head == 128
    narrow = replace(qwen.model, head_dim=0, qk_norm=False)
    plan = candidates(qwen)[0]  # the release's layout with the split predict gives it
    step = {m.d_head: estimate(m, qwen.cluster, plan, qwen.training).step_time_s
            for m in (qwen.model, narrow)}
    assert step[128] > step[64]


def test_a_row_s_model_cell_beats_its_release() -> None:
    """An optional model column the row fills is what ran; the release fills only the empty."""
    row = {**bridge_row(QWEN235, "26.04.01", "DGX-H100"), "head_dim": 96, "qk_norm": "false"}
    model = case_from_row(row).model
    assert (model.d_head, model.qk_norm) == (96, False)


def test_a_release_differs_by_model_and_release() -> None:
    """25.11's Qwen3-235B on H100 overlaps the all-to-all without TP overlap; 25.11's DeepSeek-V3
    on B200 (the model_name's "(w/ MTP)" dropped from the key) runs alltoall with the shared
    expert overlapped, and its 16-stage layout; Llama 3 8B on H100 recomputes 5 whole layers."""
    qwen = case_from_row(bridge_row(QWEN235, "25.11", "DGX-H100")).training.framework
    assert qwen.moe.moe_dispatcher == "alltoall" and qwen.moe.moe_a2a_overlap
    assert qwen.tp.tp_comm_overlap is False  # the nemo profile's is on
    ds = case_from_row(bridge_row({**DSV3, "model_name": "DeepSeekV3 (w/ MTP)", "pp": 16,
                                   "vpp": 1, "ep": 8, "global_batch": 2048},
                                  "25.11", "DGX-B200"))
    assert ds.training.framework.moe.moe_dispatcher == "alltoall"
    assert ds.training.framework.moe.moe_shared_expert_overlap
    assert ds.plan.recompute_modules == ("mla_up_proj",)
    assert (ds.plan.first_stage_layers, ds.plan.last_stage_layers) == (4, 1)
    llama = case_from_row(bridge_row(LLAMA8, "25.11", "DGX-H100"))
    assert (llama.plan.recompute, llama.plan.recompute_layers) == ("full", 5)
    assert llama.training.framework.numerics.grad_dtype_bytes == 2


def test_a_row_s_cells_win_and_an_unlisted_release_runs_the_profile() -> None:
    """A cell the row gives beats its release (the split, the recompute mode); a release the
    yaml does not list gets the nemo profile's switches alone."""
    row = {**bridge_row(DSV3, "26.04.01", "DGX-B200"), "first_stage_layers": 7,
           "last_stage_layers": 7, "recompute": "full"}
    case = case_from_row(row)
    assert (case.plan.first_stage_layers, case.plan.last_stage_layers) == (7, 7)
    assert case.plan.recompute == "full"
    other = case_from_row(bridge_row(DSV3, "26.99", "DGX-B200"))
    fw = other.training.framework
    assert fw.moe.moe_dispatcher == "alltoall" and not fw.moe.moe_a2a_overlap
    assert fw.numerics.grad_dtype_bytes == 4 and "recompute" not in other.given
    assert row_defaults("nemo", "fp8", "megatron-bridge", DETAIL.format(
        release="26.99", system="DGX-B200"), "DeepSeekV3") == {"zero_stage": 1}


def test_bridge_recipes_read_the_yaml() -> None:
    """The benchmarks' recipe tables give a listed row exactly the yaml's switches, and hold no
    table entry of their own for a (release, system) the yaml lists: a fact is written once."""
    sys.path.insert(0, str(BENCH))
    import bridge_recipes as br

    listed = load_profiles()["release_switches"]["megatron-bridge"]
    for key, facts in listed.items():
        if key == "*":  # every release's: reaches each listed row below
            continue
        release, system, model = key.split()
        preset = next((p for p, name in br.TABLE_MODELS.items()
                       if release_key("section x y", name).endswith(" " + model)), None)
        assert preset is not None, key
        got = br.bridge_facts(release, system, preset)
        assert got is not None
        moe = {k: v for k, v in facts.items() if k.startswith("moe_")}
        assert br.moe_switches(release, system, True, preset) == moe
        graphs = {k: v for k, v in facts.items() if k.startswith("cuda_graph_")}
        assert br.graph_switches(release, system, preset) == graphs
        if "recompute" in facts:
            assert br.recompute_modes(release, {}, preset, system) == (facts["recompute"],)
        assert (release, system) not in br.MOE_RECIPES
        assert (release, system, preset) not in br.GRAPH_RECIPES
        # the plan fields bench_external prices the row with are a plan's, and the split is
        # the one the measured row gets (a release's counted split included)
        model = br.PRESETS[preset]
        plan = br.plan_facts(release, system, preset, model.layers, 8)
        assert set(plan) <= set(PLAN_KEYS) - {"recompute", "moe_dispatcher", "moe_a2a_overlap"}
        if facts.get("embedding_in_pipeline_split"):
            assert (plan["first_stage_layers"], plan["last_stage_layers"]) == counted_split(
                model.layers, 8, True, bool(facts.get("loss_in_pipeline_split")))


def test_every_listed_release_runs_te_s_in_place_cross_entropy() -> None:
    """Both releases' performance scripts set cross_entropy_fusion_impl "te" for every recipe:
    Transformer Engine's loss writes the gradient over the logits in its forward, so a logit
    holds its own bf16 bytes (the generic loss: 6) and the loss makes fewer passes."""
    from costmodel import estimate

    for base, release, system in ((DSV3, "26.04.01", "DGX-B200"), (QWEN235, "25.11", "DGX-H100"),
                                  (LLAMA8, "25.11", "DGX-H100")):
        case = case_from_row(bridge_row(base, release, system))
        assert case.training.framework.kernels.loss_kernel == "te_inplace"
    case = case_from_row(bridge_row(LLAMA8, "25.11", "DGX-H100"))
    plan = candidates(case)[0]
    te, fused = (estimate(case.model, case.cluster, plan, tr) for tr in (
        case.training, case.training.with_switches(loss_kernel="fused")))
    logits = plan.micro_batch * 8192 * 128256 / plan.tp  # one micro-batch's, on the one stage
    assert fused.memory.peak.buffers_bytes - te.memory.peak.buffers_bytes == pytest.approx(
        (6.0 - 2.0) * logits, rel=1e-6)
    assert te.step_time_s < fused.step_time_s
