"""torchtitan: the current release's config form (a Python function returning ``Trainer.Config``,
selected with ``--module``/``--config``; torchtitan 0.3) or the older TOML job file (0.2).

Data parallelism maps ZeRO onto FSDP2: 3 shards and reshards after forward, 1/2 shard without
resharding (parameters stay gathered through backward), 0 replicates (HSDP with shard degree 1).
ZeRO-3 under PP is written "always": the "default" policy does not reshard under PP
(torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy: ``not pp_enabled``), which
would keep every stage's parameters gathered, not the plan that was priced.
The pipeline placement is written out as ``module_fqns_per_model_part`` so uneven and interleaved
stages land exactly where the plan put them.
"""

from __future__ import annotations

from typing import Any

from costmodel.specs import ModelSpec
from search.inputs import PlanFile

from . import rules
from .literals import comment, identifier_path, toml
from .literals import python as py
from .options import ExportError, ExportOptions
from .shell import Raw, command, script, torchrun_head
from .view import LaunchView, facts_of, virtual_stage_ranges

PY_MODULE = "tcf_titan_config"
PY_FUNCTION = "tcf_plan"
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}


def model_parts(f: LaunchView, output_name: str) -> list[list[str]] | None:
    if f.pp == 1:
        return None
    ranges = virtual_stage_ranges(f)
    parts = [[f"layers.{i}" for i in r] for r in ranges]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", output_name]
    return parts


def reshard_policy(f: LaunchView) -> str:
    """FSDP2's reshard-after-forward policy for the plan's ZeRO stage (module docstring)."""
    if f.zero == 3:
        return "always" if f.pp > 1 else "default"
    return "default" if f.zero == 0 else "never"


def parallelism(f: LaunchView, version: str) -> dict[str, Any]:
    sharded = f.zero > 0
    p: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if sharded else f.dp,
        "data_parallel_shard_degree": f.dp if sharded else 1,
        "fsdp_reshard_after_forward": reshard_policy(f),
        "tensor_parallel_degree": f.tp,
        "pipeline_parallel_degree": f.pp,
        "context_parallel_degree": f.cp,
        "expert_parallel_degree": f.ep,
    }
    if version == "0.3":
        p["enable_sequence_parallel"] = f.sp
    elif f.ep > 1:
        p["expert_tensor_parallel_degree"] = f.etp  # 0.2 takes etp = tp or 1
    if f.pp > 1:
        p["pipeline_parallel_schedule"] = SCHEDULES[f.schedule]
        p["pipeline_parallel_microbatch_size"] = f.micro_batch
        output = "lm_head" if version == "0.3" else "output"
        p["module_fqns_per_model_part"] = model_parts(f, output)
    return p


def batch(f: LaunchView) -> dict[str, int]:
    # With PP the pipeline splits the per-rank batch into micro-batches; without, torchtitan
    # accumulates gradients over global / (local * dp) steps.
    local = f.micro_batch * f.microbatches if f.pp > 1 else f.micro_batch
    return {"local_batch_size": local, "global_batch_size": f.global_batch, "seq_len": f.seq_len}


def _rope(m: ModelSpec, seq_len: int) -> str:
    """ComplexRoPE's config, with Llama 3.1's RoPE scaling as its fields
    (torchtitan/models/common/rope.py: scaling "llama", scaling_factor, low/high_freq_factor,
    original_max_position_embeddings); the rules refuse YaRN here."""
    fields = f"dim={py(m.d_head)}, max_seq_len={py(seq_len)}, theta={py(m.rope_base)}"
    if (s := m.rope_scaling) is not None:
        fields += (f', scaling="llama", scaling_factor={py(s.factor)}, '
                   f"low_freq_factor={py(s.low_freq_factor)}, "
                   f"high_freq_factor={py(s.high_freq_factor)}, "
                   f"original_max_position_embeddings={py(s.original_max_position_embeddings)}")
    return f"ComplexRoPE.Config({fields})"


def _model_lines(pf: PlanFile, f: LaunchView) -> list[str]:
    """The searched model in torchtitan's own Llama 3 parts, as its flavour functions build
    them (torchtitan/models/llama3/__init__.py: ``Llama3Model.Config`` with the layers of
    ``_build_llama3_layers``); the FP8 converter is applied as ``model_registry`` does. The
    docstring naming the model is a ``repr`` literal: the name is data."""
    m = pf.model
    doc = (f"{m.name}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} KV), "
           f"vocab {m.vocab}.")
    lines = [
        "def tcf_model():",
        f"    {py(doc)}",
        f"    dim, vocab = {py(m.hidden)}, {py(m.vocab)}",
        "    model = Llama3Model.Config(",
        f"        dim=dim, vocab_size=vocab, enable_weight_tying={py(m.tied_embeddings)},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,",
        "                                        param_init=_EMBEDDING_INIT),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab,",
        "                              param_init=_output_linear_init(dim)),",
        f"        layers=_build_llama3_layers(n_layers={py(m.layers)}, dim=dim, "
        f"n_heads={py(m.heads)}, n_kv_heads={py(m.kv_heads)},",
        f"                                    hidden_dim={py(m.ffn_hidden)}, fuse_qkv=True, "
        'attn_backend="flex",',
        f"                                    rope={_rope(m, f.seq_len)}),",
        "    )",
    ]
    if f.precision == "fp8":
        lines.append("    model = Float8LinearConverter.Config().build().convert(model)")
    lines += ['    return dataclasses.replace(model_registry("8B"), flavor="tcf", model=model)',
              "", ""]
    return lines


