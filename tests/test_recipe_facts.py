"""What measured rows and plans run where a table is silent, read from the frameworks' code:
the LM head stays in bf16 under fp8 (a Transformer Engine fp8_autocast leaves Megatron-Core's
own ColumnParallelLinear output layer alone; torchtitan filters "output"), and each DGX Cloud
benchmark release's fp8 weights and gradient dtype (frameworks.yaml ``release_switches``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, Plan
from costmodel.compute import _loss_s, layer_times
from costmodel.kernels import gemm_time, kernels_of
from costmodel.plans import PLAN_KEYS, as_plan_arrays, plans_to_arrays
from hardware_catalog.frameworks import RELEASE_KEY, load_profiles, release_key, row_defaults
from search.inputs.specs import training_spec
from tcf_search.calibration.dataset import find_measured_csv

NEMO1 = "NVIDIA/dgxc-benchmarking@8f5cbb37 {workload}/README.md (v25.02) table 'x' column 'y'"
NEMO2 = "NVIDIA/dgxc-benchmarking@741c8860 {workload}/README.md (v25.04) table 'x' column 'y'"


@pytest.mark.parametrize("plan", [Plan(dp=8, micro_batch=1), Plan(tp=4, dp=2, micro_batch=2)])
def test_the_lm_head_runs_in_bf16_under_fp8(h100, llama8b, plan: Plan) -> None:
    """Under fp8 the head's GEMMs (forward, and twice that backward) are bf16 GEMMs at the
    dense peak, with no fp8 cast, while the decoder layers' GEMMs speed up."""
    p = as_plan_arrays(plans_to_arrays([plan]))
    cluster = ClusterSpec(gpu=h100, num_gpus=8)
    times = {prec: layer_times(llama8b, cluster, training_for(seq_len=4096, global_batch=64,
                                                          precision=prec), p)
             for prec in ("bf16", "fp8")}
    tr8 = training_for(seq_len=4096, global_batch=64, precision="fp8")
    kn = kernels_of(cluster, tr8, p)
    bf16_gemm = gemm_time(kn.tokens, np.broadcast_to(llama8b.vocab / kn.tp, kn.tokens.shape),
                          np.broadcast_to(float(llama8b.hidden), kn.tokens.shape),
                          h100.peak_flops("bf16"), cluster, 2.0)
    loss_fwd, loss_bwd, _ = _loss_s(llama8b, tr8, kn)
    fp8 = times["fp8"]
    assert np.allclose(fp8.head_fwd_s - loss_fwd, bf16_gemm)
    assert np.allclose(fp8.head_bwd_s - loss_bwd, 2.0 * bf16_gemm)
    assert np.allclose(fp8.head_fwd_s, times["bf16"].head_fwd_s)
    assert np.all(fp8.fwd_dense_s < times["bf16"].fwd_dense_s)


def test_bf16_training_keeps_its_kernels(h100) -> None:
    tr = training_for(seq_len=4096, global_batch=64)
    kn = kernels_of(ClusterSpec(gpu=h100, num_gpus=8), tr,
                    as_plan_arrays(plans_to_arrays([Plan(dp=8)])))
    assert kn.unquantized() is kn


@pytest.mark.parametrize(("detail", "precision", "grads", "fp8_params"), [
    (NEMO1.format(workload="grok1"), "bf16", 2, False),  # grad_sync_dtype: bf16
    (NEMO1.format(workload="grok1"), "fp8", 2, True),
    (NEMO1.format(workload="nemotron"), "bf16", 4, False),  # optim silent: NeMo 1's fp32
    (NEMO1.format(workload="nemotron"), "fp8", 4, True),
    # performance mode: the plugin's grad_reduce_in_fp32 = False at either precision
    (NEMO2.format(workload="nemotron"), "bf16", 2, False),
    (NEMO2.format(workload="nemotron"), "fp8", 2, True),
    ("NVIDIA/dgxc-benchmarking@00000000 nemotron/README.md (v9)", "fp8", 4, True),  # unknown
])
def test_dgxc_rows_run_their_release(detail: str, precision: str, grads: int,
                                     fp8_params: bool) -> None:
    d = row_defaults("nemo", precision, "dgxc-benchmarking", detail)
    assert d.pop("zero_stage") == 1  # NeMo's distributed optimizer, every release
    tr = training_spec(framework="nemo", precision=precision, seq_len=4096, global_batch=64,
                       switches=d)
    assert tr.framework.numerics.grad_dtype_bytes == grads
    assert tr.framework.numerics.fp8_param_gather is fp8_params  # the nemo profile's at fp8
    assert tr.framework.tp.tp_comm_overlap is True


