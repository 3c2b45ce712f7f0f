"""lowering: LLVM IR module → optimised machine code for the host CPU, loaded in-process."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ll

from ..host import host_cpu_features, host_cpu_name
from ..host.cpu import initialise_llvm

_lock = threading.Lock()  # LLVM's JIT and pass managers are not thread-safe
if hasattr(os, "register_at_fork"):  # a forked child must not inherit it held by another thread
    os.register_at_fork(after_in_child=_lock._at_fork_reinit)


@functools.cache
def target_machine(opt: int = 3) -> llvm.TargetMachine:
    """The shared host target machine (for passes and assembly; never given to an engine)."""
    return new_target_machine(opt)


def new_target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A target machine for the host CPU with all its features (AVX-512 where present)."""
    initialise_llvm()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=host_cpu_name(),
        features=host_cpu_features(),
        opt=opt,
        reloc="default",
        codemodel="jitdefault",
    )


def optimise(module: ll.Module, opt: int = 3, vectorize: bool = True) -> llvm.ModuleRef:
    """Parse, verify and run LLVM's O3 pipeline (loop and SLP vectorisers on)."""
    tm = target_machine()
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    ref = llvm.parse_assembly(str(module))
    ref.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=opt)
    tuning.loop_vectorization = vectorize
    tuning.slp_vectorization = vectorize
    tuning.loop_unrolling = True
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(ref, builder)
    return ref


@dataclass
class MachineCode:
    """A JIT-compiled module; `entry` is the address of tl_kernel. Keep it alive while used.
    `object_code` is the object file the engine loaded (what the disk cache stores)."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef
    entry: ctypes._CFuncPtr
    ir_text: str | Callable[[], str]  # the optimised module, or how to rebuild it (a cache hit)
    object_code: bytes | None = None

    @functools.cached_property
    def optimised_ir(self) -> str:
        """The module as optimised, before machine-code generation rewrote it."""
        return self.ir_text if isinstance(self.ir_text, str) else self.ir_text()


# tl_kernel(buffers, params, error, phase, lo, hi, workspace, cancel); ctypes releases the GIL during
# the call, so several Python threads can run iterations of a parallel phase at once; the generated
# code returns ERROR_CANCELLED soon after another thread sets the i32 word at `cancel`
KERNEL_SIGNATURE = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_void_p,  # i8** buffers
    ctypes.c_void_p,  # i64* params
    ctypes.c_void_p,  # i64* error
    ctypes.c_int64,  # phase
    ctypes.c_int64,  # lo
    ctypes.c_int64,  # hi
    ctypes.c_void_p,  # i8* workspace (one per thread)
    ctypes.c_void_p,  # i32* cancel (one per call)
)


def compile_module(ref: llvm.ModuleRef) -> tuple[llvm.ExecutionEngine, bytes]:
    """An engine holding the (optimised) module's machine code, and that code as an object
    file. Call with `_lock` held."""
    objects = []
    # the engine takes ownership of its target machine, so it gets a fresh one
    engine = llvm.create_mcjit_compiler(ref, new_target_machine())
    engine.set_object_cache(notify_func=lambda _module, data: objects.append(data))
    engine.finalize_object()
    return engine, b"".join(objects[-1:])


def load_object(data: bytes) -> tuple[llvm.ExecutionEngine, llvm.ModuleRef]:
    """An engine holding an object file written by `compile_module` (its external symbols, the
    shared GEMM bodies, must be published first). Call with `_lock` held; raises RuntimeError
    when LLVM cannot load it."""
    initialise_llvm()
    empty = llvm.parse_assembly("")
    tm = new_target_machine()
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(data))
    engine.finalize_object()
    return engine, empty


def cached_functions(
    kind: str, parts: dict[str, object], define: Callable[[ll.Module], object], names: tuple[str, ...]
) -> tuple[llvm.ExecutionEngine, llvm.ModuleRef, dict[str, int]]:
    """The addresses of the functions `names` of a module that `define` fills: its machine code
    from the disk cache (keyed by `kind`, `parts` and the compiler), else compiled and stored
    there. Keep the engine and the module alive while the functions are used."""
    from . import disk_cache

    key = disk_cache.cache_key(kind, **parts)
    cached = disk_cache.load(key)
    if cached is not None:
        try:
            with _lock:
                engine, ref = load_object(cached[0])
                addresses = {n: engine.get_function_address(n) for n in names}
            if all(addresses.values()):
                return engine, ref, addresses
        except RuntimeError:  # LLVM rejected it: compile and overwrite
            pass
    module = ll.Module(name=kind)
    define(module)
    with _lock:
        ref = optimise(module)
        engine, data = compile_module(ref)
        addresses = {n: engine.get_function_address(n) for n in names}
    if data:
        disk_cache.store(key, data, {"kind": kind})
    return engine, ref, addresses


def jit(module: ll.Module, vectorize: bool = True) -> MachineCode:
    with _lock:
        ref = optimise(module, vectorize=vectorize)
        text = str(ref)
        engine, data = compile_module(ref)
        address = engine.get_function_address("tl_kernel")
    return MachineCode(engine, ref, KERNEL_SIGNATURE(address), text, data or None)


def jit_object(data: bytes, ir_text: Callable[[], str]) -> MachineCode:
    """Machine code from a cached object file holding tl_kernel (RuntimeError if unusable)."""
    with _lock:
        engine, module = load_object(data)
        address = engine.get_function_address("tl_kernel")
    if not address:
        raise RuntimeError("the object code defines no tl_kernel")
    return MachineCode(engine, module, KERNEL_SIGNATURE(address), ir_text, data)


def assembly_of(module: ll.Module) -> str:
    with _lock:
        return target_machine().emit_assembly(optimise(module))
