"""codegen: Schedule → isl AST → LLVM IR → JIT → Kernel (and the driver that runs every stage)."""

from .driver import compile
from .runtime.kernel import Kernel

__all__ = ["Kernel", "compile"]
