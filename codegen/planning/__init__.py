"""planning: Schedule + sizes → KernelPlan, on the isl AST (islpy only, no LLVM)."""
