"""options: the user's knobs for scheduling and code generation (validated, frozen)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from .errors import TensorLangError

FUSION_STRATEGIES = ("auto", "smart", "max", "none")


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

    def thread_count(self) -> int:
        """The threads parallel loops may use: `threads`, else the environment's default."""
        return 1 if not self.optimize else self.threads or default_threads()

    def __post_init__(self) -> None:
        tile = self.tile
        if isinstance(tile, int) and not isinstance(tile, bool):
            tile = (tile,)
        if tile is not None:
            if not isinstance(tile, tuple | list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tile
            ):
                raise TensorLangError(f"Options.tile must be positive integers, got {self.tile!r}")
            object.__setattr__(self, "tile", tuple(tile))
        if self.fusion not in FUSION_STRATEGIES:
            raise TensorLangError(
                f"Options.fusion must be one of {', '.join(FUSION_STRATEGIES)}, got {self.fusion!r}"
            )
        if self.unroll is not None and (not isinstance(self.unroll, int) or self.unroll < 1):
            raise TensorLangError(f"Options.unroll must be a positive integer, got {self.unroll!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise TensorLangError(f"Options.threads must be a positive integer, got {self.threads!r}")
        bound = self.max_specializations
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
            raise TensorLangError(f"Options.max_specializations must be a positive integer, got {bound!r}")


def default_threads() -> int:
    """TENSORLANG_NUM_THREADS if set, else every core."""
    env = os.environ.get("TENSORLANG_NUM_THREADS")
    if env:
        try:
            value = int(env)
        except ValueError:
            raise TensorLangError(f"TENSORLANG_NUM_THREADS must be a positive integer, got {env!r}") from None
        if value < 1:
            raise TensorLangError(f"TENSORLANG_NUM_THREADS must be a positive integer, got {env!r}")
        return value
    return _cpu_count()


@functools.cache
def _cpu_count() -> int:
    return os.cpu_count() or 1
