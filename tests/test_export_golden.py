"""Golden files: every format x every example plan renders exactly the checked-in text, or is
refused with exactly the checked-in reasons. Regenerate after an intended change with
``TCF_UPDATE_GOLDEN=1 pytest tests/test_export_golden.py`` and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from search.inputs.planfile import load_plan_file
from tcf_search.export import FORMATS, ExportOptions, ExportRefused, render

GOLDEN = Path(__file__).parent / "golden" / "export"
PLANS = sorted((GOLDEN / "plans").glob("*.yaml"))
VARIANTS = [(fmt, None) for fmt in FORMATS] + [("torchtitan", "0.2"), ("nanotron", "0.4")]
UPDATE = os.environ.get("TCF_UPDATE_GOLDEN") == "1"


def _rendered(plan: Path, fmt: str, version: str | None) -> dict[str, str]:
    try:
        return render(fmt, load_plan_file(plan), ExportOptions(target_version=version))
    except ExportRefused as e:
        return {"REFUSED.txt": "\n".join(e.reasons) + "\n"}


def test_example_plans_exist() -> None:
    assert {p.stem for p in PLANS} >= {"dense70b", "fsdp8b", "moe_ep", "pp8b"}


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize(("fmt", "version"), VARIANTS,
                         ids=[f"{f}@{v}" if v else f for f, v in VARIANTS])
def test_golden(plan: Path, fmt: str, version: str | None) -> None:
    folder = GOLDEN / plan.stem / (f"{fmt}@{version}" if version else fmt)
    files = _rendered(plan, fmt, version)
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in files.items():
            (folder / name).write_text(text)
    expected = {p.name: p.read_text() for p in folder.iterdir()}
    assert sorted(files) == sorted(expected)
    for name, text in files.items():
        assert text == expected[name], f"{folder / name} differs; see the module docstring"


def test_every_example_plan_exports_somewhere_and_is_refused_somewhere() -> None:
    # The examples are chosen to exercise both paths; a rule change that accepts or refuses
    # everything shows up here before it shows up as a wall of golden diffs.
    for plan in PLANS:
        refused = ["REFUSED.txt" in _rendered(plan, f, v) for f, v in VARIANTS]
        assert any(refused) and not all(refused), plan.stem


def test_megatron_fp8_recipe_switches_become_flags() -> None:
    import dataclasses

    pf = load_plan_file(GOLDEN / "plans" / "dense70b.yaml")
    plain = render("megatron", pf, ExportOptions())["megatron.sh"]
    assert "--fp8-param-gather" not in plain and "--grad-reduce-in-bf16" not in plain
    fp8 = dataclasses.replace(pf, training=dataclasses.replace(
        pf.training.with_switches(fp8_param_gather=True, grad_dtype_bytes=2), precision="fp8"))
    script = render("megatron", fp8, ExportOptions())["megatron.sh"]
    assert "--fp8-format hybrid" in script
    assert "--fp8-param-gather" in script and "--grad-reduce-in-bf16" in script
