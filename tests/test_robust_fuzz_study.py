"""Hand-written study files, fuzzed: every shipped study, mutated (wrong types, negative, zero and
huge numbers, missing and unknown keys, unknown SKU and preset names, malformed YAML, empty files,
binary junk, ``!!python`` tags), goes through ``tcf-search run`` in-process.

Every run ends with exit 0 (a result, possibly "no feasible layout" with its nearest misses) or
exit 2 with ONE line on stderr, ``error: <field>: <rule>``, naming a key of the mutated path —
never a traceback, and nothing in the input is ever executed. Mutations that are always wrong
(a negative count, an unknown key or name, a mapping where a scalar belongs, junk) must give 2.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcf_search.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "studies").glob("*.yaml"))}
TINY: dict[str, Any] = SHIPPED["tiny-cpu"]


def _custom_gpu_study() -> dict[str, Any]:
    """tiny-cpu on a device defined in the study (``cluster.gpu_spec``), not in the catalog."""
    from hardware_catalog import get_gpu

    spec = {k: v for k, v in dataclasses.asdict(get_gpu("cpu-local")).items()
            if k not in ("id", "efficiency")}
    return {**TINY, "cluster": {"gpu": "my-cpu", "gpus": 2, "gpus_per_node": 2,
                                "gpu_spec": spec}}


STUDIES = {**SHIPPED, "custom-gpu": _custom_gpu_study()}
# Examples per property: a fixed, fast set in CI; TCF_FUZZ_EXAMPLES=N draws N fresh ones
# (benchmarks/bench_robustness.py runs many more).
EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REQUIRED = {("model",), ("training",), ("cluster",), ("training", "seq_len"),
            ("cluster", "gpu")}
# Optional keys the shipped studies leave out, to be added with extreme values.
OPTIONAL = [("search", "trials"), ("search", "workers"), ("search", "seed"), ("search", "top_k"),
            ("objective", "memory_headroom_gib"), ("training", "token_budget"),
            ("cluster", "price_per_gpu_hour"), ("cluster", "gpus_per_node"),
            ("search_space", "vpp"), ("search_space", "micro_batch"), ("search_space", "tp"),
            ("validation", "timeout_s"), ("validation", "top"), ("export", "rank")]
HUGE = [2**31, 10**12, 2**63, 10**30, 1e308, math.inf, -math.inf, math.nan]
UNKNOWN = "zz_unknown_key"
Path_ = tuple[Any, ...]


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str
    out_dir: Path


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


def run_cli(text: str | bytes, *extra: str) -> Outcome:
    """``tcf-search run`` on a study file holding ``text``, in this process."""
    count_input("study")
    with tempfile.TemporaryDirectory(prefix="tcf-fuzz-") as tmp:
        study = Path(tmp) / "fuzzed.yaml"
        if isinstance(text, bytes):
            study.write_bytes(text)
        else:
            study.write_text(text, encoding="utf-8")
        out_dir = Path(tmp) / "out"
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["run", str(study), "-o", str(out_dir), "--trials", "2", "-q",
                             *extra])
            except SystemExit as exc:  # typer/click may still exit this way
                code = exc.code if isinstance(exc.code, int) else 1
        result = Outcome(code=code, out=out.getvalue(), err=err.getvalue(), out_dir=out_dir)
        check_ending(result)
        return result


def check_ending(r: Outcome) -> None:
    """The contract every run meets, whatever the input."""
    assert "Traceback" not in r.err + r.out
    assert r.code in (0, 2), f"exit {r.code}: {r.err[-400:]}"
    if r.code == 2:
        lines = r.err.splitlines()
        assert len(lines) == 1, f"one line on stderr, got {lines!r}"
        assert lines[0].startswith("error: ") and len(lines[0]) > len("error: x: y")
        assert r.out == ""
        return
    doc = json.loads((r.out_dir / "result.json").read_text())
    if doc["best"] is None:  # the "no feasible layout" answer explains itself
        assert doc["feasible_count"] == 0 and doc["notes"]
        assert doc["near_misses"] or doc["valid_count"] == 0
        assert not (r.out_dir / "best_plan.yaml").exists()
    else:  # an answer is a number: inf or nan would rank anything first
        assert all(math.isfinite(v) for v in doc["best"]["objective_values"]), doc["best"]
        assert (r.out_dir / "best_plan.yaml").is_file()


def expect_error(r: Outcome, *names: object) -> None:
    """Exit 2, and the one line names one of ``names`` (the mutated path's keys)."""
    assert r.code == 2, f"expected a bad-input error, got exit {r.code}"
    line = r.err.strip()
    assert any(str(n) in line for n in names), f"{line!r} names none of {names}"


def expect_named_if_error(r: Outcome, *names: object) -> None:
    if r.code == 2:
        expect_error(r, *names)


# ---- mutation helpers -------------------------------------------------------------------------

def leaves(doc: Any, path: Path_ = ()) -> list[Path_]:
    """Paths to every scalar or list under a mapping key."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in leaves(v, (*path, k))]
    return [path]


def mappings(doc: Any, path: Path_ = ()) -> list[Path_]:
    if not isinstance(doc, dict):
        return []
    return [path] + [p for k, v in doc.items() for p in mappings(v, (*path, k))]


def get(doc: Any, path: Path_) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def put(doc: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise AssertionError(path)
    node[path[-1]] = value
    return out


def drop(doc: dict[str, Any], path: Path_) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    del get(out, path[:-1])[path[-1]]
    return out


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def numeric_leaves(doc: Any) -> list[Path_]:
    return [p for p in leaves(doc) if is_number(get(doc, p))
            or (isinstance(get(doc, p), list) and get(doc, p) and all(map(is_number, get(doc, p))))]


def scaled(value: Any, f: Callable[[Any], Any]) -> Any:
    return [f(v) for v in value] if isinstance(value, list) else f(value)


studies = st.sampled_from(sorted(STUDIES))


# ---- properties -------------------------------------------------------------------------------

@FUZZ
@given(name=studies, data=st.data())
def test_negative_numbers_are_refused_with_the_field_named(name: str, data: st.DataObject
                                                           ) -> None:
    doc = STUDIES[name]
    path = data.draw(st.sampled_from(numeric_leaves(doc)), label="path")
    r = run_cli(dump(put(doc, path, scaled(get(doc, path), lambda v: -abs(v) - 1))))
    expect_error(r, *path)


@FUZZ
@given(name=studies, data=st.data())
def test_zero_and_huge_numbers_end_in_an_answer_or_one_line(name: str, data: st.DataObject
                                                            ) -> None:
    doc = STUDIES[name]
    path = data.draw(st.sampled_from(numeric_leaves(doc) + OPTIONAL), label="path")
    value = data.draw(st.sampled_from([0, *HUGE]), label="value")
    old = get(doc, path) if path not in OPTIONAL else None
    r = run_cli(dump(put(doc, path, scaled(old, lambda _: value) if old is not None else value)))
    expect_named_if_error(r, *path)
    if isinstance(value, float) and not math.isfinite(value):
        expect_error(r, *path)  # inf and nan are never a count, a size or a rate


@FUZZ
@given(name=studies, data=st.data())
def test_wrong_types_are_refused_with_the_field_named(name: str, data: st.DataObject) -> None:
    doc = STUDIES[name]
    path = data.draw(st.sampled_from(leaves(doc)), label="path")
    old = get(doc, path)
    pool: list[Any] = [{"nested": [1, 2]}, [[1], [2]]]
    if is_number(old) or (isinstance(old, list) and all(map(is_number, old))):
        pool += ["12abc", "", True]
    if isinstance(old, str):
        pool += [7.5, [old, old]]
    value = data.draw(st.sampled_from(pool), label="value")
    r = run_cli(dump(put(doc, path, value)))
    expect_error(r, *path)


@FUZZ
@given(name=studies, data=st.data())
def test_missing_and_unknown_keys(name: str, data: st.DataObject) -> None:
    doc = STUDIES[name]
    if data.draw(st.booleans(), label="unknown"):
        where = data.draw(st.sampled_from(mappings(doc)), label="mapping")
        r = run_cli(dump(put(doc, (*where, UNKNOWN), 1)))
        expect_error(r, UNKNOWN)
        return
    path = data.draw(st.sampled_from(leaves(doc) + [(k,) for k in doc]), label="path")
    r = run_cli(dump(drop(doc, path)))
    if path in REQUIRED:
        expect_error(r, *path)
    else:
        expect_named_if_error(r, *path, "study")


@FUZZ
@given(name=studies, bogus=st.text(min_size=1, max_size=24))
def test_unknown_sku_and_preset_names_list_the_valid_ones(name: str, bogus: str) -> None:
    doc = STUDIES[name]
    if "preset" in doc["model"]:
        r = run_cli(dump(put(doc, ("model", "preset"), bogus + "-not-a-preset")))
        expect_error(r, "model.preset")
        assert "llama3-8b" in r.err  # the valid names are listed
    if "gpu_spec" not in doc["cluster"]:  # a gpu_spec defines its own device under any id
        r = run_cli(dump(put(doc, ("cluster", "gpu"), bogus + "-not-a-sku")))
        expect_error(r, "cluster.gpu")
        assert "h100-sxm-80gb" in r.err


@FUZZ
@given(name=studies, data=st.data())
def test_malformed_text_and_junk(name: str, data: st.DataObject) -> None:
    shipped = ROOT / "studies" / f"{name}.yaml"  # with its comments, as written by hand
    text = shipped.read_text() if shipped.is_file() else dump(STUDIES[name])
    kind = data.draw(st.sampled_from(["truncate", "splice", "binary", "text"]), label="kind")
    if kind == "truncate":  # may still be a valid study: a result or one line, nothing else
        cut = data.draw(st.integers(0, len(text)), label="cut")
        run_cli(text[:cut])
        return
    if kind == "splice":
        at = data.draw(st.integers(0, len(text)), label="at")
        junk = data.draw(st.sampled_from(["{", "]", ":\n  :", "\t", "'", "&a *b", "- x\ny: 1",
                                          "\x00", "%YAML 9.9\n", "!!binary 3"]), label="junk")
        run_cli(text[:at] + junk + text[at:])
        return
    blob: str | bytes = (data.draw(st.binary(max_size=200), label="bytes") if kind == "binary"
                         else data.draw(st.text(max_size=200), label="text"))
    # No junk holds the required sections. The line names the document, a section, or a key
    # of the junk when it happens to be a YAML mapping.
    try:
        keys = list(yaml.safe_load(blob) or {})
    except Exception:  # noqa: BLE001 - not YAML, or not a mapping: no keys to name
        keys = []
    expect_error(run_cli(blob), "study", "model", "training", "cluster", *keys)


# ---- cases worth naming -----------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "", "   \n", "# only a comment\n", "null\n", "- a\n- b\n", "42\n", "'just a string'\n",
    "\ufeff", "[" * 5000, "{a: " * 5000, "a: &x [*x]\n",
], ids=["empty", "blank", "comment", "null", "list", "int", "string", "bom", "deep-list",
        "deep-map", "self-alias"])
def test_degenerate_documents(text: str) -> None:
    expect_error(run_cli(text), "study", "model")


@pytest.mark.parametrize("payload", [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
    "!!python/name:os.system",
    "!!python/object/apply:builtins.exec ['open(\"{marker}\", \"w\")']",
], ids=["apply-system", "new-popen", "name", "exec"])
@pytest.mark.parametrize("where", ["document", "name", "preset", "tp"])
def test_python_tags_are_refused_and_never_run(tmp_path: Path, payload: str, where: str) -> None:
    marker = tmp_path / "PWNED"
    tag = payload.replace("{marker}", str(marker))
    path = {"document": (), "name": ("name",), "preset": ("model", "preset"),
            "tp": ("search_space", "tp")}[where]
    text = tag + "\n" if not path else dump(put(TINY, path, "__TAG__")).replace("__TAG__", tag)
    r = run_cli(text)
    expect_error(r, "study")
    assert "not valid YAML" in r.err
    assert not marker.exists(), "the YAML payload ran"


def test_duplicate_keys_keep_the_last_and_still_validate() -> None:
    """YAML 1.1 loaders keep the last of duplicated keys; what survives is still validated."""
    r = run_cli(dump(TINY) + "search:\n  trials: -3\n")
    expect_error(r, "search.trials")


def test_an_empty_space_is_an_answer_not_an_error() -> None:
    """A tensor-parallel degree above the world size leaves no valid layout: exit 0, and the
    answer names the rules that emptied the space."""
    r = run_cli(dump(put(TINY, ("search_space", "tp"), [1024])), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["best"] is None and doc["valid_count"] == 0
    assert sum(doc["pruned_by"].values()) == doc["space_size"] > 0
    assert any("no valid layout" in n for n in doc["notes"])


def test_no_feasible_layout_is_printed_with_nearest_misses(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    study = tmp_path / "small.yaml"
    study.write_text(dump(put(STUDIES["custom-gpu"], ("cluster", "gpu_spec", "hbm_bytes"),
                              300 * 2**20)))
    code = main(["run", str(study), "-o", str(tmp_path / "out"), "--trials", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no feasible layout" in out and "needs " in out and "GiB" in out


@pytest.mark.parametrize("output", ["../../escaped", "/tmp/tcf-escaped-abs", "a/../../x",
                                    "..", "launch/../../../x", "a\\..\\..\\x"])
def test_export_output_cannot_leave_the_result_folder(output: str) -> None:
    r = run_cli(dump(put(TINY, ("export",), {"formats": ["megatron"], "output": output})))
    expect_error(r, "export.output")
    assert not Path("/tmp/tcf-escaped-abs").exists()


def test_unknown_export_format_is_refused_before_the_search() -> None:
    r = run_cli(dump(put(TINY, ("export",), {"formats": ["megatron", "nope"]})))
    expect_error(r, "export.formats")
    assert not (r.out_dir / "study.journal").exists(), "refused before any trial ran"
