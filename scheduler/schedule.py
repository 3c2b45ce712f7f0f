"""scheduler: Scop → Schedule (fusion regions, isl scheduling per region, post-passes, safe fallback)."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop
from polyhedral.scop import original_order
from tensorlang.errors import InternalError

from .fusion import partition, schedule_regions
from .graph import OpGraph, build_graph
from .options import ScheduleOptions
from .postpass import optimise_tree


def padded_schedule(sched: isl.UnionMap) -> isl.UnionMap | None:
    """`sched` with every statement's range in one anonymous space, padded with zeros to the
    widest (isl pads the children of a sequence already; this makes it certain). None when
    `sched` is empty."""
    maps: list[isl.Map] = []
    sched.foreach_map(maps.append)
    if not maps:
        return None
    width = max(m.dim(isl.dim_type.out) for m in maps)
    out = None
    for m in maps:
        n = m.dim(isl.dim_type.out)
        m = m.reset_tuple_id(isl.dim_type.out)
        if n < width:
            m = m.add_dims(isl.dim_type.out, width - n)
            for d in range(n, width):
                m = m.fix_si(isl.dim_type.out, d, 0)
        um = isl.UnionMap.from_map(m)
        out = um if out is None else out.union(um)
    return out


# Bound on isl's work per scheduling call: beyond it we fall back to the textual order.
_MAX_SCHEDULER_OPERATIONS = 2_000_000


@dataclass(frozen=True)
class Schedule:
    """A legal schedule tree for a Scop, and how it was obtained."""

    scop: Scop
    tree: isl.Schedule
    options: ScheduleOptions
    strategy: str  # "regions" (isl per fusion region) or "textual" (fallback: source order)
    regions: tuple[tuple[int, ...], ...] = ()  # ir statement positions scheduled together
    graph: OpGraph | None = None

    def schedule_map(self) -> isl.UnionMap:
        return self.tree.get_map().intersect_domain(self.scop.domain())

    def violated_dependences(self) -> isl.UnionMap:
        """The dependences this schedule does not respect (empty when legal). The dependences
        are mapped into the schedule's space and compared with one lexicographic order there:
        building the order between every pair of statements' tiled schedules instead
        (`lex_lt_union_map`) ran for minutes on heat-3d with tiles (4, 7, 3)."""
        deps = self.scop.dependences.all
        sched = padded_schedule(self.schedule_map())
        if sched is None:
            return deps
        maps: list[isl.Map] = []
        sched.foreach_map(maps.append)
        later_or_same = isl.UnionMap.from_map(isl.Map.lex_ge(maps[0].range().get_space()))
        backwards = deps.apply_domain(sched).apply_range(sched).intersect(later_or_same)
        scheduled = self.tree.get_domain()  # the tree's own domain: projecting the tiled map's is slow
        unscheduled = deps.subtract_domain(scheduled).union(deps.subtract_range(scheduled))
        if backwards.is_empty():
            return unscheduled
        return unscheduled.union(deps.intersect(sched.apply_range(backwards).apply_range(sched.reverse())))

    def verify(self) -> None:
        """Every dependence is respected and every statement scheduled; InternalError otherwise."""
        bad = self.violated_dependences()
        if not bad.is_empty():
            raise InternalError(f"{self.scop.program.name}: the schedule violates dependences {bad}")
        scheduled = self.tree.get_domain()
        if not self.scop.domain().is_subset(scheduled):
            raise InternalError(f"{self.scop.program.name}: statement instances missing from the schedule")

    def __str__(self) -> str:
        printer = isl.Printer.to_str(self.scop.ctx).set_yaml_style(isl.yaml_style.BLOCK)
        regions = " ".join("[" + " ".join(f"S{p}" for p in r) + "]" for r in self.regions)
        head = f"# strategy: {self.strategy}, fusion={self.options.fusion}, regions: {regions or '-'}\n"
        return head + printer.print_schedule(self.tree).get_str()

    def graph_text(self) -> str:
        """The op graph and the regions the partitioner chose."""
        graph = self.graph or build_graph(self.scop.program)
        regions = [f"region {n}: " + " ".join(f"S{p}" for p in r) for n, r in enumerate(self.regions)]
        return "\n".join([str(graph), f"# fusion={self.options.fusion}", *regions])


def textual_schedule(scop: Scop) -> isl.Schedule:
    """Statements one after the other in source order, each over its own loop nest."""
    domain = scop.domain()
    order = original_order(scop.statements, scop.params).intersect_domain(domain)
    if order.is_empty():
        return isl.Schedule.from_domain(domain)
    partial = isl.MultiUnionPwAff.from_union_map(order)
    return isl.Schedule.from_domain(domain).insert_partial_schedule(partial)


def _configure(ctx: isl.Context) -> None:
    ctx.set_schedule_maximize_band_depth(1)
    ctx.set_schedule_max_constant_term(20)
    ctx.set_schedule_max_coefficient(20)
    ctx.set_schedule_treat_coalescing(1)


def compute_schedule(scop: Scop, options: ScheduleOptions | None = None) -> Schedule:
    options = options or ScheduleOptions()
    ctx = scop.ctx
    if not scop.statements:
        return Schedule(scop, isl.Schedule.from_domain(scop.domain()), options, "textual")
    if not options.optimize:
        return Schedule(scop, textual_schedule(scop), options, "textual")
    _configure(ctx)
    graph = build_graph(scop.program)
    ctx.set_max_operations(_MAX_SCHEDULER_OPERATIONS)
    ctx.reset_operations()
    try:
        memo: dict = {}  # region schedules the partitioner already computed
        regions = partition(scop, graph, options, memo)
        tree = schedule_regions(scop, regions, memo)
    except isl.Error:
        regions, tree = (), None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()
    candidates = [(tree, "regions")] if tree is not None else []
    candidates.append((textual_schedule(scop), "textual"))
    for base, strategy in candidates:
        # post-passes only permute permutable bands and tile, which keeps the schedule legal;
        # the dependence check below guards that promise
        try:
            tuned = [(optimise_tree(scop, base, options), f"{strategy}+postpass")]
        except isl.Error:
            tuned = []
        for candidate, name in [*tuned, (base, strategy)]:
            schedule = Schedule(
                scop, candidate, options, name, regions if strategy == "regions" else (), graph
            )
            try:
                if schedule.violated_dependences().is_empty():
                    return schedule
            except isl.Error:
                continue
    return Schedule(scop, textual_schedule(scop), options, "textual")
