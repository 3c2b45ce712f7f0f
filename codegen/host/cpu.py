"""host facts: the running CPU → its name, features (AVX-512 or not) and cache sizes."""

from __future__ import annotations

import functools

import llvmlite.binding as llvm

from scheduler.machine import cache_size  # the scheduler's tiling model reads the same caches

__all__ = ["cache_size", "host_cpu_features", "host_cpu_name", "host_has_avx512", "initialise_llvm"]


@functools.cache
def initialise_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def host_has_avx512() -> bool:
    """True when the host CPU has AVX-512F (512-bit vectors, vscalef, mask registers)."""
    initialise_llvm()
    try:
        return bool(llvm.get_host_cpu_features().get("avx512f", False))
    except RuntimeError:  # host features unknown to LLVM: assume the portable code
        return False


@functools.cache
def host_cpu_name() -> str:
    initialise_llvm()
    return llvm.get_host_cpu_name()


@functools.cache
def host_cpu_features() -> str:
    """LLVM's feature string for the host, preferring 512-bit vectors where AVX-512 exists (the
    host tuning prefers 256 bits, which halves our vector loops)."""
    initialise_llvm()
    return llvm.get_host_cpu_features().flatten() + (",-prefer-256-bit" if host_has_avx512() else "")
