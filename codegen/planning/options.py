"""planning: the user's Options → CodegenOptions, the knobs that plan_kernel and the lowering read."""

from __future__ import annotations

from dataclasses import dataclass

THREAD_SPLITS = (None, "serial")


def check_thread_split(value: object) -> str | None:
    """Options.thread_split validated (ValueError otherwise)."""
    if value in THREAD_SPLITS and not isinstance(value, bool):
        return value
    raise ValueError(f"Options.thread_split must be None or 'serial', got {value!r}")


@dataclass(frozen=True)
class CodegenOptions:
    """What the call-time pipeline may do (the scheduler's knobs are scheduler.ScheduleOptions).

    vectorize: LLVM's loop and SLP vectorisers.
    fast_math: floating-point reassociation everywhere (changes rounding).
    pipeline: row pipelining of fused row loops.
    prefetch: prefetch the next outer iteration's rows.
    specialize: plan per set of sizes (False: one generic plan for every size).
    optimize: False plans the untransformed reference (no GEMM path, contraction or pipelining).
    vector_width: the vector register width in bits (128, 256, 512) the vectorisers may use
        (None: the target's preference).
    gemm_blocking: (MC, NC, KC) cache blocks of the GEMM calls (None: the host's, host.blocking).
    direct_conv: run convolution-shaped contractions as direct convolutions, not GEMM calls.
    fold: store temporaries modulo their dependence distance where exactly legal (planning/folding.py).
    thread_split: None (the plan's split of each phase) or "serial" (every phase on one thread).
    """

    vectorize: bool = True
    fast_math: bool = False
    pipeline: bool = True
    prefetch: bool = False
    specialize: bool = True
    optimize: bool = True
    vector_width: int | None = None
    gemm_blocking: tuple[int, int, int] | None = None
    direct_conv: bool = True
    fold: bool = True
    thread_split: str | None = None
