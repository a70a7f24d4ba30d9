"""The launchers that read a config file, each read by its own loader: DeepSpeed's JSON into
DeepSpeedConfig, nanotron's YAML by ``get_config_from_file``, Accelerate's YAML by
``load_config_from_file``, over every shipped study's top plans and the golden plans (``pip
install -e .[export-check]``; a test skips, saying why, when its launcher is not installed).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from export_helpers import exported
from export_plans import PLANS, seventy_b

from search.inputs.planfile import PlanFile, load_plan_file
from tcf_search.export import ExportOptions, render
from tcf_search.export.options import TARGETS

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
