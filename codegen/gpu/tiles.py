"""gpu: a contraction phase (C += A·B, polyhedral/contraction.py) → TileMapping, shared-memory tiles per block.

A block computes a TM x TN tile of C; the K loop runs in chunks of TK: the block's threads
stage the chunk's TM x TK slice of A (transposed) and TK x TN slice of B in shared memory
(each thread loads a few elements, out-of-range ones as zero, the next chunk's into registers
while the products of this one are computed), a barrier, every thread adds the chunk's products
to its RM x RN register tile (TM/RM x TN/RN threads), a barrier; at the end each thread adds
its register tile to C. The step structure is the row mapping's (gpu/rows.py,
gpu/rowlower.py): the same operations run on the GPU and in the emulation, with a loop over the
chunks around the load, barrier, compute, barrier steps.

Applies to a phase whose one statement is a contraction with no batch variable (one in C, A
and B), in float or double — several variables of a role are flattened into one index, so a
convolution is an implicit GEMM; the products are summed in another order than on the CPU (equal within
rounding, as any reduction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polyhedral.contraction import ContractionPlan, plan_contraction
from polyhedral.sizes import compile_size_expr

#: (TM, TN, TK, RM, RN): 256 threads each. The large (or narrow) tile once there are enough of
#: them to fill an H100 twice (132 SMs), else the small one (more blocks for a smaller matrix).
LARGE_TILE = (128, 128, 8, 8, 8)
SMALL_TILE = (64, 64, 16, 4, 4)
LARGE_TILE_MIN_TILES = 264
#: for a C of at most 64 columns (a convolution's filters): the large tile's rows, half its columns
NARROW_TILE = (128, 64, 8, 8, 4)
#: fewer multiply-adds than this keep the one-thread-per-row mapping
MIN_WORK = 4096


@dataclass(frozen=True)
class TileMapping:
    """C's tiles: `tiles_m` x `tiles_n` blocks (rows of the row machinery: one block each) of
    `threads` threads. `roles`: the variables of m, n and k, each (variable, lo, hi), the last
    varying fastest in the flattened index (an implicit GEMM: a convolution's m is n·h·w, its
    k c·kh·kw); `ranges` the flattened [0, M), [0, N), [0, K)."""

    contraction: ContractionPlan
    tm: int
    tn: int
    tk: int
    rm: int
    rn: int
    roles: tuple[tuple[tuple[str, int, int], ...], ...]
    k_fastest: tuple[bool, bool] = (True, False)  # per operand: consecutive threads load along k
    per_block: int = 1
    reductions: int = 0
    local: tuple = ()
    warps: int = 0

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        out = []
        for role in self.roles:
            total = 1
            for _, lo, hi in role:
                total *= max(0, hi - lo)
            out.append((0, total))
        return tuple(out)

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
        m, n, k = ("·".join(v for v, _, _ in role) for role in self.roles)
        return (
            f"shared-memory tiles for {c.c.tensor} += {c.a.tensor}·{c.b.tensor} (m={m}, n={n}, k={k}): "
            f"one block of {self.threads} threads per {self.tm} x {self.tn} tile, grid {self.blocks} x "
            f"{self.block} ({self.tiles_m} x {self.tiles_n} tiles); k in {self.chunks} chunks of {self.tk} "
            f"staged in shared memory between barriers (loads of {c.a.tensor} along "
            f"{'k' if self.k_fastest[0] else 'm'}, of {c.b.tensor} along {'k' if self.k_fastest[1] else 'n'}); "
            f"each thread a {self.rm} x {self.rn} register tile"
        )


def tile_mapping(
    plan, statements: tuple[str, ...], sizes: Mapping[str, int]
) -> tuple[TileMapping | None, str]:
    """The tiles of a phase that is one contraction, or None and why not."""
    if len(statements) != 1:
        return None, "not a single statement"
    stmt = plan.scop.statement(statements[0])
    # without sizes: the role analysis alone (the CPU's small-work test looks at one variable
    # of each role; the flattened roles' work is tested below)
    found = plan_contraction(plan.scop, stmt, None)
    if found is None:
        return None, "not a contraction C += A·B"
    st = stmt.statement
    a, b = found.a, found.b
    m_vars = [v for v in st.indices if a.uses(v) and not b.uses(v)]
    n_vars = [v for v in st.indices if b.uses(v) and not a.uses(v)]
    k_vars = [v for v in st.reduction_indices if a.uses(v) and b.uses(v)]
    others = [v for v in st.all_indices if v not in m_vars + n_vars + k_vars]
    if others:
        return None, f"a contraction with batch variables ({', '.join(others)})"
    roles = []
    for names in (m_vars, n_vars, k_vars):
        role = []
        for var in names:
            r = st.range_of(var)
            try:
                role.append((var, compile_size_expr(r.lo)(sizes), compile_size_expr(r.hi)(sizes)))
            except (KeyError, TypeError, ValueError, AttributeError):
                return None, f"the range of {var} is not a function of the sizes"
        roles.append(tuple(role))
    # coalesced loads: consecutive threads along the variable of an operand's stride-1 subscript
    # (the longer of its own role's fastest variable and k's, when it holds both: w + kw)
    extent = {var: hi - lo for role in roles for var, lo, hi in role}
    k_fastest = tuple(
        bool(op.forms and op.forms[-1].coeff(k_vars[-1]))
        and not (op.forms[-1].coeff(own[-1]) and extent[own[-1]] > extent[k_vars[-1]])
        for op, own in ((a, m_vars), (b, n_vars))
    )
    for tile in (NARROW_TILE, LARGE_TILE, SMALL_TILE):
        found_tiles = TileMapping(found, *tile, tuple(roles), k_fastest)
        (_, m), (_, n), (_, k) = found_tiles.ranges
        if m * n * k < MIN_WORK:
            return None, f"{m * n * k} multiply-adds: too few for tiles"
        if tile == NARROW_TILE and n > tile[1]:
            continue  # the narrow tile only where C has at most its width of columns
        if tile == SMALL_TILE or found_tiles.tiles_m * found_tiles.tiles_n >= LARGE_TILE_MIN_TILES:
            return found_tiles, ""
    raise AssertionError("unreachable")
