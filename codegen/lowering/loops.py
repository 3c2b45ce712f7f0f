"""lowering: isl AST nodes and expressions → LLVM loops, branches and i64 arithmetic (one phase's loop nest)."""

from __future__ import annotations

import islpy as isl
import llvmlite.ir as ll

from tensorlang.dtypes import ScalarType

from ..emit import values as V
from ..planning.astgen import contains_loop
from ..planning.plan import Split
from .abi import poll_cancel
from .row_vectors import RowVectorLowering

# iterations of an unsplit phase's only loop between two polls of the cancel word
POLL_BLOCK = 1 << 16


class LoopLowering(RowVectorLowering):
    """The loop nest of a phase; leaves go to StatementLowering, a pipelined outer loop to
    PipelineLowering, prefetches to PrefetchLowering, innermost loops that run as explicit
    vectors to RowVectorLowering."""

    def emit_node(self, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        t = node.get_type()
        NT = isl.ast_node_type
        if t == NT.block:
            children = node.block_get_children()
            for i in range(children.n_ast_node()):
                self.emit_node(children.get_at(i), env)
        elif t == NT.mark:
            self.emit_node(node.mark_get_node(), env)
        elif t == NT.user:
            self.emit_leaf(self.ast.leaves[node.get_annotation().get_name()], env)
        elif t == NT.if_:
            cond = self.truth(self.ast_expr(node.if_get_cond(), env))
            if node.if_has_else_node():
                with self.b.if_else(cond) as (then, otherwise):
                    with then:
                        self.emit_node(node.if_get_then_node(), env)
                    with otherwise:
                        self.emit_node(node.if_get_else_node(), env)
            else:
                with self.b.if_then(cond):
                    self.emit_node(node.if_get_then_node(), env)
        elif t == NT.for_:
            self.emit_for(node, env)
        else:
            raise NotImplementedError(f"isl AST node type {t}")

    def _loop_head(self, name: str, init: ll.Value) -> tuple[ll.Block, ll.Block, ll.Block, ll.PhiInstr]:
        """Branch into a new loop header holding the induction variable `name` (starting at
        `init`); returns (preheader, body, exit, phi), positioned in the header."""
        b = self.b
        pre = b.block
        header = self.body.append_basic_block(f"{name}.header")
        body = self.body.append_basic_block(f"{name}.body")
        exit_ = self.body.append_basic_block(f"{name}.exit")
        b.branch(header)
        b.position_at_end(header)
        iv = b.phi(V.I64, name)
        iv.add_incoming(init, pre)
        return pre, body, exit_, iv

    def _open_loop(
        self,
        node: isl.AstNode,
        name: str,
        init: ll.Value,
        env: dict[str, ll.Value],
        restricted: bool,
        carried_types: list[ll.Type] = (),
        poll: bool = False,
    ) -> tuple[ll.Value, ll.PhiInstr, ll.Block, list[ll.PhiInstr]]:
        """Header and condition of the for loop `node`, positioned at the start of its body:
        (first value, induction variable, exit block, one more header phi per `carried_types`,
        undefined on entry). `restricted`: this thread runs [lo, hi) only. `poll`: each iteration
        first returns ERROR_CANCELLED if the call's cancel word is set."""
        b = self.b
        if restricted:
            init = b.select(b.icmp_signed(">", self.lo, init), self.lo, init)
        pre, body, exit_, iv = self._loop_head(name, init)
        carried = []
        for ty in carried_types:
            phi = b.phi(ty)
            phi.add_incoming(ll.Constant(ty, ll.Undefined), pre)
            carried.append(phi)
        cond = self.ast_expr(node.for_get_cond(), {**env, name: iv})
        if restricted:
            cond = b.and_(cond, b.icmp_signed("<", iv, self.hi))
        b.cbranch(cond, body, exit_)
        b.position_at_end(body)
        if poll:
            poll_cancel(b, self.cancel)
        return init, iv, exit_, carried

    def emit_for(self, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        name = node.for_get_iterator().get_id().get_name()
        init = self.ast_expr(node.for_get_init(), env)
        if node.for_is_degenerate():
            self.emit_node(node.for_get_body(), {**env, name: init})
            return
        b = self.b
        # the phase's outermost loop carries the phase's decisions; loops inside it none
        decision, self.decision = self.decision, None
        restricted = decision is not None and decision.split is Split.OUTER_LOOP
        footprints = decision.prefetch if decision is not None else ()
        pipeline = decision.pipeline if decision is not None else None
        # the phase's outermost loops (no for around them) poll the cancel word: once per
        # iteration of the loop threads split, cheap next to the loop nest inside it; a split
        # loop with nothing nested is run in chunks by the runtime instead (PhaseDecision.chunked)
        poll = self.loop_depth == 0 and not (decision is not None and decision.chunked)
        self.loop_depth += 1
        try:
            if pipeline is not None:  # always an outermost loop: it polls too
                self.emit_pipelined_for(node, pipeline, env, init, restricted, footprints)
                return
            if poll and not footprints and not contains_loop(node.for_get_body()):
                self.emit_polled_innermost_for(node, name, init, env, restricted)
                return
            if not (poll or footprints) and not contains_loop(node.for_get_body()):
                row = self.row_plan(node, name)
                if row is not None:
                    self.emit_row_vector_for(node, name, init, env, row, restricted)
                    return
            init, iv, exit_, _ = self._open_loop(node, name, init, env, restricted, poll=poll)
            inner = {**env, name: iv}
            inc = self.ast_expr(node.for_get_inc(), inner)
            if footprints:
                self.emit_prefetch(node, name, b.add(iv, inc, flags=["nsw"]), env, footprints)
            self.emit_node(node.for_get_body(), inner)
            step = b.add(iv, inc, flags=["nsw"])
            iv.add_incoming(step, b.block)
            b.branch(iv.parent)
            b.position_at_end(exit_)
        finally:
            self.loop_depth -= 1

    def emit_plain_for(
        self, node: isl.AstNode, name: str, init: ll.Value, env: dict[str, ll.Value], end: ll.Value
    ) -> None:
        """The innermost for loop `node` of unit step, from `init` while below `end` (its own
        bound, or a thread's part of it), with no polls and no prefetches."""
        b = self.b
        _, body, exit_, iv = self._loop_head(name, init)
        b.cbranch(b.icmp_signed("<", iv, end), body, exit_)
        b.position_at_end(body)
        inner = {**env, name: iv}
        inc = self.ast_expr(node.for_get_inc(), inner)
        self.emit_node(node.for_get_body(), inner)
        iv.add_incoming(b.add(iv, inc, flags=["nsw"]), b.block)
        b.branch(iv.parent)
        b.position_at_end(exit_)

    def emit_polled_innermost_for(
        self, node: isl.AstNode, name: str, init: ll.Value, env: dict[str, ll.Value], restricted: bool
    ) -> None:
        """A phase's only loop (no loop inside it) that threads do not split, so the runtime
        cannot chunk it (a scan, say), strip-mined into blocks of POLL_BLOCK iterations: the
        cancel word is polled once per block, outside the inner loop, so that the inner loop
        keeps a single exit and LLVM still vectorises it."""
        b = self.b
        if restricted:
            init = b.select(b.icmp_signed(">", self.lo, init), self.lo, init)
        inc = self.ast_expr(node.for_get_inc(), env)
        span = b.mul(inc, ll.Constant(V.I64, POLL_BLOCK), flags=["nsw"])

        def within(iv: ll.Value) -> ll.Value:
            cond = self.ast_expr(node.for_get_cond(), {**env, name: iv})
            return b.and_(cond, b.icmp_signed("<", iv, self.hi)) if restricted else cond

        _, block_body, block_exit, start = self._loop_head(f"{name}.block", init)
        b.cbranch(within(start), block_body, block_exit)
        b.position_at_end(block_body)
        poll_cancel(b, self.cancel)
        limit = b.add(start, span, flags=["nsw"])
        _, body, exit_, iv = self._loop_head(name, start)
        b.cbranch(b.and_(within(iv), b.icmp_signed("<", iv, limit)), body, exit_)
        b.position_at_end(body)
        self.emit_node(node.for_get_body(), {**env, name: iv})
        iv.add_incoming(b.add(iv, inc, flags=["nsw"]), b.block)
        b.branch(iv.parent)
        b.position_at_end(exit_)
        start.add_incoming(limit, b.block)
        b.branch(start.parent)
        b.position_at_end(block_exit)

    def truth(self, value: ll.Value) -> ll.Value:
        """A condition as i1: isl's AST may leave an integer literal in one (`c || 1`)."""
        if value.type == ll.IntType(1):
            return value
        return self.b.icmp_signed("!=", value, ll.Constant(value.type, 0))

    def ast_expr(self, e: isl.AstExpr, env: dict[str, ll.Value]) -> ll.Value:
        b = self.b
        et = e.get_type()
        if et == isl.ast_expr_type.int:
            return ll.Constant(V.I64, e.get_val().to_python())
        if et == isl.ast_expr_type.id:
            name = e.get_id().get_name()
            return env[name] if name in env else self.params[name]
        T = isl.ast_expr_op_type
        op = e.get_op_type()
        args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
        v = [self.ast_expr(a, env) for a in args]
        if op == T.add:
            return b.add(v[0], v[1], flags=["nsw"])
        if op == T.sub:
            return b.sub(v[0], v[1], flags=["nsw"])
        if op == T.mul:
            return b.mul(v[0], v[1], flags=["nsw"])
        if op == T.minus:
            return b.sub(ll.Constant(V.I64, 0), v[0], flags=["nsw"])
        if op in (T.min, T.max):
            acc = v[0]
            for x in v[1:]:
                acc = b.select(b.icmp_signed("<" if op == T.min else ">", acc, x), acc, x)
            return acc
        if op in (T.div, T.pdiv_q):
            return b.sdiv(v[0], v[1])
        if op in (T.pdiv_r, T.zdiv_r):
            return b.srem(v[0], v[1])
        if op == T.fdiv_q:
            return V.int_div_mod(b, "/", ScalarType.INT64, v[0], v[1])
        # isl's AST conditions are affine and cannot trap, so && / || need no short circuit
        if op in (T.and_, T.and_then):
            return b.and_(self.truth(v[0]), self.truth(v[1]))
        if op in (T.or_, T.or_else):
            return b.or_(self.truth(v[0]), self.truth(v[1]))
        if op in (T.select, T.cond):
            return b.select(self.truth(v[0]), v[1], v[2])
        preds = {T.eq: "==", T.le: "<=", T.lt: "<", T.ge: ">=", T.gt: ">"}
        if op in preds:
            return b.icmp_signed(preds[op], v[0], v[1])
        raise NotImplementedError(f"isl AST expression {op}")
