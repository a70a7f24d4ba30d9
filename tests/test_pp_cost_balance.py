"""nanotron's pipeline placement by compute cost (src/nanotron/models/base.py, build_model): the
LM head counts as vocab x h against 4 h^2 + 3 f h a layer, and the block that crosses a rank's
share of the total stays on that rank."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate
from costmodel.mapping import cost_balanced_split, stage_layers
from costmodel.plans import as_plan_arrays, plans_to_arrays

# Llama 3.2 1B's shape: a layer 4 x 2048^2 + 3 x 8192 x 2048 = 67.1M, the head 128256 x 2048 =
# 262.7M (3.9 layers); 16 layers + head = 1,336.5M, 668.2M a rank at pp=2: rank 0 takes layers
# until the running cost passes 668.2M (the tenth layer, 671M), rank 1 the other 6 and the head
H, F, V = 2048, 8192, 128256
LAYER, HEAD = 4 * H * H + 3 * F * H, V * H


def test_one_billion_model_on_two_stages_splits_ten_and_six() -> None:
    assert cost_balanced_split(16, 2, LAYER, HEAD) == (10, 6)


def test_crossing_block_stays_on_its_rank() -> None:
    """32 layers, no head cost, pp=4: thresholds 8, 16, 24, 32 are passed by the 9th, 17th and
    25th layers, which stay behind: 9, 8, 8, 7."""
    assert cost_balanced_split(32, 4, 1.0, 0.0) == (9, 7)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_head_stage_holds_no_more_layers_than_the_first(pp: int) -> None:
    first, last = cost_balanced_split(16, pp, LAYER, HEAD)
    assert 1 <= last <= first and first + last <= 16


def test_balance_lightens_the_head_stage_and_keeps_every_layer(h100) -> None:
    model = ModelSpec(name="1b", layers=16, hidden=H, ffn_hidden=F, heads=32, kv_heads=8,
                      vocab=V, tied_embeddings=True)
    p = as_plan_arrays(plans_to_arrays([Plan(pp=2, dp=4, micro_batch=1)]))
    even, bal = stage_layers(16, p), stage_layers(16, p, (LAYER, HEAD))
    assert (even.first[0], even.last[0]) == (8, 8) and (bal.first[0], bal.last[0]) == (10, 6)
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    plan = Plan(pp=2, dp=4, micro_batch=1)
    tr = Training(seq_len=4096, global_batch=32)
    a = estimate(model, cluster, plan, tr)
    b = estimate(model, cluster, plan, Training(seq_len=4096, global_batch=32,
                                                pp_cost_balance=True))
    assert b.step_time_s < a.step_time_s  # the head's stage was the slowest
    given = Plan(pp=2, dp=4, micro_batch=1, first_stage_layers=8, last_stage_layers=8)
    assert np.isclose(estimate(model, cluster, given, Training(
        seq_len=4096, global_batch=32, pp_cost_balance=True)).step_time_s, a.step_time_s)
