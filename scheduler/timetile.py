"""scheduler: a skewed time-recurrence band → parallelogram or diamond time tiles, with a wavefront on threads.

isl schedules a stencil written as a time recurrence (`B(t, i, j) = f(B(t-1, ...))`) as one
permutable band (t, t + i, t + j): the skew makes every dependence distance non-negative in every
member, so any rectangular tiling of that band is legal, and a rectangle in the skewed space is a
parallelogram in (t, i, j). A tile runs `tile_t` time steps over a block of rows, so the rows it
reads stay in the L2 cache from one step to the next instead of streaming through memory once per
step (Pluto's time tiling). Inside a tile the point loops run t, then the space members, the
stride-1 one innermost so that it vectorises.

With several threads the tile loops become a wavefront: w = T + I + J + ... (the time tile plus
every space tile), then I, J, .... Every dependence goes from a tile to one with every number no
smaller, so tiles on one wavefront are independent: the outer loop w is sequential and the loops
inside it are parallel, the shape that the runtime's team phases run with one barrier per
wavefront (the team splits I). On threads a 1-d or 2-d band whose dependences allow it is tiled
along (c t - (t + i), t + i, ...) instead (diamond_skew): diamonds in (t, i), which start
together along the rows, so that a wavefront has tiles for every thread whatever T.

Storage folding (a temporary kept modulo 2 along t) stays legal under both orders: the
anti-dependences it adds (writing B(t) over B(t - 2) after its last reader at t - 1) also have
non-negative distances in every skewed member, so they are respected like any other dependence.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop

from .machine import cache_size


@dataclass(frozen=True)
class TimeBand:
    """A band recognised as a time recurrence: member 0 runs the time step, the others are space
    members skewed by it; `element` is the widest element (bytes) its statements touch; `fixed`
    names the statements that run at one fixed time (fixed_time: copies in and out)."""

    members: int
    element: int
    fixed: frozenset[str] = frozenset()


def time_band(scop: Scop, node: isl.ScheduleNode, plain: list[dict[str, str]]) -> TimeBand | None:
    """The band at `node` (already ordered: time first, stride-1 member last) if it is a skewed
    time recurrence: permutable, no member coincident (each carries the time dependences), member
    0 a plain index variable, and at least one other member a combination of variables (skewed).
    `plain` is `postpass.member_vars` of the band."""
    n = node.band_n_member()
    if n < 2 or not node.band_get_permutable():
        return None
    if any(node.band_member_get_coincident(m) for m in range(n)):
        return None
    statements: list[str] = []
    node.get_domain().foreach_set(lambda s: statements.append(s.get_tuple_name()))
    fixed = fixed_time(node)
    stepped = [s for s in statements if s not in fixed]
    if not stepped or any(s not in plain[0] for s in stepped):
        return None  # the outer member is not the time step of every statement
    if all(s in plain[m] for m in range(1, n) for s in stepped):
        return None  # no skewed member: not a time recurrence that isl skewed
    if any(scop.statement(s).projected is not None for s in statements):
        return None
    element = 1
    for s in statements:
        for access in scop.statement(s).accesses:
            element = max(element, scop.program.tensor(access.tensor).dtype.storage_bytes)
    return TimeBand(n, element, frozenset(fixed))


def fixed_time(node: isl.ScheduleNode) -> set[str]:
    """Statements that the band's member 0 runs at one time whatever their indices (a copy into
    the first plane at 0, out of the last one at T): their schedule there has no index term."""
    fixed: set[str] = set()

    def visit(pa: isl.PwAff) -> None:
        pieces: list[isl.Aff] = []
        pa.foreach_piece(lambda _set, aff: pieces.append(aff))
        if pieces and all(
            aff.get_coefficient_val(isl.dim_type.in_, d).is_zero()
            for aff in pieces
            for d in range(aff.dim(isl.dim_type.in_))
        ):
            fixed.add(pa.get_domain_space().get_tuple_name(isl.dim_type.set))

    node.band_get_partial_schedule().get_at(0).foreach_pw_aff(visit)
    return fixed


def auto_sizes(
    band: TimeBand, chain: bool = False, wavefront: bool = True, diamond: bool = False
) -> tuple[int, ...]:
    """Tile sizes from a cache footprint model: `_STEPS` time steps, and per space member as many
    rows (a power of two) as keep the rows a tile touches, (rows + steps) per member, of two
    planes (the temporary folded modulo 2) within the L2 cache. The array sizes are not known
    when the schedule is built, so the sizes do not depend on them:
    - 1-d stencils: one block of the row, reused over the tile's steps (without `wavefront`,
      `_DEEP_STEPS` of them);
    - 2-d: the stride-1 member in strips of `_STRIP` elements (long vectorised loops, and a
      footprint that stays bounded on wide grids: untiled, a 4000-wide jacobi ran 1.2x slower).
      A strip is an upper bound of the row (the footprint of a 1000-wide grid is half the
      model's); strips narrower than a row plus the skew cut every row in two, the second
      piece short (1000^2, 1 thread: jacobi-2d T=100 6.9 ms with 1024-wide strips, 5.6 ms with
      2048; fdtd-2d T=50 20.3 and 16.4 ms; jacobi-2d 4000^2 T=50 89 ms both): (16, 32, 2048);
    - 3-d and more: the stride-1 member untiled (strips of a short row make mostly partial
      tiles), its rows assumed `_ROW_3D` elements long: (16, 8, 8).
    With `chain` (the innermost member carries a dependence, so the last two point loops become
    a wavefront, Gauss-Seidel) a 2-d stencil takes strips of `_CHAIN_STRIP`: each wavefront of a
    tile then has at most `rows` independent points (seidel-2d 1000^2 T=100, 1 thread: 1024-wide
    strips 315 ms, 256-wide 226 ms; numba 741 ms).
    Without `wavefront` (one thread) a 2-d stencil's tile (not a chain's) runs `_DEEP_STEPS`
    steps over the same rows: inside a tile the steps run in groups, each sweeping the tile's
    rows, so what the next group reuses is the tile's rows (plus a group's skew) of two planes,
    the same for 16 steps as for 64, while every band of tiles streams both planes through
    memory once: 64-step tiles stream them a quarter as often.
    With `diamond` (diamond_skew: the first member is c * t - (t + i)), the first two members
    get the same size, a diamond's width in rows: a 1-d stencil's block, a 2-d stencil's rows
    (its widest step, `_DIAMOND_ROWS` and two more, of two planes of strips within the budget)."""
    n = band.members
    steps = _STEPS
    budget = cache_size(2) // band.element // 2  # elements per plane
    if diamond and n == 2:
        block = max(64, min(4096, budget // 2))
        return (block, block)
    if diamond and n == 3:
        rows = _DIAMOND_ROWS
        while rows > 4 and (rows + 2) * _STRIP > budget:
            rows //= 2
        return (rows, rows, _STRIP)
    if n == 2:
        # one thread: a block's rows stay in L1 over 64 steps as over 16, and the band streams
        # both planes through memory a quarter as often (jacobi-1d 2M T=100, one thread, 4096-point
        # blocks: 64 steps 1.11-1.14x faster per round than 16 in three runs; 128 steps the same)
        deep = _DEEP_STEPS if not wavefront and not chain else steps
        return (deep, max(64, min(4096, budget // 2)))
    strip = _CHAIN_STRIP if chain else _STRIP
    row, tail = ((strip + steps), (strip,)) if n == 3 else (_ROW_3D, ())
    rows = 4
    cap = 32 if chain else 128  # a chain's wavefront: 16 and 32 rows measured alike, 64 slower
    while ((rows * 2 + steps) ** (n - 2)) * row <= budget and rows < cap:
        rows *= 2
    if n == 3 and not chain and not wavefront:
        steps = _DEEP_STEPS
    return (steps, *([rows] * (n - 2)), *tail)


# diamond tiles on threads (diamond_skew), where a dependence of one step allows them.
# jacobi-2d 1000² 2 threads, 1T ÷ 2T per round against the parallelogram tiles (16, 64, 2048):
# T=17 1.38 against 0.87 (a wavefront held two tiles), T=100 1.99 against 1.86; diamonds of
# 32, 64 and 128 rows alike (1.97-2.00). jacobi-1d 2M T=100: 4096-wide diamonds 1.57 and 1.75
# against 1.40 for (16, 4096); 1024 1.32, 8192 1.29. Not for 3-d stencils: heat-3d 120³ T=50
# diamonds (16, 16, 8) 1.41, (32, 32, 8) 1.40 against 1.46 for (16, 8, 8).
DIAMOND_TILES = True
_DIAMOND_ROWS = 64
# time steps per tile: each row is read from memory once per tile instead of once per step, but
# more steps make more partial tiles at the edges of the skewed domain
_STEPS = 16
# time steps of a 2-d stencil's tile on one thread (auto_sizes). 1 thread, this host (2 MiB L2),
# in one process, p25 of 40 interleaved calls: jacobi-2d 1000^2 T=100 (16, 64) 15.8 ms,
# (32, 64) 15.6, (64, 64) 15.0, (64, 32) 15.0, (128, 64) 14.6; fdtd-2d 1000^2 T=50 34.3 ->
# 32.0 ms (medians of 15); jacobi-2d 4000^2 T=50 278 -> 253 ms (medians of 7). Not with
# threads: fewer, deeper tiles leave a wavefront too few of them (jacobi-2d on 2 threads:
# (64, 64) 15.6 against (16, 64) 12.9 ms)
_DEEP_STEPS = 64
# time steps of a 2-d stencil's tile run together, row by row (_jam_steps). Only for a single
# statement's rows: the same grouping measured nothing for fdtd-2d (three fields' rows per step
# overflow L1: 13.4 ms either way) and made heat-3d 120^3 slower (12.8 -> 15.0 ms); jacobi-2d
# 4000^2 (rows of 8 KB, strips of 2048) runs 3-4 % slower with it, 1000^2 about 12 % faster
_JAM_STEPS = 4
# strip width of a 2-d stencil's stride-1 member (with the inner wavefront: _CHAIN_STRIP)
_STRIP = 2048
_CHAIN_STRIP = 256
# the row length (elements of the untiled innermost member) assumed for 3-d stencils: grids of
# 100-256 elements a side; it gives (16, 8, 8), which ran heat-3d 3-10 % faster than (16, 16, 16)
# at 100^3, 120^3 and 256^3 on one thread (rows of 64 gave (16, 16, 16): 2 MB a tile at 256^3)
_ROW_3D = 160


def diamond_skew(scop: Scop, node: isl.ScheduleNode, member: int = 1) -> int | None:
    """For the time band at `node`, (t, t + i, ...): the smallest c in 1..4 for which
    c * t - (t + i) keeps every dependence distance non-negative (2 for jacobi: t - i), or None
    (`member`: the band member that plays t + i; the first space member unless asked).
    Tiles of (c * t - (t + i), t + i, ...) are diamonds in (t, i) (tile_time_band `diamond`):
    the tiles that start at t = 0 lie along i on two wavefronts (concurrent start), so that a
    wavefront holds as many tiles as the rows have, whatever the number of steps. Parallelogram
    tiles of (t, t + i) put each tile of a time band after the one before it along i: a
    wavefront held one tile per time band, two for T = 17 with 16-step tiles, and two threads ran
    jacobi-2d 1000² T=17 0.87x as fast as one."""
    if not DIAMOND_TILES or node.band_n_member() not in (2, 3):
        return None  # 3-d stencils: their wavefront already has tiles along i and j
    mupa = node.band_get_partial_schedule()
    deps = _band_dependences(scop, node)
    for c in range(1, 5):
        down = isl.UnionMap.from_union_pw_aff(_down(mupa, c, member))
        if _non_negative(deps.apply_domain(down).apply_range(down).deltas()):
            return c
    return None


def _band_dependences(scop: Scop, node: isl.ScheduleNode) -> isl.UnionMap:
    """The dependences between instances of the band at `node` that no loop around it carries."""
    domain = node.get_domain()
    deps = scop.dependences.all.intersect_domain(domain).intersect_range(domain)
    prefix = node.get_prefix_schedule_union_map()
    return deps.intersect(prefix.apply_range(prefix.reverse()))


def _down(mupa: isl.MultiUnionPwAff, c: int, member: int = 1) -> isl.UnionPwAff:
    """c * member 0 - `member` of a band's schedule."""
    return mupa.get_at(0).scale_val(isl.Val.int_from_si(mupa.get_ctx(), c)).sub(mupa.get_at(member))


