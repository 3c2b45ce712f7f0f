"""gpu: KernelPlan → a CUDA grid per phase → NVPTX IR → PTX (the `target="cuda"` back end)."""
