"""The nightly results table and what moved since the previous night: one row per (study, SKU)
a night (``history/results.csv``), the findings a night's run has against its previous one, and
the night's ``summary.md``. ``tcf_search.nightly`` runs the nights."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel.errors import TcfError
from search import p_best_faster
from search.inputs import MIB, read_input

COLUMNS = ("date", "study", "sku", "num_gpus", "status", "best_plan", "tokens_per_s_per_gpu",
           "mfu", "step_time_s", "peak_mem_gib", "usable_mem_gib", "dominant_challenge",
           "feasible_count", "trials", "elapsed_s", "error", "cost_model", "calibration")
# cost_model and calibration last, so that a table written before them keeps its columns'
# order; its rows read "" here


class NightlyError(TcfError):
    """Bad nightly input: the message names the option and the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    study: str
    sku: str
    kind: str  # best_plan_changed, throughput_up, throughput_down, no_longer_fits, lost_plan,
    #            failed
    regression: bool
    message: str


@dataclass(kw_only=True)
class Night:
    date: str
    previous: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    reports: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.regression]

    def model_changes(self) -> list[dict[str, Any]]:
        """Per (previous date, previous model, tonight's model), the runs whose cost model
        differs from their previous night's; a previous row that recorded none (written before
        the column existed) says nothing either way."""
        changes: dict[tuple[str, str, str], list[str]] = {}
        for r in self.rows:
            prev = self.previous.get((r["study"], r["sku"]))
            was, now = (prev or {}).get("cost_model") or "", r.get("cost_model") or ""
            if prev is not None and was and now and was != now:
                changes.setdefault((prev["date"], was, now), []).append(
                    f"{r['study']}@{r['sku']}")
        return [{"since": d, "from": was, "to": now, "runs": runs}
                for (d, was, now), runs in sorted(changes.items())]

    def to_dict(self) -> dict[str, Any]:
        return {"date": self.date, "runs": self.rows,
                "findings": [{"study": f.study, "sku": f.sku, "kind": f.kind,
                              "regression": f.regression, "message": f.message}
                             for f in self.findings],
                "regressions": len(self.regressions),
                "cost_model_changes": self.model_changes(),
                "previous_dates": sorted({r["date"] for r in self.previous.values()})}


# ---- the results table ----------------------------------------------------------------------

