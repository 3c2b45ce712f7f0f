"""host: the machine code is generated for → CPU features, cache sizes and the GEMM blocking they imply.

The one place below every other room of `codegen/` where facts about the host are read, so that
tests (golden files) and, later, cross-compilation can pin them.
"""

from .blocking import (
    GemmBlocking,
    check_gemm_blocking,
    gemm_blocking,
    gemm_variant,
    gemm_workspace_layout,
    variant_blocking,
    workspace_bytes,
)
from .cpu import cache_size, host_cpu_features, host_cpu_name, host_has_avx512

__all__ = [
    "GemmBlocking",
    "cache_size",
    "check_gemm_blocking",
    "gemm_blocking",
    "gemm_variant",
    "gemm_workspace_layout",
    "host_cpu_features",
    "host_cpu_name",
    "host_has_avx512",
    "variant_blocking",
    "workspace_bytes",
]
