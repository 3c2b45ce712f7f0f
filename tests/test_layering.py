"""Imports flow one way (tensorlang → polyhedral → scheduler → codegen, and between codegen's rooms) and modules say their stage."""

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

# Inside codegen, rooms import one way too: host ← emit (IR emitters that know nothing of
# schedules); host ← planning (isl AST planning, no LLVM); lowering imports planning, emit and
# host; export (ahead-of-time objects and C headers) imports lowering, planning, emit and host;
# the runtime (Kernel, thread pool, arguments), the tuner and the top-level modules (driver, the
# public Options, aot: "top") import anything. The GPU back end (gpu: grid mapping, NVPTX
# lowering, PTX, CudaKernel) imports lowering and what it imports, the runtime's interface and "top".
CODEGEN_ROOMS = ("host", "emit", "planning", "lowering", "export", "runtime", "tune", "gpu")
ROOM_MAY_IMPORT = {
    "host": {"host"},
    "emit": {"emit", "host"},
    "planning": {"planning", "host"},
    "lowering": {"lowering", "planning", "emit", "host"},
    "export": {"export", "lowering", "planning", "emit", "host"},
    "runtime": {*CODEGEN_ROOMS, "top"},
    "tune": {*CODEGEN_ROOMS, "top"},
    "gpu": {"gpu", "lowering", "planning", "emit", "host", "runtime", "top"},
    "top": {*CODEGEN_ROOMS, "top"},
}
ROOM_MUST_NOT_IMPORT = {"planning": {"llvmlite"}}  # outside codegen


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the module, relative ones resolved
    (`from ..emit import values` in codegen/lowering/x.py → codegen.emit.values)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _codegen_room(module: str) -> str | None:
    """The room of a module of codegen ("top" for codegen's top-level modules), None outside codegen."""
    parts = module.split(".")
    if parts[0] != "codegen":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in CODEGEN_ROOMS else "top"


def codegen_layering_violations(path: Path, source: str) -> list[str]:
    rel = str(path.relative_to(ROOT))
    room = _codegen_room(_module_name(path))
    bad = []
    for line, target in _imported_modules(ast.parse(source), path):
        target_room = _codegen_room(target)
        if target_room is None:
            if target.split(".")[0] in ROOM_MUST_NOT_IMPORT.get(room, ()):
                bad.append(f"{rel}:{line}: the {room} room imports {target}, which it must not use")
        elif target_room not in ROOM_MAY_IMPORT[room]:
            allowed = ", ".join(sorted(ROOM_MAY_IMPORT[room]))
            bad.append(
                f"{rel}:{line}: the {room} room imports {target} (room {target_room}); "
                f"{room} may import only {allowed}"
            )
    return bad


@pytest.mark.parametrize("path", [p for pkg, p in _modules() if pkg == "codegen"], ids=lambda x: str(x))
def test_codegen_rooms_import_one_way(path: Path) -> None:
    bad = codegen_layering_violations(path, path.read_text())
    assert not bad, "codegen's rooms import against their direction:\n" + "\n".join(bad)


def test_codegen_layering_resolves_relative_imports() -> None:
    """The checker itself: relative imports count, whatever their depth."""
    lowering = ROOT / "codegen" / "lowering" / "abi.py"
    assert codegen_layering_violations(lowering, "from ..emit import values\nfrom .jit import jit\n") == []
    assert codegen_layering_violations(lowering, "from ..runtime import arguments\n")
    assert codegen_layering_violations(lowering, "from .. import kernel\n")
    emit = ROOT / "codegen" / "emit" / "__init__.py"
    assert codegen_layering_violations(emit, "from ..lowering.jit import jit\n")
    assert codegen_layering_violations(emit, "from .values import I64\nfrom ..host import cache_size\n") == []
    planning = ROOT / "codegen" / "planning" / "plan.py"
    assert codegen_layering_violations(planning, "import llvmlite.ir as ll\n")
    assert codegen_layering_violations(planning, "from codegen.emit import values\n")


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
