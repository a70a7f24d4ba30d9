"""Expert parallelism (GShard, Lepikhin et al., 2020; Megatron-Core's alltoall dispatcher): every
MoE layer dispatches its tokens to the ranks holding their experts and combines the results."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.comm import CollectiveArrays
from costmodel.mapping import expert_tp
from costmodel.parallel.mesh import Mesh
from costmodel.specs import ModelSpec, Training


@dataclass(frozen=True, slots=True)
class ExpertComm:
    """EP's time per MoE layer per micro-batch (forward; the backward mirrors it)."""

    token_bytes: np.ndarray  # one rank's routed tokens
    moe_fraction: float
    moe_on: float  # 1 for a MoE model, else 0
    layer_fwd_s: np.ndarray

    @property
    def average_layer_s(self) -> np.ndarray:
        """Per layer of an average stage (dense layers have none)."""
        return self.moe_fraction * self.layer_fwd_s

    def collective(self, g: Mesh, layers: int) -> CollectiveArrays:
        per_step = g.micro_batches * (layers / g.pp) * self.moe_fraction
        return CollectiveArrays(
            "ep_token_all_to_all", "ep", "all_to_all", g.plan.ep,
            per_step * 4 * self.token_bytes * self.moe_on, comm.tier(g.ep, g.k_ep),
            per_step * 2 * self.layer_fwd_s, per_step * 2 * self.layer_fwd_s)


def expert_parallel(model: ModelSpec, tr: Training, g: Mesh) -> ExpertComm:
    # each rank dispatches its own M / tp sequence shard (MoE with TP runs sequence parallel);
    # when the experts are tensor-parallel (EP carved out of dp x cp) the expert-TP ranks then
    # all-gather what they received and reduce-scatter the results (Megatron's alltoall
    # dispatcher), over the expert-TP group's links (Megatron-Core's
    # --expert-tensor-parallel-size: tp by default, 1 where EP folds, any size under folding)
    tp, link = g.tp, g.link
    x_tok = g.tokens / tp * max(model.moe_topk, 1) * model.hidden * tr.activation_dtype_bytes
    moe_on = 1.0 if model.is_moe else 0.0
    etp = expert_tp(g.plan).astype(float)
    etp_gather = np.where(etp > 1, comm.gather_time(x_tok * etp, etp, g.k_etp, link), 0.0)
    layer_fwd = 2.0 * (comm.all_to_all_time(x_tok, g.ep, g.k_ep, link) + etp_gather) * moe_on
    return ExpertComm(token_bytes=x_tok, moe_fraction=model.moe_layers / model.layers,
                      moe_on=moe_on, layer_fwd_s=layer_fwd)
