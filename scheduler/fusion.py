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
    kernel runs on one thread anyway.
"""

from __future__ import annotations

import os

import islpy as isl

from polyhedral import Scop
from tensorlang.options import Options

from .graph import OpGraph
from .postpass import member_vars

Region = tuple[int, ...]  # positions of ir statements


def _poly_names(scop: Scop, region: Region) -> list[str]:
    return [s.name for s in scop.statements if s.position in region]


def _domain(scop: Scop, names: list[str]) -> isl.UnionSet:
    out = isl.UnionSet.empty(scop.params.param_space())
    for name in names:
        out = out.union(isl.UnionSet.from_set(scop.statement(name).domain))
    return out


def schedule_region(scop: Scop, region: Region, fuse: bool) -> isl.Schedule | None:
    """The isl schedule of one region (None if isl gives up)."""
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
        return constraints.compute_schedule()
    except isl.Error:
        return None


def _outer_band(tree: isl.Schedule) -> isl.ScheduleNode | None:
    node = tree.get_root().child(0)
    return node if node.get_type() == isl.schedule_node_type.band else None


def _fusion_quality(scop: Scop, region: Region) -> tuple[bool, bool]:
    """(one outer loop spans the region, that loop is parallel) for a fused region."""
    tree = schedule_region(scop, region, fuse=True)
    if tree is None:
        return False, False
    band = _outer_band(tree)
    if band is None:
        return False, False
    # a skewed outer loop (i + j) "fuses" only by walking the iteration spaces diagonally, which
    # ruins locality and vectorisation: count it as no fusion
    plain = member_vars(scop, band)[0]
    if set(plain) != set(_poly_names(scop, region)):
        return False, False
    return True, bool(band.band_member_get_coincident(0))


def _shares_data(graph: OpGraph, region: Region, position: int) -> bool:
    node = graph.nodes[position]
    written = {graph.nodes[p].tensor for p in region}
    read = {t for p in region for t in graph.nodes[p].reads}
    return bool(set(node.reads) & (written | read))


def partition(scop: Scop, graph: OpGraph, options: Options) -> tuple[Region, ...]:
    """Regions of consecutive statements, by the strategy in `options.fusion`."""
    positions = [n.position for n in graph.nodes]
    if not positions:
        return ()
    if options.fusion == "none" or not options.optimize:
        return tuple((p,) for p in positions)
    if options.fusion == "max":
        return (tuple(positions),)
    single_thread = (options.threads or os.cpu_count() or 1) == 1
    regions: list[list[int]] = [[positions[0]]]
    parallel = {(positions[0],): _fusion_quality(scop, (positions[0],))[1]}
    for p in positions[1:]:
        current = tuple(regions[-1])
        merged = (*current, p)
        ok = (
            graph.nodes[p].kind != "contraction"
            and all(graph.nodes[q].kind != "contraction" for q in current)
            and _shares_data(graph, current, p)
        )
        if ok:
            spans, is_parallel = _fusion_quality(scop, merged)
            was_parallel = parallel.get(current, False) or _fusion_quality(scop, (p,))[1]
            ok = spans and (is_parallel or not was_parallel or single_thread)
        if ok:
            regions[-1].append(p)
            parallel[merged] = is_parallel
        else:
            regions.append([p])
            parallel[(p,)] = _fusion_quality(scop, (p,))[1]
    return tuple(tuple(r) for r in regions)


def schedule_regions(scop: Scop, regions: tuple[Region, ...]) -> isl.Schedule | None:
    """Each region scheduled on its own (fused when it holds several statements), in sequence;
    a mark node names each region so that it shows in the loops."""
    tree = None
    for n, region in enumerate(regions):
        part = schedule_region(scop, region, fuse=len(region) > 1)
        if part is None:
            return None
        root = part.get_root()
        if root.n_children() > 0:
            part = root.child(0).insert_mark(isl.Id(f"region {n}", context=scop.ctx)).get_schedule()
        tree = part if tree is None else tree.sequence(part)
    return tree
