"""lowering: LLVM IR module → optimised machine code for the host CPU, loaded in-process."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
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
    """A JIT-compiled module; `entry` is the address of tl_kernel. Keep it alive while used."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef
    entry: ctypes._CFuncPtr
    optimised_ir: str  # the module as optimised, before machine-code generation rewrote it


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


def jit(module: ll.Module, vectorize: bool = True) -> MachineCode:
    with _lock:
        ref = optimise(module, vectorize=vectorize)
        text = str(ref)
        # the engine takes ownership of its target machine, so it gets a fresh one
        engine = llvm.create_mcjit_compiler(ref, new_target_machine())
        engine.finalize_object()
        address = engine.get_function_address("tl_kernel")
    return MachineCode(engine, ref, KERNEL_SIGNATURE(address), text)


def assembly_of(module: ll.Module) -> str:
    with _lock:
        return target_machine().emit_assembly(optimise(module))
