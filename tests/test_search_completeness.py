"""Search completeness: on shipped studies, the search's best is never below the tool's own
figure for a published production layout of the same run (the knobs a paper leaves unsaid are
given every value, the best that fits with the study's headroom counts)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from costmodel import Plan, estimate_batch, plans_to_arrays
from costmodel.specs import SpecError
from search.evaluate import Evaluator
from search.prune import memory_stage
from search.space import build_space, enumerate_layouts
from search.specs import build_specs
from search.study import load_study

PUBLISHED = {
    # Dubey et al. (2024), sec. 3.3 and Table 4: TP8, CP1, PP16, DP128 at 8k sequences, one
    # layer fewer on the first and the last stage (126 = 7 + 14*8 + 7), interleaved
    "llama3.1-405b-h100x16384": Plan(tp=8, pp=16, dp=128, sequence_parallel=True,
                                     first_stage_layers=7, last_stage_layers=7),
    # Narayanan et al. (SC21), Table 1: GPT-3 175B on 1,024 A100 as TP8 x PP16 x DP8
    "gpt3-175b-a100x1024": Plan(tp=8, pp=16, dp=8, sequence_parallel=True),
}


def _variants(plan: Plan) -> list[Plan]:
    out = []
    for vpp, rc, zero in itertools.product((1, 2, 3, 4, 6, 8), ("none", "selective", "full"),
                                           (0, 1, 2)):
        try:
            out.append(replace(plan, vpp=vpp, recompute=rc, zero_stage=zero))  # type: ignore[arg-type]
        except SpecError:
            continue
    return out


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_search_best_is_not_below_the_published_layout(name: str) -> None:
    study = load_study(f"studies/{name}.yaml")
    specs = build_specs(study)
    space = build_space(study, specs)
    stage = memory_stage(specs, space, enumerate_layouts(space).columns)
    ev = Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))
    best = ev.exhaustive(1).best[0]
    plans = _variants(PUBLISHED[name])
    out = estimate_batch(specs.model, specs.cluster, specs.training, plans_to_arrays(plans))
    room = (out["usable_bytes"] - out["peak_mem_bytes"]) / 2**30 - specs.headroom_gib
    tput = np.where(room >= 0, out["tokens_per_s_per_gpu"], 0.0)
    assert tput.max() > 0, "some setting of the published layout fits"
    assert best.metrics["tokens_per_s_per_gpu"] >= tput.max() * (1 - 1e-9), (
        best.plan, plans[int(np.argmax(tput))])
