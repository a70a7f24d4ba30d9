"""Every export read whole by its launcher's own config code, the way the launcher reads it, over
every shipped study's top plans and the golden plans (``pip install -e .[export-check]``).

A format either accepts a plan, and then its launcher's parser accepts the file and reads back
the plan's model and parallel sizes, or refuses it with a rule. A test skips, with the reason
shown by ``pytest -rs``, when its launcher is not installed; what each could use is in
docs/export.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from export_plans import golden_plans, study_top_plans

from search.planfile import PlanFile, load_plan_file
from search.presets import get_preset
from tcf_search.export import FORMATS, ExportOptions, ExportRefused, render
from tcf_search.export.options import TARGETS
from tcf_search.export.rules import TITAN_FLAVORS_02

PLANS = Path(__file__).parent / "golden" / "export" / "plans"


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PlanFile]:
    return {**golden_plans(), **study_top_plans(tmp_path_factory.mktemp("studies"))}


def exported(plans: dict[str, PlanFile], fmt: str, options: ExportOptions | None = None
             ) -> Iterator[tuple[str, PlanFile, dict[str, str]]]:
    """(name, plan, files) of each plan the format accepts; a refusal must name its rules."""
    accepted = 0
    for name, pf in plans.items():
        try:
            files = render(fmt, pf, options)
        except ExportRefused as e:
            assert e.reasons and all(e.reasons), name
            continue
        accepted += 1
        yield name, pf, files
    assert accepted, f"no plan is accepted by {fmt}"


def seventy_b(*, plain: bool = False) -> PlanFile:
    """The 70B golden plan with selective recompute; ``plain``: even 1F1B stages, no recompute,
    for launchers without interleaving or pinned stage sizes."""
    pf = load_plan_file(PLANS / "dense70b.yaml")
    plan = dataclasses.replace(pf.plan, recompute="selective")
    if plain:
        plan = dataclasses.replace(plan, vpp=1, pp_schedule="1f1b", first_stage_layers=0,
                                   last_stage_layers=0, recompute="none")
    return dataclasses.replace(pf, plan=plan)


def launcher_flags(script: str, entry: str) -> dict[str, str | bool]:
    """Flags after ``entry`` in an exported ``torchrun`` line, as argparse would see them."""
    line = script.split("set -euo pipefail", 1)[1]
    words = shlex.split(line.replace("\\\n", " "), comments=True)
    words = words[words.index(entry) + 1:]
    flags: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            flags[w] = True if nxt.startswith("--") else nxt
    return flags


def test_every_format_names_its_default_target() -> None:
    pf = load_plan_file(PLANS / "pp8b.yaml")
    for fmt in TARGETS:
        try:
            files = render(fmt, pf)
        except ExportRefused:
            continue
        script = next(text for name, text in files.items() if name.endswith(".sh"))
        assert f"# {fmt} {TARGETS[fmt][0]} launch" in script
    assert set(TARGETS) | {"slurm"} == set(FORMATS)


# --- Megatron-LM / Megatron-Core ---------------------------------------------------------------
# Megatron-LM's megatron.training (parse_args, validate_args) is not on the package index: the
# megatron-core wheel ships megatron.core only. The exported flags are read into Megatron-Core's
# TransformerConfig, whose __post_init__ holds the parallel and model checks.

def transformer_config_kwargs(flags: dict[str, Any], torch: Any) -> dict[str, Any]:
    def num(flag: str) -> int | None:
        return int(flags[flag]) if flag in flags else None

    return {
        "num_layers": num("--num-layers"), "hidden_size": num("--hidden-size"),
        "ffn_hidden_size": num("--ffn-hidden-size"),
        "num_attention_heads": num("--num-attention-heads"),
        "num_query_groups": num("--num-query-groups"), "kv_channels": num("--kv-channels"),
        "tensor_model_parallel_size": num("--tensor-model-parallel-size"),
        "pipeline_model_parallel_size": num("--pipeline-model-parallel-size"),
        "virtual_pipeline_model_parallel_size": num("--num-virtual-stages-per-pipeline-rank"),
        # the explicit layout gives vpp itself (TransformerConfig.__post_init__ reads it)
        "pipeline_model_parallel_layout": flags.get("--pipeline-model-parallel-layout"),
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
        "mtp_num_layers": num("--mtp-num-layers"),
        "gated_linear_unit": bool(flags.get("--swiglu")),
        "add_bias_linear": not flags.get("--disable-bias-linear"),
        "add_qkv_bias": bool(flags.get("--add-qkv-bias")),
        "normalization": flags.get("--normalization", "LayerNorm"),
        "bf16": bool(flags.get("--bf16")), "fp16": bool(flags.get("--fp16")),
        "pipeline_dtype": torch.bfloat16,
    }


def megatron_config(files: dict[str, str]) -> tuple[Any, dict[str, str | bool]]:
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    flags = launcher_flags(files["megatron.sh"], "pretrain_gpt.py")
    return tc.TransformerConfig(**transformer_config_kwargs(flags, torch)), flags


def test_megatron_core_accepts_every_export(plans: dict[str, PlanFile]) -> None:
    for name, pf, files in exported(plans, "megatron"):
        cfg, flags = megatron_config(files)
        m = pf.model
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads) == (
            m.layers, m.hidden, m.heads), name
        assert (cfg.num_query_groups or cfg.num_attention_heads) == m.kv_heads, name
        assert cfg.gated_linear_unit == (m.ffn_type == "swiglu"), name
        assert cfg.add_bias_linear == (m.bias == "all"), name
        assert cfg.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
        if m.position_embedding == "rope":
            assert int(flags["--rotary-base"]) == m.rope_base, name
        assert int(flags["--vocab-size"]) == m.vocab
        assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (
            pf.plan.tp, pf.plan.pp), name
        assert (cfg.virtual_pipeline_model_parallel_size or 1) == pf.plan.vpp, name
        assert (cfg.mtp_num_layers or 0) == m.mtp_layers, name


def test_megatron_fsdp_modes_carry_their_required_flags() -> None:
    pf = load_plan_file(PLANS / "fsdp8b.yaml")  # ZeRO-3 with overlap_param_gather
    flags = launcher_flags(render("megatron", pf)["megatron.sh"], "pretrain_gpt.py")
    for flag in ("--use-megatron-fsdp", "--use-distributed-optimizer",
                 "--no-gradient-accumulation-fusion", "--overlap-param-gather"):
        assert flag in flags
    assert flags["--ckpt-format"] == "fsdp_dtensor"
    torch_fsdp = ExportOptions(fsdp_impl="torch")
    flags = launcher_flags(render("megatron", pf, torch_fsdp)["megatron.sh"], "pretrain_gpt.py")
    # validate_args: --overlap-param-gather only with the distributed optimizer or Megatron-FSDP
    assert "--use-torch-fsdp2" in flags and "--overlap-param-gather" not in flags
    zero2 = dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, zero_stage=2))
    with pytest.raises(ExportRefused, match="no torch-FSDP ZeRO-2"):
        render("megatron", zero2, torch_fsdp)


def test_megatron_70b_reads_back() -> None:
    pf = seventy_b()
    cfg, flags = megatron_config(render("megatron", pf))
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups) == (
        80, 8192, 64, 8)
    assert flags["--vocab-size"] == "128256" and flags["--rotary-base"] == "500000"
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size,
            cfg.virtual_pipeline_model_parallel_size) == (pf.plan.tp, pf.plan.pp, pf.plan.vpp)


# --- NeMo / Megatron-Bridge ----------------------------------------------------------------------
# megatron-bridge (0.3.1 on the index) needs transformer-engine, mamba-ssm and causal-conv1d,
# CUDA builds that do not install on a CPU machine; its recipe and Hydra overrides then cannot
# run here. The model.* overrides are built into Megatron-Core's TransformerConfig, which Bridge's
# GPTModelProvider extends (megatron/bridge/models/gpt_provider.py adds the fields below).

PROVIDER_FIELDS = {"seq_length", "rotary_base", "position_embedding_type",
                   "share_embeddings_and_output_weights", "moe_layer_freq", "rope_scaling",
                   "rope_scaling_factor"}


def nemo_overrides(files: dict[str, str]) -> dict[str, str]:
    words = shlex.split(files["nemo.sh"].split("run_recipe.py", 1)[1].replace("\\\n", " "))
    return dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("--"))


def nemo_model_config(files: dict[str, str]) -> Any:
    torch = pytest.importorskip("torch", reason="torch not installed (extra: export-check)")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="megatron-core not installed (extra: export-check)")
    o = nemo_overrides(files)
    # a DeepSeek recipe's provider is an MLATransformerConfig (nemo.latent_overrides)
    cls = tc.MLATransformerConfig if "model.kv_lora_rank" in o else tc.TransformerConfig
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {"pipeline_dtype": torch.bfloat16}
    for key, text in o.items():
        section, _, name = key.partition(".")
        if section != "model" or name in PROVIDER_FIELDS:
            continue
        assert name in fields, f"model.{name} is not a {cls.__name__} field"
        kw[name] = yaml.safe_load(text)
    return cls(**kw)


def test_nemo_model_overrides_build_a_transformer_config(plans: dict[str, PlanFile]) -> None:
    for name, pf, files in exported(plans, "nemo"):
        cfg = nemo_model_config(files)
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_query_groups) == (
            pf.model.layers, pf.model.hidden, pf.model.kv_heads), name
        assert cfg.gated_linear_unit == (pf.model.ffn_type == "swiglu"), name
        assert nemo_overrides(files)["tokenizer.vocab_size"] == str(pf.model.vocab)


def test_nemo_70b_reads_back() -> None:
    pf = seventy_b()
    files = render("nemo", pf)
    cfg = nemo_model_config(files)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups) == (
        80, 8192, 64, 8)
    o = nemo_overrides(files)
    assert o["tokenizer.vocab_size"] == "128256" and o["model.rotary_base"] == "500000"
    assert "--recipe llama3_70b_pretrain_config" in files["nemo.sh"]
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (
        pf.plan.tp, pf.plan.pp)


def test_nemo_never_downloads_an_unnamed_model() -> None:
    tiny = load_plan_file(PLANS / "pp8b.yaml")
    tiny = dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, name="my-llama"))
    with pytest.raises(ExportRefused, match="Hugging Face config"):
        render("nemo", tiny)


# --- torchtitan --------------------------------------------------------------------------------

def titan_config(files: dict[str, str], folder: Path) -> Any:
    """The exported module loaded by torchtitan's ConfigManager, as ``torchtitan.train`` does."""
    pytest.importorskip("triton", reason="torchtitan's models import triton (extra: export-check)")
    manager = pytest.importorskip("torchtitan.config.manager",
                                  reason="torchtitan not installed (extra: export-check)")
    (folder / "tcf_titan_config.py").write_text(files["tcf_titan_config.py"])
    sys.modules.pop("tcf_titan_config", None)
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        return manager.ConfigManager().parse_args(
            ["--module", "tcf_titan_config", "--config", "tcf_plan"])
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("tcf_titan_config", None)


