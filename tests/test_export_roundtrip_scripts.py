"""The launch scripts of every format: each names the release it targets, and every script of
every shipped study's top plans and the golden plans parses (``bash -n``) and passes shellcheck
where it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from export_helpers import exported
from export_plans import PLANS

from search.inputs.planfile import PlanFile, load_plan_file
from tcf_search.export import FORMATS, ExportRefused, render
from tcf_search.export.options import TARGETS


def test_every_format_names_its_default_target() -> None:
    pf = load_plan_file(PLANS / "pp8b.yaml")
    for fmt in TARGETS:
        try:
            files = render(fmt, pf)
        except ExportRefused:
            continue
        script = next(text for name, text in files.items() if name.endswith(".sh"))
        assert f"# {fmt} {TARGETS[fmt][0]} launch" in script
    assert set(TARGETS) | {"slurm"} == set(FORMATS)


def test_every_script_parses_and_passes_shellcheck(plans: dict[str, PlanFile],
                                                   tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    scripts: dict[str, str] = {}
    for fmt in FORMATS:
        for name, _pf, files in exported(plans, fmt):
            scripts |= {f"{name}/{fmt}/{k}": v for k, v in files.items()
                        if k.endswith((".sh", ".sbatch"))}
    for i, (name, text) in enumerate(sorted(scripts.items())):
        path = tmp_path / f"{i}.sh"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, name
        if shellcheck:
            done = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True,
                                  text=True)
            assert done.returncode == 0, f"{name}: {done.stdout}"
    if not shellcheck:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n ran")
