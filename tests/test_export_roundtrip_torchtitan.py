"""torchtitan reads every export whole, the way ``torchtitan.train`` does: 0.3's ConfigManager on
the exported module, and 0.2's TOML job file against 0.2's flavour table, over every shipped
study's top plans and the golden plans (``pip install -e .[export-check]``; a test skips, saying
why, when torchtitan is not installed).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from export_helpers import exported, titan_config
from export_plans import PLANS, plan_file, seventy_b

from costmodel import Plan
from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.presets import get_preset
from tcf_search.export import ExportOptions, render
from tcf_search.export.rules import TITAN_FLAVORS_02


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
    # torchtitan resolves the written policy itself: parameters resharded after forward
    # exactly where the plan is ZeRO-3 ("default" keeps them gathered under PP)
    fsdp = importlib.import_module("torchtitan.distributed.fsdp")
    if par.data_parallel_shard_degree > 1:
        assert fsdp.get_fsdp_reshard_after_forward_policy(
            par.fsdp_reshard_after_forward, pp_enabled=pf.plan.pp > 1) == (pf.plan.zero_stage == 3)


def test_torchtitan_config_manager_accepts_every_export(plans: dict[str, PlanFile],
                                                        tmp_path: Path) -> None:
    for _name, pf, files in exported(plans, "torchtitan"):
        if pf.training.precision != "fp8":  # test_torchtitan_accepts_fp8_exports
            check_titan(titan_config(files, tmp_path), pf)


def test_two_exports_of_one_size_written_within_a_second_read_back_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh clone read a tp=1 export back as tp=2 (issue 39): the exports were imported from
    one path, and Python took the first one's cached bytecode for the second, whose size was the
    same and whose mtime fell in the same second. Here the importer sees one mtime for both files,
    as two writes within a second give, and writes bytecode, as it does without
    PYTHONDONTWRITEBYTECODE."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    real = importlib.machinery.SourceFileLoader.path_stats

    def same_second(self: Any, path: str) -> Any:
        stats = real(self, path)
        return {**stats, "mtime": 1.7e9} if path.endswith("tcf_titan_config.py") else stats

    monkeypatch.setattr(importlib.machinery.SourceFileLoader, "path_stats", same_second)
    pf = load_plan_file(PLANS / "pp8b.yaml")
    other = dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, tp=2, dp=4))
    first, second = render("torchtitan", pf), render("torchtitan", other)
    name = "tcf_titan_config.py"
    assert len(first[name].encode()) == len(second[name].encode()) and first != second
    for plan, files in ((pf, first), (other, second)):
        check_titan(titan_config(files, tmp_path), plan)


def _fp8_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def test_torchtitan_accepts_fp8_exports(plans: dict[str, PlanFile], tmp_path: Path) -> None:
    """fp8 plans (the GB200 study's): torchtitan builds its Float8 converter while it reads the
    config, as its own float8 configs do (torchtitan/models/llama3/__init__.py model_registry),
    and the converter needs torchao and a GPU of SM 8.9 or later."""
    fp8 = [(pf, files) for _, pf, files in exported(plans, "torchtitan")
           if pf.training.precision == "fp8"]
    assert fp8, "no shipped study's plan exports to torchtitan in fp8"
    pytest.importorskip("torchao", reason="torchtitan's Float8 converter needs torchao")
    if not _fp8_gpu():
        pytest.skip("torchtitan builds its Float8 converter only on a GPU of SM 8.9 or later "
                    "(its float8.py refuses other hardware unless emulating)")
    for pf, files in fp8:
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


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_pipeline_plan_reshards_after_forward_only_under_zero3(zero: int, tmp_path: Path,
                                                                 ) -> None:
    """torchtitan's "default" policy keeps parameters gathered under PP
    (get_fsdp_reshard_after_forward_policy: ``not pp_enabled``): a ZeRO-3 plan with a pipeline
    exported as "default" would run with every stage's parameters gathered, not as priced."""
    plan = Plan(tp=8, pp=4, dp=16, zero_stage=zero, sequence_parallel=True)
    pf = plan_file("llama3.1-70b", plan, 512, 512, seq=8192, framework="torchtitan")
    cfg = titan_config(render("torchtitan", pf, ExportOptions()), tmp_path)
    check_titan(cfg, pf)
    assert cfg.parallelism.fsdp_reshard_after_forward == ("always" if zero == 3 else "never")
