"""codegen: Schedule → isl AST → LLVM IR → JIT → Kernel (and the driver that runs every stage)."""

from .driver import compile
from .kernel import Kernel

__all__ = ["Kernel", "compile"]
