"""Size budgets for the cost model and the search (STYLE.md: one module per concern, split a
module past ~400 lines): no function over 80 lines, no module over 400. Counted from the source
with ``ast``; a function's lines run from its ``def`` to its last statement, nested functions
included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("costmodel", "search")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


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
    assert {"costmodel/step.py", "costmodel/compute.py", "search/space.py"} <= names
    step = ast.parse((ROOT / "costmodel/step.py").read_text())
    assert "evaluate" in dict(_functions(step))


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
