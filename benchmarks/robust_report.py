"""A copied hostile result folder through ``tcf-search report`` (issue 39, item 6).

``python benchmarks/robust_report.py [--quick]``. Three kinds of input, each a copy of a tiny
study's result folder with one thing changed:

1. payload × field: each of a few script, attribute, link-markup, TeX and format payloads in each
   field of ``result.json`` (text and number fields alike, those the report ignores too);
2. one-field edits of each field the report reads: wrong type, huge, negative, nan/inf, missing,
   nested junk; and of each ``trials.csv`` column the report reads;
3. a sample of both, through the whole command in this process (figures, explain section, files
   written), with the files under the sandbox listed before and after.

Kinds 1 and 2 go through the report's own load and page (``load_result`` then ``page``, no
figures: a figure holds no text of the page); kind 3 runs everything. Counted: inputs, runs
that printed a traceback (or raised anything but a one-line project error), and damage — a page
with a script, an ``on*`` handler, a ``javascript:`` address or an element a benign page lacks,
a payload found raw in the page, or a file written anywhere but the report's own outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import io
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.errors import TcfError  # noqa: E402

PAYLOADS = ["<script>document.title='pwned'</script>", "\"><img src=x onerror=alert(1)>",
            "' onmouseover='alert(1)", "javascript:alert(1)",
            "</style></title><svg onload=alert(1)>", "[link=x\"><script>alert(1)</script>]a[/link]",
            "$\\frac{x$ \\", "{0} {} %s", "<!-- -->]]>&amp;", "x\u202ey\u0000z"]
COLUMNS = ["number", "state", "value_0", "tokens_per_s_per_gpu", "peak_mem_gib", "usable_mem_gib",
           "tp", "pp"]
CELLS = ["", "x", "nan", "inf", "-1", "1.5", "1e400", "9" * 5000, PAYLOADS[0]]


def helpers() -> ModuleType:
    """tests/test_robust_report_hostile.py: its page reader and its mutations (one code path)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location(
        "robust_report_hostile", ROOT / "tests" / "test_robust_report_hostile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def junk(h: ModuleType) -> list[Any]:
    """The one-field edits: type changes, huge, negative, not finite, missing, nested junk."""
    return ["x", "", None, True, 0, -1, 1.5, 2**64, 10**4000, float("nan"), float("inf"),
            [], [1, 2], {}, {"a": [1, {"b": PAYLOADS[0]}]}, "x" * 100_000, h.MISSING]


class Tally:
    def __init__(self) -> None:
        self.inputs = self.refused = self.tracebacks = self.damage = 0
        self.examples: list[str] = []

    def note(self, kind: str, what: str) -> None:
        if len(self.examples) < 8:
            self.examples.append(f"{kind}: {what}")


def through_page(h: ModuleType, folder: Path, benign: Any, tally: Tally, label: str,
                 payload: str | None = None, explain: bool = False) -> bool:
    """``load_result`` and ``page`` (with the explain section of the best plan where
    ``explain``) on the folder as it is now; whether a page was made."""
    from tcf_search.report.build import _explain_best
    from tcf_search.report.data import load_result
    from tcf_search.report.html import page

    tally.inputs += 1
    try:
        section = _explain_best(folder, None)[0] if explain else None
        text = page(load_result(folder), {}, section, [])
    except TcfError as exc:
        tally.refused += 1
        if "\n" in str(exc):
            tally.tracebacks += 1
            tally.note("a message of several lines", label)
        return False
    except Exception:  # noqa: BLE001 - what is counted
        tally.tracebacks += 1
        tally.note("traceback", f"{label}: {traceback.format_exc().splitlines()[-1]}")
        return False
    harm = h.damage(text, benign)
    if payload is not None and any(c in payload for c in "<>\"'") and payload in text:
        harm.append("the payload raw in the page")
    if harm:
        tally.damage += 1
        tally.note("damage", f"{label}: {harm[:2]}")
    return True


def through_command(h: ModuleType, folder: Path, sandbox: Path, benign: Any, tally: Tally,
                    label: str) -> None:
    """The whole ``report`` command in this process; files outside its outputs are damage."""
    from clirunner import cli

    before = set(sandbox.rglob("*"))
    tally.inputs += 1
    with contextlib.redirect_stderr(io.StringIO()):  # matplotlib's warnings
        try:
            code, out, err = cli("report", str(folder), "-q")
        except Exception:  # noqa: BLE001 - what is counted: it left the command
            code, out, err = 1, "", traceback.format_exc()
    written = {p for p in set(sandbox.rglob("*")) - before
               if p != folder / "report.html" and folder / "report_png" not in p.parents
               and p != folder / "report_png"}
    if "Traceback" in out + err or code not in (0, 2) or (code == 2 and (
            len(err.strip().splitlines()) != 1 or not err.startswith("error: "))):
        tally.tracebacks += 1
        last = (err.strip().splitlines() or [""])[-1]
        tally.note("command", f"{label}: exit {code}: {last[:160]}")
    elif code == 2:
        tally.refused += 1
    harm = [f"wrote {p}" for p in sorted(written)]
    if code == 0:
        harm += h.damage((folder / "report.html").read_text(), benign)
    if harm:
        tally.damage += 1
        tally.note("damage", f"{label}: {harm[:2]}")
    for p in (folder / "report_png").glob("*"):
        p.unlink()
    (folder / "report.html").unlink(missing_ok=True)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def cases(h: ModuleType, doc: dict[str, Any]) -> Iterator[tuple[str, str, Any, str | None]]:
    """(kind, label, new result.json or trials.csv edit, payload)."""
    from tcf_search.report.schema import Result

    for path in h.leaves(doc):
        for payload in PAYLOADS:
            yield "payload", f"{path} = {payload[:20]!r}", h.mutate(doc, path, payload), payload
    for path in sorted(h.declared(Result, doc), key=str):
        for value in junk(h):
            shown = "missing" if value is h.MISSING else repr(value)[:20]
            yield "edit", f"{path} = {shown}", h.mutate(doc, path, value), None
    for column in COLUMNS:
        for cell in CELLS:
            yield "trials", f"trials.csv {column} = {cell[:20]!r}", (column, cell), None
    for payload in PAYLOADS:  # the explain section's text
        yield "plan", f"best_plan.yaml study, model = {payload[:20]!r}", payload, payload


def section(quick: bool) -> dict[str, int]:
    h = helpers()  # puts tests/ on the path, for clirunner
    from clirunner import TINY

    from search.pipeline import RunOptions, run_study
    from search.study import load_study

    print("\n## A copied hostile result folder through `report`\n")
    t0 = time.perf_counter()
    page_tally, command_tally = Tally(), Tally()
    sample = 24 if quick else 120
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp)
        study = sandbox / "tiny.yaml"
        study.write_text(TINY)
        with contextlib.redirect_stdout(io.StringIO()):
            run_study(load_study(study), RunOptions(out_dir=sandbox / "out", trials=3))
        result = sandbox / "out"
        benign = h.benign_shape(result, Path(tempfile.mkdtemp(dir=sandbox)))
        folder = h.copy_result(result, sandbox / "copied")
        doc = json.loads((result / "result.json").read_text())
        rows = _rows(result / "trials.csv")
        plan_text = (result / "best_plan.yaml").read_text()
        plan = yaml.safe_load(plan_text)
        every = list(cases(h, doc))
        # the whole command on every n-th page made (about a third are) and a few refused
        step, made = max(1, len(every) // (3 * sample)), 0
        for i, (kind, label, new, payload) in enumerate(every):
            h.write_json(folder / "result.json", new if kind in ("payload", "edit") else doc)
            if kind == "trials":
                column, cell = new
                _write_rows(folder / "trials.csv", [{**rows[0], column: cell}, *rows[1:]])
            if kind == "plan":
                hostile = {**plan, "study": new, "model": {**plan["model"], "name": new}}
                (folder / "best_plan.yaml").write_text(yaml.safe_dump(hostile))
            accepted = through_page(h, folder, benign, page_tally, label, payload,
                                    explain=kind == "plan")
            made += accepted
            if (accepted and made % step == 0) or (not accepted and i % (20 * step) == 0):
                through_command(h, folder, sandbox, benign, command_tally, label)
            if kind == "trials":
                _write_rows(folder / "trials.csv", rows)
            if kind == "plan":
                (folder / "best_plan.yaml").write_text(plan_text)
    kinds = {k: sum(1 for c in every if c[0] == k)
             for k in ("payload", "edit", "trials", "plan")}
    wall = time.perf_counter() - t0
    print(f"- inputs through load and page: {page_tally.inputs:,} ({kinds['payload']:,} payload "
          f"× field of {len(PAYLOADS)} payloads, {kinds['edit']:,} one-field edits of "
          f"result.json, {kinds['trials']:,} of trials.csv, {kinds['plan']:,} payloads in "
          f"best_plan.yaml's names, explained); refused in one line: "
          f"{page_tally.refused:,}")
    print(f"- of them through the whole command (figures, explain, files): "
          f"{command_tally.inputs:,}; refused in one line: {command_tally.refused:,}")
    tracebacks = page_tally.tracebacks + command_tally.tracebacks
    damage = page_tally.damage + command_tally.damage
    print(f"- tracebacks: {tracebacks}; damage (script, handler, javascript: address, new "
          f"element, raw payload, file written elsewhere): {damage}; {wall:.0f} s")
    for line in page_tally.examples + command_tally.examples:
        print(f"  - {line}")
    return {"inputs": page_tally.inputs + command_tally.inputs, "faults": 0,
            "tracebacks": tracebacks, "damage": damage, "lost": 0, "duplicates": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs of the whole command")
    print(section(parser.parse_args().quick))


if __name__ == "__main__":
    main()