def _non_negative(distances: isl.UnionSet) -> bool:
    """Whether every member of every distance in `distances` is >= 0, for all parameters."""
    found: list[isl.Set] = []
    distances.foreach_set(found.append)
    minus_one = isl.Val.int_from_si(distances.get_ctx(), -1)
    return all(
        d.upper_bound_val(isl.dim_type.set, m, minus_one).is_empty()
        for d in found
        for m in range(d.dim(isl.dim_type.set))
    )


def tile_time_band(
    node: isl.ScheduleNode,
    sizes: tuple[int, ...],
    wavefront: bool,
    inner_carried: bool = False,
    body: tuple[str, ...] | None = None,
    diamond: int | None = None,
) -> tuple[isl.ScheduleNode, int]:
    """Tile the band at `node` with `sizes`, one per member, the last repeated for missing
    members, except that a band of three or more members given one size fewer than it has
    members keeps its innermost member untiled (a band below the tiles). With `wavefront`, skew
    its tile loops to (T + I + ..., I, ...) with I, ... parallel. With `inner_carried` (the
    innermost member carries a dependence, `innermost_carries`), the last two point loops become
    a wavefront too (_inner_wavefront). With `body` (body_order), the innermost loop is
    distributed over its statements in that order (_distribute). Otherwise a 2-d stencil's
    point loops run a few time steps together, row by row (_jam_steps). With `diamond` (c of
    diamond_skew) the tiles are those of the band with its first member c * t - (t + i), `sizes`
    being theirs, the wavefront's members count tiles (_wavefront `numbers`), and a tile's
    points run in the band's own order (t, t + i, ...): legal, because that order respects
    every dependence inside a tile and the diamond band's distances are non-negative between
    tiles. Returns the node of the point loops and how many levels below the original position
    it is."""
    ctx = node.get_ctx()
    n = members = node.band_n_member()
    if n >= 3 and len(sizes) == n - 1:  # the innermost member untiled
        node = node.band_split(n - 1)
        n -= 1
    sizes = tuple(sizes[m] if m < len(sizes) else sizes[-1] for m in range(n))
    own = node.band_get_partial_schedule()
    if diamond is not None:  # tiles of the diamond band, the points of a tile in the band's order
        node = (
            node.delete().insert_partial_schedule(own.set_at(0, _down(own, diamond))).band_set_permutable(1)
        )
    mv = isl.MultiVal.zero(node.band_get_space())
    for m, size in enumerate(sizes):
        mv = mv.set_val(m, isl.Val.int_from_si(ctx, size))
    tiles = _tile(node, mv, unshifted=wavefront and n >= 2)
    if wavefront and n >= 2:
        tiles = _wavefront(tiles, sizes, numbers=diamond is not None)
    points = tiles.child(0)
    if diamond is not None:
        points = points.delete().insert_partial_schedule(own).band_set_permutable(1)
    jam = min(_JAM_STEPS, sizes[0])
    if members == 3 and not inner_carried and body is None and jam > 1 and sizes[0] % jam == 0:
        return _jam_steps(points, jam, unshifted=wavefront), 1
    if n >= 3 and inner_carried:
        points = _inner_wavefront(points)
    elif body is not None:
        points = _distribute(points, body)
    return points, 1


