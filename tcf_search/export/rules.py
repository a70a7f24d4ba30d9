"""Each launcher's own argument checks, as data: (predicate, one-line reason, where it is checked).

A rule *holds* for a plan the launcher runs as the cost model predicted it. ``COMMON`` is the
cost model's own validity table (``costmodel.rules``); the rest are each launcher's. The
predicates read the flat ``LaunchView`` view; the reasons are ``str.format`` templates over the same
names, so a refusal quotes the values that broke it. Sources name the launcher file whose check
the rule mirrors (read in the launchers' current releases; no launcher code is copied here).
A rule's type and the check are ``rule_base``'s; the rules on the model's architecture are
``model_rules``'.
"""

from __future__ import annotations

from costmodel import rules as costmodel_rules
from costmodel.layer_style import LLAMA31_ROPE_SCALING
from costmodel.specs import ModelSpec

from . import hf_model
from .model_rules import MEGATRON_ATTENTION, MEGATRON_ROPE, llama_attention, scaling
from .rule_base import AnyRule as AnyRule
from .rule_base import Rule as Rule
from .rule_base import Shared as Shared
from .rule_base import broken as broken
from .rule_base import check as check
from .view import LaunchView

# Every launcher: the cost model's validity table (with the exporters' switches, see
# layout.EXPORT_SWITCHES), and launching whole nodes.
COMMON: tuple[AnyRule, ...] = (*(Shared(r) for r in costmodel_rules.RULES), Rule(
    lambda f: f.num_gpus <= f.gpus_per_node or f.num_gpus % f.gpus_per_node == 0,
    "num_gpus % gpus_per_node == 0 must hold to launch whole nodes, but got "
    "num_gpus={num_gpus}, gpus_per_node={gpus_per_node}", "torchrun --nproc-per-node"))

# Launchers that take an explicit per-stage layer placement (Megatron's uneven split): a split
# the table allows by putting the remainder on the first stages is not one of them.
PIPELINE_SPLIT: tuple[AnyRule, ...] = (
    Rule(lambda f: f.pp == 1 or bool(f.stage_layers),
         "layers must split evenly over the pipeline stages (after the pinned first/last "
         "stages), but got layers={layers}, first={first}, last={last}, pp={pp}",
         "megatron/core/transformer/transformer_config.py (uneven PP)"),
)

# MoE under TP without sequence parallelism is the table's moe_tp_sp (COMMON, the profile's
# moe_tp_sequence_parallel switch)
# NeMo's MegatronCommOverlapCallback switches the overlap off itself where SP is off or TP < 2
# (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py): Megatron-LM's flag refuses it
TP_OVERLAP_NEEDS_SP = Rule(
    lambda f: not f.tp_comm_overlap or f.sp,
    "--tp-comm-overlap requires sequence parallelism, but got sequence_parallel={sp}",
    "megatron/training/arguments.py validate_args")
