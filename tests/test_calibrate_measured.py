"""``tcf-search calibrate --measured``: training logs written here in each framework's format
(the lines its source prints; see ``tcf_search.calibration.training_logs``), rows in the
measured_runs.csv schema, a refit that recovers a known perturbation, one-line errors, and a
study anchored on the file written (issue #37)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import nccl_tests_files as nt
import pytest
import yaml
from clirunner import cli, one_line_error

from costmodel import MeasuredLinks
from search.inputs import ClusterCalibration, MeasuredAnchor, anchored, case_from_row
from tcf_search.calibration.anchor import fit
from tcf_search.calibration.layouts import layout_row
from tcf_search.calibration.predict import run_prediction
from tcf_search.calibration.training_logs import read_measured

GIB = 2**30
LAYOUT = {"model": "llama3-8b", "gpu": "h100-sxm-80gb", "num_gpus": 16, "gpus_per_node": 8,
          "framework": "megatron", "plan": "tp=1,pp=1,mbs=1,recompute=none,zero=1",
          "seq_len": 8192, "global_batch": 256}
STUDY = ("name: anchored\nmodel: {preset: llama3-8b}\n"
         "cluster: {gpu: h100-sxm-80gb, nodes: %d, gpus_per_node: 8, calibration: %s}\n"
         "training: {framework: megatron-lm, seq_len: 8192, global_batch: 256}\n")


def _write(folder: Path, name: str, text: str, layout: dict | None = LAYOUT) -> Path:
    path = folder / name
    path.write_text(text)
    if layout is not None:
        path.with_suffix(".yaml").write_text(yaml.safe_dump(layout))
    return path


def _megatron_line(it: int, ms: float, tflops: float, batch: int = 256) -> str:
    # Megatron-LM core_v0.14.0 megatron/training/training.py, training_log: the fields in order
    return (f" [2025-06-01 10:00:{it:02d}] iteration {it:8d}/{1000:8d} | consumed samples: "
            f"{it * batch:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
            f"(TFLOP/s/GPU): {tflops:.1f} | learning rate: 3.000000E-04 | global batch size: "
            f"{batch:5d} | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number "
            f"of skipped iterations:   0 | number of nan iterations:   0 |")


def test_megatron_lm_log(tmp_path: Path) -> None:
    # the first interval (warm-up) is left out; the median of the rest is the step
    times = [9000.0, 4100.0, 4000.0, 4200.0]
    lines = [_megatron_line(10 * (i + 1), t, 400.0) for i, t in enumerate(times)]
    # megatron/training/utils.py report_memory: MiB
    lines.insert(1, "[Rank 0] (after 10 iterations) memory (MB) | allocated: 30000.0 | max "
                    "allocated: 52000.5 | reserved: 56000.0 | max reserved: 61440.0")
    (run,) = read_measured([_write(tmp_path, "train.log", "\n".join(lines))])
    assert run.tokens_per_sec_per_gpu == pytest.approx(256 * 8192 / 4.1 / 16)
    assert run.peak_mem_gib == pytest.approx(61440.0 / 1024)
    assert run.model_tflops_per_gpu == pytest.approx(400.0)
    assert run.row["tp"] == "1" and run.row["dp"] == "16" and run.row["layers"] == "32"


def test_megatron_bridge_memory_in_gb(tmp_path: Path) -> None:
    # Megatron-Bridge v0.6.0 src/megatron/bridge/training/utils/train_utils.py: report_memory
    # in GB (bytes / 1e9)
    text = "\n".join([_megatron_line(5, 4000.0, 410.0),
                      "[Rank 0] (after 5 iterations) memory (GB) | current_allocated_mem: 30.1 | "
                      "peak_allocated_mem: 50.2 | peak_reserved_mem: 60.0 | alloc_retries: 0"])
    (run,) = read_measured([_write(tmp_path, "bridge.log", text)])
    assert run.peak_mem_gib == pytest.approx(60e9 / GIB)
    assert run.tokens_per_sec_per_gpu == pytest.approx(256 * 8192 / 4.0 / 16)


def test_torchtitan_log(tmp_path: Path) -> None:
    # torchtitan v0.2.2 torchtitan/components/metrics.py MetricsProcessor.log, colour codes on
    red, reset = "\x1b[31m", "\x1b[39m"
    lines = [f"[rank0]:[titan] 2025-06-01 10:00:00,000 - root - INFO - {red}step: {s:2}  "
             f"loss: {8.0 - s / 10:8.5f}  grad_norm: {1.5:7.4f}  memory: {mem:5.2f}GiB(70.00%)  "
             f"tps: {tps:,}  tflops: {tps * 6 * 8e9 / 1e12:,.2f}  mfu: {30.0:.2f}%{reset}"
             for s, tps, mem in ((1, 900, 40.0), (10, 6000, 55.5), (20, 6200, 55.6),
                                 (30, 6100, 55.6))]
    layout = {**LAYOUT, "framework": "torchtitan", "plan": "tp=1,pp=1,mbs=2,zero=3"}
    (run,) = read_measured([_write(tmp_path, "titan.log", "\n".join(lines), layout)])
    assert run.tokens_per_sec_per_gpu == pytest.approx(6100)  # median after the first
    assert run.peak_mem_gib == pytest.approx(55.6)
    assert run.row["framework"] == "torchtitan" and run.row["zero_stage"] == "3"


@pytest.mark.parametrize("form", ["dict", "log_metrics"])
def test_hf_trainer(tmp_path: Path, form: str) -> None:
    # transformers src/transformers/trainer_utils.py speed_metrics, logged at the end of
    # Trainer.train (the dict) or printed by Trainer.log_metrics ("  key = value")
    text = ("{'train_runtime': 600.0, 'train_samples_per_second': 12.8, "
            "'train_steps_per_second': 0.05, 'train_loss': 2.1, 'epoch': 1.0}"
            if form == "dict" else
            "***** train metrics *****\n  epoch                    =        1.0\n"
            "  train_runtime            = 0:10:00.00\n  train_samples_per_second =       12.8\n"
            "  train_steps_per_second   =       0.05")
    layout = {**LAYOUT, "plan": "tp=1,pp=1,mbs=1,zero=3"}
    layout.pop("framework")
    (run,) = read_measured([_write(tmp_path, "hf.log", text, layout)])
    assert run.tokens_per_sec_per_gpu == pytest.approx(12.8 * 8192 / 16)
    assert run.row["framework"] == "accelerate"


def _csv(folder: Path, rows: list[dict[str, str]], name: str = "runs.csv") -> Path:
    path = folder / name
    columns = sorted({k for r in rows for k in r})
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


def _synthetic(layouts: list[dict], compute: float, network: float = 1.0) -> list[dict]:
    """Rows whose tokens/s the cost model gives on a cluster perturbed by the scales."""
    cal = ClusterCalibration(links=MeasuredLinks(),
                             measured=MeasuredAnchor(compute_scale=compute,
                                                     network_scale=network,
                                                     runs=({"file": "-"},)))
    rows = []
    for layout in layouts:
        row, _ = layout_row(layout, "test")
        case = case_from_row(row)
        got = run_prediction(replace(case, cluster=anchored(case.cluster, cal)))
        rows.append({**row, "status": "ok",
                     "tokens_per_sec_per_gpu": f"{got['pred_tokens_per_sec_per_gpu']:.3f}"})
    return rows


def test_refit_recovers_a_compute_perturbation(tmp_path: Path) -> None:
    layouts = [{**LAYOUT, "num_gpus": 8, "plan": p} for p in
               ("tp=1,pp=1,mbs=1,zero=1", "tp=2,pp=1,mbs=2,zero=1", "tp=4,pp=1,mbs=1,zero=1")]
    runs = read_measured([_csv(tmp_path, _synthetic(layouts, compute=0.8))])
    got = fit(runs, prior_weight=0.0).calibration.measured
    assert got is not None and got.fitted == ("compute_scale",)
    assert got.compute_scale == pytest.approx(0.8, rel=0.01)
    # single-node runs: the network moves nothing, so it is not fitted
    assert got.network_scale == 1.0
    # the pull toward the family's fit: a run moves the scale part of the way, never past it
    pulled = fit(runs[:1], prior_weight=1.0).calibration.measured
    assert pulled is not None and 0.8 < pulled.compute_scale < 0.95


def test_refit_recovers_compute_and_network_where_runs_identify_them(tmp_path: Path) -> None:
    # on 64 GPUs: DP over the network with ZeRO-3 (much exposed network traffic) beside
    # TP x PP inside nodes (little): the runs differ in their network share
    layouts = [{**LAYOUT, "num_gpus": 64, "plan": p} for p in
               ("tp=1,pp=1,mbs=1,zero=3", "tp=8,pp=2,mbs=1,zero=1", "tp=2,pp=1,mbs=1,zero=3",
                "tp=8,pp=1,mbs=1,zero=0")]
    rows = _synthetic(layouts, compute=0.9, network=0.5)
    result = fit(read_measured([_csv(tmp_path, rows)]), prior_weight=0.0)
    got = result.calibration.measured
    assert got is not None and got.fitted == ("compute_scale", "network_scale"), result.lines
    assert got.compute_scale == pytest.approx(0.9, rel=0.03)
    assert got.network_scale == pytest.approx(0.5, rel=0.1)


@pytest.mark.parametrize(("text", "layout", "words"), [
    (_megatron_line(10, 4000.0, 400.0).replace("(ms): 4000.0", "(ms): fast"), LAYOUT,
     ["bad.log:1", "elapsed time per iteration"]),
    (_megatron_line(10, 4000.0, 400.0, batch=128), LAYOUT,
     ["bad.log:1", "global batch size 128"]),
    ("NCCL INFO starting\n", LAYOUT, ["bad.log:1", "not a training log"]),
    (_megatron_line(10, 4000.0, 400.0), {**LAYOUT, "plan": "tp=3"}, ["bad.yaml:1", "tp"]),
    (_megatron_line(10, 4000.0, 400.0), {**LAYOUT, "nodes": 2}, ["bad.yaml:1", "nodes"]),
    (_megatron_line(10, 4000.0, 400.0), {k: v for k, v in LAYOUT.items() if k != "seq_len"},
     ["bad.yaml:1", "seq_len"]),
    (_megatron_line(10, 4000.0, 400.0), None, ["bad.log:1", "layout"]),
    ("step:  1  loss: 8.0  memory: 40.00GiB(50.00%)  tps: 1,000  tflops: 1.0  mfu: 1.00%\n"
     "step: 10  loss: 7.0  memory: 40.00GiB(50.00%)  tps: many", {**LAYOUT, "format":
                                                                "torchtitan"},
     ["bad.log:2", "tps"]),
])
def test_malformed_input_is_one_line(tmp_path: Path, text: str, layout: dict | None,
                                     words: list[str]) -> None:
    log = _write(tmp_path, "bad.log", text, layout)
    code, _, err = cli("calibrate", "--measured", str(log), "-o", str(tmp_path / "c.yaml"))
    one_line_error(code, err, *words)


def test_csv_errors_name_the_line(tmp_path: Path) -> None:
    row, _ = layout_row(LAYOUT, "test")
    path = _csv(tmp_path, [{**row, "status": "ok", "tokens_per_sec_per_gpu": "5000"},
                           {**row, "status": "ok", "tokens_per_sec_per_gpu": "-3"}])
    code, _, err = cli("calibrate", "--measured", str(path))
    one_line_error(code, err, "runs.csv:3", "tokens_per_sec_per_gpu")
    code, _, err = cli("calibrate", "--measured")
    one_line_error(code, err, "--measured")


@pytest.fixture(scope="module")
def anchored_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("anchor")
    runs = _synthetic([LAYOUT], compute=0.8)
    out = folder / "my-cluster.yaml"
    code, stdout, err = cli("calibrate", "--measured", str(_csv(folder, runs)), "-o", str(out))
    assert code == 0, err
    assert "anchored on 1 measured run of this cluster" in stdout
    for nodes in (2, 4):
        (folder / f"study{nodes}.yaml").write_text(STUDY % (nodes, out.name))
    return folder


def test_explain_shows_the_anchor(anchored_study: Path) -> None:
    code, out, err = cli("explain", str(anchored_study / "study2.yaml"), "--plan",
                         LAYOUT["plan"], "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "anchored on 1 measured run of this cluster (runs.csv;" in doc["calibration"]["line"]
    assert "compute x" in doc["calibration"]["line"]
    # the same model on the same 16 GPUs as the anchor: the anchored interval
    assert doc["uncertainty"]["interval_regime"].startswith("anchored")
    code, text, err = cli("explain", str(anchored_study / "study2.yaml"), "--plan",
                          LAYOUT["plan"])
    assert code == 0 and "anchored on 1 measured run" in " ".join(text.split()), err


def test_a_study_the_check_did_not_cover_keeps_its_regimes_interval(
        anchored_study: Path) -> None:
    code, out, err = cli("explain", str(anchored_study / "study4.yaml"), "--plan",
                         LAYOUT["plan"], "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "anchored on 1 measured run" in doc["calibration"]["line"]
    assert not doc["uncertainty"]["interval_regime"].startswith("anchored")


def test_the_anchor_moves_the_prediction(anchored_study: Path) -> None:
    plain = anchored_study / "plain.yaml"
    plain.write_text(STUDY.replace(", calibration: %s", "") % 2)
    tokens = []
    for study in (plain, anchored_study / "study2.yaml"):
        code, out, err = cli("explain", str(study), "--plan", LAYOUT["plan"], "--json")
        assert code == 0, err
        tokens.append(json.loads(out)["step"]["tokens_per_s_per_gpu"])
    # the run was made 20% slower in compute; the pull keeps part of the family's fit
    assert tokens[1] < tokens[0]


def test_one_file_carries_nccl_tests_and_measured_runs(tmp_path: Path) -> None:
    links = tmp_path / "links.yaml"
    code, _, err = cli("calibrate", "--nccl-tests", *map(str, nt.write_set(tmp_path)),
                       "-o", str(links))
    assert code == 0, err
    out = tmp_path / "both.yaml"
    code, stdout, err = cli("calibrate", "--measured", str(_csv(tmp_path, _synthetic(
        [LAYOUT], compute=0.9))), "--calibration", str(links), "-o", str(out))
    assert code == 0, err
    doc = yaml.safe_load(out.read_text())
    assert doc["links"]["network_bw_bytes_per_s"] == pytest.approx(nt.NET, rel=0.05)
    assert doc["measured"]["fitted"] == ["compute_scale"]
    assert "anchored on 1 measured run and 4 nccl-tests of this cluster" in stdout
