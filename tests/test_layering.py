"""Imports flow one way (tensorlang → polyhedral → scheduler → codegen) and modules say their stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tensorlang", "polyhedral", "scheduler", "codegen")
# What each package must not import (at any depth of the module).
FORBIDDEN = {
    "tensorlang": {"islpy", "llvmlite", "polyhedral", "scheduler", "codegen"},
    "polyhedral": {"llvmlite", "scheduler", "codegen"},
    "scheduler": {"llvmlite", "codegen"},
    "codegen": set(),
}
# The one sanctioned upward reference: tensorlang re-exports compile/Kernel lazily.
ALLOWED = {("tensorlang/__init__.py", "codegen")}


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def _imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(("package", "path"), list(_modules()), ids=lambda x: str(x))
def test_imports_flow_one_way(package: str, path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text())
    bad = {root for root in _imported_roots(tree) & FORBIDDEN[package] if (rel, root) not in ALLOWED}
    assert not bad, f"{rel} imports {sorted(bad)}, against the pipeline's direction"


@pytest.mark.parametrize(("package", "path"), list(_modules()), ids=lambda x: str(x))
def test_module_docstring_names_its_stage(package: str, path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.relative_to(ROOT)} has no module docstring"
    first = doc.splitlines()[0]
    assert ":" in first, f"{path.relative_to(ROOT)}: first docstring line should read 'stage: input → output'"


def test_only_codegen_imports_llvmlite() -> None:
    for package, path in _modules():
        if package != "codegen":
            assert "llvmlite" not in _imported_roots(ast.parse(path.read_text())), path
