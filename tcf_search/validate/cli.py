"""``tcf-search validate`` and ``tcf-search calibrate``: typer command functions, registered by
``tcf_search.cli`` (``app.command("validate")(validate_cmd)``).

torch is an optional extra; without it both commands print how to install it and exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Annotated

import typer

from tcf_search.validate.agreement import GIB, Row

INSTALL_HINT = ("needs PyTorch, an optional extra: pip install -e '.[validate]' "
                "(pins torch==2.13.0)")


def require_torch(command: str) -> None:
    if importlib.util.find_spec("torch") is None:
        typer.echo(f"tcf-search {command} {INSTALL_HINT}", err=True)
        raise typer.Exit(2)


def _fmt(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "-"


def _row_line(r: Row) -> str:
    return (f"{r.rank:>4} {r.plan:<34} {r.outcome:<11} "
            f"{_fmt(r.predicted_step_time_s, '9.3f')} {_fmt(r.measured_step_time_s, '9.3f')} "
            f"{_fmt(100 * r.time_error, '+7.0f') + '%':>8} "
            f"{_fmt(r.predicted_peak_gib, '8.3f')} {_fmt(r.measured_peak_gib, '8.3f')}")


HEADER = (f"{'rank':>4} {'plan':<34} {'outcome':<11} {'pred s':>9} {'meas s':>9} {'err':>8} "
          f"{'pred GiB':>8} {'meas GiB':>8}")


def validate_cmd(
    result: Annotated[Path, typer.Argument(help="A study output folder (with top/rank-N.yaml).",
                                           show_default=False)],
    top: Annotated[int, typer.Option("--top", min=1, help="Validate the K best plans.")] = 3,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per plan.")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed steps first.")] = 1,
    memory_only: Annotated[bool, typer.Option(
        "--memory-only", help="No real run: fake tensors + fake process group + memory "
                              "tracker give one rank's peak memory, on CPU.")] = False,
    device: Annotated[str, typer.Option("--device", help="cpu (gloo) or cuda (NCCL).")] = "cpu",
    timeout_s: Annotated[float, typer.Option("--timeout", min=1.0,
                                             help="Seconds per plan before it is killed.")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the top plans of a study for a few steps; print predicted against measured."""
    require_torch("validate")
    from tcf_search.validate.config import ValidationError
    from tcf_search.validate.record import record_in_study, write_csv
    from tcf_search.validate.runs import Options, validate_folder

    if device not in ("cpu", "cuda"):
        typer.echo(f"--device must be cpu or cuda, but got {device!r}", err=True)
        raise typer.Exit(2)
    opts = Options(top=top, steps=steps, warmup=warmup, device=device,  # type: ignore[arg-type]
                   timeout_s=timeout_s, memory_only=memory_only)
    if not json_out:
        typer.echo(HEADER)
    try:
        report = validate_folder(result, opts,
                                 on_result=None if json_out else lambda r: typer.echo(_row_line(r)))
    except ValidationError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    csv_path = write_csv(result, report.rows)
    stored = record_in_study(result, report.rows, report.summary())
    if json_out:
        typer.echo(json.dumps({**report.to_dict(), "csv": str(csv_path), "study": stored},
                              indent=2, default=str))
        return
    summary = report.summary()
    typer.echo(f"mode: {report.mode}; ok {summary['ok']}/{summary['plans']}; "
               f"Spearman (step time) {_fmt(report.spearman, '.3f')}; "
               f"mean |time error| {_fmt(100 * summary['mean_abs_time_error'], '.0f')} %")
    for r in report.rows:
        if r.error:
            typer.echo(f"rank {r.rank}: {r.outcome}: {r.error[:300]}")
    for note in report.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"written: {csv_path}; {stored}")


