"""The other inputs, fuzzed: ``export --set``, ``compare --with``, ``explain --plan``, plan files
and Hugging Face ``config.json`` files. Whatever the text, a command ends with its answer or with
exit 2 and ONE line ``error: ...`` on stderr — never a traceback (exit 1 only where the command
documents it: an export no launcher accepts).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from clirunner import cli as run_cli
from clirunner import one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcf_search.cli import main
from tcf_search.export import ExportOptions

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "llama3-8b-h100x8.yaml"
EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
KNOBS = ["tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "recompute_n", "sp",
         "schedule", "first_stage_layers", "last_stage_layers", "bogus"]
NASTY = ["0", "-1", "1.5", "nan", "inf", "-inf", "1e400", "18446744073709551616",
         "9" * 5000, "", "[", "]", "{a: 1}", "null", "~", "true", "yes", "0x10", "1_000",
         "\x00", "\ud800", "é", "'", '"', "$(touch PWNED)", "8,pp", "=", "full", "gpipe"]
CHARS = st.characters(blacklist_characters="\x00")
value = st.one_of(st.sampled_from(NASTY), st.integers(-2**70, 2**70).map(str),
                  st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.text(CHARS, max_size=12))


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


def cli(*args: str, allowed: tuple[int, ...] = (0, 2)) -> tuple[int, str]:
    """Exit code and stderr; never a traceback, bad input as one line."""
    code, out, text = run_cli(*args)
    assert "Traceback" not in text + out, text[-800:]
    assert code in allowed, f"exit {code}: {text[-600:]}"
    if code == 2:
        one_line_error(code, text)
    return code, text


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-inputs")
    study = folder / "tiny.yaml"
    study.write_text((ROOT / "studies" / "tiny-cpu.yaml").read_text())
    assert main(["run", str(study), "-o", str(folder / "out"), "-q"]) == 0
    return folder / "out"


@FUZZ
@given(key=st.sampled_from([f.name for f in dataclasses.fields(ExportOptions)] + ["bogus"]),
       raw=value, fmt=st.sampled_from(["megatron", "slurm", "torchtitan", "nemo", "all"]))
def test_export_set_is_an_export_or_one_line(result: Path, key: str, raw: str,
                                             fmt: str) -> None:
    count_input("export-set")
    with tempfile.TemporaryDirectory() as tmp:
        cli("export", str(result), "-f", fmt, "-o", tmp + "/e", "--set", f"{key}={raw}",
            allowed=(0, 1, 2))


@FUZZ
@given(pairs=st.lists(st.tuples(st.sampled_from(KNOBS), value), min_size=1, max_size=3))
def test_compare_with_is_a_table_or_one_line(pairs: list[tuple[str, str]]) -> None:
    count_input("compare")
    change = ",".join(f"{k}={v}" for k, v in pairs)
    cli("compare", str(STUDY), "--base", "tp=2,pp=1", "--with", change, "-q")


@FUZZ
@given(pairs=st.lists(st.tuples(st.sampled_from(KNOBS), value), min_size=1, max_size=3))
def test_explain_plan_is_an_explanation_or_one_line(result: Path,
                                                    pairs: list[tuple[str, str]]) -> None:
    count_input("explain")
    cli("explain", str(result), "--plan", ",".join(f"{k}={v}" for k, v in pairs))


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    return [path]


def _put(doc: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = new
    return out


JUNK = st.one_of(st.sampled_from([0, -1, 2**64, 10**30, 1.5, float("nan"), float("inf"), "",
                                  "x", None, True, [], [1, 2], {"a": 1}]),
                 st.text(CHARS, max_size=8), st.integers(-2**70, 2**70))


@FUZZ
@given(data=st.data())
def test_mutated_plan_files_are_read_or_one_line(result: Path, data: st.DataObject) -> None:
    count_input("plan")
    doc = yaml.safe_load((result / "best_plan.yaml").read_text())
    path = data.draw(st.sampled_from(_leaves(doc)), label="path")
    mutated = _put(doc, path, data.draw(JUNK, label="value"))
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text(yaml.safe_dump(mutated, allow_unicode=True))
        cli("explain", str(plan))
        cli("export", str(plan), "-f", "torchtitan", "-o", tmp + "/e", allowed=(0, 1, 2))


LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1536,
         "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
         "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
         "num_local_experts": 4, "num_experts_per_tok": 2}


@FUZZ
@given(data=st.data())
def test_mutated_hf_configs_are_a_result_or_one_line(data: st.DataObject) -> None:
    count_input("hf")
    key = data.draw(st.sampled_from(sorted(LLAMA) + ["kv_lora_rank", "head_dim",
                                                     "moe_intermediate_size"]), label="key")
    config = {**LLAMA, key: data.draw(JUNK, label="value")}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        study = Path(tmp) / "hf.yaml"
        study.write_text(f"name: hf\nmodel: {{hf_config: {json.dumps(str(path))}}}\n"
                         "training: {seq_len: 1024, global_batch: 32}\n"
                         "cluster: {gpu: h100-sxm-80gb, gpus: 8}\nsearch: {trials: 2}\n")
        cli("run", str(study), "-o", tmp + "/o", "-q")
