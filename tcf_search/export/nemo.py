"""NeMo / Megatron-Bridge: ``run_recipe.py --recipe R`` with Hydra-style ``section.key=value``
overrides. Key names follow Megatron-Bridge's ConfigContainer (``model.*`` is the Megatron-Core
``TransformerConfig``), per its "Megatron-LM to Megatron-Bridge" mapping table.
"""

from __future__ import annotations

from costmodel.layer_style import MoeRouter
from search.inputs import PlanFile

from . import rules
from .megatron import PAD_CAPACITY_FACTOR, layer_pattern, split_args
from .options import ExportOptions, ExportRefused
from .shell import Group, command, script, torchrun_head
from .view import LOSS_FUSION, LaunchView, facts_of

FILENAME = "nemo.sh"

# Megatron-Bridge recipes by the model the user named (megatron/bridge/recipes/*): the recipe and
# whether it sets ``comm_overlap`` (a None section takes no ``comm_overlap.*`` override). The
# Llama and Qwen recipes read the named model's Hugging Face config at start (AutoBridge), which
# the user asked for by naming the model; the GPT-3 recipe builds GPTProvider175B locally.
RECIPES: dict[str, tuple[str, bool]] = {
    "llama3-8b": ("llama3_8b_pretrain_config", False),
    "llama3-70b": ("llama3_70b_pretrain_config", True),
    "llama3.1-8b": ("llama31_8b_pretrain_config", False),
    "llama3.1-70b": ("llama31_70b_pretrain_config", True),
    "llama3.1-405b": ("llama31_405b_pretrain_config", True),
    # DeepSeek-V3's provider (megatron/bridge/models/deepseek/deepseek_v3_bridge.py) is an
    # MLATransformerConfig with DeepSeek's router; the recipe turns on one MTP layer and its own
    # pipeline layout, which the overrides below take off (the searched model has neither)
    "deepseek-v3": ("deepseek_v3_pretrain_config", True),
    "gpt3-175b": ("gpt3_175b_pretrain_config", True),
    "qwen3-30b-a3b": ("qwen3_30b_a3b_pretrain_config", False),
    "qwen3-235b-a22b": ("qwen3_235b_a22b_pretrain_config", False),
    # gpt-oss's provider from its Hugging Face config (sinks, windows, clamped SwiGLU); no
    # comm_overlap section (src/megatron/bridge/recipes/gpt_oss/gpt_oss.py, v0.3.1 and v0.5.1)
    "gpt-oss-20b": ("gpt_oss_20b_pretrain_config", False),
    "gpt-oss-120b": ("gpt_oss_120b_pretrain_config", False),
}
# Any other GELU model starts from the GPT-3 recipe (no download) with every size overridden; a
# recipe's activation_func is a callable, which Hydra overrides cannot change.
GELU_BASE = RECIPES["gpt3-175b"]
NORMALIZATION = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
POSITIONS = {"rope": "rope", "learned": "learned_absolute"}

MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                   "fp8": "bf16_with_fp8_delayed_scaling_mixed"}


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, list):  # a Hydra-style list override
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def overrides(pf: PlanFile, f: LaunchView, options: ExportOptions) -> dict[str, object]:
    m = pf.model
    o = _layout(f)
    o |= _model(pf)
    # the DeepSeek recipes' own layout and MTP depth are cleared unless the plan sets them
    o |= {k: v for k, v in latent_overrides(pf).items() if k not in o}
    if m.is_moe:
        o |= _experts(pf)
    return o | _runtime(pf, f, options)