def calibrate_cmd(
    files: Annotated[list[Path] | None, typer.Argument(
        help="With --nccl-tests: the nccl-tests output files.", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Write the catalog entry (with --nccl-tests: the cluster's "
                               "calibration) here [default: print it].")] = None,
    nccl_tests: Annotated[bool, typer.Option(
        "--nccl-tests", help="Fit the cluster's links on the nccl-tests (or rccl-tests) output "
                             "FILES instead of measuring this machine; a study anchors on the "
                             "file written with cluster.calibration.")] = False,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="With --nccl-tests: the catalog SKU whose links stand in for a tier no "
                      "file measures.")] = None,
    from_result: Annotated[Path | None, typer.Option(
        "--from", help="Refit the efficiency parameters from this folder's validation.csv "
                       "and re-rank its plans.")] = None,
    gpu_file: Annotated[Path | None, typer.Option(
        "--gpu-file", help="With --from: the catalog entry to refit (default: measure now).")
    ] = None,
    ranks: Annotated[int, typer.Option("--ranks", min=1,
                                       help="Ranks for the collective benchmark.")] = 2,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer shapes and repeats.")] = False,
    measured: Annotated[bool, typer.Option(
        "--measured", help="Anchor on measured training steps: FILES are measured_runs.csv-"
                           "schema CSVs or Megatron-LM/Megatron-Bridge/NeMo, torchtitan or HF "
                           "Trainer logs (each with its layout YAML beside it or --layout); "
                           "refits the scales they identify.")] = False,
    layout: Annotated[Path | None, typer.Option(
        "--layout", help="With --measured: the layout YAML (model, gpu, num_gpus, plan, "
                         "seq_len, global_batch) of logs that have none beside them.")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="With --measured: the cluster's nccl-tests calibration the runs "
                              "are priced on; its links are kept in the file written.")] = None,
) -> None:
    """Measure this machine and write a catalog entry; with --from, refit and re-rank; with
    --nccl-tests FILE..., fit the cluster's links on its nccl-tests output; with --measured
    FILE..., anchor on its measured training steps."""
    if measured or layout is not None or calibration is not None:
        calibrate_measured(files or [], output, layout, calibration, measured and not nccl_tests)
        return
    if nccl_tests or files or gpu is not None:
        calibrate_nccl_tests(files or [], output, gpu, nccl_tests)
        return
    require_torch("calibrate")
    from tcf_search.calibration.device import catalog_yaml, measure_machine
    from tcf_search.calibration.refit import refit_from_folder

    if device not in ("cpu", "cuda"):
        typer.echo(f"--device must be cpu or cuda, but got {device!r}", err=True)
        raise typer.Exit(2)
    if gpu_file is not None and from_result is not None:
        from tcf_search.calibration.device import load_entry
        entry = load_entry(gpu_file)
    else:
        entry = measure_machine(device=device, ranks=ranks, quick=quick)  # type: ignore[arg-type]
    if from_result is not None:
        fit = refit_from_folder(from_result, entry)
        entry = fit.entry
        typer.echo(fit.describe())
    text = catalog_yaml(entry)
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text)
        typer.echo(f"written: {output} (peak bf16 {entry.gpu.peak_flops_bf16 / 1e9:.1f} GFLOP/s, "
                   f"memory {entry.gpu.hbm_bw_bytes_per_s / GIB:.1f} GiB/s, "
                   f"collective {entry.gpu.intra_node_bw_bytes_per_s / GIB:.2f} GiB/s)")


def calibrate_nccl_tests(files: list[Path], output: Path | None, gpu: str | None,
                         flag: bool) -> None:
    """``calibrate --nccl-tests FILE... [-o FILE] [--gpu ID]`` (see
    :mod:`tcf_search.calibration.nccl_tests`); errors are one line, exit 2."""
    from costmodel.comm import link_of
    from costmodel.specs import ClusterSpec
    from hardware_catalog import get_gpu
    from search.inputs import calibration_yaml, write_atomic
    from tcf_search.calibration.nccl_tests import NcclTestsError, fit, read

    if not flag or not files:
        raise NcclTestsError("give --nccl-tests and the files it reads: tcf-search calibrate "
                             "--nccl-tests all_reduce.txt all_gather.txt ... -o my-cluster.yaml")
    tests = read(files)
    prior = None
    if gpu is not None:
        spec = get_gpu(gpu)
        prior = link_of(ClusterSpec(gpu=spec, num_gpus=max(t.ranks for t in tests),
                                    gpus_per_node=max(t.per_host for t in tests)))
    result = fit(tests, prior)
    text = calibration_yaml(result.calibration, result.fits)
    for line in result.lines:
        typer.echo(line)
    if output is None:
        typer.echo(text)
        return
    write_atomic(output, text)
    typer.echo(f"written: {output} ({result.calibration.anchor}); anchor a study on it with "
               f"cluster.calibration: {output.name}")


def calibrate_measured(files: list[Path], output: Path | None, layout: Path | None,
                       base: Path | None, flag: bool) -> None:
    """``calibrate --measured FILE... [--layout L.yaml] [--calibration C.yaml] [-o FILE]`` (see
    :mod:`tcf_search.calibration.anchor`); errors are one line, exit 2."""
    from search.inputs import calibration_yaml, load_calibration, write_atomic
    from tcf_search.calibration.anchor import fit
    from tcf_search.calibration.training_logs import MeasuredInputError, read_measured

    if not flag or not files:
        raise MeasuredInputError("give --measured and the files it reads: tcf-search calibrate "
                                 "--measured runs.csv train.log ... -o my-cluster.yaml "
                                 "(--nccl-tests files go in their own call; pass its file "
                                 "with --calibration)")
    runs = read_measured(files, layout)
    prior = load_calibration(base) if base is not None else None
    result = fit(runs, prior, files=[f.name for f in files])
    text = calibration_yaml(result.calibration, _kept_fits(base))
    for line in result.lines:
        typer.echo(line)
    if output is None:
        typer.echo(text)
        return
    write_atomic(output, text)
    typer.echo(f"written: {output} ({result.calibration.anchor}); anchor a study on it with "
               f"cluster.calibration: {output.name}")


def _kept_fits(base: Path | None) -> list[dict[str, object]]:
    """The nccl-tests fits' table of the calibration the runs were anchored on top of."""
    if base is None:
        return []
    import yaml

    doc = yaml.safe_load(base.read_text(encoding="utf-8")) or {}
    fits = doc.get("fits") if isinstance(doc, dict) else None
    return list(fits) if isinstance(fits, list) else []
