"""What the validity rules (``costmodel.rules``) read besides the plan: the model's, the run's and
the cluster's sizes, and what the framework (from its profile) or the study allows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from costmodel.framework import FrameworkProfile
from costmodel.rule_table import Facts, Switches
from costmodel.specs import ClusterSpec, ModelSpec, Training

__all__ = ["FRAMEWORK_FACTS", "Facts", "Switches", "facts_of", "framework_facts"]


def facts_of(model: ModelSpec, cluster: ClusterSpec, training: Training,
             switches: Switches | None = None) -> Facts:
    """The facts of a model on a cluster; the framework's own switches (``recompute_per_chunk``,
    ``microbatch_groups``, ``moe_tp_sequence_parallel``: a profile's) are the training's."""
    fw = training.framework
    switches = replace(switches or Switches(),
                       recompute_per_chunk=fw.activations.recompute_per_chunk,
                       microbatch_groups=fw.pp.microbatch_groups,
                       moe_tp_sequence_parallel=fw.moe.moe_tp_sequence_parallel)
    return Facts(layers=model.layers, heads=model.heads, kv_heads=model.kv_heads,
                 experts=model.moe_experts, seq_len=training.seq_len,
                 global_batch=training.global_batch, num_gpus=cluster.num_gpus,
                 nvlink_domain=cluster.nvlink_domain, switches=switches,
                 mtp_layers=model.mtp_layers, mla=model.mla is not None,
                 expert_bias=model.is_moe and model.bias == "all",
                 host_link=cluster.gpu.host_link_bw_bytes_per_s > 0
                 and cluster.gpu.host_memory_bytes > 0,
                 **framework_facts(training.framework),
                 **graph_facts(model, training))


# what a framework builds and implements at all, as its profile holds them (rules moe_*,
# mtp, framework_*)
FRAMEWORK_FACTS = ("moe_max_zero_stage", "moe_tensor_parallel", "multi_token_prediction",
                   "zero_stages", "zero_stages_pp", "recompute_modes", "partial_recompute",
                   "pp_schedules", "selective_recompute", "cpu_offloading", "moe_dispatchers",
                   "moe_a2a_overlaps", "pp_cost_balance")


def framework_facts(profile: FrameworkProfile) -> dict[str, Any]:
    return {name: profile.switch(name) for name in FRAMEWORK_FACTS}


def graph_facts(model: ModelSpec, training: Training) -> dict[str, Any]:
    """The fields of :class:`Facts` the training's switches give: what
    ``costmodel.graphs.graphs_allowed`` reads, the MoE dispatch and the optimizer's precision."""
    return {"moe_layers": model.moe_layers,
            "cuda_graph_impl": training.framework.kernels.cuda_graph_impl,
            "cuda_graph_scope": training.framework.kernels.cuda_graph_scope,
            "moe_pad_to_capacity": training.framework.moe.moe_pad_to_capacity,
            "moe_a2a_overlap": training.framework.moe.moe_a2a_overlap,
            "low_precision_moments": (training.framework.numerics.master_weights
                                      and training.framework.numerics.optimizer_state_bytes < 4),
            "moe_dispatcher": training.framework.moe.moe_dispatcher,
            "moe_shared_expert_overlap": training.framework.moe.moe_shared_expert_overlap}