def check_titan(cfg: Any, pf: PlanFile) -> None:
    dims = importlib.import_module("torchtitan.distributed.parallel_dims")
    model, par = cfg.model_spec.model, cfg.parallelism
    attention = model.layers[0].attention.qkv_linear
    assert (len(model.layers), model.dim, attention.n_heads, attention.n_kv_heads,
            model.vocab_size) == (pf.model.layers, pf.model.hidden, pf.model.heads,
                                  pf.model.kv_heads, pf.model.vocab)
    assert model.layers[0].attention.rope.theta == pf.model.rope_base
    dims.ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                      dp_shard=par.data_parallel_shard_degree, cp=par.context_parallel_degree,
                      tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                      ep=par.expert_parallel_degree, world_size=pf.num_gpus)
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (pf.plan.tp, pf.plan.pp)
    t = cfg.training
    assert (t.global_batch_size, t.seq_len) == (pf.training.global_batch, pf.training.seq_len)
    assert t.disable_cuda_graphs or pf.plan.pp == 1


def test_torchtitan_config_manager_accepts_every_export(plans: dict[str, PlanFile],
                                                        tmp_path: Path) -> None:
    for _name, pf, files in exported(plans, "torchtitan"):
        check_titan(titan_config(files, tmp_path), pf)


def test_torchtitan_70b_reads_back(tmp_path: Path) -> None:
    pf = seventy_b()
    cfg = titan_config(render("torchtitan", pf), tmp_path)
    check_titan(cfg, pf)
    assert len(cfg.model_spec.model.layers) == 80 and cfg.model_spec.model.vocab_size == 128256


