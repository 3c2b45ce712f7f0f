"""tensorlang: a polyhedral compiler for Tensor Comprehensions-style tensor programs.

The front end (this package) turns source text into a checked `ir.Program`; `compile` and
`Kernel` and `Options` come from `codegen` (the most downstream stage) and are re-exported lazily, the one
sanctioned upward reference.
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
    "compile",
]


def __getattr__(name: str):
    if name in ("compile", "Kernel", "Options"):
        from codegen import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'tensorlang' has no attribute {name!r}")
