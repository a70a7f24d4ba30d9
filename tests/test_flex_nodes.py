"""The flex (DeepEP / HybridEP) dispatch counts its network-stage bytes as DeepEP's published
figures do, a token once per destination node with the sender's own among them
(tests/legacy/test_internode.py ``num_rdma_token_sent``), and a group-limited router (DeepSeek-V3's
4 of 8 groups) sends a token to fewer nodes (``costmodel.parallel.expert.units_hit``)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from costmodel_helpers import training_for
from test_bridge_releases import DSV3, QWEN235, bridge_row

from costmodel import ClusterSpec, Plan, estimate
from costmodel.layer_style import MoeRouter
from costmodel.parallel.expert import groups_hit, units_hit
from costmodel.specs import ModelSpec
from hardware_catalog import get_gpu
from search.inputs.measured import case_from_row
from search.inputs.presets import get_preset

# DeepEP's README setting: 256 experts of 2,048, top-8, hidden 7,168; one MoE layer keeps the
# exchange the step's only network traffic worth the name
DEEPEP = ModelSpec(name="deepep", layers=1, hidden=7168, ffn_hidden=2048, heads=56, kv_heads=8,
                   vocab=32000, moe_experts=256, moe_topk=8, moe_ffn_hidden=2048)
GROUPED = dataclasses.replace(DEEPEP, moe_router=MoeRouter(score="sigmoid", groups=8,
                                                           group_topk=4, expert_bias=True))


def _enumerated(units: int, experts: int, k: int, groups: int, chosen: int) -> float:
    """Expected units hit, over every set of chosen groups alike, by inclusion of each unit:
    a unit is missed when all k experts fall outside the experts it holds of the pool."""
    per_unit = experts // units
    total = 0.0
    subsets = list(itertools.combinations(range(groups), chosen))
    for subset in subsets:
        pool = [e for g in subset for e in range(g * experts // groups,
                                                 (g + 1) * experts // groups)]
        for u in range(units):
            held = sum(1 for e in pool if e // per_unit == u)
            total += 1.0 - math.comb(len(pool) - held, k) / math.comb(len(pool), k)
    return total / len(subsets)


@pytest.mark.parametrize("units", [2, 4, 8, 16, 32, 64])
def test_group_limited_routing_reaches_the_units_enumeration_gives(units: int) -> None:
    got = float(units_hit(np.array([float(units)]), GROUPED)[0])
    assert got == pytest.approx(_enumerated(units, 256, 8, 8, 4), rel=1e-9)
    assert got <= float(groups_hit(np.array([float(units)]), 256, 8)[0]) + 1e-9


def test_at_most_group_topk_nodes_and_uniform_where_units_and_groups_do_not_nest() -> None:
    units = np.array([8.0, 3.0, 6.0, 1.0])
    hit = units_hit(units, GROUPED)
    assert hit[0] <= 4.0  # DeepSeek-V3 at EP 64: "at most 4 nodes" a token
    assert hit[1:] == pytest.approx(groups_hit(units[1:], 256, 8))
    assert units_hit(units, DEEPEP) == pytest.approx(groups_hit(units, 256, 8))


def _flex_s(model: ModelSpec, ep: int, frac: float = 0.86) -> float:
    gpu = get_gpu("h100-sxm-80gb")
    gpu = dataclasses.replace(gpu, efficiency=dataclasses.replace(
        gpu.efficiency, flex_network_bw_fraction=frac))
    tr = training_for("megatron", seq_len=4096, global_batch=ep, moe_dispatcher="flex")
    est = estimate(model, ClusterSpec(gpu=gpu, num_gpus=ep), Plan(dp=ep, ep=ep), tr)
    return next(c for c in est.collectives if c.group == "ep").time_s


def test_the_network_stage_counts_the_senders_own_node_as_deepep_s_figures_do() -> None:
    """Same tokens a rank, EP over 2 and over 4 nodes of 8: the network stage moves a token
    once per destination node, its own included (1.99 and 3.61 of 4 for top-8 of 256), not
    once per remote node (1.00 and 2.71), so the two exchanges stand about as 1.99 / 3.61."""
    two, four = _flex_s(DEEPEP, 16), _flex_s(DEEPEP, 32)
    counted = groups_hit(np.array([2.0, 4.0]), 256, 8)
    assert two / four == pytest.approx(counted[0] / counted[1], rel=0.05)
    # network-bound: half the NIC, about twice the exchange
    assert _flex_s(DEEPEP, 32, 0.43) == pytest.approx(2.0 * four, rel=0.05)


def test_the_group_limit_shortens_the_flex_exchange_across_nodes() -> None:
    nodes = np.array([4.0])
    ratio = float(units_hit(nodes, GROUPED)[0] / groups_hit(nodes, 256, 8)[0])
    assert _flex_s(GROUPED, 32) / _flex_s(DEEPEP, 32) == pytest.approx(ratio, rel=0.05)


def test_the_deepseek_v3_preset_and_bridge_rows_carry_the_group_limited_router() -> None:
    """Megatron-Bridge's DeepSeek-V3 recipes build config.json's router (n_group 8,
    topk_group 4: models/conversion/model_bridge.py at v0.4.2; DeepSeekV3ModelProvider at
    v0.2.2): the measured rows price the dispatch the preset does."""
    for release in ("26.04.01", "25.11"):
        router = case_from_row(bridge_row(DSV3, release, "DGX-B200")).model.moe_router
        assert router is not None and (router.groups, router.group_topk) == (8, 4)
        assert router == get_preset("deepseek-v3").moe_router


def test_a_table_cell_its_release_s_code_contradicts_is_priced_as_the_code_ran() -> None:
    """frameworks.yaml ``table_errata``: Megatron-Bridge's 25.11 DGX-B200 GPT-OSS row says EP 8
    where v0.2.2's config runs EP 64; the row is priced at EP 64 and predict says why; the
    26.04.01 row (EP 8 in table and code alike) keeps its cell."""
    from test_bridge_releases import GPTOSS

    b200 = {**GPTOSS, "gpu": "b200-180gb", "pp": 1, "dp": 64, "micro_batch": 4,
            "global_batch": 512}
    old = case_from_row(bridge_row(b200, "25.11", "DGX-B200"))
    assert old.plan.ep == 64
    assert any(a.startswith("ep=64 (the table's 8)") and "v0.2.2" in a for a in old.assumed)
    new = case_from_row(bridge_row({**b200, "global_batch": 1280}, "26.04.01", "DGX-B200"))
    assert new.plan.ep == 8 and not any(a.startswith("ep=") for a in new.assumed)
    h100 = case_from_row(bridge_row({**GPTOSS, "micro_batch": 4, "global_batch": 512},
                                    "25.11", "DGX-H100"))
    assert h100.plan.micro_batch == 1


def test_the_regressed_b200_qwen3_235b_row_runs_its_code_s_virtual_stages() -> None:
    """25.11's DGX-B200 Qwen3-235B row says VP 2; v0.2.2's config runs VP 4, the recipe whose
    20.1 s step PR #1760 started from (the row's 20.05 s): priced at VP 4, and said so. The
    26.04.01 row (PP 8, no VP in table and code) keeps its cell."""
    b200 = {**QWEN235, "gpu": "b200-180gb", "num_gpus": 64, "tp": 1, "pp": 8, "vpp": 2,
            "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 1024}
    old = case_from_row(bridge_row(b200, "25.11", "DGX-B200"))
    assert old.plan.vpp == 4
    assert any(a.startswith("vpp=4 (the table's 2)") and "#1760" in a for a in old.assumed)
    new = case_from_row(bridge_row({**b200, "num_gpus": 256, "dp": 32, "vpp": 1,
                                    "global_batch": 8192}, "26.04.01", "DGX-B200"))
    assert new.plan.vpp == 1 and not any(a.startswith("vpp=") for a in new.assumed)


def test_every_erratum_names_row_columns_and_says_why() -> None:
    from hardware_catalog.frameworks import load_profiles

    layout = {"tp", "pp", "vpp", "cp", "ep", "dp", "zero_stage", "micro_batch", "global_batch"}
    for source, entries in (load_profiles().get("table_errata") or {}).items():
        for key, fix in entries.items():
            assert str(fix.get("why", "")).strip(), (source, key)
            assert set(fix) - {"why"} <= layout, (source, key)


def test_explain_says_how_many_nodes_a_token_reaches_under_flex() -> None:
    """explain's MoE dispatch names the nodes a flex dispatch reaches: DeepSeek-V3's router
    limits EP 32's 4 nodes to 2.93 a token (3.61 uniform); no line where EP stays in a node."""
    from tcf_search.explain.analysis import moe_dispatch

    model = get_preset("deepseek-v3")
    tr = training_for("megatron", seq_len=4096, global_batch=256)
    placed = {"groups": [{"group": "ep", "size": 32, "per_node": 8.0, "nodes": 4}]}
    c = ClusterSpec(gpu=get_gpu("h100-sxm-80gb"), num_gpus=32)
    reach = moe_dispatch(model, c, tr, Plan(dp=32, ep=32, moe_dispatcher="flex"), placed)["reach"]
    assert reach["hit"] == pytest.approx(_enumerated(4, 256, 8, 8, 4))
    assert reach["uniform"] == pytest.approx(float(groups_hit(np.array([4.0]), 256, 8)[0]))
    assert reach["groups"] == (4, 8)
    inside = {"groups": [{"group": "ep", "size": 8, "per_node": 8.0, "nodes": 1}]}
    assert "reach" not in moe_dispatch(model, c, tr, Plan(dp=8, ep=8, moe_dispatcher="flex"),
                                       inside)
    assert "reach" not in moe_dispatch(model, c, tr, Plan(dp=32, ep=32), placed)  # alltoall
