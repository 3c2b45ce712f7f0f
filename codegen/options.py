"""codegen: the user's knobs → Options (public as `tensorlang.Options`), validated once and split by stage.

Each stage reads only its own view: the scheduler `Options.schedule` (scheduler.ScheduleOptions),
the call-time pipeline `Options.codegen` (planning.options.CodegenOptions), and the runtime the
thread count and the specialisation bound. The flat public record keeps `tl.Options(tile=...,
threads=...)` the one thing users write.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from scheduler import ScheduleOptions, default_threads
from tensorlang.errors import TensorLangError

from .host.blocking import check_gemm_blocking
from .lowering.vector_width import check_vector_width
from .planning.options import CodegenOptions, check_thread_split

# tuning knobs (codegen/tune) the repr shows only when set, so that other Options keep their repr
_SHOWN_WHEN_SET = frozenset({"loop_order", "band_tiles", "vector_width", "gemm_blocking", "thread_split"})


@dataclass(frozen=True)
class Options:
    """Compilation options; None means "choose automatically".

    tile: tile sizes for the outermost permutable band (an int applies to every member).
    fusion: "auto" (default), "max" or "none" ("smart" is an alias of "auto").
    unroll: register-tile / unroll factor for the innermost loops.
    vectorize: let LLVM vectorise (loop and SLP vectorisers).
    threads: number of threads for parallel loops (default: TENSORLANG_NUM_THREADS or all cores).
    fast_math: allow floating-point reassociation (changes rounding).
    pipeline: run the last inner loop of a fused row loop one row late, inside the loop before
        it, so that arithmetic and stores of consecutive rows overlap (softmax).
    prefetch: at the top of each iteration of a loop nest's outer loop, prefetch the rows the
        next iteration reads. Off by default: on the machines measured it did not help (README).
    specialize: generate code for the concrete sizes of each call (cached per shape).
    max_specializations: how many sets of sizes a kernel keeps machine code for (64). Past it,
        the least recently called is evicted and its machine code freed once no running call
        uses it; calling that size again compiles again (`Kernel.compile_count` counts it).
    optimize: False runs the statements in source order with no scheduling, post-passes,
        contraction path or threads: the untransformed reference that transformations are
        differential-tested against.
    tuned: use the tuning database's best options (`tl.tune`, codegen/tune/) for each call's
        sizes, dtypes, machine and thread count when it has a record; False ignores the database.
        A record applies only where the tuned knobs (codegen/tune/key.py TUNED_KNOBS: tile,
        fusion, unroll, vectorize, pipeline, prefetch and the plan-level knobs below) are left
        at their defaults. The repr shows `tuned` only when it is False, so
        the repr of every other Options (a key of the compilation cache) is unchanged.
    loop_order: a permutation of the members of every permutable band of that many members,
        applied to the scheduler's own order (positions in it, outermost first; (1, 0) swaps the
        two loops of a 2-member band). Only permutable bands are reordered, where every order is
        legal (scheduler/order.py).
    band_tiles: tile sizes per permutable band (in the scheduler's visiting order, children
        first), overriding `tile` for the bands whose entry is not None.
    vector_width: the vector register width in bits (128, 256 or 512) LLVM's vectorisers use
        (None: the target's preference).
    gemm_blocking: (MC, NC, KC) cache blocks of the packed GEMM that contractions call (None: the
        host's, codegen/host/blocking.py; rounded to the register tile).
    thread_split: how phases use the threads: None, the plan's choice (threads split a phase's
        outer parallel loop, share a GEMM, or run a sequential loop as a team), or "serial": every
        phase on the calling thread (no dispatch: small kernels). The loop that is split follows
        loop_order (the outermost parallel member).
    The repr shows these five only when they are set.
    direct_conv: run convolution-shaped contractions (a sliding window over the input, a filter
        subscripted by the output channel and the taps) as a register-tiled direct convolution
        (polyhedral/convolution.py) instead of GEMM calls; the filter is repacked on every call.
        The repr shows it only when it is False.
    fold_storage: store a temporary modulo its dependence distance along a dimension where that
        is exactly legal (two planes of a jacobi recurrence instead of T). The repr shows it
        only when it is False.
    """

    tile: tuple[int, ...] | int | None = None
    fusion: str = "auto"
    unroll: int | None = None
    vectorize: bool = True
    threads: int | None = None
    fast_math: bool = False
    pipeline: bool = True
    prefetch: bool = False
    specialize: bool = True
    optimize: bool = True
    max_specializations: int = 64
    tuned: bool = True
    loop_order: tuple[int, ...] | None = None
    band_tiles: tuple[tuple[int, ...] | None, ...] | None = None
    vector_width: int | None = None
    gemm_blocking: tuple[int, int, int] | None = None
    thread_split: str | None = None
    direct_conv: bool = True
    fold_storage: bool = True

    def __repr__(self) -> str:
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name not in ("tuned", "direct_conv", "fold_storage")
            and not (f.name in _SHOWN_WHEN_SET and getattr(self, f.name) is None)
        ]
        if not self.tuned:
            shown.append("tuned=False")
        if not self.fold_storage:
            shown.append("fold_storage=False")
        if not self.direct_conv:
            shown.append("direct_conv=False")
        return f"Options({', '.join(shown)})"

    def __post_init__(self) -> None:
        # the scheduler's view validates its knobs (and normalises tile to a tuple)
        schedule = self.schedule
        object.__setattr__(self, "tile", schedule.tile)
        object.__setattr__(self, "loop_order", schedule.loop_order)
        object.__setattr__(self, "band_tiles", schedule.band_tiles)
        try:
            object.__setattr__(self, "vector_width", check_vector_width(self.vector_width))
            object.__setattr__(self, "gemm_blocking", check_gemm_blocking(self.gemm_blocking))
            object.__setattr__(self, "thread_split", check_thread_split(self.thread_split))
        except ValueError as exc:
            raise TensorLangError(str(exc)) from None
        bound = self.max_specializations
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
            raise TensorLangError(f"Options.max_specializations must be a positive integer, got {bound!r}")

    @property
    def schedule(self) -> ScheduleOptions:
        """The knobs of fusion, isl scheduling and the post-passes."""
        return ScheduleOptions(
            self.tile,
            self.fusion,
            self.unroll,
            self.optimize,
            self.threads,
            loop_order=self.loop_order,
            band_tiles=self.band_tiles,
            time_tiles=self.specialize,  # symbolic bounds: no parallelogram tiles (scheduler/options.py)
        )

    @property
    def codegen(self) -> CodegenOptions:
        """The knobs of the call-time pipeline (plan_kernel) and the lowering."""
        return CodegenOptions(
            self.vectorize,
            self.fast_math,
            self.pipeline,
            self.prefetch,
            self.specialize,
            self.optimize,
            vector_width=self.vector_width,
            gemm_blocking=self.gemm_blocking,
            direct_conv=self.direct_conv,
            thread_split=self.thread_split,
            fold=self.fold_storage,
        )

    def thread_count(self) -> int:
        """The threads parallel loops may use: `threads`, else the environment's default."""
        return 1 if not self.optimize else self.threads or default_threads()
