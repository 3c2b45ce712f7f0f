"""lowering: KernelPlan → LLVM IR module → machine code (the JIT)."""
