"""lowering: statement instances and their expressions → loads, arithmetic, checked addresses and stores."""

from __future__ import annotations

import llvmlite.ir as ll

from polyhedral.sizes import compile_size_expr, isl_param_name
from tensorlang import ir
from tensorlang.dtypes import ScalarType

from ..emit import values as V
from ..emit.builtins import emit_builtin
from ..planning.astgen import Leaf
from ..planning.plan import Extent
from .abi import ERROR_DIVISION, require, require_in_range
from .conv_call import emit_conv_call
from .state import LoweringState, PolyLeafContext


def _contains_trap_or_read(e: ir.Expr) -> bool:
    """True when evaluating `e` eagerly could read memory or trap (so it must stay lazy)."""
    for x in ir.walk(e):
        if isinstance(x, ir.Read):
            return True
        if isinstance(x, ir.Binary) and x.op in ("/", "%") and x.dtype.is_integer:
            return True
    return False


class StatementLowering(LoweringState):
    """One statement instance at a time: the leaf's value, stored (or accumulated) at its address."""

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
        if stmt.name in self.plan.convolutions:
            emit_conv_call(self, self.plan.convolutions[stmt.name], target.dtype)
            return
        # a reduction into a privatised tensor writes this chunk's copy; its initialisation the tensor
        private = self.private_pointers.get(st.tensor) if stmt.kind != "init" else None
        # (a scatter's subscripts are checked here)
        ptr = (
            self.address(st.tensor, st.lhs, None)
            if private is None
            else self.address(st.tensor, st.lhs, None, private)
        )
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

    def address(
        self, tensor: str, subscripts: tuple[ir.Expr, ...], read: ir.Read | None, base: ll.Value | None = None
    ) -> ll.Value:
        """The element's address, in `tensor`'s storage or at the same offset from `base`."""
        b = self.b
        idx = [self.index_value(s) for s in subscripts]
        for check, d in self.checks_of.get((self.leaf_statement.name, read), ()):
            require_in_range(b, self.error_ptr, idx[d], self.extent(tensor, d), check, d)
        fold = self.plan.folded.get(tensor)
        if fold is not None:
            # the slot of a folded dimension: the index is in bounds, so non-negative (urem by a
            # constant is a multiply and shift, hoisted out of the inner loops with the index)
            idx[fold.dim] = b.urem(idx[fold.dim], ll.Constant(V.I64, fold.modulus))
        offset = ll.Constant(V.I64, 0)
        for i, stride in zip(idx, self.element_strides(tensor)):
            offset = b.add(offset, b.mul(i, stride, flags=["nsw"]), flags=["nsw"])
        return b.gep(self.pointers[tensor] if base is None else base, [offset], inbounds=True)

    def pads_rows(self) -> bool:
        """Whether folded temporaries' rows are padded to their pitch: a CPU storage decision
        (the CUDA runtime, and its emulation on the host, allocate them unpadded)."""
        return "nvptx" not in str(self.module.triple) and not getattr(self, "emulate", False)

    def element_strides(self, tensor: str) -> list[ll.Value]:
        """The stride in elements of each (logical) dimension of `tensor`'s storage: row-major,
        in the storage order of a relayout if it has one, 0 along a contracted dimension, and
        with a folded dimension's extent its modulus (`address` takes the index modulo it) and a
        folded temporary's padded rows their pitch."""
        b = self.b
        rank = self.program.tensor(tensor).rank
        order = self.layouts.get(tensor, tuple(range(rank)))  # storage position → logical dim
        contracted = self.contracted.get(tensor)
        fold = self.plan.folded.get(tensor)
        strides: list[ll.Value] = [ll.Constant(V.I64, 0)] * rank
        running: ll.Value = ll.Constant(V.I64, 1)
        for d in reversed(order):
            if contracted is not None and d == contracted.dim:
                continue  # one slice stored: the index along this dimension does not move
            strides[d] = running
            extent = self.extent(tensor, d)
            if fold is not None and d == fold.dim:
                extent = ll.Constant(V.I64, fold.modulus)
            elif fold is not None and fold.pitch is not None and d == rank - 1 and self.pads_rows():
                extent = ll.Constant(V.I64, fold.pitch)  # rows padded to a whole cache line
            running = b.mul(running, extent, flags=["nsw"])
        return strides

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
                    detail = (position, ll.Constant(V.I64, 0), ll.Constant(V.I64, 0))
                    require(b, self.error_ptr, ok, ERROR_DIVISION, detail)
                return V.int_div_mod(b, op, t, x, y)
        raise NotImplementedError(f"operator {op} on {t}")
