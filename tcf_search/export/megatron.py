"""Megatron-LM: a ``torchrun … pretrain_gpt.py`` command with the plan's flags.

Flag names follow ``megatron/training/arguments.py`` of the current Megatron-LM (flags generated
from ``TransformerConfig``/``ModelParallelConfig`` fields plus the hand-written ones). ZeRO maps to
Megatron's own data-parallel modes: 1 = distributed optimizer, 2/3 = Megatron-FSDP with
``optim_grads``/``optim_grads_params`` sharding (or torch FSDP2 for 3 when asked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from costmodel.specs import ModelSpec
from search.inputs import PlanFile

from . import rules
from .options import ExportOptions
from .rules import TP_PP_DP_ORDER
from .shell import Group, command, script, torchrun_head
from .view import LaunchView, facts_of, virtual_stage_layers

FILENAME = "megatron.sh"


def recompute_args(f: LaunchView) -> list[Group]:
    if f.recompute == "selective":
        named = [("--recompute-modules", *f.recompute_modules)] if f.recompute_modules else []
        return [("--recompute-granularity", "selective"), *named]
    if f.recompute == "full" and f.recompute_all:
        # uniform with 1 layer per unit checkpoints the input of every layer: full recompute.
        return [("--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", 1)]
    if f.recompute == "full":
        # block recomputes the first N layers of each model chunk; vpp chunks share a stage.
        return [("--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", f.recompute_layers // f.vpp)]
    return []


def offload_args(f: LaunchView) -> list[Group]:
    """Activation offloading to host memory: the flag generated from ModelParallelConfig's
    cpu_offloading_num_layers (megatron/core/model_parallel_config.py), which validate_args turns
    into cpu_offloading=True (megatron/training/arguments.py); activations only, not weights
    (cpu_offloading_activations and cpu_offloading_weights keep their defaults)."""
    return [("--cpu-offloading-num-layers", f.cpu_offload_layers)] if f.cpu_offload_layers else []


def data_parallel_args(f: LaunchView, pf: PlanFile) -> list[Group]:
    fw = pf.training.framework
    out: list[Group] = []
    if f.zero == 1:
        out.append(("--use-distributed-optimizer",))
    elif f.zero == 3 and f.fsdp_impl == "torch":
        out.append(("--use-torch-fsdp2", "--no-gradient-accumulation-fusion",
                    "--ckpt-format", "torch_dist"))
    elif f.zero in (2, 3):
        # Megatron-FSDP's required flags (megatron/core/distributed/fsdp/src/README.md and
        # the examples that run it): the sharding strategy, the distributed optimizer, no
        # gradient-accumulation fusion, and its own checkpoint format.
        strategy = "optim_grads" if f.zero == 2 else "optim_grads_params"
        out.append(("--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
                    "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                    "--ckpt-format", "fsdp_dtensor"))
    if fw.dp.overlap_grad_reduce and f.dp * f.cp > 1:
        out.append(("--overlap-grad-reduce",))
        # validate_args: --overlap-param-gather only with the distributed optimizer or
        # Megatron-FSDP, not torch FSDP2 (which overlaps its all-gathers itself).
        if fw.dp.overlap_param_gather and f.zero >= 1 and f.fsdp_impl != "torch":
            out.append(("--overlap-param-gather",))
    if fw.tp.tp_comm_overlap:
        out.append(("--tp-comm-overlap",))
    if fw.pp.rank_order == TP_PP_DP_ORDER:  # dp outermost (megatron/training/initialize.py)
        out.append(("--use-tp-pp-dp-mapping",))
    return out


# the capacity factor Megatron-Bridge's token drop sets with padding (src/megatron/bridge/training/
# utils/moe_token_drop.py apply_moe_token_drop: 1.0), taken where a plan pads to capacity
PAD_CAPACITY_FACTOR = 1.0


def cuda_graph_args(pf: PlanFile, f: LaunchView) -> list[Group]:
    """The training's CUDA graphs (megatron/training/arguments.py, core_v0.16.0:
    --cuda-graph-impl, --cuda-graph-scope nargs='+' and none for the whole layer; validate_args
    asks the local impl under EP for --moe-pad-experts-for-cuda-graph-inference and a
    full-iteration graph for --no-check-for-nan-in-loss-and-grad), and the token drop with
    padding a MoE capture of static shapes needs."""
    fw = pf.training.framework
    out: list[Group] = []
    if pf.model.is_moe and fw.moe.moe_pad_to_capacity:
        out.append(("--moe-expert-capacity-factor", PAD_CAPACITY_FACTOR,
                    "--moe-pad-expert-input-to-capacity"))
    if fw.kernels.cuda_graph_impl == "none":
        return out
    out.append(("--cuda-graph-impl", fw.kernels.cuda_graph_impl))
    if fw.kernels.cuda_graph_scope:
        out.append(("--cuda-graph-scope", *fw.kernels.cuda_graph_scope))
    if fw.kernels.cuda_graph_impl == "local" and f.ep > 1:
        out.append(("--moe-pad-experts-for-cuda-graph-inference",))
    if "full_iteration" in fw.kernels.cuda_graph_scope:
        out.append(("--no-check-for-nan-in-loss-and-grad",))
    return out


NORMALIZATION = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
POSITIONS = {"rope": "rope", "learned": "learned_absolute"}


def layer_style_args(m: ModelSpec) -> list[Group]:
    """Norm, positions, biases (arguments.py: --normalization, --position-embedding-type,
    --rotary-base, --disable-bias-linear, --add-qkv-bias), no dropout (TransformerConfig's: 0.1)."""
    out: list[Group] = [("--normalization", NORMALIZATION[m.norm],
                         "--position-embedding-type", POSITIONS[m.position_embedding])]
    if m.position_embedding == "rope":
        out.append(("--rotary-base", int(m.rope_base)))
    if m.bias != "all":
        out.append(("--disable-bias-linear",))
    if m.bias == "qkv":
        out.append(("--add-qkv-bias",))
    out.append(("--attention-dropout", 0.0, "--hidden-dropout", 0.0))
    return out


def rope_scaling_args(m: ModelSpec) -> list[Group]:
    """RoPE's long-context scaling (the table's MEGATRON rules have checked it is expressible):
    Llama 3.1's with ``--use-rope-scaling --rope-scaling-factor`` (its freq factors and 8192 are
    fixed in megatron/core/models/common/embeddings/rotary_pos_embedding.py _apply_scaling);
    under MLA, YaRN is MLATransformerConfig's rope_type default, with the factor and mscales as
    flags (megatron/training/arguments.py _add_mla_args) and MLA's plain RoPE ``--rope-type
    rope``, which the fused MLA RoPE kernel does not take (MLATransformerConfig.__post_init__)."""
    s = m.rope_scaling
    if m.mla is None:
        return [] if s is None else [("--use-rope-scaling", "--rope-scaling-factor", s.factor)]
    if s is None:
        return [("--rope-type", "rope", "--no-rope-fusion")]
    return [("--rope-type", "yarn", "--rotary-scaling-factor", s.factor, "--mscale", s.mscale,
             "--mscale-all-dim", s.mscale_all_dim)]


def mla_args(m: ModelSpec) -> list[Group]:
    """Multi-head latent attention (megatron/training/arguments.py: --multi-latent-attention from
    TransformerConfig, the ranks and head widths from _add_mla_args). DeepSeek's latent
    projections are normalised (q_a_layernorm, kv_a_layernorm): Megatron-Core's MLA layer spec
    builds those norms only under --qk-layernorm (megatron/core/models/gpt/gpt_layer_specs.py)."""
    if m.mla is None:
        return []
    a = m.mla
    out: list[Group] = [("--multi-latent-attention", "--qk-layernorm")]
    if a.q_lora_rank:
        out.append(("--q-lora-rank", a.q_lora_rank))
    out.append(("--kv-lora-rank", a.kv_lora_rank, "--qk-head-dim", a.qk_nope_head_dim,
                "--qk-pos-emb-head-dim", a.qk_rope_head_dim, "--v-head-dim", a.v_head_dim))
    return out


def router_args(m: ModelSpec) -> list[Group]:
    """The router beyond top-k softmax (TransformerConfig's moe_router_* fields, flags by
    megatron/training/arguments.py): sigmoid scores, group-limited routing, the routed output's
    scaling and the auxiliary-loss-free balancing bias."""
    r = m.moe_router
    if r is None:
        return []
    out: list[Group] = [("--moe-router-score-function", r.score)]
    if r.groups > 1:
        out.append(("--moe-router-num-groups", r.groups, "--moe-router-group-topk",
                    r.group_topk))
    if r.scaling != 1.0:
        out.append(("--moe-router-topk-scaling-factor", r.scaling))
    if r.expert_bias:
        out.append(("--moe-router-enable-expert-bias",))
    return out


def layer_pattern(flags: Sequence[bool]) -> str:
    """A per-layer 0/1 pattern as the list expression Megatron-LM's ``moe_freq_type`` evaluates
    (megatron/training/arguments.py ``_eval_pattern``: digits, brackets, ``+`` and ``*`` only):
    runs (``[0]*3+[1]*58``), or a repeated unit where that is shorter (``([0]*1+[1]*1)*24``)."""
    bits = [int(b) for b in flags]

    def runs(xs: list[int]) -> str:
        out, i = [], 0
        while i < len(xs):
            j = i
            while j < len(xs) and xs[j] == xs[i]:
                j += 1
            out.append(f"[{xs[i]}]*{j - i}")
            i = j
        return "+".join(out)

    def periodic(xs: list[int]) -> str:
        for p in range(2, len(xs) // 2 + 1):
            unit, reps = xs[:p], len(xs) // p
            if unit * reps + unit[:len(xs) % p] == xs:
                tail = xs[p * reps:]
                return f"({runs(unit)})*{reps}" + (f"+{runs(tail)}" if tail else "")
        return runs(xs)

    lead = next((i for i, b in enumerate(bits) if b), len(bits))
    options = [runs(bits), periodic(bits)]
    if 0 < lead < len(bits):
        options.append(f"{runs(bits[:lead])}+{periodic(bits[lead:])}")
    return min(options, key=len)


def attention_args(m: ModelSpec) -> list[Group]:
    """QK-norm, the sliding window and its per-layer pattern, and attention sinks, as
    TransformerConfig fields (megatron/core/transformer/transformer_config.py at d98e8a6 and in
    megatron-core 0.16.1: qk_layernorm; window_size (left, right), a query seeing w tokens at
    (w - 1, 0) as Megatron-Bridge's GPT-OSS bridge writes it, src/megatron/bridge/models/gpt_oss/
    gpt_oss_bridge.py at 067f987; window_attn_skip_freq, every Nth layer full attention,
    megatron/core/transformer/utils.py is_layer_window_attention; softmax_type learnable, a
    sink per head). Chunked attention has no field: the rules refuse it."""
    out: list[Group] = []
    if m.qk_norm:
        out.append(("--qk-layernorm",))
    if m.sliding_window:
        out.append(("--window-size", f"{m.sliding_window - 1},0"))
        if m.window_skip_freq:
            out.append(("--window-attn-skip-freq", m.window_skip_freq))
    if m.attention_sinks:
        out.append(("--softmax-type", "learnable"))
    return out


def model_args(pf: PlanFile) -> list[Group]:
    m, t = pf.model, pf.training
    out: list[Group] = [
        ("--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden),
        ("--num-attention-heads", m.heads),
    ]
    if m.kv_heads != m.heads:
        out.append(("--group-query-attention", "--num-query-groups", m.kv_heads))
    if m.head_dim:
        out.append(("--kv-channels", m.head_dim))
    out.append(("--seq-length", t.seq_len, "--max-position-embeddings", t.seq_len))
    out += layer_style_args(m) + mla_args(m) + rope_scaling_args(m) + attention_args(m)
    if m.ffn_type == "swiglu":
        out.append(("--swiglu",))
    if not m.tied_embeddings:
        out.append(("--untie-embeddings-and-output-weights",))
    if m.is_moe:
        out.append(("--num-experts", m.moe_experts, "--moe-router-topk", m.moe_topk,
                    "--moe-ffn-hidden-size", m.expert_ffn_hidden))
        if m.moe_shared_experts:
            out.append(("--moe-shared-expert-intermediate-size",
                        m.moe_shared_experts * m.expert_ffn_hidden))
        if m.moe_layers < m.layers:  # layer by layer, as the cost model places them
            out.append(("--moe-layer-freq", f"({layer_pattern(m.moe_pattern)})"))
        out += router_args(m)
        out.append(("--moe-grouped-gemm",))
    if m.mtp_layers:  # multi-token prediction (megatron/training/arguments.py _add_mtp_args)
        out.append(("--mtp-num-layers", m.mtp_layers))
    return out


def moe_dispatch_args(pf: PlanFile, f: LaunchView) -> list[Group]:
    """The MoE dispatch the plan was priced with (megatron/core/transformer/transformer_config.py,
    core_v0.16.0, whose fields the launcher takes as flags): --moe-token-dispatcher-type (the
    CLI's default is allgather, so it is always said), flex with DeepEP, the backend the model's
    flex prices (--moe-flex-dispatcher-backend, its default, said), the EP all-to-all overlap
    (--overlap-moe-expert-parallel-comm; without --delay-wgrad-compute, which the model does not
    price), and the training's fusions and shared-expert overlap."""
    if not pf.model.is_moe:
        return []
    moe = pf.training.framework.moe
    out: list[Group] = [("--moe-token-dispatcher-type", f.moe_dispatcher)]
    if f.moe_dispatcher == "flex":
        out.append(("--moe-flex-dispatcher-backend", "deepep"))
    if f.moe_a2a_overlap:
        out.append(("--overlap-moe-expert-parallel-comm",))
    for on, flag in ((moe.moe_permute_fusion, "--moe-permute-fusion"),
                     (moe.moe_router_fusion, "--moe-router-fusion"),
                     (moe.moe_shared_expert_overlap and pf.model.moe_shared_experts
                      and not f.moe_a2a_overlap, "--moe-shared-expert-overlap")):
        if on:
            out.append((flag,))
    return out


def parallel_args(f: LaunchView) -> list[Group]:
    out: list[Group] = [("--tensor-model-parallel-size", f.tp,
                         "--pipeline-model-parallel-size", f.pp)]
    if f.cp > 1:
        out.append(("--context-parallel-size", f.cp))
    if f.ep > 1:
        out.append(("--expert-model-parallel-size", f.ep))
        if f.etp != f.tp or (f.dp * f.cp) % f.ep:  # EP folds over the TP ranks (defaults: tp)
            out.append(("--expert-tensor-parallel-size", f.etp))
    split = split_args(f)
    if f.vpp > 1 and not any(g[0] == LAYOUT_FLAG for g in split):
        # This flag (not --num-layers-per-virtual-pipeline-stage) also works with uneven stages;
        # with the layout flag it must be absent (megatron/training/arguments.py, validate_args:
        # no more than one of the three), the layout giving vpp by its stage count.
        out.append(("--num-virtual-stages-per-pipeline-rank", f.vpp))
    out += split
    if f.sp:
        out.append(("--sequence-parallel",))
    return out


LAYOUT_FLAG = "--pipeline-model-parallel-layout"


def split_args(f: LaunchView) -> list[Group]:
    """The uneven split as Megatron takes it (megatron/core/transformer/transformer_config.py,
    ``__post_init__``): first/last stage counts when each rank's layers divide into the vpp
    chunks, else the embedding and/or the loss counted as a layer (the ranks hold c - e, c, ...,
    c - l), else the explicit layout of every virtual stage (:func:`pipeline_layout`; the
    table's ``vpp_layers`` rule, with the profile's ``uneven_chunks``, has allowed it)."""
    if not f.uneven:
        return []
    v, stages = f.vpp, f.stage_layers
    if len(set(stages[1:-1])) > 1:  # middle ranks a layer apart: only a layout says so
        return [(LAYOUT_FLAG, pipeline_layout(f))]
    if v == 1 or all(n % v == 0 for n in stages):
        return [(flag, n) for flag, n in (("--decoder-first-pipeline-num-layers", f.first),
                                          ("--decoder-last-pipeline-num-layers", f.last)) if n]
    first, last = stages[0], stages[-1]
    c = stages[1] if f.pp > 2 else max(first, last) + int(first == last)
    counted = (c % v == 0 and c - first in (0, 1) and c - last in (0, 1)
               and all(n == c for n in stages[1:-1]))
    if not counted:
        return [(LAYOUT_FLAG, pipeline_layout(f))]
    out: list[Group] = [("--account-for-embedding-in-pipeline-split",)] * (c - first)
    return out + [("--account-for-loss-in-pipeline-split",)] * (c - last)


def pipeline_layout(f: LaunchView) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout``
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, ``PipelineParallelLayerLayout``):
    the virtual stages in layer order (stage ``chunk * pp + rank``, as ``chunk_counts`` lists
    them), separated by ``|``; ``t`` a decoder layer, ``E`` the embedding (first stage), ``m``
    a multi-token prediction layer and ``L`` the loss (last stage: ``validate_layer_layout``
    wants every ``m`` after the decoder layers, in the last rank's last virtual stage, as many as
    ``--mtp-num-layers``); ``t*n`` repeats a layer and ``(s|)*k`` a stage. The flag excludes the
    first/last stage counts and the ``account_for_*`` switches (transformer_config.py)."""
    def decoders(n: int) -> str:
        return "t" * n if n < 2 else f"t*{n}"

    stages = [decoders(n) for n in virtual_stage_layers(f)]
    runs: list[list[Any]] = []
    for s in stages[1:-1]:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    middle = "".join(f"({s}|)*{k}" if k > 1 else f"{s}|" for s, k in runs)
    return f"E{stages[0]}|{middle}{stages[-1]}{'m' * f.model.mtp_layers}L"


def precision_args(precision: str) -> Group:
    return {"bf16": ("--bf16",), "fp16": ("--fp16",),
            "fp8": ("--bf16", "--fp8-format", "hybrid")}[precision]


def weight_and_grad_dtype_args(f: LaunchView) -> list[Group]:
    out: list[Group] = []
    if f.fp8_param_gather:
        out.append(("--fp8-param-gather",))
    if f.bf16_grads:
        out.append(("--grad-reduce-in-bf16",))
    if f.loss_fusion:  # language_module.py compute_language_model_loss (core_v0.16.0)
        out.append(("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", f.loss_fusion))
    if f.bf16_moments:  # megatron/training/arguments.py _add_training_args, core_v0.16.0
        out.append(("--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                    "--exp-avg-sq-dtype", "bf16"))
    return out


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "megatron")
    rules.check("megatron", rules.MEGATRON, f)
    run = options.run_name or pf.study
    groups: list[Group] = [
        *parallel_args(f),
        ("--micro-batch-size", f.micro_batch, "--global-batch-size", f.global_batch),
        *recompute_args(f),
        *offload_args(f),
        *data_parallel_args(f, pf),
        precision_args(f.precision),
        *weight_and_grad_dtype_args(f),
        *model_args(pf),
        *moe_dispatch_args(pf, f),
        *cuda_graph_args(pf, f),
        ("--optimizer", pf.training.optimizer, "--lr", options.lr, "--min-lr", options.lr / 10,
         "--lr-decay-style", "cosine", "--train-iters", options.train_iters),
        # Synthetic data so the command runs as is; swap in --data-path and a real tokenizer.
        ("--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", pf.model.vocab),
        ("--save", f"checkpoints/{run}", "--save-interval", options.train_iters),
        ("--log-interval", 10),
    ]
    # Megatron asserts this for TP/CP before Blackwell; FSDP modes assert the opposite; the EP
    # all-to-all overlap wants more connections and only warns beside TP/CP (arguments.py,
    # core_v0.16.0: "you can set CUDA_DEVICE_MAX_CONNECTIONS to 1 or 32"), so it gets 32
    env = ({"CUDA_DEVICE_MAX_CONNECTIONS": "32"} if f.moe_a2a_overlap and f.zero < 2
           else {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (f.tp > 1 or f.cp > 1) and f.zero < 2
           else {})
    body = command([*torchrun_head(f, options.master_port), options.megatron_script], groups)
    return {FILENAME: script("megatron", pf, body, env, f.version)}