MEGATRON: tuple[AnyRule, ...] = COMMON + PIPELINE_SPLIT + (
    TP_OVERLAP_NEEDS_SP,
    Rule(lambda f: not (f.zero == 2 and f.fsdp_impl == "torch"),
         "--use-torch-fsdp2 always shards parameters (ZeRO-3); Megatron has no torch-FSDP "
         "ZeRO-2, but got zero_stage=2 with fsdp_impl=torch (use fsdp_impl=megatron)",
         "megatron/training/arguments.py (--use-torch-fsdp2)"),
    Rule(lambda f: f.model.rope_base == int(f.model.rope_base),
         "--rotary-base takes an integer, but the model has rope_base={model.rope_base}",
         "megatron/training/arguments.py"),
    Rule(lambda f: not (f.zero == 3 and f.fsdp_impl == "torch") or f.pp == 1,
         "--use-torch-fsdp2 is not supported with pipeline parallelism, but got pp={pp}",
         "megatron/training/arguments.py validate_args"),
    Rule(lambda f: not (f.zero == 3 and f.fsdp_impl == "torch") or f.ep == 1,
         "--use-torch-fsdp2 is not supported with expert parallelism, but got ep={ep}",
         "megatron/training/arguments.py validate_args"),
    Rule(lambda f: not (f.zero == 3 and f.fsdp_impl == "torch") or f.precision != "fp16",
         "--use-torch-fsdp2 is not supported with fp16", "megatron/training/arguments.py"),
    Rule(lambda f: not (f.zero == 3 and f.fsdp_impl == "torch") or not f.tied,
         "--use-torch-fsdp2 requires untied embeddings, but the model ties them",
         "megatron/training/arguments.py validate_args"),
    # the table's cpu_offload allows a full-iteration graph (Megatron-LM main); the targeted
    # release refuses every CUDA graph beside offloading
    Rule(lambda f: f.cpu_offload_layers == 0 or f.rule_facts.cuda_graph_impl == "none",
         "Megatron-Core 0.16 raises 'CUDA graphs not supported with CPU offloading', but got "
         "cpu_offload_layers={cpu_offload_layers} with "
         "cuda_graph_impl={rule_facts.cuda_graph_impl}",
         "megatron/core/transformer/transformer_config.py __post_init__ (core_v0.16.1)"),
    *MEGATRON_ROPE,
    *MEGATRON_ATTENTION,
)

# Megatron-Bridge (NeMo) builds the same Megatron-Core configs, so it inherits the same checks,
# except that YaRN's correction range is a field of the DeepSeek provider (nemo.latent_overrides)
NEMO: tuple[AnyRule, ...] = tuple(r for r in MEGATRON
                                  if r is not MEGATRON_ROPE[1] and r is not TP_OVERLAP_NEEDS_SP) + (
    # the nemo profile runs ZeRO-2 beside a pipeline (NeMo 1's distributed Adam); this export
    # writes Megatron-FSDP for it, whose device mesh has no pipeline axis
    Rule(lambda f: f.pp == 1 or f.zero < 2,
         "ZeRO-2/3 is written as Megatron-FSDP, which runs without a pipeline only (its mesh is "
         "dp_cp x ep x tp), but got zero_stage={zero}, pp={pp}",
         "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py _get_dp_tp_mesh (core_v0.16.1)"),
    Rule(lambda f: scaling(f.model) != "yarn" or f.model.mla is not None,
         "YaRN is MLA's rope_type (the DeepSeek providers), but the model has no latent "
         "attention", "megatron/core/transformer/transformer_config.py MLATransformerConfig"),
    # run_recipe names a mixed-precision preset (mixed_precision=bf16_mixed, ...), resolved
    # after the overrides, whose setup() copies its fields over the ddp and model configs: a
    # preset's dtypes cannot be overridden from the command line
    Rule(lambda f: not f.bf16_grads,
         "Megatron-Bridge's bf16 and fp8 mixed-precision presets reduce gradients in fp32 and "
         "copy grad_reduce_in_fp32 over ddp's, which run_recipe overrides cannot change, but "
         "the study reduces them in bf16 (training.grad_reduce_in_bf16): export megatron "
         "(--grad-reduce-in-bf16)",
         "src/megatron/bridge/training/mixed_precision.py bf16_mixed, "
         "MixedPrecisionConfig.setup; config.py runtime_config_update"),
    # the precision-aware optimizer's dtypes are torch.dtype fields of the recipe's
    # OptimizerConfig (its DeepSeek-V3 recipes set them in Python), which a command-line
    # override cannot give
    Rule(lambda f: not f.bf16_moments,
         "Adam's moments in bf16 (training.adam_moments_in_bf16) are torch.dtype fields of "
         "Megatron-Core's OptimizerConfig (exp_avg_dtype, exp_avg_sq_dtype), which run_recipe's "
         "overrides cannot write: export megatron (--use-precision-aware-optimizer)",
         "megatron/core/optimizer/optimizer_config.py (core_v0.16.0)"),
    Rule(lambda f: f.precision != "fp8" or f.fp8_param_gather,
         "Megatron-Bridge's fp8 preset (bf16_with_fp8_delayed_scaling_mixed) gathers fp8 weights "
         "(fp8_param_gather=True), which run_recipe overrides cannot change, but the study "
         "keeps bf16 weights (training.fp8_param_gather: false): export megatron",
         "src/megatron/bridge/training/mixed_precision.py"),
)

