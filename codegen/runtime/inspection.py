"""runtime: a Kernel, a stage name and optional sizes → the text of that compilation stage (Kernel.inspect)."""

from __future__ import annotations

from collections.abc import Mapping

from tensorlang.errors import TensorLangError

STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "plan", "loops", "llvm", "asm")


def stage_text(kernel, stage: str, sizes: Mapping[str, int] | None) -> str:
    """The text of one stage of `kernel`; with `sizes`, of the code specialised to them. The
    stages a cache-warm Kernel skipped run here when needed."""
    if stage not in STAGES:
        raise TensorLangError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    if sizes is not None:
        missing = [s for s in kernel.interface.sizes if s not in sizes]
        if missing:
            raise TensorLangError(f"inspect: sizes= lacks {', '.join(missing)}")
        kernel._shapes(sizes)  # sizes the call would reject (ArgumentError) are not planned either
    if stage == "ast":
        return kernel._compiled_stages().syntax_text
    if stage == "ir":
        return str(kernel.program)
    if stage == "scop":
        return str(kernel.scop)
    if stage == "deps":
        return str(kernel.scop.dependences)
    if stage == "schedule":
        return str(kernel.schedule)
    if stage == "graph":
        return kernel.schedule.graph_text()
    plan = kernel._plan(sizes)
    if stage == "plan":
        return str(plan)
    if stage == "loops":
        return plan.loops()
    from ..lowering.jit import assembly_of, optimise
    from ..lowering.lower import lower_to_llvm

    module, _ = lower_to_llvm(plan)
    if stage == "llvm":
        return str(optimise(module, vectorize=plan.vectorize))
    return assembly_of(module)