def test_torchtitan_even_pipeline_split_matches_torchtitans_own() -> None:
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel",
                             reason="torchtitan not installed (extra: export-check)")
    split = getattr(pp, "_generate_llm_fqn_per_model_part", None)
    if split is None:
        pytest.skip("this torchtitan has no _generate_llm_fqn_per_model_part")
    pf = load_plan_file(PLANS / "pp8b.yaml")
    text = render("torchtitan", pf)["tcf_titan_config.py"]
    fqns = eval(text.split("module_fqns_per_model_part=")[1].split("\n")[0].rstrip(","))
    assert fqns == split(pf.plan.pp, pf.model.layers, 0, 0)


# torchtitan 0.2 is not the installed release (0.3 replaced the TOML job file), so its TOML is
# read with tomllib and checked against 0.2's flavour table and parallelism product.
def check_titan_02(doc: dict[str, Any], pf: PlanFile) -> None:
    known = {"job", "model", "optimizer", "training", "parallelism", "activation_checkpoint"}
    assert set(doc) <= known
    par = doc["parallelism"]
    world = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
             * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
             * par["context_parallel_degree"])
    assert world == pf.num_gpus
    m = pf.model
    assert TITAN_FLAVORS_02[doc["model"]["flavor"]] == (
        m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)


def test_torchtitan_0_2_toml(plans: dict[str, PlanFile]) -> None:
    for _name, pf, files in exported(plans, "torchtitan", ExportOptions(target_version="0.2")):
        check_titan_02(tomllib.loads(files["torchtitan.toml"]), pf)


