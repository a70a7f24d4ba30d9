"""The layers, held: imports run one way, costmodel <- hardware_catalog <- search <- the
tcf_search commands <- tcf_search/cli.py. A lower layer never imports a higher one, not even
inside a function (read from the source), and importing a layer loads nothing above it (read
from ``sys.modules`` in a fresh interpreter)."""

from __future__ import annotations

import ast
import importlib
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


# ---- within the layers: the search's two rooms, their faces, and no circle -----------------

INPUTS = "search.inputs"


def _modules() -> dict[str, Path]:
    out = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            name = module_name(path)
            out[name.removesuffix(".__init__")] = path
    return out


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a module imports anywhere in its source (inside functions and under
    TYPE_CHECKING too): ``from P import m`` counts as importing ``P.m`` where that is a module,
    and a package imported by its own submodule (initialised first anyway) does not count."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = subs + ([base] if len(subs) < len(node.names) else [])
        else:
            continue
        out |= {t for t in targets
                if t in modules and t != name and not name.startswith(t + ".")}
    return out


def test_no_import_circle() -> None:
    """No module reaches itself through the modules it imports (Tarjan's strongly connected
    components of the import graph, every import in the source counted)."""
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                circles.append(sorted([v, *part]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(", ".join(c) for c in circles)


def test_the_inputs_sit_below_the_search() -> None:
    """search.inputs (the readers of what users hand the tool) imports none of the search's own
    modules; the search reads user input only through it."""
    modules = _modules()
    inward = [f"{name} imports {target}"
              for name, path in modules.items() if name.startswith(INPUTS)
              for target in _edges(name, path, modules)
              if target.startswith("search") and not target.startswith(INPUTS)]
    assert not inward, "\n".join(inward)


def test_the_commands_import_the_search_by_its_faces() -> None:
    """tcf_search imports ``search`` and ``search.inputs``, never one of their modules."""
    deep = [f"{path.relative_to(ROOT)}:{line} imports {name}"
            for path in sorted((ROOT / "tcf_search").rglob("*.py"))
            for line, name in project_imports(path)
            if name.split(".")[0] == "search" and name not in ("search", INPUTS)]
    assert not deep, "deep imports of the search:\n" + "\n".join(deep)


def test_the_search_face_lists_what_it_serves() -> None:
    import search

    homes = search._MODULE_OF  # type: ignore[attr-defined]
    assert sorted(search.__all__) == sorted(homes)
    for name, module in homes.items():
        assert getattr(search, name) is getattr(importlib.import_module(f"search.{module}"), name)
    import search.inputs as inputs

    assert all(hasattr(inputs, name) for name in inputs.__all__)