# DeepSpeed and Accelerate configure the user's script; the model goes beside them as a Hugging
# Face config.json (export/hf_model.py), so it must be one a Hugging Face model class builds.
HF_MODEL: tuple[AnyRule, ...] = (
    Rule(lambda f: hf_model.family(f.model) is not None,
         "the model goes beside the config as a Hugging Face config.json, and no Hugging Face "
         "family written here (llama, qwen2, qwen3, qwen3_moe, mistral, mixtral, deepseek_v3, "
         "gpt_oss, llama4_text, gpt2) builds norm={model.norm}, position_embedding="
         "{model.position_embedding}, bias={model.bias}, ffn_type={model.ffn_type}, "
         "experts={model.moe_experts} (shared {model.moe_shared_experts}, dense layers "
         "{model.moe_dense_layers}, MoE every {model.moe_layer_freq}), mla={model.mla}, "
         "rope_scaling={model.rope_scaling}, router={model.moe_router}, qk_norm="
         "{model.qk_norm}, sliding_window={model.sliding_window}, attention_chunk="
         "{model.attention_chunk}, window_skip_freq={model.window_skip_freq}, "
         "attention_sinks={model.attention_sinks}",
         "transformers/models/*/configuration_*.py"),
)

DEEPSPEED: tuple[AnyRule, ...] = COMMON + HF_MODEL + (
    Rule(lambda f: f.cp == 1,
         "DeepSpeed has no ring context parallelism (Ulysses is all-to-all with other costs), "
         "but got cp={cp}", "deepspeed/runtime/config.py"),
    Rule(lambda f: not f.uneven,
         "PipelineModule partitions by method (uniform/parameters/type), not by pinned "
         "first/last stage sizes, but got first={first}, last={last}",
         "deepspeed/runtime/pipe/module.py"),
    Rule(lambda f: not f.sp,
         "DeepSpeed AutoTP has no Megatron-style sequence parallelism, but got "
         "sequence_parallel={sp}", "deepspeed/runtime/tensor_parallel/config.py"),
    Rule(lambda f: f.precision != "fp8",
         "the DeepSpeed config has no FP8 training mode, but got precision=fp8",
         "deepspeed/runtime/config.py"),
    Rule(lambda f: f.ep == 1 or f.etp == 1,
         "AutoEP keeps expert TP at 1 while the plan shards experts over TP, but got "
         "ep={ep}, expert_tp={etp}", "deepspeed/module_inject/auto_ep_folding.py"),
    Rule(lambda f: f.ep == 1 or (f.world // f.pp) % f.ep == 0,
         "autoep_size must divide world/pp, but got world={world}, pp={pp}, ep={ep}",
         "deepspeed/module_inject/auto_ep_folding.py"),
)


def _dp_shard(f: LaunchView) -> int:
    return f.dp if f.zero > 0 else 1


# torchtitan's Llama 3 parts (torchtitan/models/llama3/__init__.py, models/common): RMSNorm,
# RoPE, bias-free linears, SwiGLU, a dense FFN and head_dim = dim // n_heads.
TITAN_LLAMA: tuple[AnyRule, ...] = (
    Rule(lambda f: f.model.mla is None,
         "this export builds torchtitan's Llama 3 parts, which have no latent attention, but "
         "the model has mla={model.mla} (torchtitan's own deepseek_v3 model is not exported)",
         "torchtitan/models/llama3/__init__.py; torchtitan/models/deepseek_v3"),
    Rule(lambda f: scaling(f.model) != "yarn",
         "torchtitan's ComplexRoPE has no YaRN mscale, but the model has {model.rope_scaling}",
         "torchtitan/models/common/rope.py"),
    Rule(lambda f: f.model.norm == "rmsnorm" and f.model.position_embedding == "rope"
         and f.model.bias == "none" and f.model.ffn_type == "swiglu",
         "torchtitan's Llama 3 model has RMSNorm, RoPE, SwiGLU and no biases, but the model has "
         "norm={model.norm}, position_embedding={model.position_embedding}, "
         "bias={model.bias}, ffn_type={model.ffn_type}", "torchtitan/models/llama3/__init__.py"),
    Rule(lambda f: not f.model.is_moe,
         "torchtitan's Llama 3 model is dense, but the model has {model.moe_experts} experts "
         "(its MoE modules are other models' code)", "torchtitan/models/llama3/__init__.py"),
    llama_attention("torchtitan's Llama 3", "torchtitan/models/llama3/__init__.py; "
                    "torchtitan/models/common/attention.py qk_norm (b5bcd76)",
                    " (its qwen3 and gpt_oss models have them, and are not exported)"),
    Rule(lambda f: f.model.d_head * f.model.heads == f.model.hidden,
         "torchtitan's Llama 3 attention takes head_dim = dim // n_heads, but the model has "
         "head_dim={model.d_head}, hidden={model.hidden}, heads={model.heads}",
         "torchtitan/models/common/config_utils.py make_gqa_config"),
)

# torchtitan 0.2 picks a registered flavour by name (torchtitan/models/llama3/__init__.py,
# llama3_configs): layers, hidden, heads, KV heads, FFN width, vocab; all RoPE theta 500000.
TITAN_FLAVORS_02: dict[str, tuple[int, int, int, int, int, int]] = {
    "8B": (32, 4096, 32, 8, 14336, 128256),
    "70B": (80, 8192, 64, 8, 28672, 128256),
    "405B": (126, 16384, 128, 8, 53248, 128256),
}


def model_shape(m: ModelSpec) -> tuple[int, int, int, int, int, int]:
    return (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)

TORCHTITAN: tuple[AnyRule, ...] = COMMON + PIPELINE_SPLIT + TITAN_LLAMA + (
    Rule(lambda f: f.kv_heads % f.tp == 0,
         "kv_heads % tp == 0 must hold (column-sharded wk/wv split whole KV heads), but got "
         "kv_heads={kv_heads}, tp={tp}", "torchtitan/models/llama3/parallelize.py"),
    Rule(lambda f: f.precision != "fp16",
         "torchtitan trains in bfloat16 or float32 (mixed_precision_param), not fp16",
         "torchtitan/config/configs.py"),
    Rule(lambda f: f.ep == 1 or f.version == "0.2" or f.etp == 1,
         "torchtitan 0.3 folds EP over dp_shard*cp*tp, so routed experts lose TP while the "
         "plan shards them over expert_tp={etp}",
         "torchtitan/config/configs.py expert_parallel_degree"),
    Rule(lambda f: f.ep == 1 or f.version != "0.2" or f.etp in (1, f.tp),
         "torchtitan 0.2 takes expert TP equal to TP or 1, but got tp={tp}, expert_tp={etp}",
         "torchtitan/distributed/parallel_dims.py"),
    Rule(lambda f: f.ep == 1 or (_dp_shard(f) * f.cp) % f.ep == 0,
         "EP borrows FSDP ranks, so (dp_shard*cp) % ep == 0 must hold, but got "
         "dp={dp} (zero_stage={zero}), cp={cp}, ep={ep}",
         "torchtitan/distributed/parallel_dims.py"),
    Rule(lambda f: f.version != "0.2" or (
        model_shape(f.model) in TITAN_FLAVORS_02.values() and f.model.rope_base == 500000.0
        and not f.model.tied_embeddings),
         "torchtitan 0.2 trains a registered Llama 3 flavour (8B, 70B, 405B) picked by name, but "
         "the model ({model.name!r}) is none of them", "torchtitan/models/llama3/__init__.py"),
    Rule(lambda f: f.version != "0.2" or f.model.rope_scaling == LLAMA31_ROPE_SCALING,
         "torchtitan 0.2's Llama 3 flavours always scale RoPE as Llama 3.1 does "
         "(RoPEScalingArgs: factor 8, low_freq_factor 1, high_freq_factor 4, 8192), but the "
         "model has rope_scaling={model.rope_scaling}",
         "torchtitan 0.2 torchtitan/models/llama3/model/args.py, model.py precompute_freqs_cis"),
    Rule(lambda f: f.version != "0.2" or f.tp == 1 or f.sp,
         "torchtitan 0.2 always applies sequence parallelism with TP, but the plan has "
         "tp={tp} without it", "torchtitan 0.2 tensor_parallel"),
    Rule(lambda f: f.version != "0.2" or f.zero > 0 or f.world == f.dp,
         "torchtitan 0.2 DDP (zero_stage=0) does not compose with other parallelism, but got "
         "tp={tp}, pp={pp}, cp={cp}", "torchtitan/models/llama3/infra/parallelize.py"),
)

NANOTRON: tuple[AnyRule, ...] = COMMON + (
    llama_attention("nanotron's Llama", "nanotron/models/llama.py"),
    Rule(lambda f: f.model.mla is None,
         "nanotron's LlamaConfig has no latent attention, but the model has mla={model.mla}",
         "nanotron/config/models_config.py"),
    Rule(lambda f: f.model.rope_scaling is None,
         "nanotron's LlamaConfig takes rope_scaling but its Llama model never reads it, so "
         "RoPE would train unscaled, but the model has rope_scaling={model.rope_scaling}",
         "nanotron/models/llama.py (main, 2026-04; no reader of rope_scaling)"),
    Rule(lambda f: f.model.norm == "rmsnorm" and f.model.position_embedding == "rope"
         and f.model.bias == "none" and f.model.ffn_type == "swiglu" and not f.model.is_moe
         and f.model.d_head * f.model.heads == f.model.hidden,
         "nanotron's LlamaConfig is a dense RMSNorm/RoPE/SwiGLU model without biases and with "
         "head_dim = hidden / heads, but the model has norm={model.norm}, position_embedding="
         "{model.position_embedding}, bias={model.bias}, ffn_type={model.ffn_type}, "
         "experts={model.moe_experts}, head_dim={model.d_head}",
         "nanotron/config/models_config.py"),
    Rule(lambda f: f.version != "0.4" or f.model.rope_base == 10000.0,
         "nanotron 0.4's LlamaConfig has no rope_theta (RoPE base 10000), but the model has "
         "rope_base={model.rope_base}", "nanotron 0.4 nanotron/config/models_config.py"),
    Rule(lambda f: f.ep == 1,
         "nanotron asserts tp*cp*dp*pp == world while laying EP as a separate grid axis, so "
         "EP cannot be carved out of DP, but got ep={ep}", "nanotron/parallel/context.py"),
    Rule(lambda f: not f.uneven,
         "nanotron places pipeline blocks itself; first/last stage sizes are not a knob, but "
         "got first={first}, last={last}", "nanotron/models"),
    Rule(lambda f: f.kv_heads >= f.tp,
         "kv_heads >= tp must hold, but got kv_heads={kv_heads}, tp={tp}",
         "nanotron/config/config.py"),
    Rule(lambda f: f.pp == 1 or f.schedule != "1f1b" or f.microbatches >= f.pp - 1,
         "the 1F1B engine needs micro-batches >= pp-1, but got microbatches={microbatches}, "
         "pp={pp}", "nanotron/parallel/pipeline_parallel/engine.py"),
    # whole layers only, nothing selective (the table's framework_recompute, nanotron's profile)
    Rule(lambda f: f.recompute == "none" or f.version != "0.4",
         "nanotron 0.4 has no recompute_layer, but got recompute={recompute}",
         "nanotron 0.4 nanotron/config/parallelism_config.py"),
    Rule(lambda f: f.cp == 1 or (f.version != "0.4" and f.seq_len % f.cp == 0),
         "nanotron context parallelism needs seq_len % cp == 0 and a release newer than 0.4, "
         "but got seq_len={seq_len}, cp={cp}", "nanotron/config/parallelism_config.py"),
    Rule(lambda f: f.precision != "fp8",
         "nanotron's config has no FP8 training mode, but got precision=fp8",
         "nanotron/config/config.py"),
)

ACCELERATE: tuple[AnyRule, ...] = COMMON + HF_MODEL + (
    Rule(lambda f: f.pp == 1,
         "Accelerate (FSDP2 + ND-parallel) has no pipeline parallelism, but got pp={pp}",
         "accelerate/parallelism_config.py"),
    Rule(lambda f: f.ep == 1,
         "Accelerate's parallelism config has no expert-parallel axis, but got ep={ep}",
         "accelerate/parallelism_config.py"),
    Rule(lambda f: f.zero > 0 or (f.tp == 1 and f.cp == 1),
         "tensor/context parallelism cannot be used with pure data parallelism (zero_stage=0), "
         "but got tp={tp}, cp={cp}", "accelerate/parallelism_config.py"),
    Rule(lambda f: f.recompute == "none" or f.recompute_all,
         "fsdp_activation_checkpointing wraps every transformer layer; selective or per-stage "
         "recompute is not a knob, but got recompute={recompute}", "accelerate/commands/launch.py"),
    Rule(lambda f: not f.sp,
         "Accelerate TP follows the model's tp_plan with no sequence-parallel switch, but got "
         "sequence_parallel={sp}", "accelerate/parallelism_config.py"),
    # its format has no framework profile, so the table reads the generic (Megatron-like) one
    Rule(lambda f: f.cpu_offload_layers == 0,
         "Accelerate has no activation offloading to host memory (its FSDP cpu_offload moves "
         "parameters), but got cpu_offload_layers={cpu_offload_layers}",
         "accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin"),
)

# the rank order every launcher lays out (tp fastest, pp outermost; frameworks.yaml cites each),
# and Megatron-LM's alternative, --use-tp-pp-dp-mapping (megatron/training/initialize.py)
DEFAULT_ORDER, TP_PP_DP_ORDER = "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"


def _order_rule(allowed: tuple[str, ...], source: str) -> Rule:
    return Rule(lambda f: f.rank_order in allowed,
                "the launcher lays out its ranks as " + " or ".join(allowed)
                + " (fastest first), but got rank_order={rank_order}", source)


ORDER_RULES: dict[str, Rule] = {
    "megatron": _order_rule((DEFAULT_ORDER, TP_PP_DP_ORDER), "megatron/training/initialize.py"),
    "nemo": _order_rule((DEFAULT_ORDER,), "megatron/core/parallel_state.py (NeMo's default)"),
    "deepspeed": _order_rule((DEFAULT_ORDER,), "deepspeed/runtime/pipe/topology.py"),
    "torchtitan": _order_rule((DEFAULT_ORDER,), "torchtitan/distributed/parallel_dims.py"),
    "nanotron": _order_rule((DEFAULT_ORDER,), "src/nanotron/parallel/context.py"),
    "accelerate": _order_rule((DEFAULT_ORDER,), "accelerate/parallelism_config.py"),
}

MEGATRON += (ORDER_RULES["megatron"],)
NEMO += (ORDER_RULES["nemo"],)
DEEPSPEED += (ORDER_RULES["deepspeed"],)
TORCHTITAN += (ORDER_RULES["torchtitan"],)
NANOTRON += (ORDER_RULES["nanotron"],)
ACCELERATE += (ORDER_RULES["accelerate"],)

RULES: dict[str, tuple[AnyRule, ...]] = {
    "megatron": MEGATRON,
    "nemo": NEMO,
    "deepspeed": DEEPSPEED,
    "torchtitan": TORCHTITAN,
    "nanotron": NANOTRON,
    "accelerate": ACCELERATE,
}
