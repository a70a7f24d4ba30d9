"""Size budgets (STYLE.md: one module per concern, split a module past ~400 lines): in the cost
model, the search and the commands no function over 80 lines and no module over 400; in tests/ no
module over 450. Counted from the source with ``ast``; a function's lines run from its ``def`` to
its last statement, nested functions included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("costmodel", "search", "tcf_search")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
MAX_TEST_MODULE_LINES = 450


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _test_modules() -> list[Path]:
    return sorted((ROOT / "tests").glob("*.py"))


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                assert child.end_lineno is not None
                yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{name}.")
        else:
            yield from _functions(child, prefix)


def test_the_budgets_see_the_modules_they_guard() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _modules()}
    assert {"costmodel/step.py", "costmodel/compute.py", "search/space.py",
            "tcf_search/nightly.py", "tcf_search/calibration/fit.py"} <= names
    step = ast.parse((ROOT / "costmodel/step.py").read_text())
    assert "evaluate" in dict(_functions(step))
    tests = {path.name for path in _test_modules()}
    assert {"test_code_budgets.py", "conftest.py", "export_helpers.py"} <= tests


def test_no_function_is_over_the_budget() -> None:
    over = [f"{path.relative_to(ROOT)}:{name} ({lines} lines)"
            for path in _modules()
            for name, lines in _functions(ast.parse(path.read_text(), filename=str(path)))
            if lines > MAX_FUNCTION_LINES]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(over)}"


def test_no_module_is_over_the_budget() -> None:
    over = [f"{path.relative_to(ROOT)} ({lines} lines)"
            for path in _modules()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {', '.join(over)}"


def test_no_test_module_is_over_the_budget() -> None:
    """A test module past 450 lines has outgrown one theme: split it by what it guards (as
    test_robust_policy_*, test_export_roundtrip_* and test_export_model_* were), so a reader
    finds a test by its file name and a failure names the theme it broke."""
    over = [f"{path.relative_to(ROOT)} ({lines} lines)"
            for path in _test_modules()
            if (lines := len(path.read_text().splitlines())) > MAX_TEST_MODULE_LINES]
    assert not over, f"test modules over {MAX_TEST_MODULE_LINES} lines: {', '.join(over)}"
