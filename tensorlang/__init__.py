"""tensorlang: a polyhedral compiler for Tensor Comprehensions-style tensor programs.

The front end (this package) turns source text into a checked `ir.Program`; `compile` and
`Kernel` and `Options` come from `codegen` (the most downstream stage) and are re-exported lazily, the one
sanctioned upward reference. `grad` (autodiff/, front end only) and `tune`/`TuneResult` (codegen/tune/) are loaded lazily too. `__version__` is looked up lazily too (no import of islpy or llvmlite).
"""

from __future__ import annotations

from .dtypes import ScalarType
from .errors import (
    ArgumentError,
    InternalError,
    ParseError,
    SemanticError,
    Span,
    TensorLangError,
    TensorLangWarning,
)

__all__ = [
    "ArgumentError",
    "InternalError",
    "Kernel",
    "Options",
    "ParseError",
    "ScalarType",
    "SemanticError",
    "Span",
    "TensorLangError",
    "TensorLangWarning",
    "TuneResult",
    "cache_info",
    "clear_cache",
    "compile",
    "export",
    "grad",
    "tune",
]


def _version() -> str:
    """The package's version. From a source checkout (a pyproject.toml of project tensorlang next to
    the package), that file's: an editable install's metadata keeps the version it was installed
    with. Otherwise the installed distribution's metadata."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "tensorlang" and isinstance(project.get("version"), str):
            return project["version"]
    from importlib import metadata

    try:
        return metadata.version("tensorlang")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str):
    if name == "grad":  # reverse-mode gradients, a source-to-source transform of the front end
        from .autodiff import grad

        return grad
    if name == "export":  # ahead-of-time export (codegen/aot.py)
        from codegen import aot

        return aot.export
    if name in ("cache_info", "clear_cache"):  # the persistent compilation cache
        from codegen.lowering import disk_cache

        return disk_cache.info if name == "cache_info" else disk_cache.clear
    if name == "_torch_op":  # tensorlang.torch.op (codegen/interop/torch_op.py imports torch)
        from codegen.interop import torch_op

        return torch_op.op
    if name in ("tune", "TuneResult"):  # autotuning (codegen/tune/)
        from codegen.tune import api

        return getattr(api, name)
    if name == "_tune_database":  # `tensorlang tune --list/--export/--import` (codegen/tune/database.py)
        from codegen.tune import database

        return database.Database
    if name in ("compile", "Kernel", "Options"):
        from codegen import driver

        return getattr(driver, name)
    if name == "__version__":
        version = globals()["__version__"] = _version()
        return version
    raise AttributeError(f"module 'tensorlang' has no attribute {name!r}")
