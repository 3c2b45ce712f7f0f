"""gpu: a contraction phase (C += A·B, polyhedral/contraction.py) → TileMapping, shared-memory tiles per block.

A block computes a TM x TN tile of C; the K loop runs in chunks of TK: the block's threads
stage the chunk's TM x TK slice of A (transposed) and TK x TN slice of B in shared memory
(each thread loads a few elements, out-of-range ones as zero, the next chunk's into registers
while the products of this one are computed), a barrier, every thread adds the chunk's products
to its RM x RN register tile (TM/RM x TN/RN threads), a barrier; at the end each thread adds
its register tile to C. The step structure is the row mapping's (gpu/rows.py,
gpu/rowlower.py): the same operations run on the GPU and in the emulation, with a loop over the
chunks around the load, barrier, compute, barrier steps.

Applies to a phase whose one statement is a contraction with no batch (outer) variable, in
float or double; the products are summed in another order than on the CPU (equal within
rounding, as any reduction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polyhedral.contraction import ContractionPlan, plan_contraction
from polyhedral.sizes import compile_size_expr

#: (TM, TN, TK, RM, RN): 256 threads each. The large tile once there are enough of them to fill
#: an H100 twice (132 SMs), else the small one (more blocks for a smaller matrix).
LARGE_TILE = (128, 128, 8, 8, 8)
SMALL_TILE = (64, 64, 16, 4, 4)
LARGE_TILE_MIN_TILES = 264


@dataclass(frozen=True)
class TileMapping:
    """C's tiles: `tiles_m` x `tiles_n` blocks (rows of the row machinery: one block each) of
    `threads` threads; `ranges` the [lo, hi) of m, n and k."""

    contraction: ContractionPlan
    tm: int
    tn: int
    tk: int
    rm: int
    rn: int
    ranges: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    per_block: int = 1
    reductions: int = 0
    local: tuple = ()
    warps: int = 0

    @property
    def threads(self) -> int:
        return (self.tm // self.rm) * (self.tn // self.rn)

    @property
    def tiles_m(self) -> int:
        lo, hi = self.ranges[0]
        return -(-(hi - lo) // self.tm)

    @property
    def tiles_n(self) -> int:
        lo, hi = self.ranges[1]
        return -(-(hi - lo) // self.tn)

    @property
    def rows(self) -> int:
        return self.tiles_m * self.tiles_n

    @property
    def chunks(self) -> int:
        lo, hi = self.ranges[2]
        return -(-(hi - lo) // self.tk)

    @property
    def block(self) -> int:
        return self.threads

    @property
    def blocks(self) -> int:
        return max(1, self.rows)

    @property
    def cells(self) -> int:
        """The register tile, then the elements a thread stages per chunk."""
        return self.rm * self.rn + (self.tm + self.tn) * self.tk // self.threads

    @property
    def row_bytes(self) -> int:
        """Shared memory for the staged slices of A and B (8 bytes an element at most)."""
        return (self.tm + self.tn) * self.tk * 8

    def describe(self) -> str:
        c = self.contraction
        return (
            f"shared-memory tiles for {c.c.tensor} += {c.a.tensor}·{c.b.tensor} (m={c.m}, n={c.n}, k={c.k}): "
            f"one block of {self.threads} threads per {self.tm} x {self.tn} tile, grid {self.blocks} x "
            f"{self.block} ({self.tiles_m} x {self.tiles_n} tiles); k in {self.chunks} chunks of {self.tk} "
            f"staged in shared memory between barriers; each thread a {self.rm} x {self.rn} register tile"
        )


def tile_mapping(
    plan, statements: tuple[str, ...], sizes: Mapping[str, int]
) -> tuple[TileMapping | None, str]:
    """The tiles of a phase that is one contraction, or None and why not."""
    if len(statements) != 1:
        return None, "not a single statement"
    stmt = plan.scop.statement(statements[0])
    found = plan_contraction(plan.scop, stmt, sizes)
    if found is None:
        return None, "not a contraction C += A·B (or too small)"
    if found.outer:
        return None, f"a contraction with batch variables ({', '.join(found.outer)})"
    st = stmt.statement
    ranges = []
    for var in (found.m, found.n, found.k):
        r = st.range_of(var)
        try:
            ranges.append((compile_size_expr(r.lo)(sizes), compile_size_expr(r.hi)(sizes)))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None, f"the range of {var} is not a function of the sizes"
    m, n = ranges[0][1] - ranges[0][0], ranges[1][1] - ranges[1][0]
    tile = LARGE_TILE
    if -(-m // tile[0]) * -(-n // tile[1]) < LARGE_TILE_MIN_TILES:
        tile = SMALL_TILE
    return TileMapping(found, *tile, tuple(ranges)), ""
