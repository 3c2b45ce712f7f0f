"""codegen: Schedule → isl AST → LLVM IR → JIT → Kernel (and the driver that runs every stage)."""

__all__ = ["Kernel", "compile"]


def __getattr__(name: str):
    # loaded on first use, so that `import codegen.<room>` stays as light as that room
    if name == "compile":
        from .driver import compile

        return compile
    if name == "Kernel":
        from .runtime.kernel import Kernel

        return Kernel
    raise AttributeError(f"module 'codegen' has no attribute {name!r}")
