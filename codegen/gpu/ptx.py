"""gpu: NVPTX LLVM IR module → optimised module (libdevice linked where needed) → PTX text.

Math: the builtins with an inline implementation in codegen.emit (exp, log, tanh, expm1,
log1p, ... and the `special` functions built on them) need nothing. What NVPTX cannot select
(`llvm.exp`, `llvm.sin`, `llvm.pow`, ... and the libm calls such as `erff`) is renamed to
libdevice's `__nv_*` functions; when a module calls any, libdevice (`libdevice.10.bc`, shipped by
the `nvidia-cuda-nvcc` wheel, or TENSORLANG_LIBDEVICE / CUDA_HOME) is linked in, its functions
made internal and the unused ones dropped by the O3 pipeline; NVPTX's own NVVMReflect pass
resolves its `__nvvm_reflect` queries (no flush-to-zero).
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import sysconfig

import llvmlite.binding as llvm
import llvmlite.ir as ll

from tensorlang.errors import TensorLangError

from ..emit.builtins import LIBM_SYMBOLS
from ..lowering.jit import _lock
from .lower import DATA_LAYOUT, TRIPLE

DEFAULT_ARCH = "sm_90"
_ARCH = re.compile(r"sm_\d{2,3}a?")

# LLVM intrinsics that NVPTX does not select (they would become libm calls), by base name
_UNSELECTABLE = (
    "exp", "exp2", "exp10", "log", "log2", "log10", "pow", "sin", "cos", "tan", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh",
)  # fmt: skip
_INTRINSIC_CALL = re.compile(r'@"?llvm\.(' + "|".join(_UNSELECTABLE) + r')\.(f32|f64)"?(?=\()')
# libm functions with a libdevice counterpart of the same name (lgamma_r and sincos have none)
_LIBM = sorted(s for s in LIBM_SYMBOLS if not s.startswith(("lgamma", "sincos")))
_LIBM_CALL = re.compile(r'@"?(' + "|".join(map(re.escape, _LIBM)) + r')"?(?=\()')


def check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise TensorLangError(f"unknown CUDA architecture {arch!r}: expected sm_<NN> such as sm_80 or sm_90")
    return arch


@functools.cache
def _initialise() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@functools.cache
def target_machine(arch: str) -> llvm.TargetMachine:
    _initialise()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=3)


def new_calling_convention() -> bool:
    """LLVM 20 and later mark kernels with the ptx_kernel calling convention (else metadata)."""
    return llvm.llvm_version_info[0] >= 20


def _site_nvidia() -> list[pathlib.Path]:
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [pathlib.Path(r) / "nvidia" for r in sorted(roots) if (pathlib.Path(r) / "nvidia").is_dir()]


@functools.cache
def libdevice_path() -> pathlib.Path | None:
    """libdevice.10.bc: TENSORLANG_LIBDEVICE, the nvidia-cuda-nvcc wheel, or CUDA_HOME."""
    given = os.environ.get("TENSORLANG_LIBDEVICE")
    if given:
        return pathlib.Path(given) if pathlib.Path(given).is_file() else None
    for base in _site_nvidia():
        hits = sorted(base.rglob("libdevice.10.bc"))
        if hits:
            return hits[0]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (pathlib.Path(home) / "nvvm/libdevice/libdevice.10.bc").is_file():
        return pathlib.Path(home) / "nvvm/libdevice/libdevice.10.bc"
    return None


@functools.cache
def ptxas_path() -> str | None:
    """ptxas from the nvidia-cuda-nvcc wheel (or CUDA_HOME), for validating PTX without a GPU."""
    for base in _site_nvidia():
        hits = sorted(p for p in base.rglob("ptxas") if p.is_file())
        if hits:
            return str(hits[0])
    home = os.environ.get("CUDA_HOME")
    if home and (pathlib.Path(home) / "bin/ptxas").is_file():
        return str(pathlib.Path(home) / "bin/ptxas")
    return None


@functools.cache
def _libdevice_bitcode() -> bytes:
    path = libdevice_path()
    if path is None:
        raise TensorLangError(
            "the cuda target needs libdevice for this kernel's math functions: "
            "pip install 'tensorlang[cuda-tools]' (the nvidia-cuda-nvcc wheel) or set TENSORLANG_LIBDEVICE"
        )
    return path.read_bytes()


def libdevice_text(ir_text: str) -> str:
    """The module's text with unselectable intrinsics and libm calls renamed to libdevice's."""

    def intrinsic(m: re.Match) -> str:
        return f"@__nv_{m.group(1)}{'f' if m.group(2) == 'f32' else ''}"

    ir_text = _INTRINSIC_CALL.sub(intrinsic, ir_text)
    return _LIBM_CALL.sub(lambda m: f"@__nv_{m.group(1)}", ir_text)


def optimise(module: ll.Module, arch: str = DEFAULT_ARCH) -> llvm.ModuleRef:
    """Parse, verify, link libdevice if the module calls it, and run the O3 pipeline."""
    tm = target_machine(check_arch(arch))
    ref = llvm.parse_assembly(libdevice_text(str(module)))
    ref.verify()
    needed = [f.name for f in ref.functions if f.is_declaration and f.name.startswith("__nv_")]
    if needed:
        lib = llvm.parse_bitcode(_libdevice_bitcode())
        lib.triple = TRIPLE
        lib.data_layout = DATA_LAYOUT
        ref.link_in(lib)
        for f in ref.functions:
            if f.name.startswith("__nv") and not f.is_declaration:
                f.linkage = llvm.Linkage.internal
    unknown = sorted(
        f.name
        for f in ref.functions
        if f.is_declaration and not f.name.startswith(("llvm.", "__nvvm_reflect")) and f.name
    )
    if unknown:
        raise TensorLangError(f"the cuda target cannot call {', '.join(unknown)} (no GPU implementation)")
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = False
    tuning.slp_vectorization = False
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(ref, builder)
    return ref


def emit_ptx(module: ll.Module, arch: str = DEFAULT_ARCH) -> str:
    """The PTX text of an NVPTX module for `arch` (`.target` line included)."""
    with _lock:
        ref = optimise(module, arch)
        return target_machine(arch).emit_assembly(ref)


def optimised_ir(module: ll.Module, arch: str = DEFAULT_ARCH) -> str:
    with _lock:
        return str(optimise(module, arch))
