"""YAML aliases are bounded before any value is built (issue 39, item 2). A 645-byte study whose
nested aliases stand for 10⁹ strings (a "billion laughs") made the one-line error message
``repr`` them all: a minute, gigabytes, a ``MemoryError`` traceback. Every place that reads YAML
a user gives (study, plan file, ``explain`` source, ``export --set``, ``nightly``,
``calibrate --gpu-file``) now refuses it while composing the file: one line, exit 2, and not one
value constructed. Plain aliases within the bound still read as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clirunner import ROOT, cli, one_line_error

from search.planfile import PlanFileError, parse_plan_file
from search.study import StudyError, parse_study
from search.yamlinput import MAX_ALIAS_NODES, YamlInputError, load_yaml, shown
from tcf_search.calibration.device import EntryError, load_entry

TINY = (ROOT / "studies" / "tiny-cpu.yaml").read_text()


def laughs(levels: int = 9, width: int = 10) -> str:
    """A flow list whose last item stands for ``width**levels`` strings."""
    items = ['&l0 "lol"'] + [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]"
                             for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


BOMB = laughs()
STUDY = ("name: bomb\nmodel: {preset: llama3-8b, name: " + BOMB + "}\n"
         "training: {seq_len: 4096, global_batch: 64}\ncluster: {gpu: h100-sxm-80gb, nodes: 1}\n")
# the shape of a plan file, its rank a bomb (refused before any key is looked at)
PLAN = ("format_version: 1\nstudy: x\nrank: " + BOMB + "\ncluster: {gpu: h100-sxm-80gb, "
        "num_gpus: 8}\nmodel: {}\ntraining: {}\nplan: {}\n")
RULE = "YAML aliases may stand for at most"


@pytest.fixture
def constructed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many YAML nodes were turned into Python values while the test ran."""
    count = [0]
    original = yaml.constructor.BaseConstructor.construct_object

    def counting(self: Any, node: Any, deep: bool = False) -> Any:
        count[0] += 1
        return original(self, node, deep)

    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_object", counting)
    yield count


@pytest.mark.parametrize("command", [
    ["run", "{study}", "-o", "{tmp}/out"],
    ["explain", "{study}", "--plan", "tp=1"],
    ["nightly", "{folder}", "-o", "{tmp}/history"],
    ["export", "{plan}", "-f", "megatron", "-o", "{tmp}/e"],
    ["explain", "{plan}", "--plan", "tp=1"],
    ["export", "{tmp}/none", "-f", "megatron", "--set", "lr=" + BOMB],
], ids=["run", "explain-study", "nightly", "export-plan", "explain-plan", "export-set"])
def test_an_alias_bomb_is_one_line_and_nothing_is_built(
        tmp_path: Path, command: list[str], constructed: list[int]) -> None:
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "bomb.yaml").write_text(STUDY)
    (tmp_path / "plan.yaml").write_text(PLAN)
    where = {"study": str(tmp_path / "studies" / "bomb.yaml"), "folder": str(tmp_path / "studies"),
             "plan": str(tmp_path / "plan.yaml"), "tmp": str(tmp_path)}
    for key, value in where.items():
        command = [part.replace("{" + key + "}", value) for part in command]
    code, _, err = cli(*command)
    one_line_error(code, err)
    assert RULE in err or ("--set lr: not a number" in err), err
    assert constructed[0] == 0  # refused while composing: no value was built, none repr'd
    assert not (tmp_path / "out").exists() and not (tmp_path / "e").exists()


def test_the_rule_names_the_alias_and_where_it_is() -> None:
    assert len(STUDY) < 1000 and BOMB.count("*l8") == 10  # l9: 10 x l8 = ... = 10**9 strings
    with pytest.raises(StudyError) as exc:
        parse_study(STUDY)
    line = str(exc.value)
    assert line.startswith(f"study: {RULE} {MAX_ALIAS_NODES:,} nodes")
    assert "write the values out (got *l3 at line 2, column" in line
    with pytest.raises(PlanFileError, match=f"^plan file: {RULE}"):
        parse_plan_file(PLAN)


@pytest.mark.parametrize("text", [
    "a: &a [*a]",  # a list holding itself
    "a: &a {b: *a}",
    "a: &a {<<: *a}",  # a merge of itself
])
def test_an_alias_inside_its_own_node_is_refused(text: str) -> None:
    with pytest.raises(YamlInputError, match="alias may not sit inside the node it names"):
        load_yaml(text, "study")


def test_merges_that_double_are_bounded_too(constructed: list[int]) -> None:
    # each level merges the one before twice: the constructor would flatten 2**20 keys (on
    # main, 40 levels grew past 9 GB inside yaml.safe_load itself)
    lines = ["m0: &m0 {k: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}"
                                  for i in range(1, 21)]
    with pytest.raises(YamlInputError, match=RULE):
        load_yaml("\n".join(lines), "study")
    assert constructed[0] == 0


def test_aliases_read_as_before_up_to_the_bound_and_not_past_it() -> None:
    text = "x: &x {a: [1, 2, 3]}\ny: {<<: *x, b: *x}\nz: [*x, *x]\n"
    assert load_yaml(text, "study") == yaml.safe_load(text)
    study = TINY.replace("tp: [1, 2]", "tp: &two [1, 2]").replace("pp: [1, 2]", "pp: *two")
    assert parse_study(study).search_space == parse_study(TINY).search_space
    # a list of 9 nodes (itself and 8 numbers), repeated: the bound, then one alias more
    repeats = MAX_ALIAS_NODES // 9
    head = "a: &a [1, 2, 3, 4, 5, 6, 7, 8]\nb: ["
    at_bound = head + ", ".join(["*a"] * repeats) + "]\n"
    assert len(load_yaml(at_bound, "study")["b"]) == repeats
    with pytest.raises(YamlInputError, match=RULE):
        load_yaml(head + ", ".join(["*a"] * (repeats + 1)) + "]\n", "study")


def test_a_gpu_file_with_a_bomb_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text("id: " + BOMB + "\n")
    with pytest.raises(EntryError, match=f"^--gpu-file: {RULE}"):
        load_entry(path)
    path.write_text("id: x\n")
    with pytest.raises(EntryError, match="not a catalog entry written by calibrate"):
        load_entry(path)


def test_a_huge_value_is_shown_without_writing_it_out() -> None:
    # 10**12 elements by reference: repr would never end; shown looks at a few of them
    level: list[Any] = ["lol"]
    for _ in range(12):
        level = [level] * 10
    text = shown(level)
    assert len(text) <= 60 and text.endswith("...")
    assert shown(list(range(10**6)), 40) == "[0, 1, 2, 3, 4, 5, ...]"
    assert shown({"b": 1, "a": [1, 2]}) == "{'b': 1, 'a': [1, 2]}"  # small: repr as is
    cycle: list[Any] = []
    cycle.append(cycle)
    assert shown(cycle) == "[[[[...]]]]"
