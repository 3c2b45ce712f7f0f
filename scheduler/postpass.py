"""scheduler: isl schedule tree → the same tree with loop order, tiles and unrolling chosen for the CPU.

The isl scheduler finds legal, permutable bands but knows nothing of strides or vectors. In a
permutable band every member order is legal, so we choose one: members that access memory with
stride 1 go innermost (Pluto's intra-tile score: spatial reuse 2, temporal reuse 4, strided
access −16), parallel (coincident) members outermost, the rest (reductions) in between. A
skewed member (the isl scheduler skews time recurrences to (t, t + i, t + j)) is scored by the
step it takes in the statement's variables (the inverse of the band's matrix), so jacobi runs
its time step outermost and j innermost. Then optional rectangular tiling and unroll-and-jam.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import islpy as isl
import sympy

from polyhedral import Scop, StatementKind
from tensorlang import ir

from . import order
from .machine import cache_size, cache_ways
from .options import ScheduleOptions
from .timetile import auto_sizes, body_order, diamond_skew, innermost_carries, tile_time_band, time_band


@dataclass(frozen=True)
class MemberInfo:
    """What a band member is for one statement: the statement variable it iterates, if any."""

    statement: str
    var: str | None


def member_vars(scop: Scop, node: isl.ScheduleNode) -> list[dict[str, str]]:
    """For each band member: statement name → the index variable it runs over (coefficient 1)."""
    mupa = node.band_get_partial_schedule()
    out: list[dict[str, str]] = []
    for m in range(node.band_n_member()):
        upa = mupa.get_at(m)
        found: dict[str, str] = {}
        for pa in _pw_affs(upa):
            name = pa.get_domain_space().get_tuple_name(isl.dim_type.set)
            try:
                stmt = scop.statement(name)
            except KeyError:
                continue
            if not pa.isa_aff():
                continue
            aff = pa.as_aff()
            nonzero = [
                d
                for d in range(aff.dim(isl.dim_type.in_))
                if not aff.get_coefficient_val(isl.dim_type.in_, d).is_zero()
            ]
            if len(nonzero) == 1 and aff.get_coefficient_val(isl.dim_type.in_, nonzero[0]).is_one():
                found[name] = stmt.index_vars[nonzero[0]]
        out.append(found)
    return out


def _pw_affs(upa: isl.UnionPwAff) -> list[isl.PwAff]:
    items: list[isl.PwAff] = []
    upa.foreach_pw_aff(items.append)
    return items


def _access_score(scop: Scop, statement: str, var: str | dict[str, int]) -> int:
    """Pluto's spatial/temporal score of running `var` innermost for one statement; `var` may
    be a direction, the step of each index variable per iteration (a skewed band's member)."""
    stmt = scop.statement(statement)
    st = stmt.statement
    subscript_lists: list[tuple[ir.Expr, ...]] = [st.lhs]
    if stmt.kind is StatementKind.BODY:
        subscript_lists += [a.read.indices for a in stmt.reads if a.read is not None]
    step = var if isinstance(var, dict) else {var: 1}
    score = 0
    for subscripts in subscript_lists:
        forms = [ir.affine_form(s) for s in subscripts]
        coeffs = [sum(f.coeff(v) * k for v, k in step.items()) if f is not None else None for f in forms]
        if any(c is None for c in coeffs):
            score -= 16  # a gather: assume the worst
        elif all(c == 0 for c in coeffs):
            score += 4  # temporal reuse: invariant in var
        elif coeffs[-1] in (1, 2, 3, 4) and all(c == 0 for c in coeffs[:-1]):
            score += 2  # spatial reuse: stride 1..4 elements
        else:
            score -= 16
    return score


def _member_order(scop: Scop, node: isl.ScheduleNode) -> list[int]:
    n = node.band_n_member()
    members = member_vars(scop, node)
    if any(scop.statement(name).projected is not None for m in members for name in m):
        # loops around GEMM calls: each iteration is a whole call, so strides do not matter;
        # parallel loops go outermost so that threads get whole calls
        return sorted(range(n), key=lambda m: not node.band_member_get_coincident(m))
    statements: list[str] = []
    node.get_domain().foreach_set(lambda s: statements.append(s.get_tuple_name()))
    skewed = any(len(m) < len(set(statements)) for m in members)
    directions = _member_directions(scop, node) if skewed else None
    scores = []
    for m in range(n):
        vars_ = members[m]
        # a skewed member (t + j) is scored by the step it takes, statement by statement: a
        # boundary piece with an index fixed (fdtd's i == 0 row) may see it as a plain variable
        steps = {s: d[m] for s, d in (directions or {}).items() if s not in vars_}
        if vars_ or steps:
            scores.append(
                sum(_access_score(scop, s, v) for s, v in vars_.items())
                + sum(_access_score(scop, s, d) for s, d in steps.items())
            )
        else:
            scores.append(-(10**6))
    inner = max(range(n), key=lambda m: (scores[m], m))
    coincident = [m for m in range(n) if m != inner and node.band_member_get_coincident(m)]
    others = [m for m in range(n) if m != inner and not node.band_member_get_coincident(m)]
    # of the sequential members, a plain variable (a time step) before skewed ones: a time tile
    # then runs its steps in order, each over a wavefront of the space loops
    others.sort(key=lambda m: not members[m])
    return coincident + others + [inner]


def _member_directions(scop: Scop, node: isl.ScheduleNode) -> dict[str, list[dict[str, int]]] | None:
    """Per statement, per band member: the step of the statement's index variables that
    advances that member by one with the others fixed (the columns of the inverse of the band's
    matrix). None unless the band is square and unimodular on every statement's variables
    (statements that use fewer variables than the band has members are left out)."""
    mupa = node.band_get_partial_schedule()
    n = node.band_n_member()
    rows: dict[str, list[list[int]]] = {}
    for m in range(n):
        for pa in _pw_affs(mupa.get_at(m)):
            name = pa.get_domain_space().get_tuple_name(isl.dim_type.set)
            if not pa.isa_aff():
                return None
            aff = pa.as_aff()
            coeffs = []
            for d in range(aff.dim(isl.dim_type.in_)):
                val = aff.get_coefficient_val(isl.dim_type.in_, d)
                if not val.is_int():
                    return None
                coeffs.append(int(val.to_python()))
            rows.setdefault(name, []).append(coeffs)
    out: dict[str, list[dict[str, int]]] = {}
    for name, matrix in rows.items():
        try:
            variables = scop.statement(name).index_vars
        except KeyError:
            return None
        if len(matrix) != n:
            return None
        used = [d for d in range(len(variables)) if any(row[d] for row in matrix)]
        if len(used) != n:
            continue  # a boundary piece with an index fixed (fdtd's i == 0 row): the others decide
        square = sympy.Matrix([[row[d] for d in used] for row in matrix])
        if abs(square.det()) != 1:
            return None
        inverse = square.inv()
        out[name] = [
            {variables[used[i]]: int(inverse[i, m]) for i in range(n) if inverse[i, m]} for m in range(n)
        ]
    return out


def _permute_band(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    if order == list(range(len(order))):
        return node
    mupa = node.band_get_partial_schedule()
    coincident = [node.band_member_get_coincident(m) for m in range(node.band_n_member())]
    permuted = mupa
    for new_pos, old_pos in enumerate(order):
        permuted = permuted.set_at(new_pos, mupa.get_at(old_pos))
    node = node.delete().insert_partial_schedule(permuted)
    node = node.band_set_permutable(1)
    for new_pos, old_pos in enumerate(order):
        node = node.band_member_set_coincident(new_pos, coincident[old_pos])
    return node


def _tile(node: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    ctx = node.get_ctx()
    n = node.band_n_member()
    sizes = tuple(sizes[m] if m < len(sizes) else sizes[-1] for m in range(n))
    mv = isl.MultiVal.zero(node.band_get_space())
    for m, size in enumerate(sizes):
        mv = mv.set_val(m, isl.Val.int_from_si(ctx, size))
    return node.band_tile(mv)


def _strided_accesses(scop: Scop, node: isl.ScheduleNode, member: int) -> int:
    """How many accesses walk memory with a large stride along band member `member`."""
    count = 0
    for statement, var in member_vars(scop, node)[member].items():
        stmt = scop.statement(statement)
        st = stmt.statement
        lists = [st.lhs]
        if stmt.kind is StatementKind.BODY:
            lists += [a.read.indices for a in stmt.reads if a.read is not None]
        for subscripts in lists:
            forms = [ir.affine_form(x) for x in subscripts]
            if any(f is not None and f.coeff(var) for f in forms[:-1]):
                count += 1
    return count


def _auto_tile(scop: Scop, node: isl.ScheduleNode) -> tuple[int, ...] | None:
    """Square tiles when the innermost loop walks some array with a large stride (a transpose):
    tiles whose footprint fits half the L1 cache make both arrays' lines reusable."""
    n = node.band_n_member()
    members = member_vars(scop, node)
    if any(scop.statement(name).projected is not None for m in members for name in m):
        return None  # loops around GEMM calls
    if _strided_accesses(scop, node, n - 1) == 0:
        return None
    arrays = {a.tensor for name in member_vars(scop, node)[n - 1] for a in scop.statement(name).accesses}
    element = 8  # bytes, a safe upper bound for the element size
    side = 8
    while side * 2 * side * 2 * element * max(1, len(arrays)) <= cache_size(1) // 2 and side < 128:
        side *= 2
    # The second-innermost member gets few rows (see _tile_loops_innermost_first).
    return tuple([side] * (n - 2) + [min(_rows_per_set(), side), side])


def _tile_loops_innermost_first(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """For a transposing band tiled by _auto_tile: move the innermost member's tile loop
    outermost among the tile loops. LLVM unrolls the innermost point loop and vectorises the one
    around it, so each vector store scatters to (or each load gathers from) one row per lane of
    the array strided along the innermost member, and those rows stay live while the innermost
    loop fills their lines. With a power-of-two row stride (≥ 4 KiB) they all map to one L1 set,
    so that member's tile has `_rows_per_set()` rows (8 on a 12-way L1), and the tile loops then
    walk down a strip of 32 columns, eight rows at a time. 2048² float transpose, one thread:
    9.7 ms with 32×32 tiles, 4.4 ms with these. The sizes are not known when the schedule is
    built, so every size gets these tiles. `node` is the tile band; returns it."""
    n = node.band_n_member()
    return _permute_band(node, [n - 1, *range(n - 1)])


def _rows_per_set() -> int:
    """The largest power of two strictly below the L1 data cache's associativity (at least 2)."""
    rows = 2
    while rows * 2 < cache_ways(1):
        rows *= 2
    return rows


def _unroll_and_jam(node: isl.ScheduleNode, factor: int) -> isl.ScheduleNode:
    """Strip-mine the second-innermost member by `factor` and unroll its point loop inside the
    innermost one: `factor` copies of the statement per innermost iteration (register reuse)."""
    n = node.band_n_member()
    sizes = tuple(factor if m == n - 2 else 1 for m in range(n))
    point = _tile(node, sizes).child(0)
    point = point.band_member_set_ast_loop_type(n - 2, isl.ast_loop_type.unroll)
    return point


# columns per strip when a band's only parallel loop is its stride-1 one (see _strip_parallel)
PARALLEL_STRIP = 512


def _outermost_band(node: isl.ScheduleNode) -> bool:
    parent = node
    while parent.has_parent():
        parent = parent.parent()
        if parent.get_type() == isl.schedule_node_type.band:
            return False
    return True


def _strip_parallel(scop: Scop, node: isl.ScheduleNode) -> isl.ScheduleNode:
    """A region's outer band whose only parallel member is the stride-1 one that goes innermost
    (a column sum, atax's y(j) += A(i, j) * t(i)) leaves threads nothing to split: put a loop over
    strips of PARALLEL_STRIP of that member above the band, so that threads take strips while each
    still walks its rows with stride 1. Each y(j) still sums over i in order: the results are
    those of the band alone. Returns the node at the same position."""
    n = node.band_n_member()
    members = member_vars(scop, node)
    if any(scop.statement(name).projected is not None for m in members for name in m):
        return node
    if not node.band_member_get_coincident(n - 1) or any(
        node.band_member_get_coincident(m) for m in range(n - 1)
    ):
        return node
    if not _outermost_band(node):
        return node
    inner = node.band_get_partial_schedule().get_at(n - 1)
    strip = inner.scale_down_val(isl.Val.int_from_si(node.get_ctx(), PARALLEL_STRIP)).floor()
    outer = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff(strip))
    outer = outer.band_set_permutable(1).band_member_set_coincident(0, True)
    return outer.child(0)


def optimise_tree(scop: Scop, tree: isl.Schedule, options: ScheduleOptions) -> isl.Schedule:
    """Reorder every permutable band for stride-1 inner loops; tile if asked; on several threads,
    strip a band whose only parallel loop is the innermost one (_strip_parallel)."""
    threads = options.thread_count() > 1 and options.optimize
    bands = itertools.count()  # the band index of Options.band_tiles (order.band_tile)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band or not node.band_get_permutable():
            return node
        n = node.band_n_member()
        if n >= 2:
            node = _permute_band(node, order.member_order(_member_order(scop, node), options.loop_order))
            tile, explicit = order.band_tile(options.band_tiles, next(bands), options.tile)
            band = time_band(scop, node, member_vars(scop, node)) if options.time_tiles else None
            if band is not None:  # a stencil's skewed band: parallelogram tiles (timetile.py)
                carried = innermost_carries(scop, node)
                body = None if carried else body_order(scop, node)
                # on threads, diamond tiles where they are legal: a wavefront of tiles along the rows
                diamond = diamond_skew(scop, node) if threads and not carried else None
                sizes = options.time_tile or (
                    tile
                    if explicit
                    else auto_sizes(band, carried, wavefront=threads, diamond=diamond is not None)
                )
                node, depth = tile_time_band(
                    node, sizes, wavefront=threads, inner_carried=carried, body=body, diamond=diamond
                )
                for _ in range(depth):
                    node = node.parent()
                return node
            if threads and not explicit:
                node = _strip_parallel(scop, node)
            depth = 0  # the callback must return a node at the position it was given
            sizes = tile if explicit else _auto_tile(scop, node)
            if sizes is not None:
                node, depth = _tile(node, sizes).child(0), depth + 1  # work on the point band
                if not explicit:
                    node = _tile_loops_innermost_first(node.parent()).child(0)
            if options.unroll is not None and options.unroll > 1 and node.band_n_member() >= 2:
                node, depth = _unroll_and_jam(node, options.unroll), depth + 1
            for _ in range(depth):
                node = node.parent()
        return node

    return tree.map_schedule_node_bottom_up(visit)
