"""emit: values and operations → LLVM IR, knowing nothing of schedules (scalars, builtins, vector math, the GEMM body)."""
