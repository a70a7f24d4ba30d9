"""A result folder from someone else, opened with ``report`` (issue 39): whatever its files hold,
the page runs no script, no value leaves its text, and a broken field is one line (exit 2, no
traceback); no ``--force`` makes a report replace the run's own files.

The page is read back with ``html.parser`` and held to the benign page's shape: no ``<script>``,
no ``on*`` handler, no ``javascript:`` address, no element kind the benign page lacks.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import os
import shutil
import subprocess
import tempfile
import typing
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from clirunner import ROOT, TINY, cli, one_line_error
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from costmodel.errors import TcfError
from tcf_search.cli import main
from tcf_search.report.data import load_result
from tcf_search.report.html import page
from tcf_search.report.schema import Result

EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Every way out of a text node or an attribute at once: tags, handlers, a javascript: address,
# quotes, rich's link markup (the explain section), TeX for matplotlib, format braces.
PAYLOAD = ("</title></style><script>document.title='pwned'</script>"
           "<img src=x onerror=\"document.title='pwned'\"><a href='javascript:alert(1)'>a</a>"
           "\"' onmouseover=alert(1) [link=javascript:alert(1)]b[/link] "
           "[link=x\"><script>document.title='pwned'</script>]c[/link] $\\frac{d$ {0} {} &amp; \\")
MISSING = object()  # a mutation that deletes the key


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


class PageShape(HTMLParser):
    """What a page would run or fetch: its element kinds and anything active in them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.kinds: set[tuple[str, tuple[str, ...]]] = set()
        self.active: list[str] = []  # scripts, handlers, javascript: addresses
        self.texts: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.kinds.add((tag, tuple(sorted(name for name, _ in attrs))))
        if tag in ("script", "iframe", "object", "embed", "base", "link", "meta") and not (
                tag == "meta" and attrs == [("charset", "utf-8")]):
            self.active.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.active.append(f"{tag} {name}=")
            if value and "javascript:" in value.replace(" ", "").lower():
                self.active.append(f"{tag} {name}={value[:40]}")

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def damage(text: str, benign: PageShape) -> list[str]:
    """What the page has that a benign report does not: active content, new element kinds."""
    shape = PageShape(text)
    return shape.active + [f"new element {k}" for k in sorted(shape.kinds - benign.kinds)]


def run_report(folder: Path, out: Path) -> tuple[int, str]:
    """``report FOLDER -o OUT --no-png``: exit code and stderr, never a traceback; exit 2 is one
    line."""
    code, stdout, err = cli("report", str(folder), "-o", str(out), "--no-png", "-q")
    assert "Traceback" not in err + stdout, err[-800:]
    assert code in (0, 2), f"exit {code}: {err[-600:]}"
    if code == 2:
        one_line_error(code, err)
    return code, err


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile-report")
    study = folder / "tiny.yaml"
    study.write_text(TINY)
    assert main(["run", str(study), "-o", str(folder / "out"), "-q"]) == 0
    return folder / "out"


def benign_shape(result: Path, tmp: Path) -> PageShape:
    """The element kinds of a benign report: the folder's, and its page had no layout fit."""
    assert run_report(result, tmp / "report.html")[0] == 0
    folder = copy_result(result, tmp / "nofit")
    doc = json.loads((folder / "result.json").read_text())
    write_json(folder / "result.json", {**doc, "top": [], "near_misses": [{"reason": "x"}]})
    shape = PageShape((tmp / "report.html").read_text() + page(load_result(folder), {}, None, []))
    assert not shape.active, shape.active
    return shape


@pytest.fixture(scope="module")
def benign(result: Path, tmp_path_factory: pytest.TempPathFactory) -> PageShape:
    return benign_shape(result, tmp_path_factory.mktemp("benign"))


def copy_result(result: Path, dest: Path) -> Path:
    return Path(shutil.copytree(result, dest, ignore=shutil.ignore_patterns("report*")))


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, (*path, k))
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            yield from leaves(v, (*path, i))
    else:
        yield path


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def declared(model: type[BaseModel], doc: Any, path: tuple[Any, ...] = ()
             ) -> Iterator[tuple[Any, ...]]:
    """Every path of ``doc`` the report reads (the schema declares it), nodes and leaves."""
    if not isinstance(doc, dict):
        return
    for name, field in model.model_fields.items():
        if name not in doc:
            continue
        yield (*path, name)
        value, models = doc[name], _models(field.annotation)
        items = (list(enumerate(value)) if isinstance(value, list) else list(value.items())
                 if isinstance(value, dict) and not models else [])
        if isinstance(value, dict) and models:
            yield from declared(models[0], value, (*path, name))
        for key, item in items:
            yield (*path, name, key)
            if models:
                yield from declared(models[0], item, (*path, name, key))


