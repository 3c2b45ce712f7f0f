"""lowering: tl_gemm_<dtype> IR → JIT-compiled machine code, compiled once per process (or loaded from the disk cache) and shared by every kernel."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ..emit.gemm_kernel import cancellable_gemm_symbol, define_gemm, gemm_symbol
from ..host import GemmBlocking, variant_blocking
from . import disk_cache
from .jit import _lock, compile_module, load_object, optimise


def gemm_signature(dtype: str):
    dtype = dtype.partition("@")[0]  # a variant (host.gemm_variant) has its dtype's signature
    ctype = ctypes.c_float if dtype == "float32" else ctypes.c_double
    ptr = ctypes.POINTER(ctype)
    i64 = ctypes.c_int64
    return ctypes.CFUNCTYPE(None, i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ctypes.c_void_p)


@dataclass
class CompiledGemm:
    """A JIT-compiled tl_gemm_<dtype>; keep it alive while `fn` is used. `address` is that of
    `fn`, `cancellable` that of tl_gemm_<dtype>_cancellable (the same with an `i32* cancel`)."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef
    fn: ctypes._CFuncPtr
    address: int
    cancellable: int
    object_code: bytes = b""
    from_cache: bool = False


def _addresses(engine: llvm.ExecutionEngine, dtype: str) -> tuple[int, int]:
    return engine.get_function_address(gemm_symbol(dtype)), engine.get_function_address(
        cancellable_gemm_symbol(dtype)
    )


def compile_gemm(dtype: str, cfg: GemmBlocking | None = None) -> CompiledGemm:
    """JIT-compile a module holding only tl_gemm_<dtype> (stand-alone: tests, benchmarks)."""
    module = ir.Module(name=f"gemm_{dtype}")
    define_gemm(module, dtype, cfg)
    with _lock:
        ref = optimise(module)
        engine, data = compile_module(ref)
        address, cancellable = _addresses(engine, dtype)
    return CompiledGemm(engine, ref, gemm_signature(dtype)(address), address, cancellable, data)


def cached_gemm(dtype: str) -> CompiledGemm:
    """tl_gemm_<dtype> with the host's blocking (or a variant's, host.gemm_variant): its object
    code from the disk cache (keyed by dtype, blocking and the environment), else compiled and
    stored there."""
    base, cfg = variant_blocking(dtype)
    extra = {"variant": dtype} if dtype != base else {}  # the default's key is unchanged
    key = disk_cache.cache_key("gemm", dtype=base, blocking=repr(cfg), **extra)
    entry = disk_cache.load(key)
    if entry is not None:
        data, _ = entry
        try:
            with _lock:
                engine, module = load_object(data)
                address, cancellable = _addresses(engine, dtype)
            if address and cancellable:
                fn = gemm_signature(dtype)(address)
                return CompiledGemm(engine, module, fn, address, cancellable, data, from_cache=True)
        except RuntimeError:  # LLVM rejected it: compile and overwrite
            pass
    compiled = compile_gemm(dtype)
    if compiled.object_code:
        disk_cache.store(key, compiled.object_code, {"kind": "gemm", "dtype": dtype})
    return compiled


@functools.cache
def shared_gemm(dtype: str) -> CompiledGemm:
    """Compile tl_gemm_<dtype> once per process (or load it from the disk cache) and publish its
    address to the JIT linker, so every kernel calls the same machine code instead of
    recompiling it (~0.4 s with O3). A variant (host.gemm_variant) is compiled once too."""
    compiled = cached_gemm(dtype)
    llvm.add_symbol(gemm_symbol(dtype), compiled.address)
    llvm.add_symbol(cancellable_gemm_symbol(dtype), compiled.cancellable)
    return compiled
