"""The word embedding held by two pipeline stages (a tied LM head, or MTP's embedding on the last
stage) has its gradient all-reduced between them after backward, on the step's critical path
(Megatron-Core ``_allreduce_word_embedding_grads``, nanotron ``sync_tied_weights_gradients``;
``costmodel.pipeline.shared_embedding_sync``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan, Training, estimate

NAME = "pp_shared_embedding_grad"


def _sync(model: ModelSpec, cluster: ClusterSpec, plan: Plan, tr: Training):
    return {c.name: c for c in estimate(model, cluster, plan, tr).collectives}.get(NAME)


@pytest.fixture
def tied(llama8b: ModelSpec) -> ModelSpec:
    return replace(llama8b, tied_embeddings=True)


def test_two_stages_share_it(tied: ModelSpec, h100) -> None:
    """vocab x hidden / tp gradients in the reduce dtype, between the first and last stage,
    all exposed."""
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=4096, global_batch=64)
    c = _sync(tied, cluster, Plan(tp=2, pp=4, dp=2), tr)
    assert c is not None and c.group == "pp" and c.op == "all_reduce" and c.group_size == 2
    assert c.bytes == pytest.approx(tied.vocab * tied.hidden / 2
                                    * tr.framework.numerics.grad_reduce_dtype_bytes)
    assert c.time_s > 0.0 and c.exposed_s == c.time_s


def test_one_stage_or_untied_none(tied: ModelSpec, llama8b: ModelSpec, h100) -> None:
    cluster = ClusterSpec(gpu=h100, num_gpus=16)
    tr = training_for(seq_len=4096, global_batch=64)
    for model, plan in ((tied, Plan(tp=2, pp=1, dp=8)), (llama8b, Plan(tp=2, pp=4, dp=2))):
        c = _sync(model, cluster, plan, tr)
        assert c is None or (c.bytes == 0.0 and c.time_s == 0.0)


def test_mtp_shares_it_untied(llama8b: ModelSpec, h100) -> None:
    """MTP's depths embed on the last stage: the embedding's gradient is reduced there too."""
    mtp = replace(llama8b, mtp_layers=1)
    c = _sync(mtp, ClusterSpec(gpu=h100, num_gpus=16), Plan(tp=2, pp=4, dp=2),
              training_for(seq_len=4096, global_batch=64))
    assert c is not None and c.bytes > 0.0


def test_across_nodes_slower_than_within(tied: ModelSpec, h100) -> None:
    """The pair sits one job-width apart: within a node only when the whole job is."""
    tr = training_for(seq_len=4096, global_batch=64)
    inside = _sync(tied, ClusterSpec(gpu=h100, num_gpus=8), Plan(tp=2, pp=4, dp=1), tr)
    across = _sync(tied, ClusterSpec(gpu=h100, num_gpus=16), Plan(tp=2, pp=4, dp=2), tr)
    assert inside is not None and across is not None
    assert inside.bytes == across.bytes
    assert inside.tier == "nvlink" and across.tier == "network"
    assert across.time_s > 2.0 * inside.time_s

