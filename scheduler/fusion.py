"""scheduler: Scop + OpGraph → regions (statements scheduled together) and their joint schedule tree.

Graph-level fusion is our decision, not an accident of isl's clustering. The statements are cut
into regions of consecutive statements (so joining the regions in source order is always legal);
each region gets its own isl scheduling problem, with whole-component scheduling so that its
loops fuse, and the regions run one after the other.

The `auto` cost model merges the next statement into the current region when
  * neither is a contraction (those run as packed GEMM calls, which fusion would break up);
  * they share data: the statement reads a tensor the region writes (producer–consumer reuse,
    e.g. softmax's row max and sum) or an input the region reads (e.g. atax reads A twice);
  * the fused schedule really fuses them: one outer loop spans the whole region;
  * it costs no parallelism: that outer loop is parallel whenever the region's was, unless the
    kernel runs on one thread anyway. A loop that carries only reductions threads may privatise
    counts as parallel (polyhedral/privatise.py: atax's y(j) += A(i, j) * t(i) in its loop over
    i), so fusion that pays on one thread is kept on several.
A statement also joins when the fused region's outer band is a time recurrence's skewed band in
which it runs at one fixed time (a copy into the first plane or out of the last,
_joins_time_band): the band is time-tiled, and the copy then runs row by row inside the tiles.
On threads only where the band gets diamond tiles, whose wavefronts hold tiles along the rows.
"""

from __future__ import annotations

import islpy as isl

from polyhedral import Scop, StatementKind
from polyhedral.privatise import privatised_dependences

from .graph import OpGraph
from .options import ScheduleOptions
from .postpass import member_vars
from .timetile import diamond_skew, time_band

Region = tuple[int, ...]  # positions of ir statements


def _poly_names(scop: Scop, region: Region) -> list[str]:
    return [s.name for s in scop.statements if s.position in region]


def _domain(scop: Scop, names: list[str]) -> isl.UnionSet:
    out = isl.UnionSet.empty(scop.params.param_space())
    for name in names:
        out = out.union(isl.UnionSet.from_set(scop.statement(name).domain))
    return out


def schedule_region(scop: Scop, region: Region, fuse: bool, memo: dict | None = None) -> isl.Schedule | None:
    """The isl schedule of one region (None if isl gives up); `memo` keeps the ones already made."""
    if memo is not None:
        key = (region, fuse)
        if key not in memo:
            memo[key] = schedule_region(scop, region, fuse)
        return memo[key]
    ctx = scop.ctx
    domain = _domain(scop, _poly_names(scop, region))
    deps = scop.dependences.all.intersect_domain(domain).intersect_range(domain)
    ctx.set_schedule_whole_component(1 if fuse else 0)
    ctx.set_schedule_serialize_sccs(0 if fuse else 1)
    try:
        constraints = (
            isl.ScheduleConstraints.on_domain(domain)
            .set_context(scop.context)
            .set_validity(deps)
            .set_coincidence(deps)
            .set_proximity(deps)
        )
        tree = constraints.compute_schedule()
    except isl.Error:
        return None
    if fuse and not _spans_plainly(scop, region, tree):
        return _outer_loop_fusion(scop, region) or tree
    return tree


def _spans_plainly(scop: Scop, region: Region, tree: isl.Schedule) -> bool:
    """One outer loop runs over a plain index variable (no skew) of every statement."""
    band = _outer_band(tree)
    if band is None:
        return False
    bodies = {n for n in _poly_names(scop, region) if scop.statement(n).kind is StatementKind.BODY}
    return bodies <= set(member_vars(scop, band)[0])  # identity initialisations may sit at a constant


def _var_schedule(scop: Scop, names: list[str], pick) -> isl.MultiUnionPwAff:
    """{ S[..] -> [v_S] } with v_S = pick(statement) for every statement named (an int: that
    constant, for a statement that does not have the variable)."""
    upa = None
    for name in names:
        stmt = scop.statement(name)
        ls = isl.LocalSpace.from_space(stmt.domain.get_space())
        chosen = pick(stmt)
        if isinstance(chosen, int):
            aff = isl.Aff.val_on_domain(ls, isl.Val.int_from_si(scop.ctx, chosen))
        else:
            aff = isl.Aff.var_on_domain(ls, isl.dim_type.set, stmt.index_vars.index(chosen))
        part = isl.UnionPwAff.from_pw_aff(isl.PwAff.from_aff(aff))
        upa = part if upa is None else upa.union_add(part)
    return isl.MultiUnionPwAff.from_union_pw_aff(upa)


