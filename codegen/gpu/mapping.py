"""gpu: KernelPlan (specialised) → GridMapping, which loops of each phase become GPU threads.

The first, simple and correct mapping (PPCG-style, without tiling or shared memory):

* a phase whose outermost loop carries no dependence maps that loop to threads, one thread per
  iteration; while the loop directly inside is parallel too and its bounds do not depend on
  the outer iterators, it is mapped as well (up to MAX_MAPPED loops): one thread per tuple of
  iterations. The tuple is flattened to a 1-D grid
  with the loop that indexes the written tensor's stride-1 dimension varying fastest, so that
  neighbouring threads of a warp store (and usually load) neighbouring elements: coalescing;
* when loops remain inside the mapped ones (a row reduction, say), the row is spread over a
  block, or a warp for short rows, if its body fits (gpu/rows.py): inner loops strided over the
  row's threads, reductions combined by warp shuffles and shared memory; otherwise every loop
  inside the mapped ones runs sequentially in its thread, and the plan text says why;
* a phase with no parallel outer loop (a reduction or recurrence over it, or no loop) runs as a
  single-thread grid.

Each decision and its reason is printed by `GridMapping.__str__` (`inspect("plan")`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tensorlang import ir

from ..planning.astgen import LoopKind, contains_loop, expr_mentions, leaves_under, loop_range, unwrap
from ..planning.plan import KernelPlan
from .private import thread_private
from .rows import RowMapping, _subscripts, row_mapping
from .tiles import TileMapping, tile_mapping

#: threads per block of a mapped phase (a multiple of the warp size)
BLOCK_THREADS = 256
#: at most this many nested parallel loops are mapped to one thread each (a 4-D initialisation
#: `O(n, f, h, w) = 0` spreads over n·f·h·w threads, not n·f threads of 56² sequential stores)
MAX_MAPPED = 4
WARP = 32


@dataclass(frozen=True)
class MappedLoop:
    """A loop whose iterations are spread over threads: `count` iterations from `first` by `step`.
    `key` is the loop's annotation (LoopAst.loops), which lowering finds the loop by."""

    key: str
    iterator: str
    first: int
    count: int
    step: int