def _layout(f: LaunchView) -> dict[str, object]:
    """The parallel layout, the pipeline split, recomputation and offloading."""
    o: dict[str, object] = {
        "model.tensor_model_parallel_size": f.tp,
        "model.pipeline_model_parallel_size": f.pp,
        "model.virtual_pipeline_model_parallel_size": f.vpp if f.vpp > 1 else None,
        "model.context_parallel_size": f.cp,
        "model.expert_model_parallel_size": f.ep,
        "model.sequence_parallel": f.sp,
    }
    if f.etp != f.tp:  # Megatron-Core's folding (TransformerConfig defaults it to tp)
        o["model.expert_tensor_parallel_size"] = f.etp
    # the same split Megatron-LM takes (megatron.split_args): first/last stage counts, the
    # embedding and the loss counted as layers (TransformerConfig's account_for_* fields), or
    # the explicit layout (its pipeline_model_parallel_layout; TransformerConfig asserts a vpp
    # given beside it equals the layout's, transformer_config.py __post_init__)
    for group in split_args(f):
        key = {"--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
               "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
               "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
               "--account-for-embedding-in-pipeline-split":
                   "account_for_embedding_in_pipeline_split",
               "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split"}[
                   str(group[0])]
        o[f"model.{key}"] = group[1] if len(group) > 1 else True
    if f.recompute == "selective":
        o["model.recompute_granularity"] = "selective"
        if f.recompute_modules:
            o["model.recompute_modules"] = list(f.recompute_modules)
    elif f.recompute == "full":
        o["model.recompute_granularity"] = "full"
        o["model.recompute_method"] = "uniform" if f.recompute_all else "block"
        o["model.recompute_num_layers"] = 1 if f.recompute_all else f.recompute_layers // f.vpp
    if f.cpu_offload_layers:  # TransformerConfig's cpu_offloading_* (megatron.offload_args)
        o |= {"model.cpu_offloading": True,
              "model.cpu_offloading_num_layers": f.cpu_offload_layers,
              "model.cpu_offloading_activations": True, "model.cpu_offloading_weights": False}
    return o


def _model(pf: PlanFile) -> dict[str, object]:
    m, t = pf.model, pf.training
    o: dict[str, object] = {
        "model.num_layers": m.layers, "model.hidden_size": m.hidden,
        "model.ffn_hidden_size": m.ffn_hidden, "model.num_attention_heads": m.heads,
        "model.num_query_groups": m.kv_heads,
        "model.seq_length": t.seq_len, "dataset.seq_length": t.seq_len,
        "model.share_embeddings_and_output_weights": m.tied_embeddings,
    }
    if m.head_dim:
        o["model.kv_channels"] = m.head_dim
    o |= {"model.normalization": NORMALIZATION[m.norm],
          "model.position_embedding_type": POSITIONS[m.position_embedding],
          "model.add_bias_linear": m.bias == "all", "model.add_qkv_bias": m.bias != "none",
          "model.gated_linear_unit": m.ffn_type == "swiglu", "tokenizer.vocab_size": m.vocab}
    if m.position_embedding == "rope":
        o["model.rotary_base"] = int(m.rope_base)
    # TransformerConfig's attention fields, as megatron.attention_args writes them
    if m.qk_norm:
        o["model.qk_layernorm"] = True
    if m.sliding_window:
        o["model.window_size"] = f"[{m.sliding_window - 1},0]"
        if m.window_skip_freq:
            o["model.window_attn_skip_freq"] = m.window_skip_freq
    if m.attention_sinks:
        o["model.softmax_type"] = "learnable"
    return o


def _experts(pf: PlanFile) -> dict[str, object]:
    m = pf.model
    # the experts as the cost model prices them, TEGroupedMLP (megatron.sh's
    # --moe-grouped-gemm), whatever the recipe's provider has
    o: dict[str, object] = {
        "model.num_moe_experts": m.moe_experts, "model.moe_router_topk": m.moe_topk,
        "model.moe_ffn_hidden_size": m.expert_ffn_hidden, "model.moe_grouped_gemm": True}
    if m.moe_shared_experts:
        o["model.moe_shared_expert_intermediate_size"] = (
            m.moe_shared_experts * m.expert_ffn_hidden)
    if m.moe_layers < m.layers:  # megatron.layer_pattern
        o["model.moe_layer_freq"] = layer_pattern(m.moe_pattern)
    # the searched router, whatever the recipe's provider has (megatron.router_args)
    r = m.moe_router or MoeRouter()
    return o | {"model.moe_router_score_function": r.score,
                "model.moe_router_num_groups": r.groups if r.groups > 1 else None,
                "model.moe_router_group_topk": r.group_topk if r.groups > 1 else None,
                "model.moe_router_topk_scaling_factor": r.scaling if r.scaling != 1.0 else None,
                "model.moe_router_enable_expert_bias": r.expert_bias}


