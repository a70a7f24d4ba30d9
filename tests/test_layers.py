"""The layers, held: imports run one way, costmodel <- hardware_catalog <- search <- the
tcf_search commands <- tcf_search/cli.py. A lower layer never imports a higher one, not even
inside a function (read from the source), and importing a layer loads nothing above it (read
from ``sys.modules`` in a fresh interpreter)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("costmodel", "hardware_catalog", "search", "tcf_search")
CLI = ("tcf_search.cli", "tcf_search.__main__")


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of a project package in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in LAYERS]
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("layer", LAYERS)
def test_no_module_imports_a_higher_layer(layer: str) -> None:
    rank = LAYERS.index(layer)
    upward = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        me = module_name(path)
        for line, name in project_imports(path):
            top = name.split(".")[0]
            if LAYERS.index(top) > rank:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif name.startswith(CLI) and me not in CLI:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports the CLI ({name})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_importing_a_layer_loads_nothing_above_it(layer: str) -> None:
    modules = sorted(module_name(p) for p in (ROOT / layer).rglob("*.py")
                     if p.name != "__main__.py")
    above = LAYERS[LAYERS.index(layer) + 1:]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {above!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"importing {layer} loaded {out.stdout.strip()}"