def mutate(doc: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node[k]
    if new is MISSING:
        del node[path[-1]]
    else:
        node[path[-1]] = new
    return out


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, allow_nan=True))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


# ---- a hostile folder ----------------------------------------------------------------------

def test_payload_in_every_text_field_stays_text(result: Path, benign: PageShape,
                                                tmp_path: Path) -> None:
    folder = copy_result(result, tmp_path / "copied")
    doc = json.loads((folder / "result.json").read_text())
    hostile = copy.deepcopy(doc)
    for path in leaves(doc):
        if isinstance(_get(doc, path), str):
            one = mutate(doc, path, PAYLOAD)
            write_json(folder / "result.json", one)
            try:
                load_result(folder)
            except TcfError:  # a field with a few allowed values (direction, recompute)
                continue
            hostile = mutate(hostile, path, PAYLOAD)
    hostile["notes"] = [PAYLOAD]
    for counts in [hostile["pruned_by"], *(c["pruned_by"] for c in hostile["cells"])]:
        counts[PAYLOAD] = 1  # a rule name: the heat map labels a cell with it
    write_json(folder / "result.json", hostile)
    plan = yaml.safe_load((folder / "best_plan.yaml").read_text())
    plan["study"] = plan["model"]["name"] = PAYLOAD  # the explain section's text
    (folder / "best_plan.yaml").write_text(yaml.safe_dump(plan))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, err = run_report(folder, folder / "report.html")
    assert code == 0, err
    text = (folder / "report.html").read_text()
    assert damage(text, benign) == []
    shape = PageShape(text)
    assert sum(PAYLOAD in t for t in shape.texts) >= 5  # shown as text: title, h1, notes, ...
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sorted(set(after) - set(before)) == [Path("copied/report.html")]
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: apt-get install -y chromium to check no script runs")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (folder / "report.html").resolve().as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "<title>tcf-search report: &lt;/title&gt;&lt;/style&gt;&lt;script&gt;" in dom


def test_payload_in_a_number_field_is_refused_or_inert(result: Path, benign: PageShape,
                                                       tmp_path: Path) -> None:
    folder = copy_result(result, tmp_path / "copied")
    doc = json.loads((folder / "result.json").read_text())
    numbers = [p for p in leaves(doc) if isinstance(_get(doc, p), int | float)]
    assert len(numbers) > 100
    refused = 0
    for path in numbers:
        write_json(folder / "result.json", mutate(doc, path, PAYLOAD))
        try:
            data = load_result(folder)
        except TcfError as exc:
            assert "\n" not in str(exc) and "result.json: " in str(exc)
            refused += 1
            continue
        assert damage(page(data, {}, None, []), benign) == [], path
    assert refused >= 40  # every figure the report shows


@pytest.mark.parametrize("path, rule", [
    (("trials",), "trials: must be a non-negative integer"),
    (("cluster", "num_gpus"), "cluster.num_gpus: must be a parallel degree"),
    (("top", 0, "rank"), "top[0].rank: must be a positive integer"),
])
def test_the_issues_repros_are_one_line(result: Path, tmp_path: Path, path: tuple[Any, ...],
                                        rule: str) -> None:
    folder = copy_result(result, tmp_path / "copied")
    doc = json.loads((folder / "result.json").read_text())
    write_json(folder / "result.json", mutate(doc, path, "<script>document.title=1</script>"))
    code, err = run_report(folder, folder / "report.html")
    one_line_error(code, err, "result.json: " + rule, "(got '<script>")
    assert not (folder / "report.html").exists()


# ---- every one-field edit ------------------------------------------------------------------

CHARS = st.characters(blacklist_characters="\x00")
TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))  # a file's text
JUNK = st.one_of(
    st.sampled_from([0, -1, 1.5, 2**64, 10**30, 10**4000, -(10**400), float("nan"), float("inf"),
                     float("-inf"), 1e308, True, False, None, "", "x", "maximize", PAYLOAD,
                     "\ud800", "x" * 100_000, [], [1, 2], [[[[]]]], {}, {"a": 1},
                     {"a": [1, {"b": PAYLOAD}]}, MISSING]),
    st.text(CHARS, max_size=12), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True))


