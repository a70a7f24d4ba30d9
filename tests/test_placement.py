"""Where a plan's ranks sit (costmodel.placement): which groups and pipeline hops leave the NVLink
domain in the framework's rank order, checked on the two-node repro (pp over the network, dp
inside a node), against explicit counting of the ranks of small worlds, under Megatron's
alternative order, and as the run table, the metrics and ``explain --json`` show it."""

from __future__ import annotations

import itertools
import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clirunner import cli, one_line_error
from costmodel_helpers import training_for

from costmodel import (
    ClusterSpec,
    ModelSpec,
    Plan,
    check_plan,
    estimate,
    estimate_batch,
    mask_groups,
    plan_placement,
)
from costmodel.errors import SpecError
from costmodel.placement import GROUP_DIMS, ORDER_DIMS, SHOWN_GROUPS, parse_rank_order, place

DEFAULT = "tp-cp-ep-dp-pp"  # Megatron-Core's order
TP_PP_DP = "tp-cp-ep-pp-dp"  # Megatron's --use-tp-pp-dp-mapping
ORDERS = (DEFAULT, TP_PP_DP)
SLOW_NIC = 1e9  # bytes/s: a fiftieth of the H100's 50 GB/s NIC

TWO_NODE_STUDY = """\
name: two-node
model: {preset: llama3-8b}
training: {seq_len: 4096, global_batch: 64, framework: megatron%s}
cluster: {gpu: h100-sxm-80gb, nodes: 2}
search_space: {tp: [1], pp: [1, 4], cp: 1, vpp: 1, micro_batch: [1], zero_stage: [1],
               recompute: [none]}
search: {seed: 0, trials: 4}
"""


def _train(**switches: Any) -> Any:
    return training_for("megatron", seq_len=4096, global_batch=64, **switches)


def _cluster(gpu, num_gpus: int = 16) -> ClusterSpec:
    return ClusterSpec(gpu=gpu, num_gpus=num_gpus, gpus_per_node=8)


def _placement(model: ModelSpec, cluster: ClusterSpec, plan: Plan, tr: Any) -> dict[str, Any]:
    return plan_placement(model, cluster, plan, tr)


def _group(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in doc["groups"] if g["group"] == name)


def _tier(est, name: str) -> str:
    return next(c.tier for c in est.collectives if c.name == name)


# --- 1. the two-node repro ---------------------------------------------------------------------

REPRO = Plan(tp=1, pp=4, dp=4, micro_batch=1, zero_stage=1)
DP16 = Plan(tp=1, pp=1, dp=16, micro_batch=1, zero_stage=1)


def test_two_node_repro_pipeline_crosses_the_network_and_dp_stays_in_a_node(
        h100, llama8b: ModelSpec) -> None:
    cluster, tr = _cluster(h100), _train()
    check_plan(llama8b, cluster, REPRO, tr)
    doc = _placement(llama8b, cluster, REPRO, tr)
    assert doc["rank_order"] == DEFAULT and doc["nvlink_domain"] == 8
    assert [h["link"] for h in doc["pp_hops"]] == ["nvlink", "network", "nvlink"]
    assert [(h["from_stage"], h["to_stage"]) for h in doc["pp_hops"]] == [(0, 1), (1, 2), (2, 3)]
    dp, pp = _group(doc, "dp"), _group(doc, "pp")
    assert (dp["size"], dp["per_domain"], dp["domains"], dp["nodes"], dp["network"]) == \
        (4, 4, 1, 1, False)
    assert (pp["size"], pp["per_domain"], pp["domains"], pp["nodes"], pp["network"]) == \
        (4, 2, 2, 2, True)
    assert doc["network_groups"] == ["pp"]
    est = estimate(llama8b, cluster, REPRO, tr)
    assert _tier(est, "pp_activation_send_recv") == "network"
    assert _tier(est, "dp_grad_reduce") == "nvlink"
    # the batch says the same: pp alone crosses
    out = estimate_batch(llama8b, cluster, tr, {"tp": [1], "pp": [4], "dp": [4],
                                                "micro_batch": [1], "zero_stage": [1]})
    assert mask_groups(int(out["network_groups_mask"][0])) == ("pp",)


