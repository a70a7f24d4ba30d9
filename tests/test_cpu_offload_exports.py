"""Activation offloading to host memory (``Plan.cpu_offload_layers``) outside the cost model: the
launchers that take it (Megatron-LM's ``--cpu-offloading-num-layers``, Megatron-Bridge's
``model.cpu_offloading*``) read it back, those that have none refuse it naming the field, and
plan strings, ``explain``'s repairs and the ranked table carry it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from export_helpers import launcher_flags, megatron_kwargs, nemo_model_config, nemo_overrides
from export_plans import plan_file
from megatron_lm import megatron_lm_reads

from costmodel import Plan
from search.inputs.planfile import PlanFile
from search.inputs.specs import Specs, plan_file_specs
from search.output import _recompute_label
from tcf_search.explain.planspec import (
    PlanSpecError,
    apply_change,
    format_plan,
    parse_assignments,
    parse_plan,
)
from tcf_search.export import ExportRefused, render

N = 20  # of Llama 3.1 8B's 32 layers


def offload_plan(framework: str = "megatron", n: int = N, **plan: Any) -> PlanFile:
    """Llama 3.1 8B on 8 H100s (a catalogued host link), one pipeline stage, no recompute."""
    fields: dict[str, Any] = {"tp": 2, "pp": 1, "dp": 4, "zero_stage": 1,
                                 "sequence_parallel": True, "recompute": "none",
                                 "cpu_offload_layers": n, **plan}
    pf = plan_file("llama3.1-8b", Plan(**fields), 8, 64, framework=framework)
    if framework == "nemo":  # the 8B recipe has no comm_overlap section: NeMo's TP overlap off
        pf = dataclasses.replace(pf, training=pf.training.with_switches(tp_comm_overlap=False))
    return pf


@pytest.fixture(scope="module")
def specs() -> Specs:
    return plan_file_specs(offload_plan(n=0))


# --- Megatron-LM and Megatron-Bridge ------------------------------------------------------------


def test_megatron_export_carries_the_flag_and_megatron_core_accepts_it() -> None:
    files = render("megatron", offload_plan())
    tc, flags, kw = megatron_kwargs(files)
    assert flags["--cpu-offloading-num-layers"] == str(N)
    assert "--recompute-granularity" not in flags
    # validate_args sets cpu_offloading where cpu_offloading_num_layers > 0
    # (megatron/training/arguments.py); TransformerConfig.__post_init__ checks N < layers, pp 1
    # and no recompute
    n = int(str(flags["--cpu-offloading-num-layers"]))
    cfg = tc.TransformerConfig(**kw, cpu_offloading=n > 0, cpu_offloading_num_layers=n)
    assert (cfg.cpu_offloading, cfg.cpu_offloading_num_layers) == (True, N)
    assert (cfg.cpu_offloading_activations, cfg.cpu_offloading_weights) == (True, False)


def test_megatron_lm_parses_and_validates_the_offload_flag() -> None:
    pf = offload_plan()
    got = megatron_lm_reads(render("megatron", pf)["megatron.sh"], pf.num_gpus,
                            ["cpu_offloading", "cpu_offloading_num_layers",
                             "cpu_offloading_weights"])
    assert (got["cpu_offloading"], got["cpu_offloading_num_layers"]) == (True, N)
    assert got["cpu_offloading_weights"] is False


def test_a_plan_megatron_core_refuses_is_refused_by_the_rule() -> None:
    """All of a stage's layers offloaded: the table's cpu_offload refuses what
    TransformerConfig.__post_init__ raises for."""
    accepted = render("megatron", offload_plan(n=31))
    tc, _, kw = megatron_kwargs(accepted)
    with pytest.raises(ValueError, match="CPU offloading can be done only for layers less"):
        tc.TransformerConfig(**kw, cpu_offloading=True, cpu_offloading_num_layers=32)
    with pytest.raises(ExportRefused, match=r"cpu_offload:.*cpu_offload_layers=32"):
        render("megatron", offload_plan(n=32))


def test_megatron_refuses_offloading_beside_cuda_graphs() -> None:
    """The table allows a full-iteration graph (Megatron-LM main); Megatron-Core 0.16 raises for
    any graph beside offloading (transformer_config.py __post_init__)."""
    pf = offload_plan()
    graphed = dataclasses.replace(pf, training=pf.training.with_switches(
        cuda_graph_impl="local", cuda_graph_scope=("full_iteration",)))
    for fmt in ("megatron", "nemo"):
        with pytest.raises(ExportRefused, match="CUDA graphs not supported with CPU offloading"):
            render(fmt, graphed)
    tc, _, kw = megatron_kwargs(render("megatron", pf))
    with pytest.raises(ValueError, match="CUDA graphs not supported with CPU offloading"):
        tc.TransformerConfig(**kw, cpu_offloading=True, cpu_offloading_num_layers=N,
                             cuda_graph_impl="local", cuda_graph_scope=["full_iteration"])


def test_nemo_overrides_carry_offloading() -> None:
    files = render("nemo", offload_plan(framework="nemo"))
    o = nemo_overrides(files)
    assert {k: o[k] for k in o if k.startswith("model.cpu_offloading")} == {
        "model.cpu_offloading": "true", "model.cpu_offloading_num_layers": str(N),
        "model.cpu_offloading_activations": "true", "model.cpu_offloading_weights": "false"}
    assert "model.recompute_granularity" not in o
    cfg = nemo_model_config(files)
    assert (cfg.cpu_offloading, cfg.cpu_offloading_num_layers) == (True, N)


def test_no_offload_no_flag() -> None:
    pf = offload_plan(n=0)
    assert "--cpu-offloading-num-layers" not in launcher_flags(
        render("megatron", pf)["megatron.sh"], "pretrain_gpt.py")
    assert not any(k.startswith("model.cpu_offloading")
                   for k in nemo_overrides(render("nemo", offload_plan("nemo", n=0))))


# --- launchers without offloading --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["deepspeed", "accelerate", "nanotron"])
def test_launchers_without_offloading_refuse_naming_the_field(fmt: str) -> None:
    """A plan each format exports without offloading is refused with it, for that one reason."""
    # Accelerate's FSDP2 has no optimizer-only sharding (ZeRO-1): its plain plan shards all
    plain = {"tp": 1, "dp": 8, "sequence_parallel": False,
             "zero_stage": 3 if fmt == "accelerate" else 1}
    pf = offload_plan(fmt if fmt != "accelerate" else "megatron", n=0, **plain)
    if fmt == "nanotron":  # nanotron's Llama never reads rope_scaling (rules.NANOTRON)
        pf = dataclasses.replace(pf, model=dataclasses.replace(pf.model, rope_scaling=None))
    assert render(fmt, pf)
    offloaded = dataclasses.replace(pf, plan=dataclasses.replace(pf.plan, cpu_offload_layers=N))
    with pytest.raises(ExportRefused) as err:
        render(fmt, offloaded)
    assert len(err.value.reasons) == 1 and f"cpu_offload_layers={N}" in err.value.reasons[0]


def test_slurm_wraps_the_launchers_verdict() -> None:
    assert f"--cpu-offloading-num-layers {N}" in "".join(render("slurm", offload_plan()).values())


# --- plan strings, explain's repairs, the ranked table -----------------------------------------


def test_offload_key_parses_and_round_trips(specs: Specs) -> None:
    assert parse_assignments("tp=2,offload=20")["cpu_offload_layers"] == 20
    plan = parse_plan(f"tp=2,pp=1,zero=1,sp=true,offload={N}", specs)
    assert plan.cpu_offload_layers == N and plan.dp == 4
    assert f"offload={N}" in format_plan(plan)
    assert parse_plan(format_plan(plan), specs) == plan
    assert "offload" not in format_plan(dataclasses.replace(plan, cpu_offload_layers=0))


def test_offload_past_the_rule_is_refused_naming_it(specs: Specs) -> None:
    with pytest.raises(PlanSpecError, match="cpu_offload: .* but got cpu_offload_layers=20"):
        parse_plan("tp=2,pp=1,recompute=selective,offload=20", specs)


@pytest.mark.parametrize(("change", "moved"), [
    ("recompute=selective", {"cpu_offload_layers": 0}),
    ("recompute=full", {"cpu_offload_layers": 0}),
    ("pp=2", {"cpu_offload_layers": 0, "dp": 2}),
])
def test_a_change_that_forbids_offloading_resets_it(specs: Specs, change: str,
                                                    moved: dict[str, int]) -> None:
    base = parse_plan(f"tp=2,pp=1,zero=1,sp=true,offload={N}", specs)
    plan, notes = apply_change(base, parse_assignments(change), specs)
    assert {k: getattr(plan, k) for k in moved} == moved
    assert any(n.startswith(f"cpu_offload_layers {N}→0") for n in notes), notes


def test_offloading_turns_recompute_off(specs: Specs) -> None:
    base = parse_plan("tp=2,pp=1,zero=1,sp=true,recompute=selective", specs)
    plan, notes = apply_change(base, parse_assignments(f"offload={N}"), specs)
    assert (plan.cpu_offload_layers, plan.recompute) == (N, "none")
    assert any(n.startswith("recompute selective→none") for n in notes), notes


def test_the_table_labels_offloading() -> None:
    row = {"recompute": "none", "recompute_layers": 0}
    assert _recompute_label(row) == "-"  # a plan dict written before the field
    assert _recompute_label({**row, "cpu_offload_layers": 0}) == "-"
    assert _recompute_label({**row, "cpu_offload_layers": 40}) == "offload×40"
    assert _recompute_label({"recompute": "full", "recompute_layers": 4,
                             "cpu_offload_layers": 0}) == "full×4"