def _outer_loop_fusion(scop: Scop, region: Region) -> isl.Schedule | None:
    """One outer loop over an index variable that every statement of the region has, with the
    same range, and the statements in source order inside it, each over its own other loops.
    This is the fusion isl's whole-component scheduler may miss by skewing (atax: t(i) then
    y(j) += A(i, j) * t(i) fuse over i, so A is streamed once). None when no such loop is legal."""
    names = _poly_names(scop, region)
    stmts = [scop.statement(n) for n in names]
    domain = _domain(scop, names)
    deps = scop.dependences.all.intersect_domain(domain).intersect_range(domain)
    candidates = dict.fromkeys(v for s in stmts for v in s.index_vars)
    for var in candidates:
        having = [s for s in stmts if var in s.index_vars]
        r0 = having[0].statement.range_of(var)
        if any(
            (s.statement.range_of(var).lo, s.statement.range_of(var).hi) != (r0.lo, r0.hi) for s in having
        ):
            continue
        if len(having) < 2 or not r0.lo.is_Integer:
            continue
        # statements without the variable (an identity initialisation, say) run at its first value
        outer = _var_schedule(
            scop, names, lambda s, v=var, first=int(r0.lo): v if v in s.index_vars else first
        )
        node = isl.Schedule.from_domain(domain).get_root().child(0).insert_partial_schedule(outer)
        filters = isl.UnionSetList.alloc(scop.ctx, len(names))
        for s in stmts:
            filters = filters.add(isl.UnionSet.from_set(s.domain))
        node = node.child(0).insert_sequence(filters)
        for k, s in enumerate(stmts):
            inner = [v for v in s.index_vars if v != var]
            child = node.child(k).child(0)
            for v in reversed(inner):  # innermost inserted first, so outer ones end up above
                child = child.insert_partial_schedule(_var_schedule(scop, [s.name], lambda _s, v=v: v))
            node = child.ancestor(child.get_tree_depth() - node.get_tree_depth())
        tree = node.get_schedule()
        sched = tree.get_map().intersect_domain(domain)
        if not deps.subtract(sched.lex_lt_union_map(sched)).is_empty():
            continue  # this loop order breaks a dependence
        parallel = _carries_nothing(deps, outer)
        band = tree.get_root().child(0).band_member_set_coincident(0, parallel)
        return band.get_schedule()
    return None


def _carries_nothing(deps: isl.UnionMap, outer: isl.MultiUnionPwAff) -> bool:
    """Whether the one-member schedule `outer` gives both ends of every dependence one value."""
    outer_map = isl.UnionMap.from_multi_union_pw_aff(outer)
    carried = deps.apply_domain(outer_map).apply_range(outer_map)
    if carried.is_empty():
        return True
    deltas = isl.Set.from_union_set(carried.deltas())
    zero = isl.Set.universe(deltas.get_space()).fix_val(isl.dim_type.set, 0, isl.Val.zero(deps.get_ctx()))
    return deltas.is_subset(zero)


def _parallel_when_privatised(scop: Scop, region: Region, memo: dict) -> bool:
    """Whether the fused region's outer loop carries nothing but reductions that threads may
    privatise (polyhedral/privatise.py; codegen gives each thread its own copy of the tensor)."""
    tree = schedule_region(scop, region, True, memo)
    band = _outer_band(tree) if tree is not None else None
    if band is None:
        return False
    names = _poly_names(scop, region)
    private, deps = privatised_dependences(scop, names, scop.dependences.all)
    if not private:
        return False
    domain = _domain(scop, names)
    deps = deps.intersect_domain(domain).intersect_range(domain)
    first = band.band_get_partial_schedule().get_at(0)
    return _carries_nothing(deps, isl.MultiUnionPwAff.from_union_pw_aff(first))


def _outer_band(tree: isl.Schedule) -> isl.ScheduleNode | None:
    node = tree.get_root().child(0)
    return node if node.get_type() == isl.schedule_node_type.band else None


def _fusion_quality(
    scop: Scop, region: Region, memo: dict, join_time_bands: bool = False, threads: bool = False
) -> tuple[bool, bool]:
    """(one outer loop spans the region, that loop is parallel) for a fused region; with
    `join_time_bands`, a region whose statements form one time band (_joins_time_band) spans,
    and on `threads` counts as parallel (its diamond tiles' wavefronts are)."""
    tree = schedule_region(scop, region, True, memo)
    if tree is None:
        return False, False
    if join_time_bands and len(region) > 1 and _joins_time_band(scop, tree, threads):
        return True, threads
    # a skewed outer loop (i + j) "fuses" only by walking the iteration spaces diagonally, which
    # ruins locality and vectorisation: count it as no fusion
    if not _spans_plainly(scop, region, tree):
        return False, False
    return True, bool(_outer_band(tree).band_member_get_coincident(0))


