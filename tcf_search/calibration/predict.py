"""``tcf-search predict``: the cost model over a CSV of configurations (measured_runs schema).

Only configuration columns are read. An empty knob cell means *not given*: every valid value is
evaluated and the fastest plan that fits is chosen (the one with least memory if none fits); the
choice is reported in ``pred_choice_<knob>``. The pipeline split is a knob: with none of
``first_stage_layers``, ``last_stage_layers``, ``embedding_in_pipeline_split``,
``loss_in_pipeline_split`` given, the even split and the launchable uneven ones near it are
evaluated, and the first and last ranks' layers of the choice are reported. A row the model
cannot handle gets a message in ``pred_error`` and no crash.

The CSV is read, predicted and written :data:`CHUNK_ROWS` rows at a time, so memory does not grow
with its length; rows with the same inputs share one prediction (:class:`RowMemo`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from costmodel.estimate import check_plan, estimate_batch
from costmodel.mapping import cost_balanced_ranks, head_balance, stage_counts
from costmodel.plans import plans_to_arrays
from costmodel.specs import Plan, SpecError
from search import anchor_batch, plan_regime, plan_rests_on, uncertainty_metrics
from search.inputs import (
    KNOBS,
    MIB,
    Case,
    CaseError,
    ClusterCalibration,
    OutputError,
    case_from_row,
    check_target,
    load_calibration,
    open_atomic,
    open_input,
)
from tcf_search.calibration.predict_candidates import candidates
from tcf_search.calibration.predict_memo import Key, Result, RowMemo, _Reads
from tcf_search.errors import user_errors

if TYPE_CHECKING:  # pandas loads when a command reads a CSV, not with the command line
    import pandas as pd

GIB = 2**30
OUTPUT_COLUMNS = (
    "pred_tokens_per_sec_per_gpu", "pred_model_tflops_per_gpu", "pred_mfu", "pred_hfu",
    "pred_step_time_s", "pred_peak_mem_gib", "pred_first_stage_mem_gib", "pred_usable_mem_gib",
    "pred_fits",
    "pred_mem_weights_gib", "pred_mem_grads_gib", "pred_mem_optimizer_gib",
    "pred_mem_activations_gib", "pred_mem_buffers_gib", "pred_time_compute_s",
    "pred_time_comm_exposed_s", "pred_time_bubble_s", "pred_time_optimizer_s",
    "pred_time_stall_s",
    # the 80% interval on tokens/s, the residuals that bound it and P(OOM): what explain and the
    # run table show for the same plan (search.uncertainty_metrics)
    "pred_tokens_per_sec_lo", "pred_tokens_per_sec_hi", "pred_interval_regime", "pred_p_oom",
    "pred_assumed",  # empty cells filled with the framework's own default, each named
)
CHOICE_COLUMNS = tuple(f"pred_choice_{k}" for k in KNOBS)


def _pick(res: dict[str, np.ndarray]) -> int:
    fits = res["fits"].astype(bool)
    if fits.any():
        tput = np.where(fits, res["tokens_per_s_per_gpu"], -np.inf)
        return int(np.argmax(tput))
    return int(np.argmin(res["peak_mem_bytes"]))


def _prediction(case: Case, plans: list[Plan], res: dict[str, np.ndarray],
                calibration: ClusterCalibration | None = None) -> dict[str, object]:
    """The output cells of the plan chosen among ``plans`` (estimated as ``res``); the anchored
    interval where the case is what ``calibration``'s measured runs checked."""
    res, spread, sd = anchor_batch(calibration, case.model, case.cluster, case.training,
                                   plans_to_arrays(plans), res)
    j = _pick(res)
    spread = spread.at(sd[j]) if spread is not None else None
    chosen = plans[j]
    values = {
        "pred_tokens_per_sec_per_gpu": res["tokens_per_s_per_gpu"][j],
        "pred_model_tflops_per_gpu": res["model_tflops_per_gpu"][j],
        "pred_mfu": res["mfu"][j], "pred_hfu": res["hfu"][j],
        "pred_step_time_s": res["step_time_s"][j],
        "pred_peak_mem_gib": res["peak_mem_bytes"][j] / GIB,
        # global rank 0's peak, the one a single-rank memory log reports
        "pred_first_stage_mem_gib": res["first_stage_mem_bytes"][j] / GIB,
        "pred_usable_mem_gib": res["usable_bytes"][j] / GIB,
        "pred_fits": "true" if res["fits"][j] else "false",
        "pred_mem_weights_gib": res["mem_weights_bytes"][j] / GIB,
        "pred_mem_grads_gib": res["mem_grads_bytes"][j] / GIB,
        "pred_mem_optimizer_gib": res["mem_optimizer_bytes"][j] / GIB,
        "pred_mem_activations_gib": res["mem_activations_bytes"][j] / GIB,
        "pred_mem_buffers_gib": res["mem_buffers_bytes"][j] / GIB,
        "pred_time_compute_s": res["time_compute_s"][j],
        "pred_time_comm_exposed_s": res["time_comm_exposed_s"][j],
        "pred_time_bubble_s": res["time_bubble_s"][j],
        "pred_time_optimizer_s": res["time_optimizer_s"][j],
        "pred_time_stall_s": res["time_stall_s"][j],  # in pred_time_compute_s
        "pred_assumed": "; ".join(case.assumed),
    }
    u = uncertainty_metrics(
        {"tokens_per_s_per_gpu": float(res["tokens_per_s_per_gpu"][j]),
         "peak_mem_gib": float(res["peak_mem_bytes"][j]) / GIB,
         "usable_mem_gib": float(res["usable_bytes"][j]) / GIB},
        plan_regime(case.model, case.cluster, case.training, case.framework),
        rests_on=plan_rests_on(case.model, case.cluster, case.training, chosen), anchor=spread)
    values.update({"pred_tokens_per_sec_lo": u["tokens_per_s_interval"][0],
                   "pred_tokens_per_sec_hi": u["tokens_per_s_interval"][1],
                   "pred_interval_regime": u["interval_regime"], "pred_p_oom": u["p_oom"]})
    out: dict[str, object] = {k: round(float(v), 6) if not isinstance(v, str) else v
                              for k, v in values.items()}
    if (case.training.framework.pp.pp_cost_balance and chosen.pp > 1
            and "first_stage_layers" not in case.given):  # the framework's own placement
        counts = cost_balanced_ranks(case.model.layers, chosen.pp,
                                     *head_balance(case.model))[0]
    else:
        counts = stage_counts(case.model.layers, chosen.pp, chosen.first_stage_layers,
                              chosen.last_stage_layers,
                              case.training.framework.pp.uneven_chunks)
    ends = {"first_stage_layers": counts[0] if counts else chosen.first_stage_layers,
            "last_stage_layers": counts[-1] if counts else chosen.last_stage_layers}
    for knob in KNOBS:
        if knob not in case.given:
            v = ends.get(knob, getattr(chosen, knob))
            out[f"pred_choice_{knob}"] = str(v).lower() if isinstance(v, bool) else v
    return out


