"""Safe output, beyond tests/test_export_quoting.py (hostile study names, fixed list) and
tests/test_export_writer.py (the writer's rules):

* fuzzed text in every free-text export option (script paths, run name, recipe) and in the study
  name reaches the launcher stubs as inert data — no command it spells is run — or is refused
  with an error naming the option;
* a study file cannot point its exports outside the result folder (``export.output``);
* the search's result files are replaced whole: a write that fails half-way leaves the previous
  file and no temporary behind; a killed run is covered by tests/test_robust_interrupt.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search.inputs import files
from search.inputs.planfile import load_plan_file
from tcf_search.export import FORMATS, ExportError, ExportOptions, ExportRefused, render
from tcf_search.export.writer import write_exports

PLANS = Path(__file__).parent / "golden" / "export" / "plans"
EXAMPLES = int(os.environ.get("TCF_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="TCF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
STUBBED = ("torchrun", "accelerate", "srun", "scontrol", "deepspeed", "python", "python3")
STUB = """#!/usr/bin/env bash
printf '%s\\0' "$@" >> "$STUB_LOG"
[[ "$(basename "$0")" == scontrol ]] && echo node0
exit 0
"""
FREE_TEXT = ("run_name", "megatron_script", "nemo_script", "train_script", "nanotron_script",
             "nemo_recipe", "titan_config", "slurm_partition", "slurm_account")
SCRIPT_OF = {"megatron_script": ("megatron", "slurm"), "nemo_script": ("nemo",),
             "train_script": ("deepspeed", "accelerate"), "nanotron_script": ("nanotron",)}
# Text a shell would act on, mixed with arbitrary unicode (no NUL: no argv can carry one).
SHELLISH = ["$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "' ; touch PWNED ; '",
            "\" ; touch PWNED ; \"", "\n touch PWNED", "${IFS}touch${IFS}PWNED", "&& touch PWNED",
            "| touch PWNED", "$'\\x74ouch' PWNED", "a b", "*", "~root", "-rf"]
CHARS = st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])
hostile = st.one_of(
    st.sampled_from(SHELLISH),
    st.builds(lambda a, b, c: a + b + c, st.text(CHARS, max_size=6), st.sampled_from(SHELLISH),
              st.text(CHARS, max_size=6)),
    st.text(CHARS, min_size=1, max_size=24),
)

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bin_dir = tmp_path_factory.mktemp("bin")
    for name in STUBBED:
        stub = bin_dir / name
        stub.write_text(STUB)
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def count_input(kind: str) -> None:
    """One line per fuzzed input in $TCF_FUZZ_COUNT (benchmarks/bench_robustness.py counts)."""
    if path := os.environ.get("TCF_FUZZ_COUNT"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(kind + "\n")


def run_scripts(folder: Path, stubs: Path) -> list[str]:
    """Run every exported script with stub launchers; return the argv words they saw."""
    log = folder / "argv.bin"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "SLURM_SUBMIT_DIR": str(folder), "SLURM_JOB_NODELIST": "node0", "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "HOME": str(folder)}
    for script in sorted([*folder.glob("*.sh"), *folder.glob("*.sbatch")]):
        done = subprocess.run(["bash", script.name], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, f"{script.name}: {done.stderr[-400:]}"
    return log.read_bytes().decode("utf-8", "surrogateescape").split("\0") if log.exists() else []


@FUZZ
@given(option=st.sampled_from(FREE_TEXT), value=hostile, study=hostile,
       plan=st.sampled_from(sorted(PLANS.glob("*.yaml"))))
def test_fuzzed_text_in_export_options_stays_data(tmp_path_factory: pytest.TempPathFactory,
                                                  stubs: Path, option: str, value: str,
                                                  study: str, plan: Path) -> None:
    count_input("export")
    pf = dataclasses.replace(load_plan_file(plan), study=study)
    options = ExportOptions(**{option: value})  # type: ignore[arg-type]
    folder = tmp_path_factory.mktemp("export")
    ran = 0
    for fmt in FORMATS:
        try:
            files = render(fmt, pf, options)
        except ExportRefused:
            continue  # the launcher cannot run this plan: a refusal, not an export
        except ExportError as exc:  # untrusted text refused, naming the option
            assert option in str(exc) or "study" in str(exc), exc
            continue
        out = folder / fmt
        write_exports(files, out)
        for name, text in files.items():
            if name.endswith(".json"):
                json.loads(text)
        argv = run_scripts(out, stubs)
        ran += 1
        assert not list(folder.rglob("PWNED")), f"{fmt}: the text ran as a command"
        if fmt in SCRIPT_OF.get(option, ()):  # the script path is one argv word, verbatim
            assert value in argv, f"{fmt}: {value!r} split or lost"
    assert not Path("PWNED").exists()


@pytest.mark.parametrize("output_dir", ["../../escaped", "/tmp/tcf-robust-abs", "a/../../x",
                                        "..", "launch/../../../x"])
def test_study_exports_stay_in_the_result_folder(output_dir: str) -> None:
    from search.inputs.study import StudyError, parse_study

    text = (Path(__file__).parents[1] / "studies" / "tiny-cpu.yaml").read_text()
    with pytest.raises(StudyError, match=r"^export\.output: must be a folder inside"):
        parse_study(text + f"export: {{formats: [megatron], output: '{output_dir}'}}\n")
    study = parse_study(text + "export: {formats: [megatron], output: launch/best}\n")
    assert study.export is not None and study.export.output == "launch/best"


def test_a_failed_write_keeps_the_previous_result_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    files.write_atomic(target, '{"trials": 1}\n')

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(files.OutputError, match=r"^cannot write .*result.json: No space left"):
        files.write_atomic(target, '{"trials": 2}\n' * 1000)
    monkeypatch.undo()
    assert target.read_text() == '{"trials": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"], "no temporary left"


def test_an_interrupted_write_keeps_the_previous_result_file(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Ctrl-C while the text is being written: the old file stays, whole."""
    target = tmp_path / "trials.csv"
    files.write_atomic(target, "number,state\n0,complete\n")
    real_fdopen = os.fdopen

    class Interrupted:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.f = real_fdopen(*args, **kwargs)  # type: ignore[call-overload]

        def __enter__(self) -> Interrupted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def write(self, text: bytes) -> int:
            self.f.write(text[: len(text) // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fdopen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(target, "number,state\n" + "1,complete\n" * 500)
    monkeypatch.undo()
    assert target.read_text() == "number,state\n0,complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["trials.csv"]