@pytest.mark.parametrize("plan", [REPRO, DP16], ids=["pp-over-network", "dp-over-network"])
def test_a_slower_network_slows_a_plan_whose_group_crosses_it(h100, llama8b: ModelSpec,
                                                               plan: Plan) -> None:
    tr = _train()
    check_plan(llama8b, _cluster(h100), plan, tr)
    fast = estimate(llama8b, _cluster(h100), plan, tr)
    slow = estimate(llama8b, _cluster(replace(h100, network_bw_bytes_per_s=SLOW_NIC)), plan, tr)
    assert slow.tokens_per_s_per_gpu < fast.tokens_per_s_per_gpu
    if plan is DP16:
        assert _tier(fast, "dp_grad_reduce") == "network"


# --- 2. invariants over a batch of plans -------------------------------------------------------

def _valid_batch(model: ModelSpec, cluster: ClusterSpec, tr) -> dict[str, np.ndarray]:
    rows = []
    for tp, pp, zero in itertools.product((1, 2, 4, 8), (1, 2, 4), (0, 1)):
        dp, rest = divmod(cluster.num_gpus, tp * pp)
        if rest or dp < 1:
            continue
        plan = Plan(tp=tp, pp=pp, dp=dp, micro_batch=1, zero_stage=zero,
                    sequence_parallel=tp > 1)
        try:
            check_plan(model, cluster, plan, tr)
        except SpecError:
            continue
        rows.append(plan)
    assert len(rows) >= 10
    keys = ("tp", "pp", "dp", "micro_batch", "zero_stage", "sequence_parallel")
    return {k: np.asarray([getattr(p, k) for p in rows]) for k in keys}


@pytest.mark.parametrize("num_gpus", [8, 16, 32])
def test_a_slower_network_never_speeds_a_plan_and_spares_those_inside_a_domain(
        h100, llama8b: ModelSpec, num_gpus: int) -> None:
    tr = _train()
    fast_c = _cluster(h100, num_gpus)
    slow_c = _cluster(replace(h100, network_bw_bytes_per_s=SLOW_NIC), num_gpus)
    batch = _valid_batch(llama8b, fast_c, tr)
    fast = estimate_batch(llama8b, fast_c, tr, batch)
    slow = estimate_batch(llama8b, slow_c, tr, batch)
    f, s = fast["tokens_per_s_per_gpu"], slow["tokens_per_s_per_gpu"]
    assert np.all(s <= f * (1 + 1e-12))
    mask = fast["network_groups_mask"]
    np.testing.assert_array_equal(mask, slow["network_groups_mask"])
    inside = mask == 0
    np.testing.assert_array_equal(s[inside], f[inside])
    # a world of one node crosses nothing; a world of more nodes always crosses, and pays for it
    assert bool(np.all(inside)) is (num_gpus <= fast_c.nvlink_domain)
    if num_gpus > fast_c.nvlink_domain:
        assert np.all(s < f)
    # the mask names what plan_placement says crosses
    for i in range(len(mask)):
        plan = Plan(**{k: v[i].item() for k, v in batch.items()})
        doc = _placement(llama8b, fast_c, plan, tr)
        assert list(mask_groups(int(mask[i]))) == doc["network_groups"]


# --- 3. spans against explicit counting ---------------------------------------------------------

def _random_sizes(rng: np.random.Generator, n: int, max_log2: int) -> dict[str, np.ndarray]:
    return {d: 2 ** rng.integers(0, max_log2 + 1, size=n) for d in ORDER_DIMS}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("domain", "node"), [(8, 8), (16, 8), (32, 4), (4, 2), (8, 1)])
def test_span_identities_for_random_power_of_two_sizes(order: str, domain: int,
                                                       node: int) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{order}/{domain}/{node}".encode()))
    dense, expert = _random_sizes(rng, 2000, 6), _random_sizes(rng, 2000, 6)
    at = place(parse_rank_order(order), dense, expert, domain, node)
    for group in GROUP_DIMS:
        sp = at.span(group)
        np.testing.assert_array_equal(sp.per_domain * sp.domains, sp.size)
        np.testing.assert_array_equal(sp.per_node * sp.nodes, sp.size)
        assert np.all(sp.per_domain >= sp.per_node)  # the domain holds whole nodes
        assert np.all((sp.per_domain >= 1) & (sp.per_domain <= sp.size))
        np.testing.assert_array_equal(sp.crosses_network, sp.domains > 1)
    pp = at.span("pp").size
    assert np.all((at.pp_network_hops >= 0) & (at.pp_network_hops <= np.maximum(pp - 1, 0)))
    np.testing.assert_array_equal(at.pp_crosses_network, at.span("pp").crosses_network)


