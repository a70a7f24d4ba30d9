"""The plan seen from a launcher: batch arithmetic and where the layers go.

Every exporter and every rule reads this one flat, derived view (``LaunchView``) so that a rule is a
one-line predicate over named numbers and its reason can quote them (``{tp}``, ``{seq_len}``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from costmodel import rules
from costmodel.mapping import chunk_counts, expert_tp, stage_counts
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.recompute_modules import MEGATRON_DEFAULT
from costmodel.rule_facts import framework_facts, graph_facts
from costmodel.specs import ModelSpec
from hardware_catalog.frameworks import framework_profile
from search.inputs import LOSS_KERNELS, PlanFile

from .options import ExportOptions, target_for

# the loss kernels that are Megatron-Core's fused cross-entropy, by its cross_entropy_fusion_impl
LOSS_FUSION = {kernel: impl for impl, kernel in LOSS_KERNELS.items()}
# ... and what Megatron-LM is told, as it runs the eager loss unless told: a profile's one-pass
# "fused" loss (priced as "native") is the native fusion
LAUNCH_LOSS_FUSION = {"fused": "native", **LOSS_FUSION}


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchView:
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int  # the routed experts' tensor parallelism, resolved (costmodel.mapping.expert_tp)
    vpp: int
    zero: int
    micro_batch: int
    global_batch: int
    microbatches: int  # per optimizer step and data-parallel rank (0 when not integral)
    layers: int
    heads: int
    kv_heads: int
    experts: int
    seq_len: int
    first: int  # resolved: both ends' counts when either is pinned (_stage_split); 0 = even
    last: int
    recompute: str
    recompute_layers: int  # with full: per stage, 0 = all
    recompute_all: bool  # full recompute of every layer on every stage
    # the Megatron-Core modules selective recomputes where they are not its default
    # (["core_attn"], which a launcher needs not be told); () otherwise
    recompute_modules: tuple[str, ...]
    # layers whose activations go to host memory (Megatron-Core's cpu_offloading_num_layers)
    cpu_offload_layers: int
    sp: bool
    schedule: str  # 1f1b | interleaved | gpipe
    precision: str
    # bf16 or fp8 training whose gradients are accumulated and reduced in bf16 (Megatron-LM's
    # --grad-reduce-in-bf16; Megatron-Core's grad_reduce_in_fp32=False), not the fp32 default
    bf16_grads: bool
    fp8_param_gather: bool  # fp8 training holding and all-gathering fp8 weights only
    # Adam's moments in bf16 beside fp32 master weights (Megatron-Core's precision-aware
    # optimizer: --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
    bf16_moments: bool
    # Megatron-Core's fused loss the training runs (--cross-entropy-fusion-impl): "native",
    # "te" (Transformer Engine's in-place cross-entropy), or "" (unfused, Megatron's default)
    loss_fusion: str
    optimizer: str
    tied: bool
    tp_comm_overlap: bool
    # the MoE dispatch run: the plan's own, else the training's (costmodel.dispatch)
    moe_dispatcher: str  # alltoall | allgather | flex
    moe_a2a_overlap: bool  # the EP all-to-all overlapped with another micro-batch's compute
    rank_order: str  # how the ranks are laid out, fastest first (costmodel.placement)
    world: int
    num_gpus: int
    gpus_per_node: int
    nodes: int
    nproc_per_node: int
    stage_layers: tuple[int, ...]  # per pipeline rank; () when the split is not integral
    middle_layers: int
    middle_stages: int
    fsdp_impl: str
    version: str
    model: ModelSpec  # the searched model, for the architecture rules
    plan_columns: dict[str, Any]  # the plan as the validity table reads it (costmodel.rules)
    rule_facts: rules.Facts

    @property
    def uneven(self) -> bool:
        return self.pp > 1 and (self.first > 0 or self.last > 0)

    def values(self) -> dict[str, Any]:
        """Named values for rule reasons; ``str.format`` cannot call properties."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["uneven"] = self.uneven
        return out


def _stage_split(layers: int, pp: int, first: int, last: int, near_even: bool
                 ) -> tuple[tuple[int, ...], int, int, int, int]:
    """The cost model's split (``costmodel.mapping.stage_counts``; ``near_even``: the launcher
    takes a per-rank layout, so the unpinned ranks may hold shares a layer apart): layers per
    pipeline rank (() when not whole), the layers and ranks between the first and the last, and
    the first and last ranks' counts when the plan pins either or the ranks differ (0, 0 for an
    even split)."""
    stages = stage_counts(layers, pp, first, last, near_even)
    if pp == 1 or (first <= 0 and last <= 0 and len(set(stages)) <= 1):
        return stages, layers, pp, 0, 0
    if not stages:
        return (), layers - max(first, 0) - max(last, 0), pp - 2, max(first, 0), max(last, 0)
    return stages, sum(stages[1:-1]), pp - 2, stages[0], stages[-1]


# The exporters' switches: the chunks of a virtual stage are those the launcher's flags build
# (virtual_stage_layers) unless its profile takes an explicit layout (format_switches); TP may
# cross nodes, and a plan need not be the search's canonical one.
EXPORT_SWITCHES = rules.Switches(uneven_chunks=False)