def _jam_steps(points: isl.ScheduleNode, steps: int, unshifted: bool = False) -> isl.ScheduleNode:
    """Point loops (t, t + i, t + j) of a 2-d stencil's tile → (t / steps, t + i, t, t + j): the
    tile's time steps taken `steps` at a time, and within such a group, for each skewed row
    s = t + i, its `steps` rows (t, s - t), one per step, before the next s. Row s - t of step
    t reads rows s - t - 1 .. s - t + 1 of step t - 1, computed for s - 2, s - 1 and s, so the rows
    a step reads were written one or two rows of the sweep before and are still in L1, where
    step after step each 4 KB row came from L2 (1000² jacobi, 1 thread: 5.5-5.8 → 4.9-5.1 ms;
    2 steps 5.2, 8 steps 5.3 ms). A rectangular tiling (steps, 1) of the permutable (t, s)
    members, outside the stride-1 member, so legal like the tile itself. `unshifted`: in a
    wavefront, point loops over the band's own values (_tile: isl dropped the odd
    steps of jacobi-2d 2×3, T=7, tiles (2, 3, 5) over shifted ones). Returns the node of the
    new tile band (at `points`' position)."""
    ctx = points.get_ctx()
    outer = points.band_split(2) if points.band_n_member() > 2 else points  # j untiled: below already
    mv = isl.MultiVal.zero(outer.band_get_space())
    mv = mv.set_val(0, isl.Val.int_from_si(ctx, steps)).set_val(1, isl.Val.int_from_si(ctx, 1))
    return _tile(outer, mv, unshifted)


