"""scheduler: the user's Options → ScheduleOptions, the knobs that fusion, isl scheduling and the post-passes read."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from tensorlang.errors import TensorLangError

from .order import check_band_tiles, check_loop_order

# "smart" is TC's name for the cost-model strategy; it is an alias of "auto"
FUSION_STRATEGIES = ("auto", "smart", "max", "none")


@dataclass(frozen=True)
class ScheduleOptions:
    """What the scheduler may decide, validated once.

    tile: tile sizes for permutable bands (None: chosen from the cache model).
    fusion: "auto" (cost model; "smart" is an alias), "max" (one region) or "none" (one region
        per statement).
    unroll: unroll-and-jam factor of the second-innermost loop of a band (None: no unrolling).
    optimize: False schedules the statements in source order with no post-passes.
    threads: the thread count the fusion cost model plans for (None: `default_threads()`).
    loop_order: a permutation applied to the cost model's member order of every permutable band
        of that many members (scheduler/order.py; None: the cost model's order).
    band_tiles: tile sizes per permutable band of 2 or more members, in the post-pass's visiting
        order (children first); None entries and bands past the end use `tile`.
    time_tile: tile sizes of a time-recurrence band (a stencil's skewed (t, i, j) band): time
        steps first, then the space members, the last repeated (None: `tile` if given, else
        chosen from the cache model; scheduler/timetile.py).
    time_tiles: tile time-recurrence bands at all (False: such a band is reordered and tiled like any
        other band). A generic kernel (Options(specialize=False)) sets it False: its loop bounds
        stay symbolic, and parallelogram tiles with symbolic bounds made isl's AST and LLVM's
        code explode (48 s to compile seidel-2d on 2 threads, against 0.4 s specialised).
    private_reductions: the target runs a loop that carries only reductions on threads, each
        with its own copy of the tensor (the CPU's teams, polyhedral/privatise.py), so fusion may
        count such a loop as parallel. The CUDA target has no such copies: False there.
    """

    tile: tuple[int, ...] | None = None
    fusion: str = "auto"
    unroll: int | None = None
    optimize: bool = True
    threads: int | None = None
    loop_order: tuple[int, ...] | None = None
    band_tiles: tuple[tuple[int, ...] | None, ...] | None = None
    time_tile: tuple[int, ...] | None = None
    time_tiles: bool = True
    private_reductions: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "loop_order", check_loop_order(self.loop_order))
        object.__setattr__(self, "band_tiles", check_band_tiles(self.band_tiles))
        tile = self.tile
        if _is_int(tile):
            tile = (tile,)
        if tile is not None:
            if not isinstance(tile, tuple | list) or not all(_is_int(t) and t >= 1 for t in tile):
                raise TensorLangError(f"Options.tile must be positive integers, got {self.tile!r}")
            object.__setattr__(self, "tile", tuple(tile))
        time_tile = self.time_tile
        if _is_int(time_tile):
            time_tile = (time_tile,)
        if time_tile is not None:
            if not isinstance(time_tile, tuple | list) or not all(_is_int(t) and t >= 1 for t in time_tile):
                raise TensorLangError(f"Options.time_tile must be positive integers, got {self.time_tile!r}")
            object.__setattr__(self, "time_tile", tuple(time_tile))
        if self.fusion not in FUSION_STRATEGIES:
            raise TensorLangError(
                f"Options.fusion must be one of {', '.join(FUSION_STRATEGIES)}, got {self.fusion!r}"
            )
        if self.unroll is not None and not (_is_int(self.unroll) and self.unroll >= 1):
            raise TensorLangError(f"Options.unroll must be a positive integer, got {self.unroll!r}")
        if self.threads is not None and not (_is_int(self.threads) and self.threads >= 1):
            raise TensorLangError(f"Options.threads must be a positive integer, got {self.threads!r}")

    def thread_count(self) -> int:
        """The threads parallel loops may use: `threads`, else the environment's default."""
        return 1 if not self.optimize else self.threads or default_threads()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
