"""Where a plan's ranks sit, as its framework places them: for every parallel group, how many
members share an NVLink domain and a node, how many domains and nodes it spans, and which of the
pipeline's hops leave the domain. The one place this is computed: the communication formulas,
explain, the run table and the exports read it.

Global ranks fill nodes in order (rank r sits on node r // gpus_per_node and NVLink domain
r // nvlink_domain, as a launcher numbers them), and a framework lays its parallel dimensions
over the ranks in a fixed order, fastest-varying first (``training.framework.placement.
rank_order``; frameworks.yaml cites each framework's code). A dimension's neighbours sit as many
ranks apart as the product of the sizes before it in that order. The dense layers' grid is
``tp, cp, dp, pp`` in that order (ep takes no rank of its own there); Megatron-Core's MoE
folding lays the routed experts over the same ranks as expert TP, EP and expert DP, in the same
order, ``megatron/core/parallel_state.py`` (``RankGenerator`` built for the expert grid with cp
1). Where a group's copies meet the domain boundaries differently (an NVL72 rack of 72 GPUs under
power-of-two degrees: stage 1 of a pp 2 x dp 16 x tp 4 plan starts at rank 64, and its DP group
straddles ranks 71 and 72), the copy that spans the most domains counts: the step waits on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.errors import SpecError

ORDER_DIMS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
# the groups a plan communicates over: dims of the dense grid or of the expert grid
GROUP_DIMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)), "cp": ("dense", ("cp",)), "dp": ("dense", ("dp",)),
    # the gradients of the dense layers reduce over dp x cp together
    "dpcp": ("dense", ("cp", "dp")), "pp": ("dense", ("pp",)),
    "ep": ("expert", ("ep",)), "etp": ("expert", ("tp",)), "edp": ("expert", ("dp",)),
}
# what the run table and explain name a group that crosses the network
SHOWN_GROUPS: tuple[str, ...] = ("tp", "cp", "dp", "pp", "ep", "etp", "edp")


def parse_rank_order(order: str, where: str = "rank_order") -> tuple[str, ...]:
    """``"tp-cp-ep-dp-pp"`` as a tuple, fastest-varying first; every one of tp, cp, ep, dp, pp
    exactly once."""
    dims = tuple(d.strip() for d in str(order).split("-"))
    if sorted(dims) != sorted(ORDER_DIMS):
        raise SpecError(f"{where} must order each of {', '.join(ORDER_DIMS)} once, "
                        f"fastest-varying first, joined by '-' (got {order!r})")
    return dims


@dataclass(frozen=True, slots=True)
class Span:
    """One group's members and where they sit, per plan: of all the copies of the group (one
    per combination of the other dimensions), the most NVLink domains and nodes one spans."""

    size: np.ndarray
    domains: np.ndarray
    nodes: np.ndarray

    @property
    def per_domain(self) -> np.ndarray:
        """Members per NVLink domain (1: every neighbour is remote)."""
        return self.size / self.domains

    @property
    def per_node(self) -> np.ndarray:
        return self.size / self.nodes

    @property
    def crosses_network(self) -> np.ndarray:
        return (self.size > 1) & (self.domains > 1)


@dataclass(frozen=True, slots=True)
class Placement:
    """Every group's :class:`Span` and the pipeline's hops (see the module docstring)."""

    spans: Mapping[str, Span]
    hops: np.ndarray  # plans x hops: stage r's send to r + 1 leaves its domain in some pipeline
    domain: int
    node: int

    def span(self, group: str) -> Span:
        return self.spans[group]

    def hop_crosses(self, rank: np.ndarray) -> np.ndarray:
        """Per plan, whether pipeline rank ``rank``'s send to rank + 1 leaves its NVLink domain
        (in any of the plan's pipelines); False past the last stage."""
        r = np.broadcast_to(np.asarray(rank, dtype=float), self.hops.shape[:1])
        if self.hops.shape[1] == 0:
            return np.zeros(r.shape, dtype=bool)
        idx = np.clip(r, 0, self.hops.shape[1] - 1).astype(np.int64)
        inside = (r >= 0) & (r < self.spans["pp"].size - 1)
        return inside & np.take_along_axis(self.hops, idx[:, None], axis=1)[:, 0]

    @property
    def pp_network_hops(self) -> np.ndarray:
        """Hops between consecutive stages that leave the NVLink domain (of pp - 1): where
        stages sit closer than a domain, only those a domain boundary falls between."""
        return self.hops.sum(axis=1).astype(float)

    @property
    def pp_crosses_network(self) -> np.ndarray:
        """Some hop of the pipeline leaves the domain: its steps run at that hop's pace."""
        return self.pp_network_hops > 0

    def network_mask(self, moe: bool) -> np.ndarray:
        """Per plan, bit i set where SHOWN_GROUPS[i] crosses the network (the expert groups
        only for a model with routed experts; :func:`mask_groups` reads it back)."""
        out = np.zeros(self.spans["tp"].size.shape, dtype=np.int64)
        for bit, group in enumerate(SHOWN_GROUPS):
            if moe or group not in EXPERT_GROUPS:
                out |= self.spans[group].crosses_network.astype(np.int64) << bit
        return out

    def describe(self, i: int, moe: bool, order: Sequence[str]) -> dict[str, object]:
        """Plan ``i``'s placement as plain data: every group it communicates over (the expert
        groups only for a model with routed experts) and the link of every pipeline hop."""
        groups = []
        for group in SHOWN_GROUPS:
            sp = self.spans[group]
            if float(sp.size[i]) <= 1 or (group in EXPERT_GROUPS and not moe):
                continue
            groups.append({"group": group, "size": int(sp.size[i]),
                           "per_domain": float(sp.per_domain[i]), "domains": int(sp.domains[i]),
                           "per_node": float(sp.per_node[i]), "nodes": int(sp.nodes[i]),
                           "network": bool(sp.crosses_network[i])})
        pp = int(self.spans["pp"].size[i])
        hops = [{"from_stage": r, "to_stage": r + 1,
                 "link": "network" if bool(self.hops[i, r]) else "nvlink"}
                for r in range(pp - 1)]
        return {"rank_order": "-".join(order), "nvlink_domain": self.domain,
                "gpus_per_node": self.node, "groups": groups, "pp_hops": hops,
                "network_groups": [g["group"] for g in groups if g["network"]]}


EXPERT_GROUPS = frozenset({"ep", "etp", "edp"})


def mask_groups(mask: int) -> tuple[str, ...]:
    """The groups a :meth:`Placement.network_mask` value names, in SHOWN_GROUPS order."""
    return tuple(g for bit, g in enumerate(SHOWN_GROUPS) if int(mask) >> bit & 1)


def _strides(order: Sequence[str], sizes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, acc = {}, None
    for d in order:
        out[d] = np.ones_like(sizes[d], dtype=float) if acc is None else acc
        acc = sizes[d].astype(float) if acc is None else acc * sizes[d]
    return out


def _spanned(sizes: Mapping[str, np.ndarray], strides: Mapping[str, np.ndarray],
             dims: Sequence[str], block: int) -> np.ndarray:
    """Blocks of ``block`` consecutive ranks the group over ``dims`` spans, where the blocks
    fall on the layout's digit boundaries (:func:`_aligned`): a mixed-radix layout nests each
    dimension's spacing, so the members a block holds multiply and every copy is alike."""
    per = np.ones_like(sizes[dims[0]], dtype=float)
    size = np.ones_like(per)
    for d in dims:
        per = per * np.minimum(sizes[d], np.maximum(block // np.maximum(strides[d], 1.0), 1.0))
        size = size * sizes[d]
    return size / per


def _aligned(order: Sequence[str], sizes: Mapping[str, np.ndarray], block: int) -> np.ndarray:
    """Every dimension's spacing and extent divide the block or are divided by it: then each
    copy of a group meets the block boundaries alike and rank 0's copy counts for all."""
    st = _strides(order, sizes)
    ok = np.ones_like(st[order[0]], dtype=bool)
    for d in order:
        for x in (st[d], st[d] * sizes[d]):
            ok &= (block % x == 0) | (x % block == 0)
    return ok


def _residues(terms: Sequence[tuple[int, int]], block: int) -> np.ndarray:
    """Every sum of ``c * stride`` (``0 <= c < size``) over ``terms``, modulo ``block``: where
    the copies of a group start within a block (at most ``block`` values, however many)."""
    res = np.zeros(1, dtype=np.int64)
    for size, stride in terms:
        res = np.unique((res[:, None] + (np.arange(size) * stride)[None, :]) % block)
    return res


def _offsets(terms: Sequence[tuple[int, int]]) -> np.ndarray:
    """A copy's members relative to its first rank, in order."""
    out = np.zeros(1, dtype=np.int64)
    for size, stride in terms:
        out = (out[:, None] + (np.arange(size) * stride)[None, :]).reshape(-1)
    return np.sort(out)


def _counted(order: Sequence[str], grids: Mapping[str, Mapping[str, int]], domain: int,
             node: int) -> tuple[dict[str, tuple[int, int]], np.ndarray]:
    """One plan's spans and pipeline hops where its layout is not aligned with the domain
    (an NVL72 rack of 72 GPUs under power-of-two degrees): each group's most domains and nodes
    over its copies, and each hop that leaves a domain in any pipeline. A copy's blocks depend
    only on where it starts within a block, so each distinct start is counted once."""
    spans = {}
    for group, (grid, dims) in GROUP_DIMS.items():
        sizes = grids[grid]
        stride = 1
        mine: list[tuple[int, int]] = []
        others: list[tuple[int, int]] = []
        for d in order:
            (mine if d in dims else others).append((sizes[d], stride))
            stride *= sizes[d]
        offsets = _offsets(mine)
        out = []
        for block in (domain, node):
            at = (_residues(others, block)[:, None] + offsets[None, :]) // block
            out.append(int((1 + (np.diff(at, axis=1) != 0).sum(axis=1)).max()))
        spans[group] = (out[0], out[1])
    sizes = grids["dense"]
    stride, pp_stride = 1, 1
    others = []
    for d in order:
        if d == "pp":
            pp_stride = stride
        else:
            others.append((sizes[d], stride))
        stride *= sizes[d]
    start = _residues(others, domain)[:, None] + pp_stride * np.arange(sizes["pp"] - 1)[None, :]
    hops = ((start // domain) != ((start + pp_stride) // domain)).any(axis=0)
    return spans, hops


def place(order: Sequence[str], dense: Mapping[str, np.ndarray],
          expert: Mapping[str, np.ndarray], domain: int, node: int) -> Placement:
    """The placement of a batch of plans: ``dense`` and ``expert`` give each grid's sizes by
    dimension (tp, cp, ep, dp, pp; arrays over the plans), ``domain`` and ``node`` the GPUs of an
    NVLink domain and of a node. Layouts aligned with both are counted by formula; the others
    rank by rank, once per distinct layout."""
    grids = {"dense": dense, "expert": expert}
    strides = {name: _strides(order, sizes) for name, sizes in grids.items()}
    n_plans = np.asarray(dense["pp"]).shape[0]
    spans: dict[str, list[np.ndarray]] = {}
    for group, (grid, dims) in GROUP_DIMS.items():
        sizes, st = grids[grid], strides[grid]
        size = np.prod([sizes[d].astype(float) for d in dims], axis=0)
        spans[group] = [size, _spanned(sizes, st, dims, domain), _spanned(sizes, st, dims, node)]
    pp = np.asarray(dense["pp"]).astype(np.int64)
    width = int(max(pp.max(initial=1) - 1, 0))
    rank = np.arange(width, dtype=float)[None, :]
    s = strides["dense"]["pp"][:, None]
    hops = ((rank * s) // domain != ((rank + 1.0) * s) // domain) & (rank < pp[:, None] - 1)
    aligned = np.ones(n_plans, dtype=bool)
    for sizes in grids.values():
        for block in (domain, node):
            aligned &= _aligned(order, sizes, block)
    odd = np.flatnonzero(~aligned)
    if odd.size:
        keys = np.stack([np.asarray(g[d]) for g in grids.values() for d in ORDER_DIMS], axis=1)
        for key in np.unique(keys[odd], axis=0):
            rows = odd[(keys[odd] == key).all(axis=1)]
            k = dict(zip([f"{g}:{d}" for g in grids for d in ORDER_DIMS], key, strict=True))
            one = {g: {d: int(k[f"{g}:{d}"]) for d in ORDER_DIMS} for g in grids}
            counted, crossing = _counted(order, one, domain, node)
            for group, (doms, nodes) in counted.items():
                spans[group][1][rows] = doms
                spans[group][2][rows] = nodes
            hops[rows, :crossing.size] = crossing
    return Placement(spans={g: Span(size=v[0], domains=v[1], nodes=v[2])
                            for g, v in spans.items()},
                     hops=hops, domain=domain, node=node)