def test_release_switches_are_training_switches() -> None:
    """Every switch a release sets is a framework profile's switch (at a precision suffix or
    without), a plan field a measured row takes where its cell is empty, or a model field the
    row does not state (MODEL_OWN), or the pipeline split flags a row's cells may give
    (SPLIT_COLUMNS: Megatron's account_for_*_in_pipeline_split)."""
    from costmodel.framework import switch_names
    from search.inputs.measured import MODEL_OWN, SPLIT_COLUMNS

    fields = set(switch_names()) | set(PLAN_KEYS) | set(MODEL_OWN) | set(SPLIT_COLUMNS)
    for source, releases in load_profiles()["release_switches"].items():
        for key, switches in releases.items():
            # a key a row's source_detail (and model_name) reaches: a launch script at a commit
            # ("<commit8> <workload>"), or a table's section ("<release> <system> <model>")
            parts = key.split()
            if key != "*":  # "*": what every listed release of the source ran
                detail = (f"x@{parts[0]} {parts[1]}/f" if len(parts) == 2 else
                          f"x section {parts[0]} {parts[1]}")
                assert release_key(detail, " ".join(parts[2:])) == key, (source, key)
            for name in switches:
                base = name.rsplit("_", 1)[0] if name.endswith(("_fp8", "_bf16")) else name
                assert base in fields, (key, name)
                if base in MODEL_OWN:  # read as its type: a quoted "false" would read true
                    assert type(switches[name]) is MODEL_OWN[base], (key, name)


GROK_NEMO2 = "NVIDIA/dgxc-benchmarking@{commit} grok1/README.md (x)"


@pytest.mark.parametrize(("commit", "gpu", "expert_tp", "graphs"), [
    # on GB200: the table's ETP 4 (launch.sh's ET from v25.05.01), CUDA graphs
    ("68eaf7e1", "gb200-nvl72", 4, "local"),
    ("dfc80397", "h100-sxm-80gb", 1, "none"),  # on H100: ET 1, no graphs
])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_nemo2_grok_rows_run_their_launchers_moe(commit: str, gpu: str, expert_tp: int,
                                                 graphs: str, precision: str) -> None:
    """NeMo 2's Grok-1 script: token drop padded to capacity, bf16 gradients at either
    precision (pretrain_performance_optimizations), the launcher's expert TP and graphs; a
    row's own expert_tp cell wins."""
    from search.inputs.measured import case_from_row

    row = {"model_name": "grok", "layers": 64, "hidden": 6144, "ffn_hidden": 32768,
           "heads": 48, "kv_heads": 8, "vocab": 131072, "seq_len": 8192, "moe_experts": 8,
           "moe_topk": 2, "gpu": gpu, "gpus_per_node": 4 if gpu.startswith("gb") else 8,
           "num_gpus": 128, "tp": 4, "pp": 1, "cp": 1, "ep": 8, "dp": 32, "micro_batch": 1,
           "global_batch": 256, "precision": precision, "framework": "nemo",
           "source": "dgxc-benchmarking", "source_detail": GROK_NEMO2.format(commit=commit)}
    case = case_from_row(row)
    assert case.plan.expert_tp == expert_tp
    fw = case.training.framework
    assert fw.moe.moe_pad_to_capacity and fw.numerics.grad_dtype_bytes == 2
    assert case.training.framework.kernels.cuda_graph_impl == graphs
    assert case_from_row({**row, "expert_tp": 2}).plan.expert_tp == 2


@pytest.mark.skipif(find_measured_csv() is None,
                    reason="measured_runs.csv not found at ../shared/data/")
def test_every_dgxc_row_names_a_known_release() -> None:
    csv = find_measured_csv()
    assert csv is not None
    frame = pd.read_csv(csv)
    rows = frame[frame["source"].eq("dgxc-benchmarking")]
    known = set(load_profiles()["release_switches"]["dgxc-benchmarking"])
    keys = {f"{m[1]} {m[2]}" for m in map(RELEASE_KEY.search, rows["source_detail"]) if m}
    assert len(rows) > 0 and keys <= known
    assert all(RELEASE_KEY.search(str(d)) for d in rows["source_detail"])


@pytest.mark.parametrize(("precision", "fp8_weights", "bf16_grads", "refused_for"), [
    ("bf16", False, False, None),
    ("bf16", False, True, "grad_reduce_in_bf16"),
    ("fp8", True, False, None),
    ("fp8", True, True, "grad_reduce_in_bf16"),
    ("fp8", False, False, "fp8_param_gather"),
])
def test_exports_train_the_searched_dtypes(precision: str, fp8_weights: bool, bf16_grads: bool,
                                           refused_for: str | None) -> None:
    """Megatron-LM takes both as flags; Megatron-Bridge's run_recipe names a mixed-precision
    preset, whose fp32 gradient reduction and fp8 weights no override changes: it writes the
    plans that preset trains and refuses the others, naming the study's field."""
    import dataclasses
    from pathlib import Path

    from search.inputs.planfile import load_plan_file
    from tcf_search.export import ExportOptions, ExportRefused, render

    pf = load_plan_file(Path(__file__).parent / "golden" / "export" / "plans" / "dense70b.yaml")
    pf = dataclasses.replace(pf, training=dataclasses.replace(
        pf.training.with_switches(fp8_param_gather=fp8_weights,
                                  grad_dtype_bytes=2 if bf16_grads else 4),
        precision=precision))
    script = render("megatron", pf, ExportOptions())["megatron.sh"]
    assert ("--grad-reduce-in-bf16" in script) is bf16_grads
    assert ("--fp8-param-gather" in script) is (precision == "fp8" and fp8_weights)
    if refused_for is None:
        preset = {"bf16": "bf16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed"}[precision]
        assert f"mixed_precision={preset}" in render("nemo", pf, ExportOptions())["nemo.sh"]
    else:
        with pytest.raises(ExportRefused, match=refused_for):
            render("nemo", pf, ExportOptions())


