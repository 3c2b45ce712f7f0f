"""planning: the schedules of a sequential loop's parallel pieces (and the parallel loops inside them) → the window of tiles each tile waits for (lowering/wavefront.py).

A time-tiled stencil of three space dimensions (heat-3d) gives a wavefront loop c0 whose body
holds several parallel loops over the same tile row c1 (the AST builder separates boundary
pieces), each with a parallel loop over tile columns c2 inside. A team can then run every tile
(c1, c2) of a piece as one iteration space, and a tile of wavefront w wait only for the tiles of
wavefronts w - 1 .. w - back it reads from: over the dependences between instances of the pieces,
the window is a box of (Δc1, Δc2) = (c1, c2 of the sink) - (c1, c2 of the source) when Δc0 ≥ 1.
Within one wavefront nothing may depend on another tile: every dependence with Δc0 = 0 stays in
one tile, and no tile lies in two pieces (else there is no window). The build's schedule at a
loop gives the values of the for loops built so far (the outermost first, this one last), so
the box is in the values the AST's iterators take.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl


@dataclass(frozen=True)
class WaveLags:
    """For a phase's sequential outer loop: the parallel loops right inside it (`pieces`,
    annotation names) and, when `inner`, the one parallel loop inside each (`inner`, the piece's
    annotation name → its own); a tile of a piece waits, in each of the `back` outer iterations
    before, for the tiles whose rows lie within [r - most_row, r - least_row] of its row r and
    (when inner) columns within [c - most_col, c - least_col] of its column c."""

    pieces: tuple[str, ...]
    inner: tuple[tuple[str, str], ...]  # (piece, its inner loop); empty: rows are the tiles
    back: int
    least_row: int
    most_row: int
    least_col: int = 0
    most_col: int = 0


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def flat_schedule(sched: isl.UnionMap, dims: int) -> isl.UnionMap | None:
    """The build's schedule with its range flattened to one tuple (isl nests the spaces of
    successive bands), or None when it has not `dims` values."""
    out = None
    for m in _maps(sched):
        if m.range_is_wrapping():
            m = m.flatten_range()
        if m.dim(isl.dim_type.out) != dims:
            return None
        m = m.set_tuple_id(isl.dim_type.out, None) if m.has_tuple_id(isl.dim_type.out) else m
        um = isl.UnionMap.from_map(m)
        out = um if out is None else out.union(um)
    return out


def wave_lags(
    deps: isl.UnionMap,
    pieces: list[tuple[str, isl.UnionMap | None]],
    inner: dict[str, list[tuple[str, isl.UnionMap | None]]],
) -> WaveLags | None:
    """The window of `pieces` (annotation name, flattened 2-value schedule of the outer loop
    and the piece's loop), with `inner`'s loops (piece → [(name, 3-value schedule)]) when every
    piece has exactly one; None when a schedule is missing, a dependence within one outer
    iteration leaves its tile, two pieces share a tile or a difference is unbounded."""
    if not pieces or any(s is None for _, s in pieces):
        return None
    cols = all(len(inner.get(p, [])) == 1 and inner[p][0][1] is not None for p, _ in pieces)
    scheds = [inner[p][0][1] for p, _ in pieces] if cols else [s for _, s in pieces]
    dims = 3 if cols else 2
    for i, a in enumerate(scheds):  # no tile in two pieces
        for b in scheds[i + 1 :]:
            if not a.range().intersect(b.range()).is_empty():
                return None
    union = scheds[0]
    for s in scheds[1:]:
        union = union.union(s)
    rel = deps.apply_range(union).apply_domain(union)
    found: list[tuple[int, ...]] = []
    for m in _maps(rel):
        if m.dim(isl.dim_type.in_) != dims or m.dim(isl.dim_type.out) != dims:
            return None
        deltas = m.deltas()
        one = isl.Val.one(m.get_ctx())
        zero = isl.Val.zero(m.get_ctx())
        same = deltas.upper_bound_val(isl.dim_type.set, 0, zero)
        for d in range(1, dims):  # within one outer iteration: the same tile only
            if not same.is_empty() and not (same.dim_min_val(d).is_zero() and same.dim_max_val(d).is_zero()):
                return None
        if not same.is_empty() and not same.dim_min_val(0).is_zero():
            return None
        later = deltas.lower_bound_val(isl.dim_type.set, 0, one)
        if later.is_empty():
            continue
        vals = [later.dim_max_val(0)]
        for d in range(1, dims):
            vals += [later.dim_min_val(d), later.dim_max_val(d)]
        if not all(v.is_int() for v in vals):
            return None
        found.append(tuple(v.to_python() for v in vals))
    if not found:
        return None
    back = max(f[0] for f in found)
    rows = min(f[1] for f in found), max(f[2] for f in found)
    names = tuple(p for p, _ in pieces)
    if not cols:
        return WaveLags(names, (), back, *rows)
    columns = min(f[3] for f in found), max(f[4] for f in found)
    return WaveLags(names, tuple((p, inner[p][0][0]) for p in names), back, *rows, *columns)