def _inner_edges(scop: Scop, node: isl.ScheduleNode) -> list[tuple[str, str, bool]]:
    """The dependences between statements of the band at `node` that neither an outer loop nor
    an outer member of the band carries (zero distance in all but the innermost member), as
    (source, sink, whether the innermost member carries it) per pair of statements."""
    band = isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule())
    n = node.band_n_member()
    maps: list[isl.Map] = []
    _band_dependences(scop, node).foreach_map(maps.append)
    edges: dict[tuple[str, str], bool] = {}
    for dep in maps:
        pair = (dep.get_tuple_name(isl.dim_type.in_), dep.get_tuple_name(isl.dim_type.out))
        distances = isl.UnionMap.from_map(dep).apply_domain(band).apply_range(band).deltas()
        found: list[isl.BasicSet] = []
        distances.foreach_set(found.append)
        for d in found:
            inner = d
            for m in range(n - 1):
                inner = inner.fix_val(isl.dim_type.set, m, isl.Val.zero(d.get_ctx()))
            if inner.is_empty():
                continue
            carried = not inner.fix_val(isl.dim_type.set, n - 1, isl.Val.zero(d.get_ctx())).is_equal(inner)
            edges[pair] = edges.get(pair, False) or carried
    return [(a, b, c) for (a, b), c in edges.items()]