def render_python(pf: PlanFile, f: LaunchView, options: ExportOptions) -> str:
    """The module. Its first line is a constant comment and the study is named in the module
    docstring, a ``repr`` literal (``literals``: no input text in a Python comment)."""
    if (not identifier_path(options.titan_module) or not identifier_path(options.titan_config)
            or "." in options.titan_config):
        raise ExportError(f"options.titan_module/titan_config must be a Python module path and "
                          f"identifier, but got {options.titan_module!r}, {options.titan_config!r}")
    base = f"torchtitan.models.{options.titan_module}"
    parts = "torchtitan.models.llama3"  # the model's parts; base only gives training settings
    ac = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}
    lines = [
        "# torchtitan config generated by `tcf-search export`; the study is named below.",
        py(f"torchtitan {f.version} config for study {pf.study}, rank {pf.rank}."),
        "",
        f"# Run: torchrun ... -m torchtitan.train --module {PY_MODULE} --config {PY_FUNCTION}",
        f"# Training settings come from {options.titan_config}; the model is the searched one "
        "(tcf_model below).",
        "",
        "import dataclasses",
        "",
        "from torchtitan.config import ParallelismConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
        f"from {parts} import (_EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers, "
        "_output_linear_init,",
        "                     model_registry)",
        f"from {base}.config_registry import {options.titan_config} as base_config",
        f"from {parts}.model import Llama3Model",
    ]
    if f.precision == "fp8":
        lines += ["from torchtitan.components.quantization import Float8LinearConverter"]
    lines += ["", "", *_model_lines(pf, f), f"def {PY_FUNCTION}():", "    config = base_config()",
              "    config.model_spec = tcf_model()",
              f"    config.loss.loss_fn.global_vocab_size = {py(pf.model.vocab)}"]
    lines += [f"    config.training.{k} = {py(v)}" for k, v in batch(f).items()]
    lines += [f"    config.training.steps = {py(options.train_iters)}"]
    if f.pp > 1:  # torchtitan: "CUDA graphs do not support pipeline parallelism yet"
        lines += ["    config.training.disable_cuda_graphs = True"]
    lines += ["    config.parallelism = ParallelismConfig("]
    lines += [f"        {k}={py(v)}," for k, v in parallelism(f, "0.3").items()]
    lines += ["    )", f"    config.activation_checkpoint = {ac[f.recompute]}"]
    lines += ["    return config", ""]
    return "\n".join(lines)


def flavor_02(pf: PlanFile) -> str:
    shape = rules.model_shape(pf.model)
    return next(name for name, known in rules.TITAN_FLAVORS_02.items() if known == shape)


def render_toml(pf: PlanFile, f: LaunchView, options: ExportOptions) -> str:
    mode = {"none": "none", "selective": "selective", "full": "full"}[f.recompute]
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"{pf.study} rank {pf.rank}"},
        "model": {"name": options.titan_module, "flavor": options.titan_flavor or flavor_02(pf),
                  "converters": ["quantize.linear.float8"] if f.precision == "fp8" else []},
        "optimizer": {"name": "AdamW", "lr": options.lr},
        "training": {**batch(f), "steps": options.train_iters, "dataset": "c4",
                     "mixed_precision_param": "bfloat16"},
        "parallelism": parallelism(f, "0.2"),
        "activation_checkpoint": {"mode": mode, **({"selective_ac_option": "op"}
                                                   if mode == "selective" else {})},
    }
    out = [f"# torchtitan 0.2 job config; study {comment(pf.study)}, generated by tcf-search"]
    for name, table in sections.items():
        out.append(f"\n[{name}]")
        out += [f"{k} = {toml(v, f'{name}.{k}')}" for k, v in table.items() if v is not None]
    return "\n".join(out) + "\n"


def render(pf: PlanFile, options: ExportOptions) -> dict[str, str]:
    f = facts_of(pf, options, "torchtitan")
    version = f.version
    rules.check("torchtitan", rules.TORCHTITAN, f)
    head = [*torchrun_head(f, options.master_port), "-m", "torchtitan.train"]
    if version == "0.3":
        body = command(head, [("--module", PY_MODULE, "--config", PY_FUNCTION)])
        env = {"PYTHONPATH": Raw('"$(dirname "$0")${PYTHONPATH:+:$PYTHONPATH}"')}
        return {f"{PY_MODULE}.py": render_python(pf, f, options),
                "torchtitan.sh": script("torchtitan", pf, body, env, f.version)}
    body = command(head, [("--job.config_file", Raw('"$(dirname "$0")/torchtitan.toml"'))])
    return {"torchtitan.toml": render_toml(pf, f, options),
            "torchtitan.sh": script("torchtitan", pf, body, None, f.version)}