def _joins_time_band(scop: Scop, tree: isl.Schedule, threads: bool = False) -> bool:
    """The region's outer band is a time recurrence's skewed band (timetile.time_band) in which
    some statements run at one fixed time: the copy into the first plane at time 0, the copy out
    of the last plane after the last step. In the tiles these copies run row by row next to the
    steps that read or wrote the rows, in cache, instead of as plane copies of their own
    (jacobi-2d 1000² T=2, 1 thread: 1.31 -> 0.96 ms a call). On `threads` only where the band
    gets diamond tiles (timetile.diamond_skew, whichever space member the post-pass puts
    first): with parallelograms a short recurrence's wavefronts hold a tile or two, and the
    copies, parallel phases of their own before, would run on one thread (T=2 on 2 threads:
    1.11 -> 1.66 ms); with diamonds the copies are shared like the steps (jacobi-2d 1000², 2
    threads, per round against one thread: T=17 1.58 -> 1.75, T=100 1.85 -> 1.92)."""
    band = _outer_band(tree)
    recurrence = None if band is None else time_band(scop, band, member_vars(scop, band))
    if recurrence is None or not recurrence.fixed:
        return False
    return not threads or all(diamond_skew(scop, band, m) is not None for m in range(1, band.band_n_member()))


def _shares_data(graph: OpGraph, region: Region, position: int) -> bool:
    node = graph.nodes[position]
    written = {graph.nodes[p].tensor for p in region}
    read = {t for p in region for t in graph.nodes[p].reads}
    return bool(set(node.reads) & (written | read))


def partition(
    scop: Scop, graph: OpGraph, options: ScheduleOptions, memo: dict | None = None
) -> tuple[Region, ...]:
    """Regions of consecutive statements, by the strategy in `options.fusion`."""
    memo = {} if memo is None else memo
    positions = [n.position for n in graph.nodes]
    if not positions:
        return ()
    if options.fusion == "none" or not options.optimize:
        return tuple((p,) for p in positions)
    if options.fusion == "max":
        return (tuple(positions),)
    single_thread = options.thread_count() == 1
    regions: list[list[int]] = [[positions[0]]]
    parallel = {(positions[0],): _fusion_quality(scop, (positions[0],), memo)[1]}
    for p in positions[1:]:
        current = tuple(regions[-1])
        merged = (*current, p)
        ok = (
            graph.nodes[p].kind != "contraction"
            and all(graph.nodes[q].kind != "contraction" for q in current)
            and _shares_data(graph, current, p)
        )
        if ok:
            spans, is_parallel = _fusion_quality(
                scop, merged, memo, join_time_bands=options.time_tiles, threads=not single_thread
            )
            was_parallel = parallel.get(current, False) or _fusion_quality(scop, (p,), memo)[1]
            if (
                spans
                and not is_parallel
                and was_parallel
                and not single_thread
                and options.private_reductions
            ):
                is_parallel = _parallel_when_privatised(scop, merged, memo)
            ok = spans and (is_parallel or not was_parallel or single_thread)
        if ok:
            regions[-1].append(p)
            parallel[merged] = is_parallel
        else:
            regions.append([p])
            parallel[(p,)] = _fusion_quality(scop, (p,), memo)[1]
    return tuple(tuple(r) for r in regions)


def schedule_regions(
    scop: Scop, regions: tuple[Region, ...], memo: dict | None = None
) -> isl.Schedule | None:
    """Each region scheduled on its own (fused when it holds several statements), in sequence;
    a mark node names each region so that it shows in the loops."""
    tree = None
    for n, region in enumerate(regions):
        # the pieces of a statement split on an affine select (polyhedral/split.py) are fused like
        # several statements: isl would otherwise run each piece's SCC as its own loop nest
        bodies = sum(s.kind is StatementKind.BODY for s in scop.statements if s.position in region)
        fuse = len(region) > 1 or bodies > 1
        part = schedule_region(scop, region, fuse, memo)
        if part is None:
            return None
        root = part.get_root()
        if root.n_children() > 0:
            part = root.child(0).insert_mark(isl.Id(f"region {n}", context=scop.ctx)).get_schedule()
        tree = part if tree is None else tree.sequence(part)
    return tree
