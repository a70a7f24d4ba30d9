"""The search space generates exactly the valid layouts, and the search never emits an invalid
plan."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import optuna
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import Plan, check_plan
from search.inputs.specs import build_specs
from search.inputs.study import parse_study
from search.pipeline import RunOptions, run_study
from search.space import AXES, DERIVED, SearchSpace, build_space, enumerate_layouts, violations


def tiny_study(gpus: int = 16, extra: str = "", layers: int = 6, seq: int = 512,
               batch: int = 32) -> str:
    return f"""
model:
  architecture: {{layers: {layers}, hidden: 256, ffn_hidden: 512, heads: 8, kv_heads: 4,
                 vocab: 1000, moe: {{experts: 4, topk: 2}}}}
training: {{seq_len: {seq}, global_batch: {batch}}}
cluster: {{gpu: h100-sxm-80gb, gpus: {gpus}, gpus_per_node: 4}}
search_space:
  cp: auto
  vpp: [1, 2, 3]
  micro_batch: [1, 2, 4]
  pp_schedule: [1f1b, gpipe]
{extra}
"""


def _some_split(layers: int, pp: int, vpp: int) -> bool:
    """Some first/last split Megatron builds with vpp chunks, by trying them all: every rank's
    layers divisible by vpp, or the ends c - e and c - l around middles of c, c % vpp == 0."""
    for first, last in itertools.product(range(1, layers + 1), repeat=2):
        rest = layers - first - last
        if pp == 2 and rest != 0 or pp > 2 and (rest < pp - 2 or rest % (pp - 2)):
            continue
        c = rest // (pp - 2) if pp > 2 else max(first, last)
        ranks = [first, *[c] * (pp - 2), last]
        if all(n % vpp == 0 for n in ranks):
            return True
        for cc in (c, c + 1) if pp == 2 else (c,):
            if cc % vpp == 0 and cc - 1 <= first <= cc and cc - 1 <= last <= cc:
                return True
    return False


def valid_by_hand(s: SearchSpace, v: dict[str, int]) -> bool:
    """The validity rules restated independently of ``search.space``."""
    tp, pp, cp, ep, vpp = v["tp"], v["pp"], v["cp"], v["ep"], v["vpp"]
    if s.facts.num_gpus % (tp * pp * cp):
        return False
    dp = s.facts.num_gpus // (tp * pp * cp)
    # the MoE dispatch is decided per layout: it stays if one of the space's options runs
    return base_valid(s, v, tp, pp, cp, ep, vpp, dp) and any(
        dispatch_valid(s, v, tp, cp, ep, vpp, pp, dp, d, o) for d, o in s.dispatch)


def dispatch_valid(s: SearchSpace, v: dict[str, int], tp: int, cp: int, ep: int, vpp: int,
                   pp: int, dp: int, d: int, o: int) -> bool:
    """A plan's own MoE dispatch (0: the training's): one the launcher offers, not the
    training's; flex named needs ep x expert TP > 1; the all-to-all overlap needs EP, the
    alltoall or flex dispatcher, no full recompute, and vpp > 1 under pp."""
    f = s.facts
    disp = ("", "alltoall", "allgather", "flex")[d] or f.moe_dispatcher
    overlap = f.moe_a2a_overlap if o == 0 else o == 2
    return all([
        d == 0 or (f.experts > 0 and disp != f.moe_dispatcher and disp in f.moe_dispatchers),
        o == 0 or (f.experts > 0 and overlap != f.moe_a2a_overlap
                   and overlap in f.moe_a2a_overlaps),
        disp != "flex" or d == 0 or ep * (
            v["expert_tp"] or (1 if (dp * cp) % ep else tp)) > 1,
        not overlap or (ep > 1 and disp in ("alltoall", "flex") and v["recompute"] != 2
                        and (pp == 1 or vpp > 1) and f.mtp_layers == 0),
    ])


def base_valid(s: SearchSpace, v: dict[str, int], tp: int, pp: int, cp: int, ep: int, vpp: int,
               dp: int) -> bool:
    f, sw = s.facts, s.switches
    return all([
        f.heads % tp == 0 and (f.kv_heads % tp == 0 or tp % f.kv_heads == 0),
        not sw.tp_in_node or f.nvlink_domain % tp == 0,
        pp <= f.layers and (sw.uneven_pipeline or f.layers % pp == 0),
        cp == 1 or f.seq_len % (2 * cp) == 0,
        dp in s.domains["dp"],
        ep == 1 or (f.experts % ep == 0 and (tp * dp * cp) % ep == 0),
        # the experts' own TP: 0 is derived (tp, or 1 where ep does not divide dp * cp); a
        # given one fills the stage with ep and differs from the derived one
        v["expert_tp"] == 0 or (f.experts > 0 and (tp * cp * dp) % (ep * v["expert_tp"]) == 0
                                and v["expert_tp"] != (1 if (dp * cp) % ep else tp)),
        f.experts == 0 or f.moe_tensor_parallel or tp == 1,
        f.experts == 0 or v["zero_stage"] <= f.moe_max_zero_stage,
        # MoE under TP needs sequence parallelism (Megatron's MoELayer; generic profile: on)
        f.experts == 0 or tp == 1 or v["sequence_parallel"] == 1
        or not sw.moe_tp_sequence_parallel,
        # any split where the framework takes an explicit layout (uneven_chunks: the generic
        # profile's, Megatron-Core's --pipeline-model-parallel-layout), else one its flags build
        vpp == 1 or (pp > 1 and (f.layers % (pp * vpp) == 0
                                 or (sw.uneven_pipeline and (sw.uneven_chunks
                                                             or _some_split(f.layers, pp, vpp))))),
        f.global_batch % (v["micro_batch"] * dp) == 0,
        # the interleaved schedule's groups of pp micro-batches (generic profile: on)
        vpp == 1 or not sw.microbatch_groups
        or (f.global_batch // (v["micro_batch"] * dp)) % pp == 0,
        # the ZeRO stages the framework runs (generic profile: Megatron-FSDP's ZeRO-2/3 not
        # beside a pipeline)
        v["zero_stage"] in (f.zero_stages_pp if pp > 1 else f.zero_stages),
        v["zero_stage"] == 0 or dp * cp > 1 or (f.experts > 0 and tp * cp * dp // (
            ep * (v["expert_tp"] or (1 if (dp * cp) % ep else tp))) > 1),
        v["sequence_parallel"] == 0 or tp > 1,
        v["pp_schedule"] == 0 or (vpp == 1 and pp > 1),
        # the framework's schedules (generic profile: Megatron-Core's 1F1B and interleaved 1F1B)
        pp == 1 or ("interleaved" if vpp > 1 else ("1f1b", "interleaved", "gpipe")[
            v["pp_schedule"]]) in f.pp_schedules,
    ])


def brute_force(s: SearchSpace) -> set[tuple[int, ...]]:
    axes = [a for a in AXES if a != DERIVED]
    out = set()
    for combo in itertools.product(*(s.domains[a] for a in axes)):
        v = dict(zip(axes, combo, strict=True))
        if valid_by_hand(s, v):
            v["dp"] = s.facts.num_gpus // (v["tp"] * v["pp"] * v["cp"])
            out.add(tuple(v[a] for a in AXES))
    return out


def enumerated(s: SearchSpace) -> set[tuple[int, ...]]:
    layouts = enumerate_layouts(s)
    rows = set(zip(*(layouts.columns[a].tolist() for a in AXES), strict=True))
    assert len(rows) == len(layouts), "no layout twice"
    assert sum(layouts.pruned_by.values()) + len(layouts) == s.size, "every combination counted"
    return rows


def test_enumeration_equals_brute_force_filtering() -> None:
    study = parse_study(tiny_study(extra="  uneven_pipeline: false"))
    space = build_space(study, build_specs(study))
    expected = brute_force(space)
    assert 0 < len(expected) < space.size
    assert enumerated(space) == expected


@settings(max_examples=25, deadline=None)
@given(gpus=st.sampled_from([1, 2, 4, 6, 8, 12, 16]), layers=st.integers(1, 12),
       seq=st.sampled_from([64, 96, 512]), batch=st.sampled_from([6, 8, 16, 24]),
       in_node=st.booleans(), uneven=st.booleans())
def test_enumeration_equals_brute_force_on_random_spaces(gpus: int, layers: int, seq: int,
                                                         batch: int, in_node: bool,
                                                         uneven: bool) -> None:
    extra = f"  tp_in_node: {str(in_node).lower()}\n  uneven_pipeline: {str(uneven).lower()}"
    study = parse_study(tiny_study(gpus=gpus if gpus <= 4 else gpus - gpus % 4, extra=extra,
                                   layers=layers, seq=seq, batch=batch))
    space = build_space(study, build_specs(study))
    got = enumerated(space)
    assert got == brute_force(space)


def test_rules_attribute_pruning_to_tp_pp_cells() -> None:
    study = parse_study(tiny_study())
    space = build_space(study, build_specs(study))
    layouts = enumerate_layouts(space)
    by_cell = sum(n for cell in layouts.cell_pruned.values() for n in cell.values())
    assert by_cell == sum(layouts.pruned_by.values())


def test_search_never_emits_an_invalid_plan(tmp_path: Path) -> None:
    study = parse_study(tiny_study(extra="  tp_in_node: false"), name="tiny-space")
    specs = build_specs(study)
    space = build_space(study, specs)
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=40, exhaustive=True))
    assert result.top, "something fits"
    stored = optuna.load_study(study_name="tiny-space", storage=_journal(tmp_path))
    plans = [t.user_attrs["plan"] for t in stored.get_trials()]
    plans += [r.to_dict()["plan"] for r in result.top]
    assert len(plans) > 10

    for raw in plans:
        plan = Plan(**raw)
        check_plan(specs.model, specs.cluster, plan, specs.training)  # raises if invalid
        assert violations(space, plan) == [], raw
    for r in result.top:
        assert r.predicted["fits"] and r.predicted["peak_mem_gib"] <= r.predicted["usable_mem_gib"]


def _journal(path: Path) -> optuna.storages.BaseStorage:
    from search.storage import StorageSpec

    return StorageSpec.parse(None, path).open()


def test_domains_follow_the_study() -> None:
    study = parse_study(tiny_study(extra="  tp: [2]\n  zero_stage: 1"))
    space = build_space(study, build_specs(study))
    cols = enumerate_layouts(space).columns
    assert set(np.unique(cols["tp"])) == {2} and set(np.unique(cols["zero_stage"])) == {1}