@FUZZ
@given(data=st.data())
def test_every_one_field_edit_is_a_page_or_one_line(result: Path, benign: PageShape,
                                                    data: st.DataObject) -> None:
    count_input("report")
    doc = json.loads((result / "result.json").read_text())
    path = data.draw(st.sampled_from(sorted(declared(Result, doc), key=str)), label="path")
    new = data.draw(JUNK, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_result(result, Path(tmp) / "copied")
        write_json(folder / "result.json", mutate(doc, path, new))
        code, err = run_report(folder, folder / "report.html")
        if code == 2:
            assert "result.json" in err
            return
        text = (folder / "report.html").read_text()
        assert damage(text, benign) == []
        assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>")


@FUZZ
@given(column=st.sampled_from(["number", "state", "value_0", "tokens_per_s_per_gpu",
                               "peak_mem_gib", "usable_mem_gib", "tp", "pp"]),
       row=st.integers(0, 2),
       new=st.one_of(st.sampled_from(["", "x", "nan", "inf", "-inf", "1e400", "-1", "1.5",
                                      "9" * 5000, PAYLOAD, "True"]),
                     st.text(TEXT, max_size=8)))
@example(column="peak_mem_gib", row=0, new="inf")
def test_every_trials_cell_edit_is_a_page_or_one_line(result: Path, benign: PageShape,
                                                      column: str, row: int, new: str) -> None:
    count_input("report")
    import csv

    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_result(result, Path(tmp) / "copied")
        with open(folder / "trials.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        rows[row][column] = new
        with open(folder / "trials.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        code, err = run_report(folder, folder / "report.html")
        if code == 2:
            assert "trials.csv: line " in err and column in err
            return
        assert damage((folder / "report.html").read_text(), benign) == []


# ---- what a run writes loads, typed --------------------------------------------------------

def _no_fit(tmp: Path) -> Path:
    study = tmp / "full.yaml"
    study.write_text(TINY.replace("gpus_per_node: 2\n",
                                  "gpus_per_node: 2\n  overrides: {hbm_bytes: 4.0e+6}\n"))
    assert main(["run", str(study), "-o", str(tmp / "nofit"), "-q"]) == 0
    return tmp / "nofit"


def test_every_result_a_run_writes_loads_typed(result: Path, tmp_path: Path) -> None:
    exhaustive = tmp_path / "tiny.yaml"
    exhaustive.write_text(TINY)
    assert main(["run", str(exhaustive), "-o", str(tmp_path / "exh"), "--exhaustive",
                 "-q"]) == 0
    for folder in (result, tmp_path / "exh", _no_fit(tmp_path)):
        raw = json.loads((folder / "result.json").read_text())
        data = load_result(folder)
        assert [r.rank for r in data.top] == [r["rank"] for r in raw["top"]]
        assert [r.predicted.tokens_per_s_per_gpu for r in data.top] == [
            r["predicted"]["tokens_per_s_per_gpu"] for r in raw["top"]]
        assert [m.reason for m in data.result.near_misses] == [
            m["reason"] for m in raw["near_misses"]]
        optimum = data.result.optimum
        assert (optimum and optimum.value) == raw.get("optimum", {}).get("value")
        assert all(math.isfinite(t.value) for t in data.trials if t.value is not None)
    nofit = load_result(tmp_path / "nofit")
    assert nofit.top == [] and nofit.result.near_misses
    assert load_result(tmp_path / "exh").result.optimum is not None


# ---- the run's files are the run's ---------------------------------------------------------

@pytest.mark.parametrize("name", ["result.json", "trials.csv", "best_plan.yaml",
                                  "top/rank-1.yaml", "study.journal"])
def test_force_never_replaces_the_runs_files(result: Path, tmp_path: Path, name: str) -> None:
    folder = copy_result(result, tmp_path / "copied")
    before = (folder / name).read_bytes()
    for force in ((), ("--force",)):
        code, _, err = cli("report", str(folder), "-o", str(folder / name), "--no-png",
                           *force)
        one_line_error(code, err, str(folder / name))
        assert (folder / name).read_bytes() == before
    assert not list(folder.rglob("*.tmp"))


# ---- escaped by construction ---------------------------------------------------------------

def test_the_page_is_built_only_from_literal_templates() -> None:
    """Html is made from a string literal (``html``, ``Html``, ``join``'s separator) or, for the
    explain section alone, by ``fragment``; no f-string writes a tag: no value from a result can
    become markup."""
    report = ROOT / "tcf_search" / "report"
    makers = {"html": 0, "Html": 0, "join": 1}
    calls = 0
    for path in sorted(report.glob("*.py")):
        if path.name == "markup.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                literal = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
                assert "<" not in literal, f"{path.name}:{node.lineno}: an f-string writes HTML"
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            name = node.func.id
            if name == "fragment":
                assert path.name == "build.py", f"{path.name}:{node.lineno}"
            elif name in makers and len(node.args) > makers[name]:
                arg = node.args[makers[name]]
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                    f"{path.name}:{node.lineno}: {name}() needs a string literal")
                calls += name == "html"
    assert calls >= 20  # the page's templates