def _coords(order: tuple[str, ...], sizes: dict[str, int]) -> list[dict[str, int]]:
    """Each global rank's coordinate on every dimension, the first of ``order`` fastest."""
    world = int(np.prod([sizes[d] for d in order]))
    out = []
    for r in range(world):
        c, rest = {}, r
        for d in order:
            c[d], rest = rest % sizes[d], rest // sizes[d]
        out.append(c)
    return out


def _counted(order: tuple[str, ...], sizes: dict[str, int], dims: tuple[str, ...],
             block: int) -> tuple[int, int]:
    """(members in one block, blocks spanned) of every group over ``dims``, by counting; every
    group must give the same."""
    groups: dict[tuple, list[int]] = {}
    for r, c in enumerate(_coords(order, sizes)):
        groups.setdefault(tuple(c[d] for d in order if d not in dims), []).append(r)
    seen = set()
    for ranks in groups.values():
        per_block: dict[int, int] = {}
        for r in ranks:
            per_block[r // block] = per_block.get(r // block, 0) + 1
        assert len(set(per_block.values())) == 1, per_block
        seen.add((next(iter(per_block.values())), len(per_block)))
    assert len(seen) == 1, seen
    return seen.pop()


def _counted_hops(order: tuple[str, ...], sizes: dict[str, int], domain: int) -> list[bool]:
    """Whether stage s's send to s + 1 leaves the domain, the same in every pipeline."""
    pipes: dict[tuple, dict[int, int]] = {}
    for r, c in enumerate(_coords(order, sizes)):
        pipes.setdefault(tuple(c[d] for d in order if d != "pp"), {})[c["pp"]] = r
    hops = {tuple(st[s] // domain != st[s + 1] // domain for s in range(sizes["pp"] - 1))
            for st in pipes.values()}
    assert len(hops) == 1, hops
    return list(hops.pop())


def _small_cases(seed: int, count: int) -> list[tuple[dict[str, int], dict[str, int]]]:
    rng = np.random.default_rng(seed)
    cases: list[tuple[dict[str, int], dict[str, int]]] = []
    while len(cases) < count:
        dense = {d: int(2 ** rng.integers(0, 4)) for d in ORDER_DIMS}
        expert = {d: int(2 ** rng.integers(0, 4)) for d in ORDER_DIMS}
        if np.prod(list(dense.values())) <= 64 and np.prod(list(expert.values())) <= 64:
            cases.append((dense, expert))
    return cases


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("domain", "node"), [(8, 8), (16, 8), (4, 2)])
def test_spans_and_hops_match_counting_the_ranks(order: str, domain: int, node: int) -> None:
    o = parse_rank_order(order)
    for dense, expert in _small_cases(zlib.crc32(f"{order}/{domain}/{node}".encode()), 60):
        at = place(o, {d: np.asarray([v]) for d, v in dense.items()},
                   {d: np.asarray([v]) for d, v in expert.items()}, domain, node)
        grids = {"dense": dense, "expert": expert}
        for group, (grid, dims) in GROUP_DIMS.items():
            sp = at.span(group)
            want_d = _counted(o, grids[grid], dims, domain)
            want_n = _counted(o, grids[grid], dims, node)
            got_d = (int(sp.per_domain[0]), int(sp.domains[0]))
            got_n = (int(sp.per_node[0]), int(sp.nodes[0]))
            assert (got_d, got_n) == (want_d, want_n), (group, dense, expert)
        hops = _counted_hops(o, dense, domain)
        got = [bool(at.hop_crosses(np.asarray([float(r)]))[0]) for r in range(dense["pp"] - 1)]
        assert got == hops, (dense, domain)
        assert int(at.pp_network_hops[0]) == sum(hops), (dense, domain)
        hop_docs: Any = at.describe(0, True, o)["pp_hops"]
        links = [h["link"] == "network" for h in hop_docs]
        assert links == hops


def _most_blocks(order: tuple[str, ...], sizes: dict[str, int], dims: tuple[str, ...],
                 block: int) -> int:
    """The most blocks any copy of the group over ``dims`` spans, by counting every rank."""
    groups: dict[tuple, set[int]] = {}
    for r, c in enumerate(_coords(order, sizes)):
        groups.setdefault(tuple(c[d] for d in order if d not in dims), set()).add(r // block)
    return max(len(b) for b in groups.values())


def _any_pipeline_hops(order: tuple[str, ...], sizes: dict[str, int], domain: int) -> list[bool]:
    pipes: dict[tuple, dict[int, int]] = {}
    for r, c in enumerate(_coords(order, sizes)):
        pipes.setdefault(tuple(c[d] for d in order if d != "pp"), {})[c["pp"]] = r
    return [any(st[s] // domain != st[s + 1] // domain for st in pipes.values())
            for s in range(sizes["pp"] - 1)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("domain", "node"), [(72, 4), (6, 2), (12, 4), (9, 3)])
def test_unaligned_domains_count_the_copy_that_spans_most(order: str, domain: int,
                                                          node: int) -> None:
    """Domains the layout's digits do not divide (NVL72's 72): every copy of a group is
    counted and the one over the most domains and nodes wins; a hop crosses where it does in
    any pipeline."""
    o = parse_rank_order(order)
    for dense, expert in _small_cases(zlib.crc32(f"odd/{order}/{domain}".encode()), 60):
        at = place(o, {d: np.asarray([v]) for d, v in dense.items()},
                   {d: np.asarray([v]) for d, v in expert.items()}, domain, node)
        grids = {"dense": dense, "expert": expert}
        for group, (grid, dims) in GROUP_DIMS.items():
            sp = at.span(group)
            assert int(sp.domains[0]) == _most_blocks(o, grids[grid], dims, domain), group
            assert int(sp.nodes[0]) == _most_blocks(o, grids[grid], dims, node), group
        got = [bool(at.hop_crosses(np.asarray([float(r)]))[0]) for r in range(dense["pp"] - 1)]
        assert got == _any_pipeline_hops(o, dense, domain), (dense, domain)


# --- 4. Megatron's alternative order ------------------------------------------------------------

def test_tp_pp_dp_mapping_keeps_the_pipeline_in_a_node_and_sends_dp_over_the_network(
        h100, llama8b: ModelSpec) -> None:
    plan = Plan(tp=1, pp=2, dp=8, micro_batch=1, zero_stage=1)
    cluster = _cluster(h100)
    alt, default = _train(rank_order=TP_PP_DP), _train()
    assert alt.framework.pp.rank_order == TP_PP_DP
    assert _train().with_switches(rank_order=TP_PP_DP).framework.pp.rank_order == TP_PP_DP
    check_plan(llama8b, cluster, plan, alt)
    a, d = _placement(llama8b, cluster, plan, alt), _placement(llama8b, cluster, plan,
                                                                       default)
    assert a["rank_order"] == TP_PP_DP and d["rank_order"] == DEFAULT
    assert [h["link"] for h in a["pp_hops"]] == ["nvlink"]
    assert a["network_groups"] == ["dp"] and _group(a, "dp")["nodes"] == 2
    assert [h["link"] for h in d["pp_hops"]] == ["network"]
    assert d["network_groups"] == ["pp"] and _group(d, "dp")["nodes"] == 1
    ea, ed = estimate(llama8b, cluster, plan, alt), estimate(llama8b, cluster, plan, default)
    assert _tier(ea, "pp_activation_send_recv") == "nvlink"
    assert _tier(ea, "dp_grad_reduce") == "network"
    assert _tier(ed, "pp_activation_send_recv") == "network"
    assert _tier(ed, "dp_grad_reduce") == "nvlink"


# --- 5. bad orders ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["tp-dp", "tp-cp-ep-dp-pp-pp", "tp-cp-ep-dp-xx", "",
                                 "tp-cp-cp-dp-pp"])
def test_parse_rank_order_refuses_a_bad_order(bad: str) -> None:
    with pytest.raises(SpecError, match="rank_order"):
        parse_rank_order(bad)
    with pytest.raises(SpecError, match="training.rank_order"):
        _train(rank_order=bad)


def test_parse_rank_order_reads_both_megatron_orders() -> None:
    assert parse_rank_order(DEFAULT) == ("tp", "cp", "ep", "dp", "pp")
    assert parse_rank_order(" tp - cp - ep - pp - dp ") == ("tp", "cp", "ep", "pp", "dp")


@pytest.mark.parametrize("command", ["run", "explain"])
def test_a_study_with_a_bad_rank_order_is_one_error_line(tmp_path: Path, command: str) -> None:
    study = tmp_path / "bad.yaml"
    study.write_text(TWO_NODE_STUDY % ", rank_order: tp-dp")
    args = (["run", str(study), "-o", str(tmp_path / "out")] if command == "run"
            else ["explain", str(study), "--plan", "tp=1,pp=4,mbs=1,zero=1"])
    code, _, err = cli(*args)
    one_line_error(code, err, "training.rank_order", "'tp-dp'")


# --- 6. the run table, the metrics and explain --------------------------------------------------

def test_the_run_table_and_metrics_name_the_groups_on_the_network(tmp_path: Path,
                                                                  llama8b: ModelSpec) -> None:
    study = tmp_path / "two.yaml"
    study.write_text(TWO_NODE_STUDY % "")
    code, out, err = cli("run", str(study), "-o", str(tmp_path / "out"))
    assert code == 0, err
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if "tok/s/GPU" in ln)
    assert lines[header].split("┃")[-1].strip() == "net"
    rows = {ln.split("│")[1].strip(): ln.split("│")[-1].strip()
            for ln in lines[header + 2:] if ln.count("│") > 10}
    assert rows == {"1×4×4": "pp", "1×1×16": "dp"}
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    got = {(p["plan"]["pp"], p["plan"]["dp"]): p["predicted"]["network_groups"]
           for p in doc["top"]}
    assert got == {(4, 4): "pp", (1, 16): "dp"}
    # the HTML report's table carries the same column
    code, _, err = cli("report", str(tmp_path / "out"), "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    assert "<th class=l>net</th>" in page
    assert "<td class=l>pp</td>" in page and "<td class=l>dp</td>" in page  # one group each


def test_explain_shows_the_placement_and_every_hop(tmp_path: Path) -> None:
    study = tmp_path / "two.yaml"
    study.write_text(TWO_NODE_STUDY % "")
    code, out, err = cli("explain", str(study), "--plan", "tp=1,pp=4,mbs=1,zero=1", "--json")
    assert code == 0, err
    at = json.loads(out)["communication"]["placement"]
    assert at["rank_order"] == DEFAULT
    assert [h["link"] for h in at["pp_hops"]] == ["nvlink", "network", "nvlink"]
    assert at["network_groups"] == ["pp"]
    assert {g["group"]: g["network"] for g in at["groups"]} == {"dp": False, "pp": True}
    code, text, err = cli("explain", str(study), "--plan", "tp=1,pp=4,mbs=1,zero=1")
    assert code == 0, err
    assert "placement (tp-cp-ep-dp-pp" in text
    assert "pipeline hops: 0→1 nvlink, 1→2 network, 2→3 nvlink" in text
    # the alternative order, set by the study, reaches explain
    study.write_text(TWO_NODE_STUDY % f", rank_order: {TP_PP_DP}")
    code, out, err = cli("explain", str(study), "--plan", "tp=1,pp=2,mbs=1,zero=1", "--json")
    assert code == 0, err
    at = json.loads(out)["communication"]["placement"]
    assert at["rank_order"] == TP_PP_DP
    assert [h["link"] for h in at["pp_hops"]] == ["nvlink"]
    assert at["network_groups"] == ["dp"]


def test_shown_groups_round_trip_through_the_mask() -> None:
    for r in range(1, len(SHOWN_GROUPS) + 1):
        for names in itertools.combinations(SHOWN_GROUPS, r):
            mask = sum(1 << SHOWN_GROUPS.index(g) for g in names)
            assert mask_groups(mask) == names
    assert mask_groups(0) == ()
