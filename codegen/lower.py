"""codegen: LoopAst + Scop → LLVM IR module (loops, statement bodies, run-time checks).

The module defines `tl_kernel(i8** buffers, i64* params, i64* error) -> i32`, which unpacks its
arguments and calls `tl_body`, whose tensor pointers are `noalias`. Parameters are the isl
parameters followed by every tensor dimension; when the AST is specialised to concrete sizes
they are compile-time constants instead. A non-zero return code reports a run-time error whose
details are in `error[0..3]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
import llvmlite.ir as ll

from polyhedral import Scop
from polyhedral.contraction import ContractionPlan
from polyhedral.sizes import compile_size_expr, isl_param_name
from tensorlang import ir
from tensorlang.dtypes import ScalarType

from .emit import values as V
from .emit.builtins import emit_builtin
from .gemm import declare_gemm
from .planning.astgen import Footprint, Leaf
from .planning.pipeline import PipelinePlan
from .planning.plan import (
    PREFETCH_MAX_BYTES,
    PREFETCH_MIN_BYTES,
    Extent,
    KernelPlan,
    Param,
    PhaseDecision,
    Split,
)

ERROR_INDEX = 1  # error = [code, check id, dim, value]
ERROR_DIVISION = 2


#: llvm.prefetch locality: 2 = prefetcht1, into L2 (and L3).
PREFETCH_LOCALITY = 2
CACHE_LINE = 64


@dataclass(frozen=True)
class KernelLayout:
    """How the host passes arguments: buffer order and parameter order."""

    tensors: tuple[str, ...]  # buffer pointer order
    params: tuple[Param, ...]  # isl parameters, then the extent of every tensor dimension


def kernel_layout(scop: Scop) -> KernelLayout:
    program = scop.program
    dims = tuple(Extent(t.name, d) for t in program.tensors for d in range(t.rank))
    return KernelLayout(tuple(t.name for t in program.tensors), scop.params.names + dims)


def _contains_trap_or_read(e: ir.Expr) -> bool:
    """True when evaluating `e` eagerly could read memory or trap (so it must stay lazy)."""
    for x in ir.walk(e):
        if isinstance(x, ir.Read):
            return True
        if isinstance(x, ir.Binary) and x.op in ("/", "%") and x.dtype.is_integer:
            return True
    return False


class Lowering:
    """Emits one kernel module from a KernelPlan. Single use: construct, then call `run()`."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.scop = plan.scop
        self.program = plan.scop.program
        self.ast = plan.ast
        self.plans = plan.contractions
        self.contracted = plan.contracted
        self.layouts = plan.layouts  # tensor → storage order of its dimensions
        self.param_values = plan.param_values
        self.layout = kernel_layout(plan.scop)
        self.flags = ("fast",) if plan.fast_math else ()
        self.module = ll.Module("tensorlang")
        # run-time bounds checks by what they check: (statement, read), None for the write. Reads
        # are values (frozen, compared without their spans), so a rewrite that copies a read still
        # finds its checks; equal reads of one statement get the checks of all of them.
        self.checks_of: dict[tuple[str, ir.Read | None], list[tuple[int, int]]] = {}
        for n, c in enumerate(plan.scop.checks):
            found = self.checks_of.setdefault((c.statement, c.read), [])
            found += [(n, d) for d in c.dynamic_dims if d not in {dim for _, dim in found}]
        self.read_overrides: dict[tuple[str, ir.Read], ll.Value] = {}  # (statement, read) → loaded earlier
        self.decision: PhaseDecision | None = None  # the phase being emitted; its outer loop not yet
        self.leaf_statement: PolyLeafContext | None = None
        self.phase_functions: list[ll.Function] = []

    # ------------------------------------------------------------------ driver

    def run(self) -> ll.Module:
        for decision, phase in zip(self.plan.phases, self.ast.phases):
            self._begin_phase(decision.index)
            self.decision = decision
            self.restrict_gemm_rows = decision.split is Split.GEMM_ROWS
            self.emit_node(phase.node, {})
            self.b.ret(ll.Constant(V.I32, 0))
        self._emit_entry()
        return self.module

    def _begin_phase(self, n: int) -> None:
        """A function `tl_phase<n>(tensors..., [params...], error, lo, hi)` with noalias tensors."""
        layout = self.layout
        tensor_types = [V.memory_type(self.program.tensor(t).dtype).as_pointer() for t in layout.tensors]
        param_types = [] if self.param_values is not None else [V.I64] * len(layout.params)
        ty = ll.FunctionType(
            V.I32, tensor_types + param_types + [V.I64.as_pointer(), V.I64, V.I64, V.I8.as_pointer()]
        )
        fn = ll.Function(self.module, ty, f"tl_phase{n}")
        fn.attributes.add("noinline")
        fn.attributes.add("nounwind")
        for arg in fn.args[: len(tensor_types)]:
            arg.add_attribute("noalias")
        self.body = fn
        self.phase_functions.append(fn)
        self.error_ptr, self.lo, self.hi, self.workspace = fn.args[-4:]
        self.b = ll.IRBuilder(fn.append_basic_block("entry"))
        if self.param_values is not None:
            self.params = {p: ll.Constant(V.I64, int(self.param_values[p])) for p in layout.params}
        else:
            self.params = dict(zip(layout.params, fn.args[len(tensor_types) : -4]))
        self.pointers = dict(zip(layout.tensors, fn.args))

    def _emit_entry(self) -> None:
        """tl_kernel(i8** buffers, i64* params, i64* error, i64 phase, i64 lo, i64 hi) -> i32"""
        ptr_ty = V.I8.as_pointer()
        ty = ll.FunctionType(
            V.I32, [ptr_ty.as_pointer(), V.I64.as_pointer(), V.I64.as_pointer(), V.I64, V.I64, V.I64, ptr_ty]
        )
        fn = ll.Function(self.module, ty, "tl_kernel")
        buffers, params, error, phase, lo, hi, workspace = fn.args
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        args = []
        for n in range(len(self.layout.tensors)):
            raw = b.load(b.gep(buffers, [ll.Constant(V.I64, n)]))
            args.append(
                b.bitcast(raw, V.memory_type(self.program.tensor(self.layout.tensors[n]).dtype).as_pointer())
            )
        if self.param_values is None:
            for n in range(len(self.layout.params)):
                args.append(b.load(b.gep(params, [ll.Constant(V.I64, n)])))
        args += [error, lo, hi, workspace]
        default = fn.append_basic_block("no_such_phase")
        switch = b.switch(phase, default)
        for n, phase_fn in enumerate(self.phase_functions):
            block = fn.append_basic_block(f"phase{n}")
            switch.add_case(ll.Constant(V.I64, n), block)
            b.position_at_end(block)
            b.ret(b.call(phase_fn, args))
        b.position_at_end(default)
        b.ret(ll.Constant(V.I32, 0))

    # ------------------------------------------------------------------ AST nodes

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
            cond = self.ast_expr(node.if_get_cond(), env)
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
    ) -> tuple[ll.Value, ll.PhiInstr, ll.Block, list[ll.PhiInstr]]:
        """Header and condition of the for loop `node`, positioned at the start of its body:
        (first value, induction variable, exit block, one more header phi per `carried_types`,
        undefined on entry). `restricted`: this thread runs [lo, hi) only."""
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
        if pipeline is not None:
            self.emit_pipelined_for(node, pipeline, env, init, restricted, footprints)
            return
        init, iv, exit_, _ = self._open_loop(node, name, init, env, restricted)
        inner = {**env, name: iv}
        inc = self.ast_expr(node.for_get_inc(), inner)
        if footprints:
            self.emit_prefetch(node, name, b.add(iv, inc, flags=["nsw"]), env, footprints)
        self.emit_node(node.for_get_body(), inner)
        step = b.add(iv, inc, flags=["nsw"])
        iv.add_incoming(step, b.block)
        b.branch(iv.parent)
        b.position_at_end(exit_)

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
        loop A before it (codegen/pipeline.py): prologue = the first row's A alone, epilogue =
        the last row's B alone. B's row-invariant reads of values the phase writes are loaded at
        the end of each row and carried to the next iteration in registers. When threads split
        the loop, each runs its rows [lo, hi) as a pipeline of its own (every row's work stays
        with the thread that owns the row, so rows remain independent)."""
        b = self.b
        name = node.for_get_iterator().get_id().get_name()
        types = [V.register_type(read.dtype) for _, read in plan.captured]
        init, iv, exit_, carried = self._open_loop(node, name, init, env, restricted, types)
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
            return b.and_(v[0], v[1])
        if op in (T.or_, T.or_else):
            return b.or_(v[0], v[1])
        if op in (T.select, T.cond):
            return b.select(v[0], v[1], v[2])
        preds = {T.eq: "==", T.le: "<=", T.lt: "<", T.ge: ">=", T.gt: ">"}
        if op in preds:
            return b.icmp_signed(preds[op], v[0], v[1])
        raise NotImplementedError(f"isl AST expression {op}")

    # ------------------------------------------------------------------ statements

    def emit_leaf(self, leaf: Leaf, env: dict[str, ll.Value]) -> None:
        stmt = self.scop.statement(leaf.statement)
        indices = {var: self.ast_expr(expr, env) for var, expr in leaf.index_exprs}
        ctx = PolyLeafContext(stmt.name, stmt.statement, indices)
        self.leaf_statement = ctx
        st = stmt.statement
        target = self.program.tensor(st.tensor)
        if stmt.name in self.plans:
            self.emit_gemm(self.plans[stmt.name], target.dtype)
            return
        lhs = tuple(ir.IndexRef(name=v) for v in st.indices)
        ptr = self.address(st.tensor, lhs, None)
        if stmt.kind == "init":
            V.store_element(self.b, V.identity(st.op, target.dtype), ptr, target.dtype)
            return
        value = self.value(st.rhs)
        if st.op != "=":
            old = V.load_element(self.b, ptr, target.dtype)
            # the language leaves the order of a reduction unspecified, so its accumulation may be
            # reassociated (that is what lets LLVM vectorise it), whatever fast_math says
            reduction_flags = self.flags if self.flags else ("reassoc",)
            value = V.combine(self.b, st.op, target.dtype, old, value, reduction_flags)
        V.store_element(self.b, value, ptr, target.dtype)

    def emit_gemm(self, plan: ContractionPlan, dtype: ScalarType) -> None:
        """C[m, n] += A[m, k] · B[k, n] for the current outer point, as one packed GEMM call."""
        b = self.b
        st = self.leaf_statement.statement
        lo = {r.var: self.size_value(r.lo) for r in st.ranges}
        hi = {r.var: self.size_value(r.hi) for r in st.ranges}
        values = dict(self.leaf_statement.indices)
        m_lo, m_hi = lo[plan.m], hi[plan.m]
        if self.restrict_gemm_rows:  # this thread computes rows [lo, hi) of M only
            m_lo = b.select(b.icmp_signed(">", self.lo, m_lo), self.lo, m_lo)
            m_hi = b.select(b.icmp_signed("<", self.hi, m_hi), self.hi, m_hi)
        values.update({plan.m: m_lo, plan.n: lo[plan.n], plan.k: lo[plan.k]})

        def extent(a, z):
            d = b.sub(z, a)
            return b.select(b.icmp_signed("<", d, ll.Constant(V.I64, 0)), ll.Constant(V.I64, 0), d)

        def operand(op) -> tuple[ll.Value, dict[str, ll.Value]]:
            """Base pointer at the current point, and the element stride of each variable."""
            strides = self.element_strides(op.tensor)
            offset = ll.Constant(V.I64, 0)
            var_stride: dict[str, ll.Value] = {v: ll.Constant(V.I64, 0) for v in (plan.m, plan.n, plan.k)}
            for d, form in enumerate(op.forms):
                sub = ll.Constant(V.I64, form.constant)
                for name, coeff in form.coeffs:
                    value = values[name] if name in values else self.params[isl_param_name(name)]
                    sub = b.add(sub, b.mul(value, ll.Constant(V.I64, coeff), flags=["nsw"]), flags=["nsw"])
                    if name in var_stride:
                        var_stride[name] = b.add(
                            var_stride[name], b.mul(strides[d], ll.Constant(V.I64, coeff))
                        )
                offset = b.add(offset, b.mul(sub, strides[d], flags=["nsw"]), flags=["nsw"])
            return b.gep(self.pointers[op.tensor], [offset]), var_stride

        a_ptr, a_st = operand(plan.a)
        b_ptr, b_st = operand(plan.b)
        c_ptr, c_st = operand(plan.c)
        gemm = declare_gemm(self.module, dtype.numpy_name)
        b.call(
            gemm,
            [
                extent(m_lo, m_hi), extent(lo[plan.n], hi[plan.n]), extent(lo[plan.k], hi[plan.k]),
                a_ptr, a_st[plan.m], a_st[plan.k],
                b_ptr, b_st[plan.k], b_st[plan.n],
                c_ptr, c_st[plan.m], c_st[plan.n],
                self.workspace,
            ],
        )  # fmt: skip

    # ------------------------------------------------------------------ prefetching

    def emit_prefetch(
        self,
        loop: isl.AstNode,
        iterator: str,
        next_iv: ll.Value,
        env: dict[str, ll.Value],
        footprints: tuple[Footprint, ...],
    ) -> None:
        """At the top of an iteration of a phase's outer loop: prefetch, one cache line at a
        time, what the next iteration reads, so that rows a body makes several passes over
        (softmax: max, exp and sum, divide) could arrive while this row computes. (Measured on
        softmax and layer norm here it did not pay: Options(prefetch) is off by default.) Only
        contiguous footprints (the box covers at least half of its address range) of
        PREFETCH_MIN_BYTES to PREFETCH_MAX_BYTES are fetched, and nothing past the loop's last
        iteration."""
        b = self.b
        nxt = {**env, iterator: next_iv}
        with b.if_then(self.ast_expr(loop.for_get_cond(), nxt)):
            for f in footprints:
                t = self.program.tensor(f.tensor)
                size = t.dtype.storage_bytes
                lo = [self.ast_expr(e, nxt) for e in f.lo]
                hi = [self.ast_expr(e, nxt) for e in f.hi]
                strides = self.element_strides(f.tensor)
                first = last = ll.Constant(V.I64, 0)
                count: ll.Value = ll.Constant(V.I64, 1)
                for lo_d, hi_d, stride in zip(lo, hi, strides):
                    first = b.add(first, b.mul(lo_d, stride))
                    last = b.add(last, b.mul(hi_d, stride))
                    count = b.mul(count, b.add(b.sub(hi_d, lo_d), ll.Constant(V.I64, 1)))
                span = b.add(b.sub(last, first), ll.Constant(V.I64, 1))
                worth = b.and_(
                    b.icmp_signed("<=", span, b.mul(count, ll.Constant(V.I64, 2))),
                    b.icmp_signed("<=", span, ll.Constant(V.I64, PREFETCH_MAX_BYTES // size)),
                )
                worth = b.and_(
                    worth, b.icmp_signed(">=", span, ll.Constant(V.I64, -(-PREFETCH_MIN_BYTES // size)))
                )
                with b.if_then(worth):
                    start = b.bitcast(b.gep(self.pointers[f.tensor], [first]), V.I8.as_pointer())
                    self.emit_prefetch_lines(start, b.mul(span, ll.Constant(V.I64, size)))

    def emit_prefetch_lines(self, start: ll.Value, nbytes: ll.Value) -> None:
        """for (o = 0; o < nbytes; o += 64) prefetch(start + o) into L2."""
        b = self.b
        fn = self.module.globals.get("llvm.prefetch.p0")
        if fn is None:
            fn = ll.Function(
                self.module,
                ll.FunctionType(ll.VoidType(), [V.I8.as_pointer(), V.I32, V.I32, V.I32]),
                "llvm.prefetch.p0",
            )
        pre = b.block
        loop = self.body.append_basic_block("prefetch.loop")
        done = self.body.append_basic_block("prefetch.done")
        b.branch(loop)
        b.position_at_end(loop)
        offset = b.phi(V.I64, "prefetch.offset")
        offset.add_incoming(ll.Constant(V.I64, 0), pre)
        # rw = read, locality 2 (prefetcht1: into L2 and below), data cache
        args = [ll.Constant(V.I32, 0), ll.Constant(V.I32, PREFETCH_LOCALITY), ll.Constant(V.I32, 1)]
        b.call(fn, [b.gep(start, [offset]), *args])
        nxt = b.add(offset, ll.Constant(V.I64, CACHE_LINE))
        offset.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, nbytes), loop, done)
        b.position_at_end(done)

    def size_value(self, expr) -> ll.Value:
        """A size expression's value (the code is specialised, so it is a constant)."""
        return ll.Constant(V.I64, compile_size_expr(expr)(self.ast.sizes))

    def index_value(self, e: ir.Expr) -> ll.Value:
        """An integral subscript as i64 (affine ones directly in 64-bit arithmetic)."""
        form = ir.affine_form(e)
        b = self.b
        if form is None:
            return V.to_index(b, self.value(e), e.dtype)
        acc = ll.Constant(V.I64, form.constant)
        for name, coeff in form.coeffs:
            term = self.leaf_statement.indices.get(name)
            if term is None:
                term = self.params[isl_param_name(name)]
            if coeff != 1:
                term = b.mul(term, ll.Constant(V.I64, coeff), flags=["nsw"])
            acc = b.add(acc, term, flags=["nsw"])
        return acc

    def extent(self, tensor: str, d: int) -> ll.Value:
        return self.params[Extent(tensor, d)]

    def address(self, tensor: str, subscripts: tuple[ir.Expr, ...], read: ir.Read | None) -> ll.Value:
        b = self.b
        idx = [self.index_value(s) for s in subscripts]
        for check, d in self.checks_of.get((self.leaf_statement.name, read), ()):
            self.require_in_range(idx[d], self.extent(tensor, d), check, d)
        offset = ll.Constant(V.I64, 0)
        for i, stride in zip(idx, self.element_strides(tensor)):
            offset = b.add(offset, b.mul(i, stride, flags=["nsw"]), flags=["nsw"])
        return b.gep(self.pointers[tensor], [offset], inbounds=True)

    def element_strides(self, tensor: str) -> list[ll.Value]:
        """The stride in elements of each (logical) dimension of `tensor`'s storage: row-major,
        in the storage order of a relayout if it has one, 0 along a contracted dimension."""
        b = self.b
        rank = self.program.tensor(tensor).rank
        order = self.layouts.get(tensor, tuple(range(rank)))  # storage position → logical dim
        contracted = self.contracted.get(tensor)
        strides: list[ll.Value] = [ll.Constant(V.I64, 0)] * rank
        running: ll.Value = ll.Constant(V.I64, 1)
        for d in reversed(order):
            if contracted is not None and d == contracted.dim:
                continue  # one slice stored: the index along this dimension does not move
            strides[d] = running
            running = b.mul(running, self.extent(tensor, d), flags=["nsw"])
        return strides

    def fail(self, code: int, detail: tuple[ll.Value, ...]) -> None:
        """At the current position: record the error and return `code`."""
        b = self.b
        values = (ll.Constant(V.I64, code),) + detail
        for n, v in enumerate(values):
            b.store(v, b.gep(self.error_ptr, [ll.Constant(V.I64, n)]))
        b.ret(ll.Constant(V.I32, code))

    def require(self, ok: ll.Value, code: int, detail: tuple[ll.Value, ...]) -> None:
        bad = self.body.append_basic_block("check.fail")
        cont = self.body.append_basic_block("check.ok")
        self.b.cbranch(ok, cont, bad)
        self.b.position_at_end(bad)
        self.fail(code, detail)
        self.b.position_at_end(cont)

    def require_in_range(self, index: ll.Value, extent: ll.Value, check: int, dim: int) -> None:
        # one unsigned comparison covers both index < 0 and index >= extent
        ok = self.b.icmp_unsigned("<", index, extent)
        self.require(ok, ERROR_INDEX, (ll.Constant(V.I64, check), ll.Constant(V.I64, dim), index))

    # ------------------------------------------------------------------ expressions

    def value(self, e: ir.Expr) -> ll.Value:
        b = self.b
        match e:
            case ir.Const(value=v):
                return V.const(e.dtype, v)
            case ir.IndexRef(name=n):
                return V.convert(b, self.leaf_statement.indices[n], ScalarType.INT64, e.dtype)
            case ir.SizeRef(name=n):
                return V.convert(b, self.params[isl_param_name(n)], ScalarType.INT64, e.dtype)
            case ir.Read(tensor=t, indices=ix):
                carried = self.read_overrides.get((self.leaf_statement.name, e))
                if carried is not None:
                    return carried
                return V.load_element(b, self.address(t, ix, e), e.dtype)
            case ir.Cast(operand=o):
                return V.convert(b, self.value(o), o.dtype, e.dtype)
            case ir.Unary(op="!", operand=o):
                return b.xor(self.value(o), ll.Constant(V.I1, 1))
            case ir.Unary(op="-", operand=o):
                x = self.value(o)
                return b.fneg(x) if e.dtype.is_float else b.sub(ll.Constant(x.type, 0), x)
            case ir.Select(cond=c, if_true=t, if_false=f):
                return self.select(c, t, f)
            case ir.Binary(op="&&" | "||", lhs=lhs, rhs=rhs):
                if not _contains_trap_or_read(rhs):
                    x, y = self.value(lhs), self.value(rhs)
                    return b.and_(x, y) if e.op == "&&" else b.or_(x, y)
                if e.op == "&&":
                    return self.select(lhs, rhs, ir.Const(value=False, dtype=ScalarType.BOOL))
                return self.select(lhs, ir.Const(value=True, dtype=ScalarType.BOOL), rhs)
            case ir.Binary(op=op, lhs=lhs, rhs=rhs):
                return self.binary(op, lhs, rhs, e.dtype)
            case ir.Call(function=fn, args=args):
                return emit_builtin(b, fn, [self.value(a) for a in args])
        raise NotImplementedError(f"expression {e!r}")

    def select(self, cond: ir.Expr, if_true: ir.Expr, if_false: ir.Expr) -> ll.Value:
        b = self.b
        c = self.value(cond)
        if not (_contains_trap_or_read(if_true) or _contains_trap_or_read(if_false)):
            return b.select(c, self.value(if_true), self.value(if_false))
        with b.if_else(c) as (then, otherwise):
            with then:
                t_val = self.value(if_true)
                t_block = b.block
            with otherwise:
                f_val = self.value(if_false)
                f_block = b.block
        phi = b.phi(t_val.type)
        phi.add_incoming(t_val, t_block)
        phi.add_incoming(f_val, f_block)
        return phi

    def binary(self, op: str, lhs: ir.Expr, rhs: ir.Expr, dtype: ScalarType) -> ll.Value:
        b = self.b
        t = lhs.dtype
        x, y = self.value(lhs), self.value(rhs)
        if op in ir.COMPARISON_OPS:
            return V.compare(b, op, t, x, y)
        if op in ("min", "max"):
            return V.combine(b, op, t, x, y, self.flags)
        if t.is_bool:
            return {"+": b.or_, "*": b.and_, "-": b.xor}.get(op, b.or_)(x, y)
        if t.is_float:
            if op == "+":
                return b.fadd(x, y, flags=self.flags)
            if op == "-":
                return b.fsub(x, y, flags=self.flags)
            if op == "*":
                return b.fmul(x, y, flags=self.flags)
            if op == "/":
                return b.fdiv(x, y, flags=self.flags)
            if op == "%":
                return V.float_mod(b, x, y, self.flags)
        else:
            if op == "+":
                return b.add(x, y)
            if op == "-":
                return b.sub(x, y)
            if op == "*":
                return b.mul(x, y)
            if op in ("/", "%"):
                if not (isinstance(y, ll.Constant) and y.constant != 0):
                    ok = b.icmp_unsigned("!=", y, ll.Constant(y.type, 0))
                    position = ll.Constant(V.I64, self.leaf_statement.statement_position)
                    self.require(ok, ERROR_DIVISION, (position, ll.Constant(V.I64, 0), ll.Constant(V.I64, 0)))
                return V.int_div_mod(b, op, t, x, y)
        raise NotImplementedError(f"operator {op} on {t}")


@dataclass
class PolyLeafContext:
    """The statement instance being emitted: its name and index variable values."""

    name: str
    statement: ir.Statement
    indices: dict[str, ll.Value]

    @property
    def statement_position(self) -> int:
        return int(self.name[1:])


def lower_to_llvm(plan: KernelPlan) -> tuple[ll.Module, KernelLayout]:
    """The plan's LLVM module and the argument layout its entry expects."""
    lowering = Lowering(plan)
    return lowering.run(), lowering.layout