def test_explain_prices_the_numerics_the_study_leaves_unsaid(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Megatron-Bridge's 405B layout is over under the study's fp32 gradients; explain says what
    bf16 gradients (its recipe's) would do to this plan, as a number, not a search move; a study
    that states the switch, or a profile without it, gets no such line."""
    import json
    from pathlib import Path

    import typer
    from typer.testing import CliRunner

    from tcf_search.explain import explain_cmd

    app = typer.Typer()
    app.command("explain")(explain_cmd)
    app.command("noop")(lambda: None)
    study = Path(__file__).resolve().parents[1] / "studies" / "llama3.1-405b-h100x4096.yaml"
    plan = ("tp=8,pp=8,cp=2,vpp=8,mbs=1,sp=true,zero=1,recompute=selective,"
            "first_stage_layers=15,last_stage_layers=15")

    def numerics(path: Path) -> list[dict]:  # type: ignore[type-arg]
        got = CliRunner().invoke(app, ["explain", str(path), "--plan", plan, "--json"])
        assert got.exit_code == 0, got.stdout
        return list(json.loads(got.stdout)["verdict"]["numerics"])

    grads, loss = numerics(study)
    assert grads["field"] == "training.grad_reduce_in_bf16" and grads["fits"]
    # the loss kernel Bridge's recipes run: the logits at 2 bytes, not 6
    assert (loss["field"], loss["value"]) == ("training.cross_entropy_fusion_impl", "te")
    assert loss["gain"] > 0
    stated = tmp_path / "stated.yaml"
    stated.write_text(study.read_text().replace(
        "  precision: bf16\n", "  precision: bf16\n  grad_reduce_in_bf16: false\n"
        "  cross_entropy_fusion_impl: native\n", 1))
    assert numerics(stated) == []
    small = study.parent / "llama3-8b-h100x8.yaml"
    plan = "dp=8,mbs=1,zero=3"
    assert [n["field"] for n in numerics(small)] == ["training.grad_reduce_in_bf16",
                                                     "training.cross_entropy_fusion_impl"]
    titan = tmp_path / "titan.yaml"
    titan.write_text(small.read_text().replace(
        "  precision: bf16\n", "  precision: bf16\n  framework: torchtitan\n", 1))
    assert "framework: torchtitan" in titan.read_text()
    assert numerics(titan) == []


NEMO_2407 = ("NVIDIA/NeMo docs/source/performance/performance_summary.md @8e3d65dc (24.07 "
             "container, 2024-09-09) Pretraining table")


def test_a_release_builds_the_vocabulary_a_table_leaves_empty() -> None:
    """NeMo's 24.07 table gives GPT-3 175B no vocabulary: its release's tokenizer (GPT-2's BPE,
    padded to 128 x TP) is priced, with the release's even split and no recompute; a row's own
    vocab cell wins, and a row of no listed release is refused naming the cell."""
    from search.inputs.measured import CaseError, case_from_row

    row = {"case_id": "x", "source": "nemo", "source_detail": NEMO_2407,
           "model_name": "GPT3-175B", "layers": 96, "hidden": 12288, "ffn_hidden": 49152,
           "heads": 96, "seq_len": 2048, "ffn_type": "gelu", "gpu": "h100-sxm-80gb",
           "num_gpus": 128, "tp": 4, "pp": 8, "vpp": 6, "cp": 1, "dp": 4, "micro_batch": 1,
           "global_batch": 256, "precision": "fp8", "framework": "nemo", "vocab": ""}
    case = case_from_row(row)
    assert case.model.vocab == 50688  # 50,257 padded to a multiple of 512
    assert (case.plan.recompute, case.plan.first_stage_layers) == ("none", 0)
    assert {"recompute", "sequence_parallel", "first_stage_layers"} <= case.given
    assert case_from_row({**row, "vocab": "51200"}).model.vocab == 51200
    with pytest.raises(CaseError, match="vocab: required"):
        case_from_row({**row, "source_detail": "a paper, table 3"})
