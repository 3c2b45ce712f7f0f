"""gpu: KernelPlan → a CUDA grid per phase → NVPTX IR → PTX → launches through the CUDA driver API (the target="cuda" back end)."""