def _runtime(pf: PlanFile, f: LaunchView, options: ExportOptions) -> dict[str, object]:
    """Batch, optimizer, precision and data-parallel switches."""
    fw = pf.training.framework
    o: dict[str, object] = {
        "train.micro_batch_size": f.micro_batch, "train.global_batch_size": f.global_batch,
        "train.train_iters": options.train_iters, "optimizer.lr": options.lr,
        "mixed_precision": MIXED_PRECISION[f.precision]}
    distributed = f.zero == 1 or (f.zero in (2, 3) and f.fsdp_impl == "megatron")
    o["ddp.use_distributed_optimizer"] = distributed
    o["optimizer.use_distributed_optimizer"] = distributed
    if f.zero == 3 and f.fsdp_impl == "torch":
        o |= {"dist.use_torch_fsdp2": True, "checkpoint.ckpt_format": "torch_dist"}
    elif f.zero in (2, 3):  # Megatron-FSDP's required settings, as in megatron.py
        o |= {"dist.use_megatron_fsdp": True, "ddp.use_megatron_fsdp": True,
              "model.gradient_accumulation_fusion": False,
              "ddp.data_parallel_sharding_strategy":
                  "optim_grads" if f.zero == 2 else "optim_grads_params",
              "checkpoint.ckpt_format": "fsdp_dtensor"}
    o["ddp.overlap_grad_reduce"] = fw.dp.overlap_grad_reduce and f.dp * f.cp > 1
    o["ddp.overlap_param_gather"] = (fw.dp.overlap_param_gather and fw.dp.overlap_grad_reduce
                                     and f.zero >= 1 and f.dp * f.cp > 1
                                     and f.fsdp_impl != "torch")  # not with torch FSDP2
    return o


def latent_overrides(pf: PlanFile) -> dict[str, object]:
    """Latent attention and RoPE scaling as provider fields: GPTModelProvider's rope_scaling /
    rope_scaling_factor (Llama 3.1, megatron/bridge/models/gpt_provider.py) and, on a DeepSeek
    recipe's MLATransformerConfig, the latent sizes, its normed latents (qk_layernorm) and YaRN
    (rope_type, rotary_scaling_factor, original_max_position_embeddings, beta_*, mscale*)."""
    m = pf.model
    s = m.rope_scaling
    o: dict[str, object] = {}
    if m.mla is None:
        llama3 = s is not None and s.kind == "llama3"
        o["model.rope_scaling"] = llama3
        if m.mtp_layers:  # TransformerConfig's mtp_num_layers (multi-token prediction)
            o["model.mtp_num_layers"] = m.mtp_layers
        if s is not None and llama3:
            o["model.rope_scaling_factor"] = s.factor
        return o
    a = m.mla
    o |= {"model.q_lora_rank": a.q_lora_rank or None, "model.kv_lora_rank": a.kv_lora_rank,
          "model.qk_head_dim": a.qk_nope_head_dim, "model.qk_pos_emb_head_dim":
          a.qk_rope_head_dim, "model.v_head_dim": a.v_head_dim, "model.qk_layernorm": True,
          "model.mtp_num_layers": m.mtp_layers or None,
          "model.pipeline_model_parallel_layout": None}
    if s is None:
        return o | {"model.rope_type": "rope", "model.apply_rope_fusion": False}
    return o | {"model.rope_type": "yarn", "model.rotary_scaling_factor": s.factor,
                "model.original_max_position_embeddings": s.original_max_position_embeddings,
                "model.beta_fast": s.beta_fast, "model.beta_slow": s.beta_slow,
                "model.mscale": s.mscale, "model.mscale_all_dim": s.mscale_all_dim}


def graph_overrides(pf: PlanFile) -> dict[str, object]:
    """The training's CUDA graphs as Megatron-Bridge's ConfigContainer takes them (its
    performance scripts' set_cuda_graph_overrides, scripts/performance/utils/helpers.py v0.2.2:
    model.cuda_graph_impl, model.cuda_graph_scope, and the Transformer Engine RNG tracker the
    graphs need, rng.te_rng_tracker and model.use_te_rng_tracker), token drop with padding
    (apply_moe_token_drop's model.moe_expert_capacity_factor 1.0 and
    model.moe_pad_expert_input_to_capacity) and the study's fused loss (the provider's
    cross_entropy_loss_fusion and cross_entropy_fusion_impl, as the performance scripts set)."""
    fw = pf.training.framework
    o: dict[str, object] = {}
    if pf.model.is_moe and fw.moe.moe_pad_to_capacity:
        o = {"model.moe_expert_capacity_factor": PAD_CAPACITY_FACTOR,
             "model.moe_pad_expert_input_to_capacity": True}
    if (loss := LOSS_FUSION.get(fw.kernels.loss_kernel)) is not None:  # the study's fused loss
        o |= {"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": loss}
    if fw.kernels.cuda_graph_impl != "none":
        o |= {"model.cuda_graph_impl": fw.kernels.cuda_graph_impl,
              "model.cuda_graph_scope": list(fw.kernels.cuda_graph_scope),
              "rng.te_rng_tracker": True, "model.use_te_rng_tracker": True}
    return o


