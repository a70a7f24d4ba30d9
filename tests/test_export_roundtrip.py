"""Round-trips through the launchers' own config code, where it installs on a CPU machine
(``pip install -e .[export-check]``). Each test skips, with the reason shown by ``pytest -rs``,
when its library is missing; the golden files and the format parsers here still run."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from search.planfile import PlanFile, load_plan_file
from tcf_search.export import ExportOptions, ExportRefused, render

PLANS = Path(__file__).parent / "golden" / "export" / "plans"
EXAMPLES = sorted(PLANS.glob("*.yaml"))


def accepted(fmt: str, options: ExportOptions | None = None) -> list[tuple[PlanFile, dict]]:
    out = []
    for path in EXAMPLES:
        pf = load_plan_file(path)
        try:
            out.append((pf, render(fmt, pf, options)))
        except ExportRefused:
            continue
    assert out, f"no example plan is accepted by {fmt}"
    return out


def megatron_flags(script: str) -> dict[str, str | bool]:
    """Flags after the training script in an exported ``torchrun`` line."""
    line = script.split("set -euo pipefail", 1)[1]
    words = shlex.split(line.replace("\\\n", " "), comments=True)
    words = words[words.index("pretrain_gpt.py") + 1:]
    flags: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            flags[w] = True if nxt.startswith("--") else nxt
    return flags


# --- DeepSpeed -------------------------------------------------------------------------------

@dataclasses.dataclass
class _Mpu:
    dp: int

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def test_deepspeed_config_class_accepts_json(monkeypatch: pytest.MonkeyPatch) -> None:
    dsc = pytest.importorskip("deepspeed.runtime.config",
                              reason="deepspeed not installed (extra: export-check)")
    # DeepSpeedConfig reads the data-parallel size from an mpu once it has a rank.
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    for pf, files in accepted("deepspeed"):
        cfg = json.loads(files["deepspeed.json"])

        ds = dsc.DeepSpeedConfig(cfg, mpu=_Mpu(pf.plan.dp))
        assert ds.train_batch_size == pf.training.global_batch
        assert ds.train_micro_batch_size_per_gpu == pf.plan.micro_batch
        assert ds.gradient_accumulation_steps == (
            pf.training.global_batch // (pf.plan.micro_batch * pf.plan.dp))
        assert ds.zero_optimization_stage == pf.plan.zero_stage
        assert ds.bfloat16_config.enabled == (pf.training.precision == "bf16")
        if pf.plan.pp > 1:
            assert ds.pipeline["stages"] == pf.plan.pp
        if pf.plan.tp > 1:
            assert ds.tensor_parallel_config.autotp_size == pf.plan.tp


# --- Megatron-Core ---------------------------------------------------------------------------

def transformer_config_kwargs(flags: dict[str, Any], torch: Any) -> dict[str, Any]:
    def num(flag: str) -> int | None:
        return int(flags[flag]) if flag in flags else None

    kw: dict[str, Any] = {
        "num_layers": num("--num-layers"), "hidden_size": num("--hidden-size"),
        "ffn_hidden_size": num("--ffn-hidden-size"),
        "num_attention_heads": num("--num-attention-heads"),
        "num_query_groups": num("--num-query-groups"),
        "tensor_model_parallel_size": num("--tensor-model-parallel-size"),
        "pipeline_model_parallel_size": num("--pipeline-model-parallel-size"),
        "virtual_pipeline_model_parallel_size": num("--num-virtual-stages-per-pipeline-rank"),
        "context_parallel_size": num("--context-parallel-size") or 1,
        "expert_model_parallel_size": num("--expert-model-parallel-size") or 1,
        "sequence_parallel": bool(flags.get("--sequence-parallel")),
        "num_layers_in_first_pipeline_stage": num("--decoder-first-pipeline-num-layers"),
        "num_layers_in_last_pipeline_stage": num("--decoder-last-pipeline-num-layers"),
        "recompute_granularity": flags.get("--recompute-granularity"),
        "recompute_method": flags.get("--recompute-method"),
        "recompute_num_layers": num("--recompute-num-layers"),
        "num_moe_experts": num("--num-experts"),
        "moe_router_topk": num("--moe-router-topk") or 2,
        "moe_ffn_hidden_size": num("--moe-ffn-hidden-size"),
        "gated_linear_unit": bool(flags.get("--swiglu")),
        "add_bias_linear": not flags.get("--disable-bias-linear"),
        "bf16": bool(flags.get("--bf16")), "fp16": bool(flags.get("--fp16")),
        "pipeline_dtype": torch.bfloat16,
    }
    return kw


def test_megatron_core_accepts_exported_sizes() -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    for pf, files in accepted("megatron"):
        cfg = tc.TransformerConfig(**transformer_config_kwargs(
            megatron_flags(files["megatron.sh"]), torch))
        assert cfg.tensor_model_parallel_size == pf.plan.tp
        assert cfg.pipeline_model_parallel_size == pf.plan.pp
        assert (cfg.virtual_pipeline_model_parallel_size or 1) == pf.plan.vpp
        assert (cfg.num_layers_in_first_pipeline_stage or 0) == pf.plan.first_stage_layers


def test_megatron_core_refuses_what_our_rules_refuse() -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    base = load_plan_file(PLANS / "dense70b.yaml")
    cases = [dataclasses.replace(base.plan, first_stage_layers=17, last_stage_layers=19),
             dataclasses.replace(base.plan, first_stage_layers=20, last_stage_layers=21)]
    for plan in cases:
        pf = dataclasses.replace(base, plan=plan)
        with pytest.raises(ExportRefused):
            render("megatron", pf)
        p = pf.plan
        with pytest.raises(ValueError):
            tc.TransformerConfig(
                num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
                virtual_pipeline_model_parallel_size=p.vpp, sequence_parallel=True,
                num_layers_in_first_pipeline_stage=p.first_stage_layers,
                num_layers_in_last_pipeline_stage=p.last_stage_layers,
                pipeline_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_query_groups"):
        tc.TransformerConfig(num_layers=32, hidden_size=3072, num_attention_heads=24,
                             num_query_groups=3, tensor_model_parallel_size=4)


# --- torchtitan ------------------------------------------------------------------------------

def parallelism_kwargs(module_text: str) -> dict[str, Any]:
    """The literal keyword arguments of the ``ParallelismConfig(...)`` call in the module."""
    for node in ast.walk(ast.parse(module_text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ParallelismConfig":
            return {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    raise AssertionError("no ParallelismConfig(...) call in the exported module")


def test_torchtitan_config_classes_accept_export() -> None:
    cfg = pytest.importorskip("torchtitan.config",
                              reason="torchtitan not installed (extra: export-check)")
    dims = pytest.importorskip("torchtitan.distributed.parallel_dims")
    for pf, files in accepted("torchtitan"):
        kw = parallelism_kwargs(files["tcf_titan_config.py"])
        par = cfg.ParallelismConfig(**kw)
        dims.ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                          dp_shard=par.data_parallel_shard_degree,
                          cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                          pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                          world_size=pf.num_gpus)  # asserts the product equals the world
        text = files["tcf_titan_config.py"]
        local = int(text.split("local_batch_size = ")[1].split()[0])
        cfg.TrainingConfig(local_batch_size=local, global_batch_size=pf.training.global_batch,
                           seq_len=pf.training.seq_len)


def test_torchtitan_even_pipeline_split_matches_torchtitans_own() -> None:
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel",
                             reason="torchtitan not installed (extra: export-check)")
    split = getattr(pp, "_generate_llm_fqn_per_model_part", None)
    if split is None:
        pytest.skip("this torchtitan has no _generate_llm_fqn_per_model_part")
    pf = load_plan_file(PLANS / "pp8b.yaml")
    kw = parallelism_kwargs(render("torchtitan", pf)["tcf_titan_config.py"])
    assert kw["module_fqns_per_model_part"] == split(pf.plan.pp, pf.model.layers, 0, 0)


def test_torchtitan_0_2_toml_has_the_documented_shape() -> None:
    # torchtitan 0.2 is not the installed release; parse the TOML and check its documented keys.
    known = {"job", "model", "optimizer", "training", "parallelism", "activation_checkpoint"}
    for pf, files in accepted("torchtitan", ExportOptions(target_version="0.2")):
        doc = tomllib.loads(files["torchtitan.toml"])
        assert set(doc) <= known
        par = doc["parallelism"]
        world = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
                 * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
                 * par["context_parallel_degree"])
        assert world == pf.num_gpus
        assert doc["activation_checkpoint"]["mode"] in ("none", "selective", "full")


# --- Accelerate ------------------------------------------------------------------------------

def test_accelerate_loads_its_config(tmp_path: Path) -> None:
    args = pytest.importorskip("accelerate.commands.config.config_args",
                               reason="accelerate not installed (extra: export-check)")
    for pf, files in accepted("accelerate"):
        path = tmp_path / "accelerate.yaml"
        path.write_text(files["accelerate.yaml"])
        cfg = args.ClusterConfig.from_yaml_file(str(path))
        assert cfg.num_processes == pf.num_gpus
        assert cfg.mixed_precision == pf.training.precision
        if pf.plan.zero_stage:
            assert cfg.fsdp_config["fsdp_version"] == 2
            par = cfg.parallelism_config
            assert par["parallelism_config_dp_shard_size"] * par["parallelism_config_tp_size"] \
                * par["parallelism_config_cp_size"] == pf.num_gpus


# --- nanotron --------------------------------------------------------------------------------

def test_nanotron_0_4_parses_sections() -> None:
    dacite = pytest.importorskip("dacite", reason="dacite not installed (extra: export-check)")
    try:
        version = importlib.metadata.version("nanotron")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nanotron not installed (extra: export-check)")
    try:  # the PyPI release (0.4) fails its own imports: nanotron.logging and
        # nanotron.config.config import each other
        import nanotron.config as nanotron_config
        from nanotron.config import parallelism_config as pc
        from nanotron.config import utils_config as utils
    except ImportError as e:
        pytest.skip(f"nanotron {version} is installed but fails its own imports: {e}")
    hooks = {pc.PipelineEngine: utils.cast_str_to_pipeline_engine,
             pc.TensorParallelLinearMode: lambda x: pc.TensorParallelLinearMode[x.upper()]}
    for pf, files in accepted("nanotron", ExportOptions(target_version="0.4")):
        doc = yaml.safe_load(files["nanotron.yaml"])
        strict = dacite.Config(type_hooks=hooks, strict=True)
        par = dacite.from_dict(pc.ParallelismArgs, doc["parallelism"], config=strict)
        tok = dacite.from_dict(nanotron_config.TokensArgs, doc["tokens"], config=strict)
        assert par.dp * par.pp * par.tp == pf.num_gpus
        assert tok.micro_batch_size * tok.batch_accumulation_per_replica * par.dp == (
            pf.training.global_batch)


def test_nanotron_sections_use_documented_keys() -> None:
    # Field names of nanotron's ParallelismArgs / TokensArgs (src/nanotron/config) per dialect.
    release_parallelism = {"dp", "pp", "tp", "pp_engine", "tp_mode",
                           "tp_linear_async_communication", "expert_parallel_size"}
    for _pf, files in accepted("nanotron", ExportOptions(target_version="0.4")):
        assert set(yaml.safe_load(files["nanotron.yaml"])["parallelism"]) <= release_parallelism
    main_parallelism = {"dp", "pp", "tp", "pp_engine", "tp_mode", "tp_linear_async_communication",
                        "recompute_layer", "tp_recompute_allgather", "expert_parallel_size",
                        "context_parallel_size"}
    tokens = {"sequence_length", "train_steps", "micro_batch_size",
              "batch_accumulation_per_replica"}
    for _pf, files in accepted("nanotron"):
        doc = yaml.safe_load(files["nanotron.yaml"])
        assert set(doc["parallelism"]) <= main_parallelism
        assert set(doc["tokens"]) == tokens
        assert doc["parallelism"]["pp_engine"] in ("1f1b", "afab")
