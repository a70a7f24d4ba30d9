"""Hostile names cannot inject: every exported script runs with stub launchers on PATH and the
stubs see the hostile text as one verbatim argument, while nothing it tries to run happens."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from search.inputs.planfile import load_plan_file
from tcf_search.export import FORMATS, ExportError, ExportOptions, ExportRefused, render

PLANS = Path(__file__).parent / "golden" / "export" / "plans"
HOSTILE = [
    "my study",
    "it's \"quoted\"",
    "x; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "a\nb; touch PWNED",
    "${HOME}|&>'",
]
# Records its argv NUL-separated, so newlines inside an argument survive.
STUB = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_LOG"
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _stubs(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "accelerate"):
        stub = bin_dir / name
        stub.write_text(STUB)
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _exports(study: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for plan in sorted(PLANS.glob("*.yaml")):
        pf = dataclasses.replace(load_plan_file(plan), study=study)
        for fmt in FORMATS:
            try:
                out.append((fmt, render(fmt, pf, ExportOptions(run_name=None))))
            except ExportRefused:
                continue
    return out


@pytest.mark.parametrize("study", HOSTILE[1:5])
def test_scripts_pass_hostile_names_as_inert_words(tmp_path: Path, study: str) -> None:
    bin_dir = _stubs(tmp_path)
    ran = 0
    for i, (fmt, files) in enumerate(_exports(study)):
        folder = tmp_path / f"{i}-{fmt}"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        for name in files:
            if not name.endswith(".sh"):
                continue
            log = folder / "argv.bin"
            env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log)}
            done = subprocess.run(["bash", name], cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            argv = log.read_text().split("\0")[:-1]
            if fmt == "megatron":
                assert f"checkpoints/{study}" in argv  # one word, verbatim
            ran += 1
        assert not (folder / "PWNED").exists()
    assert not (tmp_path / "PWNED").exists()
    assert ran >= 10


@pytest.mark.parametrize("study", HOSTILE)
def test_config_files_keep_hostile_names_as_data(study: str) -> None:
    for fmt, files in _exports(study):
        for name, text in files.items():
            if name.endswith(".toml"):
                assert study in tomllib.loads(text)["job"]["description"]
            elif name.endswith(".yaml"):
                doc = yaml.safe_load(text)
                if fmt == "nanotron":
                    assert doc["general"]["run"] == study
            elif name.endswith(".py"):
                # The generated module must compile and must not carry the name as code.
                code = compile(text, name, "exec")
                assert study not in code.co_names
            elif name.endswith(".json"):
                json.loads(text)
            for line in text.splitlines():
                if line.startswith("#") and "touch PWNED" in study:
                    assert "\n" not in line


def test_sbatch_directives_refuse_or_sanitise_untrusted_text() -> None:
    pf = load_plan_file(PLANS / "dense70b.yaml")
    with pytest.raises(ExportError, match="slurm_partition"):
        render("slurm", pf, ExportOptions(slurm_partition="gpu\n#SBATCH --uid=0"))
    with pytest.raises(ExportError, match="slurm_time"):
        render("slurm", pf, ExportOptions(slurm_time="1:00; rm"))
    hostile = dataclasses.replace(pf, study="x\n#SBATCH --uid=0 $(id)")
    text = render("slurm", hostile)["slurm.sbatch"]
    assert "#SBATCH --job-name=x__SBATCH_--uid_0___id_" in text
    assert sum(line.startswith("#SBATCH --uid") for line in text.splitlines()) == 0


def test_sbatch_script_is_valid_bash() -> None:
    pf = load_plan_file(PLANS / "dense70b.yaml")
    for launcher in ("megatron", "nemo"):
        files = render("slurm", pf, ExportOptions(slurm_launcher=launcher,
                                                  slurm_partition="gpu", slurm_account="a-1"))
        done = subprocess.run(["bash", "-n"], input=files["slurm.sbatch"], text=True,
                              capture_output=True)
        assert done.returncode == 0, done.stderr
        assert f"{launcher}.sh" in files


def test_torchtitan_module_options_must_be_identifiers() -> None:
    pf = load_plan_file(PLANS / "fsdp8b.yaml")
    with pytest.raises(ExportError, match="titan_module"):
        render("torchtitan", pf, ExportOptions(titan_module="llama3; import os"))
