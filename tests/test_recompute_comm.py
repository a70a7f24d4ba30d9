"""Full recompute reruns each recomputed layer's forward with its collectives: TP's, the CP ring's
and the EP dispatch and combine. The step always paid them (``pipeline.stage_times`` counts
``r * comm_fwd``); the per-collective table, which explain, compare and the report show, counts
them too: bytes, time and exposure alike, and for partial recompute by the share of layers."""

from __future__ import annotations

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, estimate
from costmodel.specs import GpuSpec

MOE = ModelSpec(layers=8, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=8, vocab=32000,
                moe_experts=64, moe_topk=4, moe_ffn_hidden=1024)
# TP without sequence parallelism on the MoE layers (its all-reduce is what the test counts),
# which Megatron-Core's MoELayer refuses: the switch off, as nanotron's and DeepSpeed's run it
TRAIN = training_for(seq_len=8192, global_batch=32, moe_tp_sequence_parallel=False)


def _collectives(gpu: GpuSpec, **plan: object) -> dict[str, object]:
    p = Plan(tp=2, cp=2, dp=4, ep=4, micro_batch=1, **plan)  # type: ignore[arg-type]
    est = estimate(MOE, ClusterSpec(gpu=gpu, num_gpus=16), p, TRAIN)
    return {c.name: c for c in est.collectives}


@pytest.mark.parametrize("layers,share", [(0, 1.0), (4, 0.5), (2, 0.25)])
def test_recomputed_forwards_carry_their_collectives(h100: GpuSpec, layers: int,
                                                     share: float) -> None:
    """Per pass of a layer: EP and TP one forward and one backward (the rerun forward adds
    share / 2 of the two); the CP ring moves K and V forward and dK, dV back (share / 3)."""
    none = _collectives(h100, recompute="none")
    full = _collectives(h100, recompute="full", recompute_layers=layers)
    for name, per_pass in (("ep_token_all_to_all", 2.0), ("tp_activation_allreduce", 2.0),
                           ("cp_kv_ring", 3.0)):
        a, b = none[name], full[name]
        ratio = (per_pass + share) / per_pass
        assert b.bytes == pytest.approx(a.bytes * ratio, rel=1e-9), name  # type: ignore[attr-defined]
        assert b.time_s == pytest.approx(a.time_s * ratio, rel=1e-9), name  # type: ignore[attr-defined]
        assert b.exposed_s >= a.exposed_s, name  # type: ignore[attr-defined]


def test_the_rerun_exchange_is_exposed_as_the_forwards(h100: GpuSpec) -> None:
    """Without --overlap-moe-expert-parallel-comm nothing hides the EP exchange (the forward's
    and the backward's are exposed alike): full recompute's rerun adds half of it again."""
    none = estimate(MOE, ClusterSpec(gpu=h100, num_gpus=16),
                    Plan(tp=2, cp=2, dp=4, ep=4, recompute="none"), TRAIN)
    full = estimate(MOE, ClusterSpec(gpu=h100, num_gpus=16),
                    Plan(tp=2, cp=2, dp=4, ep=4, recompute="full"), TRAIN)
    ep_none = next(c for c in none.collectives if c.name == "ep_token_all_to_all")
    ep_full = next(c for c in full.collectives if c.name == "ep_token_all_to_all")
    # the rerun forward's exchange is exposed as the forward's is
    assert ep_full.exposed_s - ep_none.exposed_s == pytest.approx(ep_none.exposed_s / 2,
                                                                   rel=1e-9)
