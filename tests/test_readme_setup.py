"""What the README tells a new user about set-up and the search holds (issue #38): the torch
line's CPU route, what pulls triton, precision as an input, and the two set-up commands as CI
reads them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_two_set_up_commands_are_unchanged() -> None:
    assert ("pip install -e . && tcf-search studies/llama3-8b-h100x8.yaml     # install, run a "
            "shipped study") in README
    assert ("pip install torch==2.13.0 && pip install -e '.[test,validate,export-check]' && "
            "python -m pytest   # install test deps, run tests") in README


def test_a_cpu_only_user_is_told_the_cpu_wheel_index() -> None:
    assert ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
            in README)
    # plain PyPI gives the CUDA build: the README must not claim otherwise
    assert "the CPU build on CPU machines" not in README


def test_what_pulls_triton_is_named_as_the_extras_declare_it() -> None:
    assert "triton" in EXTRAS["export-check"]
    said = re.search(r"`export-check`[^.]*?triton[^.]*?~285 MB", README, re.S)
    assert said, "the README should say export-check pulls triton (~285 MB) on CPU machines"


def test_precision_is_an_input_not_a_searched_axis() -> None:
    opening = README.split("## Set-up", 1)[0]
    knobs = re.search(r"Every plan \((.*?)\)\s+is judged", opening, re.S)
    assert knobs and "bf16" not in knobs.group(1) and "fp8" not in knobs.group(1)
    assert "`training.precision`" in opening and "not searched" in opening