def run_prediction(case: Case, calibration: ClusterCalibration | None = None) -> Result:
    """One case's output cells, as :func:`predict_frame` gives them (calibrate --measured)."""
    plans = _plans_of(case)
    if isinstance(plans, dict):
        return plans
    res = estimate_batch(case.model, case.cluster, case.training, plans_to_arrays(plans))
    return _prediction(case, plans, res, calibration)


def _plans_of(case: Case) -> list[Plan] | Result:
    """The candidate plans of a case, or the error that says why it has none."""
    try:
        plans = candidates(case)
        if not plans:
            check_plan(case.model, case.cluster, case.plan, case.training)
            raise SpecError("no valid value for the empty knobs")
    except (CaseError, SpecError, ValueError) as e:
        return {"pred_error": str(e).splitlines()[0]}
    return plans


# Candidate plans waiting for one estimate; past this many they are estimated at once, so the
# memory held does not grow with the number of rows.
MAX_PENDING_PLANS = 50_000


def predict_frame(frame: pd.DataFrame, memo: RowMemo | None = None,
                  calibration: ClusterCalibration | None = None) -> pd.DataFrame:
    """``frame`` with the prediction columns (``memo``'s where it has a row), on ``calibration``."""
    import pandas as pd

    memo = RowMemo() if memo is None else memo
    out = frame.copy()
    cols: dict[str, list[object]] = {c: [None] * len(frame)
                                     for c in OUTPUT_COLUMNS + CHOICE_COLUMNS + ("pred_error",)}
    rows_of: dict[Case, list[int]] = {}  # cases waiting for their estimate: their rows
    keys_of: dict[Case, list[Key]] = {}  # ... and the cells that made them
    groups: dict[tuple, list[tuple[Case, list[Plan]]]] = {}
    pending = 0

    def fill(rows: list[int], result: Result) -> None:
        for k, v in result.items():
            column = cols[k]
            for i in rows:
                column[i] = v

    def done(case: Case, result: Result) -> None:
        memo.by_case.keep(case, result)
        for key in keys_of.pop(case):
            memo.set(key, result)
        fill(rows_of.pop(case), result)

    def estimate() -> None:
        for (model, cluster, training), items in groups.items():
            all_plans = [pl for _, plans in items for pl in plans]
            res = estimate_batch(model, cluster, training, plans_to_arrays(all_plans))
            start = 0
            for case, plans in items:
                sl = {k: v[start:start + len(plans)] for k, v in res.items()}
                start += len(plans)
                done(case, _prediction(case, plans, sl, calibration))
        groups.clear()

    names = [str(c) for c in frame.columns]
    values = [frame.iloc[:, j].tolist() for j in range(len(names))]
    for i, row in enumerate(zip(*values, strict=True)):
        cells = dict(zip(names, row, strict=True))
        key, found = memo.find(cells)
        if isinstance(found, Case) and found in rows_of:  # as a row before it: to estimate
            rows_of[found].append(i)
            continue
        if isinstance(found, dict):
            fill([i], found)
            continue
        reads = _Reads(cells)
        try:
            case = case_from_row(reads, calibration)
        except (CaseError, SpecError, ValueError) as e:
            error: Result = {"pred_error": str(e).splitlines()[0]}
            memo.put(reads, error)
            fill([i], error)
            continue
        result = memo.by_case.get_recent(case)
        if result is not None:
            memo.put(reads, result)
            fill([i], result)
            continue
        key = memo.put(reads, case)  # found by the rows after it; filled in by done()
        if case in rows_of:
            rows_of[case].append(i)
            keys_of[case].append(key)
            continue
        rows_of[case], keys_of[case] = [i], [key]
        plans = _plans_of(case)
        if isinstance(plans, dict):
            done(case, plans)
            continue
        groups.setdefault((case.model, case.cluster, case.training), []).append((case, plans))
        pending += len(plans)
        if pending > MAX_PENDING_PLANS:
            estimate()
            pending = 0
    estimate()
    for k, v in cols.items():
        out[k] = pd.Series(v, index=out.index, dtype=object)
    return out