def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    text = read_input(path, "nightly history", 256 * MIB)
    try:
        rows = list(csv.DictReader(io.StringIO(text.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise NightlyError(f"{path}: not a readable results table ({exc})") from None
    if rows and not {"date", "study", "sku", "status"} <= set(rows[0]):
        raise NightlyError(f"{path}: not a tcf-search nightly results table")
    return rows


def rows_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def previous_rows(rows: list[dict[str, str]], date: str) -> dict[tuple[str, str], dict[str, str]]:
    """Per (study, sku), the latest row dated before ``date``."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for row in sorted(rows, key=lambda r: r["date"]):
        if row["date"] < date:
            out[(row["study"], row["sku"])] = row
    return out


def diff(study: Any, row: dict[str, Any], prev: dict[str, str] | None,
         threshold: float) -> list[Finding]:
    """What moved since the previous night for one (study, sku)."""
    if prev is None:
        return []
    s, k = row["study"], row["sku"]
    out: list[Finding] = []

    def add(kind: str, regression: bool, message: str) -> None:
        out.append(Finding(study=s, sku=k, kind=kind, regression=regression, message=message))

    if row["status"] != "ok":
        if prev["status"] == "ok":
            add("lost_plan" if row["status"] == "no_fit" else "failed", True,
                f"found {prev['best_plan']} on {prev['date']}, now {row['status']}"
                + (f": {row['error']}" if row.get("error") else ""))
        elif row["status"] == "error":
            add("failed", True, f"run failed: {row['error']}")
        return out
    if prev["status"] != "ok":
        add("found_plan", False, f"no plan on {prev['date']} ({prev['status']}), now "
                                 f"{row['best_plan']}")
        return out
    old, new = float(prev["tokens_per_s_per_gpu"]), float(row["tokens_per_s_per_gpu"])
    still, old_tonight = rejudge(study, prev["best_plan"])
    if prev["best_plan"] != row["best_plan"]:
        add("best_plan_changed", False, f"best plan {prev['best_plan']} → {row['best_plan']}"
            + (versus(new, old_tonight) if still is None else ""))
    moved = new / old - 1.0 if old else 0.0
    if abs(moved) > threshold:
        add("throughput_down" if moved < 0 else "throughput_up", moved < 0,
            f"predicted tokens/s per GPU {old:,.0f} → {new:,.0f} ({moved:+.1%}, threshold "
            f"±{threshold:.0%})")
    if still is not None:
        add("no_longer_fits", True, f"{prev['best_plan']} fitted on {prev['date']}; {still}")
    return out


def versus(new_tokens: float, old_tokens: float | None) -> str:
    """How surely tonight's best beats the previous best, both judged by tonight's model: the
    share of held-out pairs of runs with that predicted gap the model ordered right."""
    p = p_best_faster(new_tokens, old_tokens) if old_tokens else None
    if p is None or old_tokens is None:
        return ""
    return (f" (tonight predicted {new_tokens / old_tokens - 1:+.1%} over the previous best, "
            f"really faster with P {p:.0%})")


def rejudge(study: Any, plan_text: str) -> tuple[str | None, float | None]:
    """The previous best plan under tonight's model: why it fails (None when it is still valid
    and fits) and its predicted tokens/s per GPU (None when it no longer parses)."""
    from costmodel import estimate
    from search.inputs import build_specs
    from tcf_search.explain.planspec import parse_plan

    specs = build_specs(study)
    try:
        plan = parse_plan(plan_text, specs)
    except ValueError as exc:
        return f"it is no longer valid ({exc})", None
    e = estimate(specs.model, specs.cluster, plan, specs.training)
    why = None if e.memory.fits else (f"now it needs {e.memory.peak_bytes / 2**30:.1f} GiB of "
                                      f"{e.memory.usable_bytes / 2**30:.1f} GiB usable")
    return why, e.tokens_per_s_per_gpu


def summary_markdown(night: Night, threshold: float) -> str:
    lines = [f"# tcf-search nightly {night.date}", ""]
    regress = night.regressions
    models = ", ".join(sorted({r["cost_model"] for r in night.rows if r.get("cost_model")}))
    lines.append(f"**{len(regress)} regression(s)**, {len(night.findings) - len(regress)} other "
                 f"change(s) against the previous night (throughput threshold ±{threshold:.0%}"
                 + (f"; cost model {models}" if models else "") + ").")
    for c in night.model_changes():
        lines += ["", f"Cost model changed since {c['since']} ({c['from']} → {c['to']}) for "
                      f"{len(c['runs'])} of {len(night.rows)} run(s): a move in prediction since "
                      f"then is partly the model's; predictions are not comparable to earlier "
                      f"nights without a re-run."]
    lines += ["", "| study | sku | status | best plan | tokens/s/GPU | MFU | peak GiB | "
              "bound by | report |", "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in night.rows:
        report = night.reports.get((r["study"], r["sku"]), "")
        tput = f"{r['tokens_per_s_per_gpu']:,.0f}" if r["status"] == "ok" else ""
        mfu = f"{r['mfu']:.1%}" if r["status"] == "ok" else ""
        mem = (f"{r['peak_mem_gib']:.1f}/{r['usable_mem_gib']:.1f}" if r["status"] == "ok"
               else "")
        lines.append(f"| {r['study']} | {r['sku']} | {r['status']} | `{r.get('best_plan', '')}` "
                     f"| {tput} | {mfu} | {mem} | {r.get('dominant_challenge', '')} | "
                     + (f"[report]({report})" if report else "") + " |")
    if night.findings:
        lines += ["", "## Changes since the previous night", ""]
        for f in night.findings:
            mark = "**REGRESSION**" if f.regression else "change"
            lines.append(f"- {mark} `{f.study}` on `{f.sku}` ({f.kind}): {f.message}")
    errors = [r for r in night.rows if r.get("error")]
    if errors:
        lines += ["", "## Failed runs", ""]
        lines += [f"- `{r['study']}` on `{r['sku']}`: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"