def test_torchtitan_0_2_70b_reads_back() -> None:
    # 0.2's flavours always scale RoPE as Llama 3.1 does: Llama 3.1 70B is the 70B it trains
    pf = dataclasses.replace(seventy_b(), model=get_preset("llama3.1-70b"))
    doc = tomllib.loads(render("torchtitan", pf, ExportOptions(target_version="0.2"))
                        ["torchtitan.toml"])
    check_titan_02(doc, pf)
    assert doc["model"]["flavor"] == "70B"  # 80 layers, 8192, 64 heads, 8 KV, vocab 128256


# --- DeepSpeed ---------------------------------------------------------------------------------

@dataclasses.dataclass
class _PipeGrid:
    """What the pipeline engine hands DeepSpeedConfig: its grid's data-parallel size."""

    dp: int

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def deepspeed_config(cfg: dict[str, Any], pf: PlanFile, monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeedConfig as ``deepspeed.initialize`` builds it under torchrun: every rank in the
    world, no mpu for a plain module (AutoTP makes its groups itself), the grid for PP."""
    dsc = pytest.importorskip("deepspeed.runtime.config",
                              reason="deepspeed not installed (extra: export-check)")
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: pf.num_gpus)
    mpu = _PipeGrid(pf.plan.dp) if pf.plan.pp > 1 else None
    return dsc.DeepSpeedConfig(cfg, mpu=mpu)


def test_deepspeed_config_accepts_every_export(plans: dict[str, PlanFile],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name, pf, files in exported(plans, "deepspeed"):
        ds = deepspeed_config(json.loads(files["deepspeed.json"]), pf, monkeypatch)
        p = pf.plan
        assert ds.train_micro_batch_size_per_gpu == p.micro_batch, name
        assert ds.gradient_accumulation_steps == pf.training.global_batch // (
            p.micro_batch * p.dp), name
        assert ds.zero_optimization_stage == p.zero_stage, name
        if p.pp > 1:
            assert ds.pipeline["stages"] == p.pp
        if p.tp > 1:
            assert ds.tensor_parallel_config.autotp_size == p.tp


def test_deepspeed_70b_reads_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # DeepSpeed's config has no model: the user's train.py builds it. Parallel sizes only.
    pf = seventy_b(plain=True)
    pf = dataclasses.replace(pf, plan=dataclasses.replace(
        pf.plan, pp=1, dp=pf.plan.dp * pf.plan.pp, sequence_parallel=False))
    ds = deepspeed_config(json.loads(render("deepspeed", pf)["deepspeed.json"]), pf,
                          monkeypatch)
    assert ds.tensor_parallel_config.autotp_size == pf.plan.tp
    assert ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps * pf.plan.dp == (
        pf.training.global_batch)


# --- nanotron ----------------------------------------------------------------------------------

def nanotron_config_module() -> Any:
    pytest.importorskip("dacite", reason="dacite/nanotron not installed")
    try:  # the PyPI release (0.4) fails its own imports (a cycle through nanotron.logging)
        return importlib.import_module("nanotron.config")
    except ImportError as e:
        pytest.skip(f"nanotron does not import here, so its run_train.py cannot run: {e}")


@pytest.mark.parametrize("version", TARGETS["nanotron"])
def test_nanotron_reads_the_whole_file(plans: dict[str, PlanFile], tmp_path: Path,
                                       version: str) -> None:
    exports = list(exported(plans, "nanotron", ExportOptions(target_version=version)))
    for _name, pf, files in exports:  # the file is whole: every section Config requires
        doc = yaml.safe_load(files["nanotron.yaml"])
        assert {"general", "parallelism", "model", "tokenizer", "tokens", "optimizer"} <= set(doc)
        assert doc["model"]["init_method"] and doc["optimizer"]["learning_rate_scheduler"]
        par = doc["parallelism"]
        assert par["dp"] * par["pp"] * par["tp"] * par.get("context_parallel_size", 1) == (
            pf.num_gpus)
    nc = nanotron_config_module()
    for _name, pf, files in exports:
        path = tmp_path / "nanotron.yaml"
        path.write_text(files["nanotron.yaml"])
        cfg = nc.get_config_from_file(str(path))
        assert cfg.model.model_config.num_hidden_layers == pf.model.layers


def test_nanotron_70b_reads_back(tmp_path: Path) -> None:
    pf = seventy_b(plain=True)
    doc = yaml.safe_load(render("nanotron", pf)["nanotron.yaml"])
    llama = doc["model"]["model_config"]
    assert (llama["num_hidden_layers"], llama["hidden_size"], llama["num_attention_heads"],
            llama["num_key_value_heads"], llama["vocab_size"], llama["rope_theta"]) == (
        80, 8192, 64, 8, 128256, 500000.0)
    assert (doc["parallelism"]["tp"], doc["parallelism"]["pp"]) == (pf.plan.tp, pf.plan.pp)
    nc = nanotron_config_module()
    path = tmp_path / "nanotron.yaml"
    path.write_text(render("nanotron", pf)["nanotron.yaml"])
    assert nc.get_config_from_file(str(path)).model.model_config.num_hidden_layers == 80


# --- Accelerate --------------------------------------------------------------------------------

def accelerate_config(text: str, folder: Path) -> Any:
    args = pytest.importorskip("accelerate.commands.config.config_args",
                               reason="accelerate not installed (extra: export-check)")
    path = folder / "accelerate.yaml"
    path.write_text(text)
    return args.load_config_from_file(str(path))


def test_accelerate_loads_every_export(plans: dict[str, PlanFile], tmp_path: Path) -> None:
    for name, pf, files in exported(plans, "accelerate"):
        cfg = accelerate_config(files["accelerate.yaml"], tmp_path)
        assert cfg.num_processes == pf.num_gpus, name
        assert cfg.mixed_precision == pf.training.precision, name
        if pf.plan.zero_stage:
            par = cfg.parallelism_config
            assert par["parallelism_config_dp_shard_size"] * par["parallelism_config_tp_size"] \
                * par["parallelism_config_cp_size"] == pf.num_gpus


def test_accelerate_70b_reads_back(tmp_path: Path) -> None:
    # Accelerate's config has no model (the user's script loads it); parallel sizes only.
    pf = load_plan_file(PLANS / "fsdp8b.yaml")
    cfg = accelerate_config(render("accelerate", pf)["accelerate.yaml"], tmp_path)
    assert cfg.parallelism_config["parallelism_config_tp_size"] == pf.plan.tp
    assert cfg.parallelism_config["parallelism_config_dp_shard_size"] == pf.plan.dp


# --- Scripts -----------------------------------------------------------------------------------

def test_every_script_parses_and_passes_shellcheck(plans: dict[str, PlanFile],
                                                   tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    scripts: dict[str, str] = {}
    for fmt in FORMATS:
        for name, _pf, files in exported(plans, fmt):
            scripts |= {f"{name}/{fmt}/{k}": v for k, v in files.items()
                        if k.endswith((".sh", ".sbatch"))}
    for i, (name, text) in enumerate(sorted(scripts.items())):
        path = tmp_path / f"{i}.sh"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, name
        if shellcheck:
            done = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True,
                                  text=True)
            assert done.returncode == 0, f"{name}: {done.stdout}"
    if not shellcheck:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n ran")