MAX_CSV_BYTES = 256 * MIB
CHUNK_ROWS = 10_000  # rows read, predicted and written at a time


@dataclass(frozen=True, slots=True)
class Predicted:
    rows: int
    errors: int
    columns: tuple[str, ...]


def predict_file(src: Path, dst: Path, *, chunk_rows: int = CHUNK_ROWS,
                 each: Callable[[pd.DataFrame], None] | None = None,
                 calibration: ClusterCalibration | None = None) -> Predicted:
    """Predict CSV ``src`` into ``dst`` ``chunk_rows`` rows at a time (read, predicted and
    appended to ``dst``'s temporary file, which replaces ``dst`` once every row is written):
    the memory held does not grow with the file. ``each`` sees every chunk's predictions."""
    import pandas as pd

    memo, rows, errors = RowMemo(), 0, 0
    columns: tuple[str, ...] = ()
    # a regular file, bounded: never a FIFO
    with (open_input(src, "CASES.csv", MAX_CSV_BYTES) as f, open_atomic(dst) as out,
          pd.read_csv(f, dtype=str, keep_default_na=False, chunksize=chunk_rows) as reader):
        for frame in reader:
            result = predict_frame(frame, memo, calibration)
            out.write(result.to_csv(index=False, header=not columns).encode("utf-8"))
            rows += len(result)
            errors += int((result["pred_error"].notna() & (result["pred_error"] != "")).sum())
            columns = tuple(str(c) for c in result.columns)
            if each is not None:
                each(result)
    return Predicted(rows=rows, errors=errors, columns=columns)


def predict_csv(src: Path, dst: Path) -> pd.DataFrame:
    """:func:`predict_file`, with every row's predictions returned (a file that fits in
    memory; the command line streams)."""
    import pandas as pd

    parts: list[pd.DataFrame] = []
    predict_file(src, dst, each=parts.append)
    return pd.concat(parts, ignore_index=True)


def predict_cmd(
    cases: Annotated[Path, typer.Argument(help="CSV in the measured_runs.csv schema.",
                                          show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the CSV.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="A JSON summary on stdout.")] = False,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="Anchor every row's cluster on this calibration file (tcf-search "
                              "calibrate --nccl-tests/--measured -o FILE).")] = None,
) -> None:
    """Predict every row of CASES.csv (measured_runs.csv schema) into OUT.csv."""
    if not cases.exists():
        typer.echo(f"error: CASES.csv: no such file: {cases}", err=True)
        raise typer.Exit(2)
    try:
        check_target(output)  # a device, FIFO, folder or symlink is never replaced
    except OutputError as exc:
        typer.echo(f"error: -o: {exc}", err=True)
        raise typer.Exit(2) from None
    if output.exists() and not force:
        typer.echo(f"error: -o: {output} exists; pass --force to overwrite", err=True)
        raise typer.Exit(2)
    if output.is_dir() or not output.parent.is_dir():
        typer.echo(f"error: -o: must be a file in an existing folder (got {output})", err=True)
        raise typer.Exit(2)
    import pandas as pd

    try:
        with user_errors():
            cal = load_calibration(calibration) if calibration is not None else None
            done = predict_file(cases, output, calibration=cal)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        typer.echo(f"error: CASES.csv: not a readable CSV ({str(e).splitlines()[0]})", err=True)
        raise typer.Exit(2) from None
    except OSError as e:  # unreadable input, unwritable output
        typer.echo(f"error: {e.filename or output}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    missing = [c for c in ("layers", "hidden", "gpu", "num_gpus") if c not in done.columns]
    rows, errors = done.rows, done.errors
    summary = {"rows": rows, "errors": errors, "output": str(output),
               "missing_columns": missing}
    if json_out:
        print(json.dumps(summary))
    else:
        print(f"predicted {rows - errors} of {rows} rows -> {output}"
              + (f" ({errors} rows with pred_error)" if errors else ""), file=sys.stderr)
