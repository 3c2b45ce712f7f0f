"""lowering: KernelPlan → MachineCode + KernelLayout, loaded from the disk cache or lowered, compiled and stored."""

from __future__ import annotations

from dataclasses import dataclass

from ..planning.plan import KernelPlan
from . import disk_cache
from .abi import KernelLayout, kernel_layout
from .gemm_jit import shared_gemm
from .jit import MachineCode, _lock, jit, jit_object, optimise
from .lower import lower_to_llvm


def plan_cache_key(plan: KernelPlan) -> str:
    """The disk-cache key of a plan's machine code: its text (which names its sizes, phases,
    storage and the fast-math and vectorize flags), the program's text (its dtypes), and the
    environment (CPU, versions, codegen's sources: disk_cache.environment)."""
    return disk_cache.cache_key(
        "kernel",
        plan=str(plan),
        program=str(plan.program),
        fast_math=plan.fast_math,
        vectorize=plan.vectorize,
    )


def _layout_text(layout: KernelLayout) -> str:
    return repr(layout)


@dataclass(frozen=True)
class Built:
    """A plan's machine code, its layout, its disk-cache key and whether it came from there."""

    code: MachineCode
    layout: KernelLayout
    key: str
    from_disk: bool


def build(plan: KernelPlan) -> Built:
    """Machine code for the plan. The GEMM bodies its contractions call are published first
    (they are external symbols of the kernel's object code). Raises what lowering or LLVM raise
    (isl.Error, RuntimeError)."""
    for contraction in plan.contractions.values():  # GEMM bodies: compiled once per process
        shared_gemm(plan.gemm_variant(plan.program.tensor(contraction.c.tensor).dtype.numpy_name))
    key = plan_cache_key(plan)
    layout = kernel_layout(plan.scop)
    entry = disk_cache.load(key)
    if entry is not None:
        data, meta = entry
        if meta.get("kind") == "kernel" and meta.get("layout") == _layout_text(layout):
            try:
                return Built(jit_object(data, lambda: optimised_text(plan)), layout, key, True)
            except RuntimeError:  # LLVM rejected it: compile and overwrite
                pass
    module, layout = lower_to_llvm(plan)
    code = jit(module, vectorize=plan.vectorize)
    if code.object_code:
        disk_cache.store(
            key,
            code.object_code,
            {
                "kind": "kernel",
                "name": plan.program.name,
                "entry": "tl_kernel",
                "layout": _layout_text(layout),
                "sizes": dict(plan.sizes) if plan.sizes is not None else None,
            },
        )
    return Built(code, layout, key, False)


def optimised_text(plan: KernelPlan) -> str:
    """The optimised module of a plan whose machine code came from the disk cache (inspection)."""
    module, _ = lower_to_llvm(plan)
    with _lock:
        return str(optimise(module, vectorize=plan.vectorize))