@dataclass(frozen=True)
class PhaseMapping:
    """The grid of one phase. `loops`: mapped loops, outermost first in the loop nest;
    `fastest`: the position in `loops` of the one the thread index varies fastest along."""

    index: int
    statements: tuple[str, ...]
    loops: tuple[MappedLoop, ...]
    fastest: int
    reason: str  # why this mapping (printed)
    rows: RowMapping | TileMapping | None = None  # a row per block or warp, or C's tiles
    sequential: str = ""  # why the loops inside the mapped ones stay sequential (printed)
    private: tuple[str, ...] = ()  # temporaries each thread keeps in a register (gpu/private.py)

    @property
    def threads(self) -> int:
        n = 1
        for loop in self.loops:
            n *= loop.count
        return n

    @property
    def block(self) -> int:
        if self.rows is not None:
            return self.rows.block
        if not self.loops:
            return 1
        return max(WARP, min(BLOCK_THREADS, -(-self.threads // WARP) * WARP))

    @property
    def blocks(self) -> int:
        if self.rows is not None:
            return self.rows.blocks
        return max(1, -(-self.threads // self.block))

    @property
    def order(self) -> tuple[int, ...]:
        """Positions in `loops`, slowest varying first (the linear thread id's digits)."""
        rest = [n for n in range(len(self.loops)) if n != self.fastest]
        return tuple(rest + [self.fastest]) if self.loops else ()

    def describe(self) -> str:
        head = f"cuda phase {self.index} ({', '.join(self.statements) or 'no statements'}): "
        if not self.loops:
            return head + f"single thread (grid 1 x 1): {self.reason}"
        dims = " x ".join(f"{self.loops[n].iterator}[{self.loops[n].count}]" for n in self.order)
        fastest = self.loops[self.fastest].iterator
        if isinstance(self.rows, TileMapping):
            return head + self.rows.describe()
        if self.rows is not None:
            return head + f"rows {dims} = {self.threads}, {self.rows.describe()}"
        return (
            head
            + f"one thread per {dims} = {self.threads} threads, grid {self.blocks} x {self.block}; "
            + f"{fastest} varies fastest ({self.reason}); inner loops sequential per thread"
            + (f" ({self.sequential})" if self.sequential else "")
            + (
                f"; {', '.join(self.private)} kept in registers (each thread its own element, never in memory)"
                if self.private
                else ""
            )
        )


@dataclass(frozen=True)
class GridMapping:
    phases: tuple[PhaseMapping, ...]

    def __str__(self) -> str:
        return "\n".join(f"// {p.describe()}" for p in self.phases)


def map_plan(plan: KernelPlan) -> GridMapping:
    """The grid of every phase of a specialised plan (sizes are needed for the thread counts)."""
    values: Mapping = plan.param_values or {}
    phases = []
    for decision, phase in zip(plan.phases, plan.ast.phases):
        phases.append(_map_phase(plan, decision.index, phase, values))
    return GridMapping(tuple(phases))


def _map_phase(plan: KernelPlan, index: int, phase, values: Mapping) -> PhaseMapping:
    statements = phase.statements
    if plan.param_values is None:
        return PhaseMapping(index, statements, (), 0, "sizes unknown (a generic plan)")
    tiles, _ = tile_mapping(plan, statements, values)
    if tiles is not None:
        loop = MappedLoop("", "tile", 0, tiles.rows, 1)  # a block per tile: no loop of the AST is mapped
        return PhaseMapping(index, statements, (loop,), 0, "shared-memory tiles", rows=tiles)
    if phase.loop is None:
        if phase.outer is None:
            reason = "no loop"
        else:
            name = phase.outer.for_get_iterator().get_id().get_name()
            reason = f"the outer loop {name} carries a dependence (a reduction or recurrence over it)"
            inner, why = _inner_parallel(plan, phase, values)
            if inner is not None:
                reason += f"; the loop {inner.iterator} inside it is mapped instead, {name} runs in each thread ({why})"
                private = thread_private(plan, phase, (inner.iterator,))
                return PhaseMapping(index, statements, (inner,), 0, reason, private=private)
            reason += f"; {why}"
        return PhaseMapping(index, statements, (), 0, reason)
    outer = _mapped(plan, unwrap(phase.loop), values)
    if outer is None:
        return PhaseMapping(index, statements, (), 0, "the parallel outer loop's bounds are not constant")
    loops = [outer]
    node = unwrap(phase.loop)
    while len(loops) < MAX_MAPPED:  # the perfectly nested parallel loops inside, with fixed bounds
        inner_node = unwrap(node.for_get_body())
        if (
            inner_node.get_type() != isl.ast_node_type.for_
            or inner_node.for_is_degenerate()
            or plan.ast.loops[inner_node.get_annotation().get_name()].kind is not LoopKind.PARALLEL
        ):
            break
        inner = _mapped(plan, inner_node, values)
        if inner is None:
            break
        loops.append(inner)
        node = inner_node
    if len(loops) == 1:
        fastest, reason = 0, "the only mapped loop"
    else:
        fastest, reason = _coalescing(plan, phase, loops)
    private = thread_private(plan, phase, tuple(loop.iterator for loop in loops))
    found = PhaseMapping(index, statements, tuple(loops), fastest, reason, private=private)
    body = unwrap(node.for_get_body())
    if not contains_loop(body):
        return found
    iterators = tuple(loop.iterator for loop in loops)
    rows, why = row_mapping(plan, body, found.threads, values, iterators, statements)
    if rows is None:
        return dataclasses.replace(found, sequential=f"no block per row: {why}")
    return dataclasses.replace(found, rows=rows, private=())  # a row's threads share its elements


def _inner_parallel(plan: KernelPlan, phase, values: Mapping) -> tuple[MappedLoop | None, str]:
    """The loop directly inside a phase's dependence-carrying outer loop, mapped to threads with
    the outer loop run inside each thread (a column sum `S(d) +=! X(n, d)` scheduled with n
    outside): an interchange, legal when the nest is perfect, the inner loop's bounds do not
    depend on the outer one, and threads touch disjoint elements — every tensor the nest writes
    is accessed, wherever the nest accesses it, at `±inner + c` in one dimension (the same sign
    and c)."""
    outer = unwrap(phase.outer)
    node = unwrap(outer.for_get_body())
    if node.get_type() != isl.ast_node_type.for_ or node.for_is_degenerate():
        return None, "no loop directly inside it alone"
    mapped = _mapped(plan, node, values)
    if mapped is None:
        return None, "the loop inside it has bounds that depend on it"
    j = mapped.iterator
    accesses: dict[str, list] = {}
    written: set[str] = set()
    for leaf in leaves_under(node, plan.ast.leaves) or ():
        poly = plan.scop.statement(leaf.statement)
        st = poly.statement
        exprs = dict(leaf.index_exprs)
        written.add(st.tensor)
        accesses.setdefault(st.tensor, []).append(_subscripts(st.lhs, exprs))
        if poly.kind != "init":
            for read in ir.walk(st.rhs):
                if isinstance(read, ir.Read):
                    accesses.setdefault(read.tensor, []).append(_subscripts(read.indices, exprs))
    for tensor in sorted(written):
        common = None
        for subs in accesses[tensor]:
            if subs is None:
                return None, f"{tensor} is written and accessed at a data-dependent element"
            dims = {
                (d, dict(sub)[j], dict(sub).get("", 0))
                for d, sub in enumerate(subs)
                if set(dict(sub)) - {""} == {j} and abs(dict(sub)[j]) == 1
            }
            common = dims if common is None else common & dims
        if not common:
            return None, f"threads of {j} would share elements of {tensor}"
    return mapped, f"each thread its own elements of {', '.join(sorted(written))}"


def _mapped(plan: KernelPlan, node: isl.AstNode, values: Mapping) -> MappedLoop | None:
    found = loop_range(node, values)  # None when the bounds depend on an enclosing iterator
    if found is None:
        return None
    first, stop, step = found
    count = max(0, -(-(stop - first) // step))
    name = node.for_get_iterator().get_id().get_name()
    return MappedLoop(node.get_annotation().get_name(), name, first, count, step)


def _coalescing(plan: KernelPlan, phase, loops: list[MappedLoop]) -> tuple[int, str]:
    """Which mapped loop the thread index varies fastest along: the one the written tensors'
    last (stride-1) subscripts move with, by a majority of the phase's statements; the inner
    loop when it is a tie (the post-passes put stride-1 loops innermost)."""
    votes = [0] * len(loops)
    for leaf in leaves_under(phase.node, plan.ast.leaves) or ():
        st = plan.scop.statement(leaf.statement).statement
        if not st.lhs:
            continue
        form = ir.affine_form(st.lhs[-1])
        if form is None:
            continue
        exprs = dict(leaf.index_exprs)
        for n, loop in enumerate(loops):
            if any(var in exprs and expr_mentions(exprs[var], loop.iterator) for var, _ in form.coeffs):
                votes[n] += 1
    inner = len(loops) - 1
    best = max(range(len(loops)), key=lambda n: (votes[n], n == inner))
    tensors = sorted({plan.scop.statement(s).statement.tensor for s in phase.statements})
    if votes[best] == 0:
        return (
            inner,
            f"the inner mapped loop; no written subscript is stride-1 in one of them ({', '.join(tensors)})",
        )
    return best, f"stride-1 dimension of {', '.join(tensors)}: coalesced"