def moe_dispatch_overrides(pf: PlanFile, f: LaunchView) -> dict[str, object]:
    """The MoE dispatch the plan was priced with, as the model config's fields (Megatron-Core's
    TransformerConfig, which the recipe's provider is): the dispatcher (flex with DeepEP, the
    backend the model's flex prices), the fusions and the shared-expert overlap."""
    if not pf.model.is_moe:
        return {}
    moe = pf.training.framework.moe
    o: dict[str, object] = {"model.moe_token_dispatcher_type": f.moe_dispatcher,
                            "model.moe_permute_fusion": moe.moe_permute_fusion,
                            "model.moe_router_fusion": moe.moe_router_fusion}
    if f.moe_dispatcher == "flex":
        o["model.moe_flex_dispatcher_backend"] = "deepep"
    if pf.model.moe_shared_experts:
        o["model.moe_shared_expert_overlap"] = (moe.moe_shared_expert_overlap
                                                and not f.moe_a2a_overlap)
    return o


def recipe_of(pf: PlanFile, options: ExportOptions) -> tuple[str, bool]:
    """The recipe and whether it has a comm_overlap section; refuses a model without one."""
    if options.nemo_recipe:
        return options.nemo_recipe, True
    m = pf.model
    if m.name in RECIPES:
        return RECIPES[m.name]
    if m.ffn_type == "gelu":
        return GELU_BASE
    raise ExportRefused("nemo", [
        f"a SwiGLU model needs a Megatron-Bridge recipe of its family (activation_func is a "
        f"callable no override changes), and those read a named model's Hugging Face config; "
        f"{m.name!r} is none of {', '.join(RECIPES)} (pass --set nemo_recipe=... to choose one)"])


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "nemo")
    rules.check("nemo", rules.NEMO, f)
    recipe, has_comm_overlap = recipe_of(pf, options)
    if (pf.model.mla is not None) != recipe.startswith("deepseek_"):
        # a recipe's config class is fixed: only the DeepSeek providers are MLATransformerConfig
        raise ExportRefused("nemo", [
            f"latent attention is built by a DeepSeek recipe's MLATransformerConfig (an "
            f"override cannot change a config's class), but the model has mla="
            f"{pf.model.mla} and the recipe is {recipe}"])
    o = overrides(pf, f, options) | graph_overrides(pf) | moe_dispatch_overrides(pf, f)
    # the overlap runs only at TP > 1 with SP (NeMo's callback turns it off elsewhere)
    overlap = pf.training.framework.tp.tp_comm_overlap and f.tp > 1 and f.sp
    if f.moe_a2a_overlap and pf.model.is_moe:
        # a recipe with a comm_overlap section sets the model's switch from its
        # CommOverlapConfig, False unless told (src/megatron/bridge/training/comm_overlap.py,
        # v0.2.2 _get_model_comm_overlap_cfgs); without one the model config's own field runs
        key = "comm_overlap" if has_comm_overlap else "model"
        o[f"{key}.overlap_moe_expert_parallel_comm"] = True
    if has_comm_overlap:
        o["comm_overlap.tp_comm_overlap"] = overlap
    elif overlap:
        raise ExportRefused("nemo", [f"recipe {recipe} has no comm_overlap section, so "
                                     "tp_comm_overlap=true cannot be set by an override (a "
                                     "study with training.tp_comm_overlap: false plans it "
                                     "without the overlap)"])
    groups: list[Group] = [("--recipe", recipe)]
    groups += [(f"{k}={_value(v)}",) for k, v in o.items()]
    body = command([*torchrun_head(f, options.master_port), options.nemo_script], groups)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (f.tp > 1 or f.cp > 1) and f.zero < 2 else {}
    return {FILENAME: script("nemo", pf, body, env, f.version)}