def format_switches(fmt: str) -> rules.Switches:
    """The exporters' switches with the launcher's own framework switches, from its profile
    in hardware_catalog/frameworks.yaml (a format with no profile of its own reads the generic
    one): the table's rules then refuse what the search, under that profile, never picks.
    ``uneven_chunks``: the launcher writes any per-virtual-stage split (Megatron-Core's
    ``--pipeline-model-parallel-layout``, torchtitan's per-stage module lists)."""
    own = framework_profile(fmt)
    return dataclasses.replace(EXPORT_SWITCHES,
                               recompute_per_chunk=own.activations.recompute_per_chunk,
                               microbatch_groups=own.pp.microbatch_groups,
                               moe_tp_sequence_parallel=own.moe.moe_tp_sequence_parallel,
                               uneven_chunks=own.pp.uneven_chunks)


def facts_of(pf: PlanFile, options: ExportOptions, fmt: str) -> LaunchView:
    p, t, m = pf.plan, pf.training, pf.model
    fw = t.framework
    switches = format_switches(fmt)
    denominator = p.micro_batch * p.dp
    microbatches = t.global_batch // denominator if t.global_batch % denominator == 0 else 0
    stages, middle_layers, middle_stages, first, last = _stage_split(
        m.layers, p.pp, p.first_stage_layers, p.last_stage_layers,
        switches.uneven_chunks)
    most = max(stages) if stages else m.layers
    nproc = min(pf.gpus_per_node, pf.num_gpus)
    return LaunchView(
        tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, vpp=p.vpp, zero=p.zero_stage,
        etp=int(expert_tp(as_plan_arrays(plans_to_arrays([p])))[0]),
        micro_batch=p.micro_batch, global_batch=t.global_batch, microbatches=microbatches,
        layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, experts=m.moe_experts,
        seq_len=t.seq_len, first=first, last=last,
        recompute=p.recompute, recompute_layers=p.recompute_layers,
        recompute_all=p.recompute == "full" and (p.recompute_layers == 0
                                                 or p.recompute_layers >= most),
        # the plan's own selective modules, else the training's (Megatron-Core's default unsaid)
        recompute_modules=(p.recompute_modules if p.recompute_modules else
                           fw.activations.recompute_modules
                           if fw.activations.selective_recompute == "modules"
                           and fw.activations.recompute_modules != MEGATRON_DEFAULT else ()),
        cpu_offload_layers=p.cpu_offload_layers,
        sp=p.sequence_parallel, schedule=p.schedule, precision=t.precision,
        bf16_grads=t.precision in ("bf16", "fp8") and fw.numerics.grad_dtype_bytes == 2,
        fp8_param_gather=t.precision == "fp8" and fw.numerics.fp8_param_gather,
        bf16_moments=fw.numerics.master_weights and fw.numerics.optimizer_state_bytes == 2,
        loss_fusion=LAUNCH_LOSS_FUSION.get(fw.kernels.loss_kernel, ""),
        optimizer=t.optimizer, tied=m.tied_embeddings, tp_comm_overlap=fw.tp.tp_comm_overlap,
        moe_dispatcher=p.moe_dispatcher or fw.moe.moe_dispatcher,
        moe_a2a_overlap=(fw.moe.moe_a2a_overlap if not p.moe_a2a_overlap
                         else p.moe_a2a_overlap == "on"),
        rank_order=fw.pp.rank_order,
        world=p.world_size, num_gpus=pf.num_gpus, gpus_per_node=pf.gpus_per_node,
        nodes=max(1, pf.num_gpus // pf.gpus_per_node), nproc_per_node=nproc,
        stage_layers=stages, middle_layers=middle_layers, middle_stages=middle_stages,
        fsdp_impl=options.fsdp_impl, version=target_for(fmt, options), model=m,
        plan_columns=rules.plan_columns(p),
        # host_link: a launcher offloads over whatever link its node has; whether the catalogue
        # has the GPU's is the estimate's concern (rule cpu_offload in the search and predict)
        rule_facts=rules.Facts(layers=m.layers, heads=m.heads, kv_heads=m.kv_heads,
                               experts=m.moe_experts, seq_len=t.seq_len,
                               global_batch=t.global_batch, num_gpus=pf.num_gpus,
                               nvlink_domain=pf.gpus_per_node, switches=switches,
                               mtp_layers=m.mtp_layers, mla=m.mla is not None,
                               host_link=True, expert_bias=m.is_moe and m.bias == "all",
                               **_moe_switches(fmt),
                               **graph_facts(m, t)),
    )


def _moe_switches(fmt: str) -> dict[str, Any]:
    """What the launcher's framework runs beside MoE layers, whether it builds multi-token
    prediction modules, and the ZeRO stages and recompute modes it implements: its profile's
    switches (a launcher with no profile of its own, the generic one's)."""
    return framework_facts(framework_profile(fmt))


def virtual_stage_layers(f: LaunchView) -> list[int]:
    """Layers of each model chunk in pipeline-stage order (``costmodel.mapping.chunk_counts``);
    assumes the table's ``vpp_layers`` rule holds."""
    return list(chunk_counts(f.stage_layers, f.vpp))


def virtual_stage_ranges(f: LaunchView) -> list[range]:
    """Layer indices of each virtual stage, in stage order."""
    out: list[range] = []
    start = 0
    for n in virtual_stage_layers(f):
        out.append(range(start, start + n))
        start += n
    return out
