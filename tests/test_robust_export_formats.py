"""Generated files are code (issue 39, item 1): hostile text in every field a study, a plan file,
a Hugging Face config or an export option carries reaches every generated file of every format
as data only. Each ``.py`` is parsed from its bytes as ``import`` decodes them and must hold the
benign module's statements with only its strings changed; each ``.toml``, ``.yaml`` and ``.json``
parses and holds the text verbatim; each script has the benign one's words and directives
(tests/export_formats.py). tests/test_export_quoting.py and tests/test_robust_output.py run the
scripts with stub launchers.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from clirunner import cli
from export_formats import (
    BREAKERS,
    CHECKED,
    COOKIE,
    REPRO,
    TARGETS,
    Target,
    cases,
    files_of,
    one_line,
    outcome,
    plans,
    python_tree,
    reads,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.layer_style import RopeScaling
from search.hf_config import load_hf_config
from search.planfile import dump_plan_file
from tcf_search.export import ExportError, ExportOptions, ExportRefused, render

EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TITAN = Target("fsdp8b", "torchtitan")
PY = "tcf_titan_config.py"


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


def _docstring(tree: ast.Module, function: str | None = None) -> str:
    node: Any = tree if function is None else next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return ast.get_docstring(node, clean=False) or ""


def test_the_issues_model_name_stays_one_string_of_the_torchtitan_module() -> None:
    tree = python_tree(files_of(TITAN, (("model.name", REPRO),))[PY])
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert not [c for c in calls if "import" in c or "system" in c], calls
    assert _docstring(tree, "tcf_model").startswith(f"{REPRO}: 32 layers")
    assert outcome(TITAN, REPRO, ("model.name",)) == ("written", [])


def test_a_coding_cookie_in_the_study_name_cannot_re_decode_the_module() -> None:
    # python_tree refuses a file whose first lines name an encoding other than UTF-8
    tree = python_tree(files_of(TITAN, (("study", COOKIE),))[PY])
    assert COOKIE in _docstring(tree)
    assert outcome(TITAN, COOKIE, ("study",)) == ("written", [])


def _stubbed_import(name: str, *args: Any, **kwargs: Any) -> Any:
    """torchtitan (absent or not, never run here) and dataclasses as permissive stubs; any
    other module, as a payload would import it, for real."""
    if name.split(".")[0] in ("torchtitan", "dataclasses"):
        return _Stub()
    return builtins.__import__(name, *args, **kwargs)


class _Stub:
    def __getattr__(self, name: str) -> _Stub:
        return _Stub()

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()


@pytest.mark.parametrize(("field", "text"), [("model.name", REPRO), ("study", COOKIE)])
def test_the_generated_module_run_with_torchtitan_stubbed_runs_no_payload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, text: str) -> None:
    source = files_of(TITAN, ((field, text),))[PY].encode("utf-8")  # as the importer reads it
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "tcf_titan_config",
                                 "__builtins__": {**vars(builtins), "__import__": _stubbed_import}}
    exec(compile(source, PY, "exec"), namespace)  # noqa: S102 (the point: nothing runs)
    namespace["tcf_plan"]()
    assert list(tmp_path.iterdir()) == []


def _fixed_cases() -> list[tuple[Target, str, tuple[str, ...]]]:
    """Every breaker in every free field at once on every target (with and without a run name,
    alternately), and in each checked option on the first target that reads it (titan_module
    also where torchtitan 0.2 writes it into TOML)."""
    checked = [(next(t for t in TARGETS if reads(t, f)), (f,)) for f in CHECKED]
    checked.append((TARGETS[-1], ("titan_module",)))
    return [(target, text, fields)
            for i, text in enumerate(BREAKERS)
            for target, fields in [(t, cases(t)[i % 2]) for t in TARGETS] + checked]


def test_every_breaker_in_every_field_of_every_format_is_data_or_refused() -> None:
    seen: dict[str, list[str]] = {"written": [], "refused": [], "damage": []}
    for target, text, fields in _fixed_cases():
        kind, problems = outcome(target, text, fields)
        free = len(fields) > 1
        seen[kind].append(f"{target.label} {'free fields' if free else fields[0]} {text[:60]!r}: "
                          f"{problems}")
        if free and "\ud800" not in text:  # a lone surrogate: the writer refuses it
            assert kind == "written", seen[kind][-1]
    assert not seen["damage"], "\n".join(seen["damage"][:20])
    assert len(seen["written"]) > len(BREAKERS) * len(TARGETS)


CHARS = st.characters(blacklist_categories=())  # controls, separators and surrogates too
hostile = st.one_of(
    st.sampled_from(BREAKERS),
    st.text(CHARS, min_size=1, max_size=40),
    st.builds(lambda a, b, c: a + b + c, st.text(CHARS, max_size=8), st.sampled_from(BREAKERS),
              st.text(CHARS, max_size=8)),
)
ALL_CASES = [(t, fields) for t in TARGETS for fields in cases(t)]


@FUZZ
@given(case=st.sampled_from(ALL_CASES), text=hostile)
def test_fuzzed_text_in_any_field_of_any_format_is_data_or_refused(
        case: tuple[Target, tuple[str, ...]], text: str) -> None:
    count_input("export-format")
    kind, problems = outcome(*case[:1], text, case[1])
    assert kind != "damage", problems


def test_a_refusal_quotes_the_model_name_on_one_line() -> None:
    pf = plans()["moe_ep"]  # no torchtitan 0.2 flavour: the refusal names the model
    hostile = replace(pf, model=replace(pf.model, name="a\nb\u2028c"))
    with pytest.raises(ExportRefused) as refused:
        render("torchtitan", hostile, ExportOptions(target_version="0.2"))
    assert one_line(str(refused.value)), str(refused.value)


def _parse_all(folder: Path) -> list[str]:
    """Every file an export wrote, read from disk as its launcher would; the names a .py uses."""
    names: list[str] = []
    for path in sorted(folder.iterdir()):
        if path.suffix == ".py":
            tree = python_tree(path.read_bytes().decode("utf-8"))
            names += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
        elif path.suffix == ".yaml":
            yaml.safe_load(path.read_text())
        elif path.suffix == ".json" and not path.name.startswith("."):
            json.loads(path.read_text())
    return names


def test_a_shared_plan_file_exports_its_hostile_names_as_data(tmp_path: Path) -> None:
    pf = plans()["fsdp8b"]
    pf = replace(pf, study=COOKIE, model=replace(pf.model, name=REPRO))
    plan = tmp_path / "best_plan.yaml"
    plan.write_text(dump_plan_file(pf))
    code, _, err = cli("export", str(plan), "-f", "all", "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "tcf_titan_config.py" in os.listdir(tmp_path / "out")
    assert not {"__import__", "os"} & set(_parse_all(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best_plan.yaml", "out"]


def test_a_hugging_face_configs_name_reaches_the_export_as_data(tmp_path: Path) -> None:
    """``_name_or_path`` names the model of a study's ``hf_config``; a study run with an
    ``export:`` section writes it into the torchtitan module."""
    config = {"_name_or_path": REPRO, "model_type": "llama", "num_hidden_layers": 4,
              "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 2048, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_hf_config(tmp_path / "config.json").name == REPRO
    study = {"name": "hf", "model": {"hf_config": "config.json"},
             "training": {"seq_len": 256, "global_batch": 16, "framework": "torchtitan"},
             "cluster": {"gpu": "cpu-local", "gpus": 2, "gpus_per_node": 2},
             "search_space": {"tp": [1, 2], "pp": 1, "cp": 1, "vpp": 1, "zero_stage": [0, 3],
                              "micro_batch": [1, 2], "recompute": ["none"]},
             "search": {"trials": 4}, "export": {"formats": ["torchtitan"]}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    code, _, err = cli("run", str(tmp_path / "study.yaml"), "-o", str(tmp_path / "out"), "-q")
    assert code == 0, err
    module = tmp_path / "out" / "export" / "rank-1" / PY
    tree = python_tree(module.read_bytes().decode("utf-8"))
    assert _docstring(tree, "tcf_model").startswith(f"{REPRO}: 4 layers")
    assert "__import__" not in _parse_all(module.parent)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


@pytest.mark.parametrize("fmt", ["torchtitan", "deepspeed"])  # its .py, its config.json
def test_a_number_no_literal_writes_is_refused_not_written(fmt: str) -> None:
    """An infinite RoPE frequency factor (a ``RopeScaling`` built in Python: study and plan files
    refuse it) would be Python's undefined name ``inf`` or JSON's missing ``Infinity``."""
    pf = plans()["fsdp8b"]
    scaling = RopeScaling(kind="llama3", factor=8.0, original_max_position_embeddings=8192,
                          high_freq_factor=math.inf)
    hostile = replace(pf, model=replace(pf.model, rope_scaling=scaling))
    with pytest.raises(ExportError, match="finite") as refused:
        render(fmt, hostile)
    assert one_line(str(refused.value))