def _components(nodes: list[str], edges: list[tuple[str, str, bool]]) -> dict[str, int]:
    """Strongly connected components (Tarjan) of the statement graph: statement → component."""
    succ: dict[str, list[str]] = {v: [] for v in nodes}
    for a, b, _ in edges:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comp: dict[str, int] = {}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w not in comp:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            while True:
                w = stack.pop()
                comp[w] = len(set(comp.values()))
                if w == v:
                    break

    for v in succ:
        if v not in index:
            visit(v)
    return comp


def innermost_carries(scop: Scop, node: isl.ScheduleNode) -> bool:
    """Whether the band's innermost member carries a chain of dependences (a Gauss-Seidel sweep:
    B(t, i, j) reads B(t, i, j - 1)), so that its loop runs dependent sums no vector or pipeline
    can overlap: a cycle of dependences left to the innermost loop, one of them carried by it.
    A dependence between two statements that is not on such a cycle (fdtd's hz(i, j) reads this
    step's ex(i, j + 1)) is no chain: with the source statement first in the loop body
    (`order_body`), each vector of the sink reads values the source already stored."""
    edges = _inner_edges(scop, node)
    comp = _components([], edges)
    return any(carried and comp[a] == comp[b] for a, b, carried in edges)


def body_order(scop: Scop, node: isl.ScheduleNode) -> tuple[str, ...] | None:
    """The statements of the band at `node` in an order for its innermost loop's body (a
    topological order of the dependences that loop carries or leaves to the body), when it runs
    several: then every such dependence goes forward in the body, which the loop vectoriser
    needs (isl would otherwise emit the statements in an order of its own). None for one
    statement, for statements with no such dependence between them, or where the dependences
    form a cycle (innermost_carries)."""
    statements: list[str] = []
    node.get_domain().foreach_set(lambda s: statements.append(s.get_tuple_name()))
    names = sorted(set(statements), key=_natural)
    if len(names) < 2:
        return None
    edges = [(a, b) for a, b, _ in _inner_edges(scop, node) if a != b]
    if not edges:
        return None  # independent statements (a stencil's interior and boundary pieces)
    placed: list[str] = []
    while len(placed) < len(names):
        ready = [v for v in names if v not in placed and all(a in placed for a, b in edges if b == v)]
        if not ready:
            return None  # a cycle: leave the order to isl
        placed.append(ready[0])
    return tuple(placed)


def _distribute(points: isl.ScheduleNode, body: tuple[str, ...]) -> isl.ScheduleNode:
    """The innermost loop at or below the point band `points` distributed over `body`'s
    statements: one innermost loop per statement, in that order, inside the loops around it.
    Legal: the loops around stay as they were, and below them every dependence that they leave
    goes from a statement earlier in `body` to a later one (body_order). Each loop then runs one
    statement with no dependence inside it at all, a sweep that vectorises (fused, fdtd's hz(i -
    1, j - 1) reads ey(i, j - 1) of the previous iteration: a store-to-load forward that LLVM's
    vectoriser refuses). Returns `points` (with its innermost member split off when it had
    more than one)."""
    depth = 0
    node = points
    while node.n_children() and node.child(0).get_type() == isl.schedule_node_type.band:
        node, depth = node.child(0), depth + 1
    if node.n_children() and node.child(0).get_type() != isl.schedule_node_type.leaf:
        return points
    if node.band_n_member() > 1:
        node, depth = node.band_split(node.band_n_member() - 1).child(0), depth + 1
    pieces: list[isl.Set] = []
    node.get_domain().foreach_set(pieces.append)
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(body))
    for name in body:
        for piece in pieces:
            if piece.get_tuple_name() == name:
                filters = filters.add(isl.UnionSet.from_set(piece))
    node = node.insert_sequence(filters)
    for _ in range(depth):
        node = node.parent()
    return node


