"""lowering: a PipelinePlan → the phase's outer loop with its last inner loop run one row late."""

from __future__ import annotations

import islpy as isl
import llvmlite.ir as ll

from tensorlang import ir

from ..emit import values as V
from ..planning.astgen import Footprint
from ..planning.pipeline import PipelinePlan
from .state import LoweringState, PolyLeafContext


class PipelineLowering(LoweringState):
    """Row pipelining of a phase's outer loop, as the plan's PipelinePlan says."""

    def emit_pipelined_for(
        self,
        node: isl.AstNode,
        plan: PipelinePlan,
        env: dict[str, ll.Value],
        init: ll.Value,
        restricted: bool,
        footprints: tuple[Footprint, ...],
    ) -> None:
        """The phase's outer loop with its last inner loop B run one iteration late, inside the
        loop A before it (codegen/planning/pipeline.py): prologue = the first row's A alone, epilogue =
        the last row's B alone. B's row-invariant reads of values the phase writes are loaded at
        the end of each row and carried to the next iteration in registers. When threads split
        the loop, each runs its rows [lo, hi) as a pipeline of its own (every row's work stays
        with the thread that owns the row, so rows remain independent)."""
        b = self.b
        name = node.for_get_iterator().get_id().get_name()
        types = [V.register_type(read.dtype) for _, read in plan.captured]
        init, iv, exit_, carried = self._open_loop(node, name, init, env, restricted, types, poll=True)
        inner = {**env, name: iv}
        inc = ll.Constant(V.I64, plan.step)  # a constant: also valid in the exit block below
        if footprints:
            self.emit_prefetch(node, name, b.add(iv, inc, flags=["nsw"]), env, footprints)
        for child in plan.prefix:
            self.emit_node(child, inner)
        with b.if_else(b.icmp_signed("==", iv, init)) as (prologue, steady):
            with prologue:
                self.emit_node(plan.a_loop, inner)
            with steady:
                self.emit_fused_rows(plan, env, name, iv, b.sub(iv, inc, flags=["nsw"]), carried)
        now = [self.captured_value(plan, stmt, read, inner) for stmt, read in plan.captured]
        latch = b.block
        iv.add_incoming(b.add(iv, inc, flags=["nsw"]), latch)
        for phi, value in zip(carried, now):
            phi.add_incoming(value, latch)
        b.branch(iv.parent)
        b.position_at_end(exit_)
        with b.if_then(b.icmp_signed("!=", iv, init)):  # epilogue: the last row's B
            self.emit_late(plan, carried, plan.b_loop, {**env, name: b.sub(iv, inc, flags=["nsw"])})

    def emit_fused_rows(
        self,
        plan: PipelinePlan,
        env: dict[str, ll.Value],
        name: str,
        iv: ll.Value,
        previous: ll.Value,
        carried,
    ) -> None:
        """for j in [0, trip): B(previous row, j); A(this row, j)"""
        b = self.b
        _, body, exit_, j = self._loop_head("pipe.j", ll.Constant(V.I64, 0))
        b.cbranch(b.icmp_signed("<", j, ll.Constant(V.I64, plan.trip)), body, exit_)
        b.position_at_end(body)
        b_iter = plan.b_loop.for_get_iterator().get_id().get_name()
        a_iter = plan.a_loop.for_get_iterator().get_id().get_name()
        # B first: where A rewrites a contracted row buffer, B reads the old row at j before A
        # writes the new one there
        b_at = b.add(j, ll.Constant(V.I64, plan.b_first), flags=["nsw"])
        self.emit_late(plan, carried, plan.b_loop.for_get_body(), {**env, name: previous, b_iter: b_at})
        a_at = b.add(j, ll.Constant(V.I64, plan.a_first), flags=["nsw"])
        self.emit_node(plan.a_loop.for_get_body(), {**env, name: iv, a_iter: a_at})
        j.add_incoming(b.add(j, ll.Constant(V.I64, 1), flags=["nsw"]), b.block)
        b.branch(j.parent)
        b.position_at_end(exit_)

    def emit_late(self, plan: PipelinePlan, carried, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        """Emit (part of) the late loop B, its row-invariant reads replaced by the carried values."""
        self.read_overrides = dict(zip(plan.captured, carried))
        self.emit_node(node, env)
        self.read_overrides = {}

    def captured_value(
        self, plan: PipelinePlan, stmt: str, read: ir.Read, env: dict[str, ll.Value]
    ) -> ll.Value:
        """The value `read` (row-invariant, in B's statement `stmt`) has for the row `env` is at."""
        leaf = dict(plan.b_leaves)[stmt]
        b_iter = plan.b_loop.for_get_iterator().get_id().get_name()
        at = {**env, b_iter: ll.Constant(V.I64, plan.b_first)}
        indices = {var: self.ast_expr(expr, at) for var, expr in leaf.index_exprs}
        scop_stmt = self.scop.statement(stmt)
        self.leaf_statement = PolyLeafContext(stmt, scop_stmt.statement, indices)
        return V.load_element(self.b, self.address(read.tensor, read.indices, read), read.dtype)
