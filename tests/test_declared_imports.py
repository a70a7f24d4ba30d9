"""Every third-party module that the packages, the tests and the benchmarks import is declared in
``pyproject.toml`` (a dependency or an extra): a package that happens to be on the machine running
the tests must not stand in for a declaration a fresh machine needs."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("costmodel", "search", "hardware_catalog", "tcf_search")
SCRIPT_DIRS = ("tests", "benchmarks")  # their modules import each other by bare name
GENERATED = ROOT / "tests" / "golden"  # exported launcher files, compared as text, never run
# Calls that import the module named by their first argument.
IMPORTING_CALLS = {"importorskip", "import_module", "find_spec"}
# Import names that differ from their distribution's, for a module not installed here (an
# optional launcher): installed ones are mapped by importlib.metadata.
NOT_INSTALLED_DISTRIBUTIONS = {"megatron": ["megatron-core"], "yaml": ["PyYAML"]}


def normalized(dist: str) -> str:
    """PEP 503 normalization: ``PyYAML`` and ``pyyaml``, ``megatron_core`` and
    ``megatron-core`` are one distribution."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra]
    return {normalized(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}


def sources() -> Iterator[Path]:
    for folder in PACKAGES + SCRIPT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def imported(tree: ast.AST) -> Iterator[str]:
    """Absolute module names imported anywhere in the tree: statements at any depth (inside
    functions and ``try`` too) and ``pytest.importorskip("x")``-style calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORTING_CALLS):
            yield node.args[0].value


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module name -> the files importing it, less the standard library and the
    project's own modules."""
    local = set(PACKAGES) | {p.stem for d in SCRIPT_DIRS for p in (ROOT / d).glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sources():
        for module in imported(ast.parse(path.read_text(), filename=str(path))):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in local or top == "__future__":
                continue
            found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_scan_sees_the_imports_it_must_judge() -> None:
    found = third_party_imports()
    assert {"numpy", "optuna", "pytest", "yaml"} <= set(found)  # plain imports
    assert "psutil" in found  # a test's import
    assert "megatron" in found  # only ever under pytest.importorskip
    assert not {"costmodel", "search", "conftest", "os"} & set(found)


def test_every_third_party_import_is_declared() -> None:
    names = declared()
    dists = packages_distributions()
    undeclared = {}
    for top, files in sorted(third_party_imports().items()):
        providers = dists.get(top) or NOT_INSTALLED_DISTRIBUTIONS.get(top, [top])
        if not {normalized(d) for d in providers} & names:
            undeclared[top] = (sorted(set(providers)), sorted(files)[:3])
    assert not undeclared, (
        "imported but named by no dependency or extra in pyproject.toml (module: "
        "(distributions, files)); a fresh machine has them only if something else pulls them "
        f"in: {undeclared}")
