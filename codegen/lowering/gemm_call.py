"""lowering: a contraction's ContractionPlan → one call of the packed GEMM at the current outer point."""

from __future__ import annotations

import math

import llvmlite.ir as ll
import sympy

from polyhedral.contraction import ContractionPlan
from polyhedral.sizes import isl_param_name, split_coefficient
from tensorlang.dtypes import ScalarType

from ..emit import values as V
from ..emit.gemm_kernel import declare_gemm
from ..emit.gemm_small import define_small_gemm
from ..emit.gemm_team import TEAM_TICKET
from .abi import poll_cancel
from .state import LoweringState

INT64_MIN = -(2**63)  # the lo of a call that runs a whole phase


class GemmCallLowering(LoweringState):
    """Contractions the plan sends to the GEMM library (codegen/emit/gemm_kernel.py)."""

    def emit_gemm(self, plan: ContractionPlan, dtype: ScalarType) -> None:
        """C[m, n] += A[m, k] · B[k, n] for the current outer point, as one packed GEMM call
        (C = A·B when the phase's init was folded into it), shared by a team of threads when
        the runtime passes one. A generic kernel's call checks the extents first and runs small
        ones (below plan.small_gemm_work) as plain vector loops (emit/gemm_small.py)."""
        b = self.b
        st = self.leaf_statement.statement
        lo = {r.var: self.range_bound(r.lo) for r in st.ranges}
        hi = {r.var: self.range_bound(r.hi) for r in st.ranges}
        values = dict(self.leaf_statement.indices)
        m_lo, m_hi = lo[plan.m], hi[plan.m]
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
        gemm = declare_gemm(self.module, self.plan.gemm_variant(dtype.numpy_name))
        no_team = ll.Constant(V.I8.as_pointer(), None)
        team = no_team
        if self.gemm_team:  # a thread of a team gets the shared block's address as lo
            alone = b.icmp_signed("==", self.lo, ll.Constant(V.I64, INT64_MIN))
            team = b.select(alone, no_team, b.inttoptr(self.lo, V.I8.as_pointer()))
        extents = [extent(m_lo, m_hi), extent(lo[plan.n], hi[plan.n]), extent(lo[plan.k], hi[plan.k])]
        operands = [
            a_ptr, a_st[plan.m], a_st[plan.k],
            b_ptr, b_st[plan.k], b_st[plan.n],
            c_ptr, c_st[plan.m], c_st[plan.n],
        ]  # fmt: skip
        overwrite = ll.Constant(V.I64, int(self.gemm_overwrite))
        if self.plan.small_gemm_work is None:  # specialised: planning chose the GEMM for these sizes
            b.call(gemm, [*extents, *operands, self.workspace, self.cancel, overwrite, team])
            poll_cancel(b, self.cancel)  # the GEMM returned early: so does the phase
            return
        # generic: small extents (known only now) run plain loops; each extent is bounded too,
        # so that the product cannot overflow
        limit = ll.Constant(V.I64, self.plan.small_gemm_work)
        small = b.icmp_signed("<", b.mul(b.mul(extents[0], extents[1]), extents[2]), limit)
        for e in extents:
            small = b.and_(small, b.icmp_signed("<", e, limit))
        loops = define_small_gemm(self.module, dtype.numpy_name)
        with b.if_else(small) as (plain, packed):
            with plain:
                if not self.gemm_team:
                    b.call(loops, [*extents, *operands, overwrite])
                else:  # every thread of the team gets here: the first to take a ticket runs it
                    alone = b.icmp_signed("==", self.lo, ll.Constant(V.I64, INT64_MIN))
                    with b.if_else(alone) as (solo, shared):
                        with solo:
                            b.call(loops, [*extents, *operands, overwrite])
                        with shared:
                            block = b.inttoptr(self.lo, V.I8.as_pointer())
                            ticket = b.bitcast(
                                b.gep(block, [ll.Constant(V.I64, TEAM_TICKET)]), V.I64.as_pointer()
                            )
                            taken = b.atomic_rmw("add", ticket, ll.Constant(V.I64, 1), "monotonic")
                            with b.if_then(b.icmp_signed("==", taken, ll.Constant(V.I64, 0))):
                                b.call(loops, [*extents, *operands, overwrite])
            with packed:
                b.call(gemm, [*extents, *operands, self.workspace, self.cancel, overwrite, team])
        poll_cancel(b, self.cancel)  # the GEMM returned early: so does the phase

    def range_bound(self, expr: sympy.Expr) -> ll.Value:
        """A range bound's value: a constant of specialised code, else computed at run time from
        the kernel's size parameters (a generic kernel)."""
        if self.param_values is not None:
            return self.size_value(expr)
        num, den = self._rational(sympy.sympify(expr))
        if den != 1:
            raise ValueError(f"size expression {expr} is not integral")
        return num

    def _rational(self, e: sympy.Expr) -> tuple[ll.Value, int]:
        """A size expression as numerator (i64, at run time) over a positive constant denominator:
        the expressions range inference writes (sums, rational multiples, min, max, floor,
        ceiling, modulo by a constant); anything else is a derived parameter (polyhedral/sizes.py)."""
        b = self.b
        derived = {atom: name for name, atom in self.scop.params.derived}
        if e in derived:
            return self.params[derived[e]], 1
        if e.is_Integer:
            return ll.Constant(V.I64, int(e)), 1
        if e.is_Rational:
            return ll.Constant(V.I64, int(e.p)), int(e.q)
        if e.is_Symbol:
            return self.params[isl_param_name(e.name)], 1
        if isinstance(e, sympy.Add | sympy.Min | sympy.Max):
            parts = [self._rational(a) for a in e.args]
            den = math.lcm(*(d for _, d in parts))
            nums = [
                n if d == den else b.mul(n, ll.Constant(V.I64, den // d), flags=["nsw"]) for n, d in parts
            ]
            acc = nums[0]
            for x in nums[1:]:
                if isinstance(e, sympy.Add):
                    acc = b.add(acc, x, flags=["nsw"])
                else:
                    keep = b.icmp_signed("<" if isinstance(e, sympy.Min) else ">", acc, x)
                    acc = b.select(keep, acc, x)
            return acc, den
        if isinstance(e, sympy.Mul):
            coeff, rest = split_coefficient(e)
            if len(rest) == 1:
                num, den = self._rational(rest[0])
                return b.mul(num, ll.Constant(V.I64, int(coeff.p)), flags=["nsw"]), den * int(coeff.q)
        if isinstance(e, sympy.floor | sympy.ceiling):
            num, den = self._rational(e.args[0])
            if den == 1:
                return num, 1
            q = ll.Constant(V.I64, den)
            if isinstance(e, sympy.floor):
                return V.int_div_mod(b, "/", ScalarType.INT64, num, q), 1
            neg = b.sub(ll.Constant(V.I64, 0), num)
            return b.sub(ll.Constant(V.I64, 0), V.int_div_mod(b, "/", ScalarType.INT64, neg, q)), 1
        if isinstance(e, sympy.Mod) and e.args[1].is_Integer and e.args[1] > 0:
            num, den = self._rational(e.args[0])
            if den == 1:
                return V.int_div_mod(b, "%", ScalarType.INT64, num, ll.Constant(V.I64, int(e.args[1]))), 1
        raise ValueError(f"cannot evaluate size expression {e} at run time")
