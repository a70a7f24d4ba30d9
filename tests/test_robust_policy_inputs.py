"""Issue 19, held for what a command reads: every bad input is one line, never a traceback.

* FIFOs and devices are refused before they are opened, and sizes are bounded;
* study names never become paths;
* bad export settings, plan files, Hugging Face configs, huge integers and zero knobs are one
  line; a knob's list and a placement CP-SAT cannot find are bounded, user-facing lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clirunner import MOE, ROOT, TINY, cli, one_line_error

# ---- inputs ---------------------------------------------------------------------------------

def _hf_study(tmp_path: Path, config: str) -> Path:
    study = tmp_path / "hf.yaml"
    study.write_text(f"name: hf\nmodel: {{hf_config: '{config}'}}\n"
                     "training: {seq_len: 4096, global_batch: 64}\n"
                     "cluster: {gpu: h100-sxm-80gb, gpus: 8}\n")
    return study


@pytest.mark.parametrize("what", ["study", "hf_config", "plan", "csv", "journal"])
@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "too-big"])
def test_fifos_devices_and_huge_inputs_are_refused(tmp_path: Path, finished: Path, what: str,
                                                   source: str) -> None:
    path = tmp_path / "input"
    if source == "fifo":
        os.mkfifo(path)  # opened for reading, it would block forever
    elif source == "too-big":
        with path.open("wb") as f:  # sparse: 300 MiB of nothing, over every limit
            f.truncate(300 * 2**20)
    else:
        path = Path(source)
        if not path.exists():
            pytest.skip(f"no {source} here")
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    args = {"study": ["run", str(path), "-o", str(tmp_path / "o"), "-q"],
            "hf_config": ["run", str(_hf_study(tmp_path, str(path))), "-o", str(tmp_path / "o"),
                          "-q"],
            "plan": ["explain", str(path)],
            "csv": ["predict", str(path), "-o", str(tmp_path / "p.csv")],
            "journal": ["run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage",
                        f"journal:{path}"]}[what]
    if what == "journal" and source == "too-big":
        path.write_text("not a journal\n")
    code, _, err = cli(*args)
    one_line_error(code, err, str(path))
    assert not Path(f"{path}.run-lock").exists()


# ---- names are not paths --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../../escaped", "/tmp/tcf-nightly-abs", "a/b", "..",
                                  ".hidden", "x\ny"])
def test_nightly_never_uses_a_study_name_as_a_path(tmp_path: Path, name: str) -> None:
    history = tmp_path / "deep" / "er" / "history"
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("name: tiny-cpu", f"name: {json.dumps(name)}"))
    before = set(tmp_path.rglob("*"))
    code, _, err = cli("nightly", str(study), "-o", str(history), "--no-report", "-q",
                       "--date", "2026-01-02")
    one_line_error(code, err, "study name")
    assert set(tmp_path.rglob("*")) - before <= {history, *history.parents}
    assert not Path("/tmp/tcf-nightly-abs").exists()


def test_a_study_name_with_a_lone_surrogate_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("name: tiny-cpu", 'name: "x\\ud800"'))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "name")


# ---- one line, not a traceback ----------------------------------------------------------------

@pytest.mark.parametrize("setting, words", [
    ("lr=[", ["lr"]), ("lr=nan", ["lr", "finite"]), ("lr=inf", ["lr"]),
    ("train_iters=1e400", ["train_iters"]), ("megatron_script=null", ["megatron_script"]),
    ("train_iters=" + "9" * 5000, ["train_iters"]), ("master_port=0.5", ["master_port"]),
])
def test_bad_export_settings_are_one_line(finished: Path, tmp_path: Path, setting: str,
                                          words: list[str]) -> None:
    code, _, err = cli("export", str(finished), "-f", "megatron", "-o", str(tmp_path / "e"),
                       "--set", setting)
    one_line_error(code, err, *words)
    assert not (tmp_path / "e").exists()


def test_text_settings_are_taken_verbatim(finished: Path, tmp_path: Path) -> None:
    code, _, err = cli("export", str(finished), "-f", "slurm", "-o", str(tmp_path / "e"),
                       "--set", "slurm_account=0.2")
    assert code == 0, err
    assert "--account=0.2" in (tmp_path / "e" / "slurm.sbatch").read_text()


@pytest.mark.parametrize("text", [
    "num_gpus: .nan", "num_gpus: .inf", "num_gpus: -8", "num_gpus: 1" + "0" * 5000,
    "rank: [1]", "gpus_per_node: 2.5"])
def test_bad_plan_files_are_one_line(finished: Path, tmp_path: Path, text: str) -> None:
    key, value = text.split(": ", 1)
    lines = (finished / "best_plan.yaml").read_text().splitlines()
    edited = [f"{line.split(':')[0]}: {value}" if line.strip().startswith(f"{key}:") else line
              for line in lines]
    if not any(line.strip().startswith(f"{key}:") for line in lines):
        edited.append(f"{key}: {value}")
    plan = tmp_path / "plan.yaml"
    plan.write_text("\n".join(edited) + "\n")
    for args in (["explain", str(plan)], ["export", str(plan), "-f", "megatron"]):
        code, _, err = cli(*args)
        one_line_error(code, err)


@pytest.mark.parametrize("config", [
    {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 10},
    {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 10,
     "kv_lora_rank": 8},
    "[" * 100_000 + "]" * 100_000,
    '{"num_hidden_layers": ' + "9" * 5000 + "}",
    {"num_hidden_layers": 1e400},
], ids=["zero-heads", "zero-heads-mla", "deep", "huge-int", "inf"])
def test_bad_hf_configs_are_one_line(tmp_path: Path, config: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    code, _, err = cli("run", str(_hf_study(tmp_path, str(path))), "-o", str(tmp_path / "o"),
                       "-q")
    one_line_error(code, err, "hf_config")


def test_a_study_with_a_huge_integer_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("global_batch: 16", "global_batch: " + "9" * 5000))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "study")


@pytest.mark.parametrize("args", [
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "mbs=0"],
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "tp=-2"],
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "vpp=18446744073709551616"],
    ["explain", "{result}", "--plan", "recompute_n=18446744073709551616"],
    ["explain", "{result}", "--plan", "tp=18446744073709551616"],
])
def test_huge_and_zero_knobs_are_one_line(finished: Path, args: list[str]) -> None:
    study = str(ROOT / "studies" / "llama3-8b-h100x8.yaml")
    code, _, err = cli(*[a.format(study=study, result=finished) for a in args])
    one_line_error(code, err)


# ---- bounded work ---------------------------------------------------------------------------

def test_a_knob_lists_at_most_64_values(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("tp: [1, 2]", f"tp: {list(range(1, 1001))}"))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "search_space.tp", "at most 64 values")
    assert not (tmp_path / "o").exists()


def test_a_placement_cp_sat_cannot_find_is_a_user_facing_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from search.prune import MemoryStage

    monkeypatch.setattr(MemoryStage, "place", lambda self, i: None)
    study = tmp_path / "s.yaml"
    study.write_text(MOE)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--trials", "30")
    one_line_error(code, err, "layer placement (CP-SAT)", "uneven_pipeline")
    assert "AssertionError" not in err
