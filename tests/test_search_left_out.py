"""Issue #38: what the study's own settings left out of the search is said in one note line:
context parallelism at a long sequence, layouts a global batch's divisors rule out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import main


def run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> dict:
    tmp_path.mkdir(exist_ok=True)
    study = tmp_path / "s.yaml"
    study.write_text(text)
    code = main(["run", str(study), "-o", str(tmp_path / "out"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


LONG = """name: long
model: {preset: llama3-8b}
training: {seq_len: 131072, global_batch: 64}
cluster: {gpu: h100-sxm-80gb, gpus: 16}
"""


def test_cp_left_at_one_on_a_long_sequence_says_what_cp_auto_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(tmp_path, capsys, LONG)
    assert all(r["plan"]["cp"] == 1 for r in doc["top"])
    notes = [n for n in doc["notes"] if n.startswith("search_space.cp:")]
    assert len(notes) == 1 and "with cp: auto the best plan gives" in notes[0]
    best = doc["top"][0]["predicted"]["tokens_per_s_per_gpu"]
    said = float(notes[0].split("gives ")[1].split(" tokens/s")[0].replace(",", ""))
    assert said > best  # CP beats the best cp-1 plan at 128k on 16 H100
    searched = run_json(tmp_path / "auto", capsys,
                        LONG + "search_space: {cp: auto}\nsearch: {trials: 2000}\n")
    assert not any(n.startswith("search_space.cp:") for n in searched["notes"])
    assert searched["top"][0]["predicted"]["tokens_per_s_per_gpu"] == pytest.approx(said, 0.01)


def test_short_sequence_or_cp_given_says_nothing_of_cp(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(tmp_path, capsys, LONG.replace("131072", "8192") + "search: {trials: 20}\n")
    assert not any("search_space.cp" in n for n in doc["notes"])


def test_a_batch_whose_divisors_rule_out_layouts_names_the_nearest_batches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 70B on a 72-GPU NVL72 rack: 128 sequences rule out dp 3, 6, 9, ..., 72, so the best plan
    # pipelines over 9 stages; 72 and 144 admit every dp (72 = lcm of the divisors of 72)
    doc = run_json(tmp_path, capsys, """name: nvl72
model: {preset: llama3-70b}
training: {seq_len: 8192, global_batch: 128, precision: fp8, framework: megatron}
cluster: {gpu: gb200-nvl72, gpus: 72, gpus_per_node: 4}
search_space: {cp: auto}
search: {trials: 60}
""")
    notes = [n for n in doc["notes"] if n.startswith("training.global_batch:")]
    assert len(notes) == 1, doc["notes"]
    assert "rule out data parallelism 3, 6, 9, 12, 18, 24, 36, 72" in notes[0]
    assert "nearest batches that admit every dp are 72: best " in notes[0]
    assert " and 144: best " in notes[0]
    at_144 = float(notes[0].split("144: best ")[1].split(" tokens/s")[0].replace(",", ""))
    assert at_144 > doc["top"][0]["predicted"]["tokens_per_s_per_gpu"]


def test_a_batch_every_dp_divides_says_nothing(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(tmp_path, capsys, LONG.replace("131072", "8192").replace(
        "global_batch: 64", "global_batch: 256") + "search: {trials: 20}\n")
    assert not any(n.startswith("training.global_batch:") for n in doc["notes"])