def _natural(name: str) -> tuple:
    """S1_10 after S1_9: statement names compared by their numbers."""
    return tuple(int(x) if x.isdigit() else x for x in name.replace("_", " ").split())


def _inner_wavefront(points: isl.ScheduleNode) -> isl.ScheduleNode:
    """Point loops (t, .., i, j) → (t, .., i + j, i): when j carries a dependence, the points of
    a tile with equal i + j are independent (every distance is non-negative in i and j, so a
    zero distance in i + j is zero in both), and the innermost loop runs them one after another
    without waiting on each other's result."""
    mupa = points.band_get_partial_schedule()
    n = points.band_n_member()
    skewed = mupa.set_at(n - 2, mupa.get_at(n - 2).add(mupa.get_at(n - 1))).set_at(n - 1, mupa.get_at(n - 2))
    points = points.delete().insert_partial_schedule(skewed)
    points = points.band_set_permutable(1)
    return points.band_member_set_coincident(n - 1, True)


def _tile(node: isl.ScheduleNode, sizes: isl.MultiVal, unshifted: bool) -> isl.ScheduleNode:
    """`node.band_tile(sizes)`; `unshifted`: with point loops over the band's own values (t, not
    t mod size), as the time tiles of a wavefront and the groups of steps inside them have.

    isl's AST generator drops iterations from a wavefront over shifted point loops: fdtd-2d with
    tiles (2, 3, 5) on 2 threads skipped 32 of the 48 field updates of a 1×1 grid at T=17 and
    gave a wrong ey (reduced: over 0 < t <= 16, a band (⌊t/2⌋+⌊t/3⌋+⌊t/5⌋, t - t mod 3) above
    (t mod 2, t mod 3) loses the steps t ≡ 2 (mod 3); with (t, t) below it loses none, checked
    by hand on isl's printed AST). The loops are the same, only their counters are not rebased to
    the tile's origin. Not on one thread, whose loops were tuned and checked as they are."""
    if not unshifted:
        return node.band_tile(sizes)
    ctx = node.get_ctx()
    shift = ctx.get_tile_shift_point_loops()
    ctx.set_tile_shift_point_loops(0)
    try:
        return node.band_tile(sizes)
    finally:
        ctx.set_tile_shift_point_loops(shift)


def _wavefront(tiles: isl.ScheduleNode, sizes: tuple[int, ...], numbers: bool = False) -> isl.ScheduleNode:
    """(T, I, J, ...) → (T + I + J + ..., I, J, ...) in tile numbers (isl's tile loops run over
    tile origins, multiples of the sizes): a skew of a permutable band whose dependence distances
    are non-negative, so it stays legal and permutable; a dependence between two tiles raises the
    sum of their numbers, so tiles with an equal sum are independent and every member but the
    first is coincident (the AST builder checks it again exactly). Summing every space member,
    not only the first, gives a wavefront as many tiles as the grid has in all its dimensions:
    seidel-2d 1000² T=20 (two time tiles, strips of 256) had at most two a wavefront, 1.2x on 2
    threads, and 1.7x with the strips; heat-3d 120³ 0.9x → 1.6x. With `numbers` the members
    after the first are tile numbers, not origins: over a diamond band's origins isl built
    extra loops for each wavefront's edge tiles beside the one over its tiles (jacobi-2d 1000²
    T=100: 13 205 team barriers instead of 5, and the phase ran on one thread)."""
    ctx = tiles.get_ctx()
    mupa = tiles.band_get_partial_schedule()
    n = tiles.band_n_member()
    number = [mupa.get_at(m).scale_down_val(isl.Val.int_from_si(ctx, sizes[m])).floor() for m in range(n)]
    wave = number[0]
    for member in number[1:]:
        wave = wave.add(member)
    mupa = mupa.set_at(0, wave)
    if numbers:
        for m in range(1, n):
            mupa = mupa.set_at(m, number[m])
    tiles = tiles.delete().insert_partial_schedule(mupa)
    tiles = tiles.band_set_permutable(1)
    for m in range(n):
        tiles = tiles.band_member_set_coincident(m, m >= 1)
    return tiles
