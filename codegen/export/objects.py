"""export: kernel module + GEMM bodies → one optimised, self-contained relocatable object (and a shared library when a linker exists)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import llvmlite.ir as ll

from tensorlang.errors import TensorLangError

from ..emit.gemm_kernel import define_gemm
from ..host import host_cpu_features, host_cpu_name
from ..host.cpu import initialise_llvm
from ..lowering.jit import _lock


def object_target_machine() -> llvm.TargetMachine:
    """The host CPU with all its features, as the JIT uses, but position-independent: the object
    may be linked into a shared library (the JIT's machine uses the JIT code model)."""
    initialise_llvm()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=host_cpu_name(), features=host_cpu_features(), opt=3, reloc="pic", codemodel="default"
    )


def _parse(module: ll.Module, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    ref = llvm.parse_assembly(str(module))
    ref.verify()
    return ref


def build_object(
    module: ll.Module, gemm_dtypes: tuple[str, ...], public: tuple[str, ...], vectorize: bool
) -> bytes:
    """Machine code of `module` with the GEMM bodies it calls defined inside (the JIT instead
    links every kernel to one process-wide copy, which an object cannot reference). Every
    function and global but `public` becomes internal, so that several exported kernels link
    into one program without clashing (tl_kernel, tl_phase0, tl_gemm_f32 ...)."""
    with _lock:  # LLVM's pass managers are not thread-safe (the JIT holds the same lock)
        tm = object_target_machine()
        ref = _parse(module, tm)
        for dtype in gemm_dtypes:
            gemm = ll.Module(name=f"gemm_{dtype}")
            define_gemm(gemm, dtype)
            ref.link_in(_parse(gemm, tm))
        for fn in ref.functions:
            if not fn.is_declaration and fn.name not in public:
                fn.linkage = "internal"
        for g in ref.global_variables:
            if not g.is_declaration:
                g.linkage = "internal"
        ref.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = vectorize
        tuning.slp_vectorization = vectorize
        tuning.loop_unrolling = True
        builder = llvm.create_pass_builder(tm, tuning)
        builder.getModulePassManager().run(ref, builder)
        return tm.emit_object(ref)


def linker_command() -> list[str] | None:
    """A C compiler driver that links shared libraries: the system `cc`, else the `ziglang`
    wheel's bundled clang/lld (optional), else None."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc:
        return [cc]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "cc"]
    return None


def link_shared(obj: Path, target: Path) -> bool:
    """Link `obj` into the shared library `target` against libm; False when no linker exists."""
    command = linker_command()
    if command is None:
        return False
    done = subprocess.run(
        [*command, "-shared", "-o", str(target), str(obj), "-lm"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise TensorLangError(f"linking {target.name} failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return True
