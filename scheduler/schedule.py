"""scheduler: Scop → Schedule (the isl scheduler under dependence constraints, with a safe fallback)."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop
from polyhedral.scop import original_order
from tensorlang.options import Options

from .postpass import optimise_tree

# Bound on isl's work per scheduling call: beyond it we fall back to the textual order.
_MAX_SCHEDULER_OPERATIONS = 2_000_000


@dataclass(frozen=True)
class Schedule:
    """A legal schedule tree for a Scop, and how it was obtained."""

    scop: Scop
    tree: isl.Schedule
    options: Options
    strategy: str  # "isl" (isl scheduler) or "textual" (fallback: statements in source order)

    def schedule_map(self) -> isl.UnionMap:
        return self.tree.get_map().intersect_domain(self.scop.domain())

    def violated_dependences(self) -> isl.UnionMap:
        """The dependences this schedule does not respect (empty when legal)."""
        sched = self.schedule_map()
        deps = self.scop.dependences.all
        respected = sched.lex_lt_union_map(sched)
        return deps.subtract(respected)

    def verify(self) -> None:
        bad = self.violated_dependences()
        assert bad.is_empty(), f"schedule violates dependences: {bad}"

    def __str__(self) -> str:
        printer = isl.Printer.to_str(self.scop.ctx).set_yaml_style(isl.yaml_style.BLOCK)
        return f"# strategy: {self.strategy}\n" + printer.print_schedule(self.tree).get_str()


def textual_schedule(scop: Scop) -> isl.Schedule:
    """Statements one after the other in source order, each over its own loop nest."""
    domain = scop.domain()
    order = original_order(scop.statements, scop.params).intersect_domain(domain)
    if order.is_empty():
        return isl.Schedule.from_domain(domain)
    partial = isl.MultiUnionPwAff.from_union_map(order)
    return isl.Schedule.from_domain(domain).insert_partial_schedule(partial)


def _configure(ctx: isl.Context, options: Options) -> None:
    ctx.set_schedule_maximize_band_depth(1)
    ctx.set_schedule_serialize_sccs(1 if options.fusion == "none" else 0)
    ctx.set_schedule_whole_component(1 if options.fusion == "max" else 0)
    ctx.set_schedule_max_constant_term(20)
    ctx.set_schedule_max_coefficient(20)
    ctx.set_schedule_treat_coalescing(1)


def compute_schedule(scop: Scop, options: Options | None = None) -> Schedule:
    options = options or Options()
    ctx = scop.ctx
    if not scop.statements:
        return Schedule(scop, isl.Schedule.from_domain(scop.domain()), options, "textual")
    if not options.optimize:
        return Schedule(scop, textual_schedule(scop), options, "textual")
    deps = scop.dependences.all
    domain = scop.domain()
    _configure(ctx, options)
    tree = None
    ctx.set_max_operations(_MAX_SCHEDULER_OPERATIONS)
    ctx.reset_operations()
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
        tree = None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()
    candidates = [(tree, "isl")] if tree is not None else []
    candidates.append((textual_schedule(scop), "textual"))
    for base, strategy in candidates:
        # post-passes only permute permutable bands and tile, which keeps the schedule legal;
        # the dependence check below guards that promise
        try:
            tuned = [(optimise_tree(scop, base, options), f"{strategy}+postpass")]
        except isl.Error:
            tuned = []
        for candidate, name in [*tuned, (base, strategy)]:
            schedule = Schedule(scop, candidate, options, name)
            try:
                if schedule.violated_dependences().is_empty():
                    return schedule
            except isl.Error:
                continue
    return Schedule(scop, textual_schedule(scop), options, "textual")
