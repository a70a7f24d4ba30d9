"""``tcf-search predict``: the cost model over a CSV of configurations (measured_runs schema).

Only configuration columns are read. An empty knob cell means *not given*: every valid value is
evaluated and the fastest plan that fits is chosen (the one with least memory if none fits); the
choice is reported in ``pred_choice_<knob>``. The pipeline split is a knob: with none of
``first_stage_layers``, ``last_stage_layers``, ``embedding_in_pipeline_split``,
``loss_in_pipeline_split`` given, the even split and the launchable uneven ones near it are
evaluated, and the first and last ranks' layers of the choice are reported. A row the model
cannot handle gets a message in ``pred_error`` and no crash.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

from costmodel import rules
from costmodel.estimate import check_plan, estimate_batch
from costmodel.mapping import chunk_split_exists, stage_counts
from costmodel.plans import plans_to_arrays
from costmodel.specs import Plan, SpecError
from search.files import MIB, OutputError, check_target, read_input, write_atomic
from search.measured import KNOBS, Case, CaseError, case_from_row
from search.placement import candidates as placement_candidates
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
)
CHOICE_COLUMNS = tuple(f"pred_choice_{k}" for k in KNOBS)


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def candidates(case: Case) -> list[Plan]:
    """Every valid plan that agrees with the given knobs."""
    p, m, tr = case.plan, case.model, case.training
    given = case.given
    per_dp = tr.global_batch // p.dp if tr.global_batch % p.dp == 0 else 1
    axes: dict[str, list[Any]] = {
        "micro_batch": [p.micro_batch] if "micro_batch" in given else _divisors(per_dp, 64),
        "recompute": [p.recompute] if "recompute" in given else ["none", "selective", "full"],
        "zero_stage": [p.zero_stage] if "zero_stage" in given else [0, 1, 2, 3],
        "vpp": ([p.vpp] if "vpp" in given or p.pp == 1
                else [v for v in range(1, 9)
                      if chunk_split_exists(m.layers, p.pp, v,
                                            any_split=tr.framework.pp.uneven_chunks)]),
        "sequence_parallel": ([p.sequence_parallel] if "sequence_parallel" in given or p.tp == 1
                              else [False, True]),
    }
    plans: list[Plan] = []
    for values in itertools.product(*axes.values()):
        try:
            plan = replace(p, **dict(zip(axes, values, strict=True)))  # type: ignore[arg-type]
        except (SpecError, ValueError):
            continue
        plans.extend(plan if "first_stage_layers" in given else with_split
                     for with_split in _splits(plan, m.layers, tr.framework.pp.uneven_chunks))
    if not plans:
        return plans
    keep = rules.valid(plans, rules.facts_of(m, case.cluster, tr))  # check_plan, on columns
    return [plan for plan, ok in zip(plans, keep, strict=True) if ok]


def _splits(plan: Plan, layers: int, any_chunks: bool) -> list[Plan]:
    """The plan with each pipeline split the row's launcher builds near the even one (the even
    split first, then the first/last ranks within max(vpp, 2) layers of the middle ranks):
    Megatron's first/last stage flags, the embedding and the loss counted as layers, or, where
    the framework takes an explicit per-stage layout (``training.framework.pp.uneven_chunks``),
    any."""
    if plan.pp == 1:
        return [plan]
    reach = max(plan.vpp, 2)
    rows = placement_candidates(layers, plan.pp, True, plan.vpp, any_chunks)
    near = (np.abs(rows[:, 0] - rows[:, 1]) <= reach) & (np.abs(rows[:, 2] - rows[:, 1]) <= reach)
    out = [plan] if layers % plan.pp == 0 else []
    for nf, _nm, nl in rows[near]:
        if int(nf) == int(nl) == layers // plan.pp and layers % plan.pp == 0:
            continue
        try:
            out.append(replace(plan, first_stage_layers=int(nf), last_stage_layers=int(nl)))
        except (SpecError, ValueError):
            continue
    return out


def _pick(res: dict[str, np.ndarray]) -> int:
    fits = res["fits"].astype(bool)
    if fits.any():
        tput = np.where(fits, res["tokens_per_s_per_gpu"], -np.inf)
        return int(np.argmax(tput))
    return int(np.argmin(res["peak_mem_bytes"]))


def predict_frame(frame: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    out = frame.copy()
    cols: dict[str, list[object]] = {c: [None] * len(frame)
                                     for c in OUTPUT_COLUMNS + CHOICE_COLUMNS + ("pred_error",)}
    groups: dict[tuple, list[tuple[int, Case, list[Plan]]]] = {}
    for i, row in enumerate(frame.to_dict("records")):
        try:
            case = case_from_row({str(k): v for k, v in row.items()})
            plans = candidates(case)
            if not plans:
                check_plan(case.model, case.cluster, case.plan, case.training)
                raise SpecError("no valid value for the empty knobs")
        except (CaseError, SpecError, ValueError) as e:
            cols["pred_error"][i] = str(e).splitlines()[0]
            continue
        key = (case.model, case.cluster, case.training)
        groups.setdefault(key, []).append((i, case, plans))
    for (model, cluster, training), items in groups.items():
        all_plans = [pl for _, _, plans in items for pl in plans]
        res = estimate_batch(model, cluster, training, plans_to_arrays(all_plans))
        start = 0
        for i, case, plans in items:
            sl = {k: v[start:start + len(plans)] for k, v in res.items()}
            j = _pick(sl)
            start += len(plans)
            chosen = plans[j]
            values = {
                "pred_tokens_per_sec_per_gpu": sl["tokens_per_s_per_gpu"][j],
                "pred_model_tflops_per_gpu": sl["model_tflops_per_gpu"][j],
                "pred_mfu": sl["mfu"][j], "pred_hfu": sl["hfu"][j],
                "pred_step_time_s": sl["step_time_s"][j],
                "pred_peak_mem_gib": sl["peak_mem_bytes"][j] / GIB,
                # global rank 0's peak, the one a single-rank memory log reports
                "pred_first_stage_mem_gib": sl["first_stage_mem_bytes"][j] / GIB,
                "pred_usable_mem_gib": sl["usable_bytes"][j] / GIB,
                "pred_fits": "true" if sl["fits"][j] else "false",
                "pred_mem_weights_gib": sl["mem_weights_bytes"][j] / GIB,
                "pred_mem_grads_gib": sl["mem_grads_bytes"][j] / GIB,
                "pred_mem_optimizer_gib": sl["mem_optimizer_bytes"][j] / GIB,
                "pred_mem_activations_gib": sl["mem_activations_bytes"][j] / GIB,
                "pred_mem_buffers_gib": sl["mem_buffers_bytes"][j] / GIB,
                "pred_time_compute_s": sl["time_compute_s"][j],
                "pred_time_comm_exposed_s": sl["time_comm_exposed_s"][j],
                "pred_time_bubble_s": sl["time_bubble_s"][j],
                "pred_time_optimizer_s": sl["time_optimizer_s"][j],
                "pred_time_stall_s": sl["time_stall_s"][j],  # in pred_time_compute_s
            }
            for k, v in values.items():
                cols[k][i] = round(float(v), 6) if not isinstance(v, str) else v
            counts = stage_counts(case.model.layers, chosen.pp, chosen.first_stage_layers,
                                  chosen.last_stage_layers)
            ends = {"first_stage_layers": counts[0] if counts else chosen.first_stage_layers,
                    "last_stage_layers": counts[-1] if counts else chosen.last_stage_layers}
            for knob in KNOBS:
                if knob not in case.given:
                    v = ends.get(knob, getattr(chosen, knob))
                    cols[f"pred_choice_{knob}"][i] = (str(v).lower() if isinstance(v, bool)
                                                      else v)
    for k, v in cols.items():
        out[k] = pd.Series(v, index=out.index, dtype=object)
    return out


MAX_CSV_BYTES = 256 * MIB


def predict_csv(src: Path, dst: Path) -> pd.DataFrame:
    import io

    import pandas as pd

    data = read_input(src, "CASES.csv", MAX_CSV_BYTES)  # a regular file, bounded: never a FIFO
    frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    result = predict_frame(frame)
    write_atomic(dst, result.to_csv(index=False))
    return result


def predict_cmd(
    cases: Annotated[Path, typer.Argument(help="CSV in the measured_runs.csv schema.",
                                          show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the CSV.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="A JSON summary on stdout.")] = False,
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
            result = predict_csv(cases, output)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        typer.echo(f"error: CASES.csv: not a readable CSV ({str(e).splitlines()[0]})", err=True)
        raise typer.Exit(2) from None
    except OSError as e:  # unreadable input, unwritable output
        typer.echo(f"error: {e.filename or output}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    missing = [c for c in ("layers", "hidden", "gpu", "num_gpus") if c not in result.columns]
    errors = int((result["pred_error"].notna() & (result["pred_error"] != "")).sum())
    summary = {"rows": len(result), "errors": errors, "output": str(output),
               "missing_columns": missing}
    if json_out:
        print(json.dumps(summary))
    else:
        print(f"predicted {len(result) - errors} of {len(result)} rows -> {output}"
              + (f" ({errors} rows with pred_error)" if errors else ""), file=sys.stderr)
