"""export: sympy size expressions → exact int64 LLVM IR, so that a C entry computes shapes and parameters from its sizes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl
import llvmlite.ir as ll
import sympy

from tensorlang.errors import TensorLangError

from ..emit import values as V


class UnsupportedSizeExpression(TensorLangError):
    """A size expression the generic export cannot evaluate in generated code."""


@dataclass(frozen=True)
class _Rational:
    """num / den with a run-time numerator and a positive compile-time denominator: size
    expressions hold rationals under floor/ceiling (`floor(N/2)`), and only the final value must be
    an integer, so intermediate values are kept exact like the Python evaluator's Fractions."""

    num: ll.Value
    den: int


def _const(value: int) -> ll.Constant:
    return ll.Constant(V.I64, value)


class SizeIR:
    """Emits size expressions at the builder's position; `symbols` maps a size name to its value."""

    def __init__(self, b: ll.IRBuilder, symbols: Mapping[str, ll.Value]):
        self.b = b
        self.symbols = symbols

    def integer(self, expr: object) -> ll.Value:
        """The exact int64 value of an integral size expression."""
        r = self._emit(sympy.sympify(expr))
        return r.num if r.den == 1 else self.b.sdiv(r.num, _const(r.den))

    def _scaled(self, r: _Rational, den: int) -> ll.Value:
        """r's numerator over the denominator `den` (a multiple of r.den)."""
        return r.num if den == r.den else self.b.mul(r.num, _const(den // r.den))

    def _floor_div(self, num: ll.Value, den: int) -> ll.Value:
        """⌊num / den⌋ for den > 0 (sdiv truncates towards zero)."""
        b = self.b
        if den == 1:
            return num
        q = b.sdiv(num, _const(den))
        negative_rest = b.icmp_signed("<", b.srem(num, _const(den)), _const(0))
        return b.sub(q, b.zext(negative_rest, V.I64))

    def _emit(self, e: sympy.Expr) -> _Rational:
        b = self.b
        if e.is_Integer:
            return _Rational(_const(int(e)), 1)
        if e.is_Rational:
            return _Rational(_const(int(e.p)), int(e.q))
        if e.is_Symbol:
            if e.name not in self.symbols:
                raise UnsupportedSizeExpression(f"size expression {e}: {e.name} is not a size")
            return _Rational(self.symbols[e.name], 1)
        if isinstance(e, sympy.Add | sympy.Min | sympy.Max | sympy.Mod):
            parts = [self._emit(a) for a in e.args]
            den = math.lcm(*(p.den for p in parts))
            nums = [self._scaled(p, den) for p in parts]
            out = nums[0]
            for n in nums[1:]:
                if isinstance(e, sympy.Add):
                    out = b.add(out, n)
                elif isinstance(e, sympy.Min):
                    out = b.select(b.icmp_signed("<", n, out), n, out)
                elif isinstance(e, sympy.Max):
                    out = b.select(b.icmp_signed(">", n, out), n, out)
                else:  # Python's modulo (sign of the divisor), as the Python evaluator computes it
                    zero = b.icmp_signed("==", n, _const(0))
                    divisor = b.select(zero, _const(1), n)  # a zero divisor must not trap
                    rest = b.srem(out, divisor)
                    signs_differ = b.icmp_signed("<", b.xor(rest, divisor), _const(0))
                    fix = b.and_(b.icmp_signed("!=", rest, _const(0)), signs_differ)
                    out = b.select(fix, b.add(rest, divisor), rest)
            return _Rational(out, den)
        if isinstance(e, sympy.Mul):
            out = _Rational(_const(1), 1)
            for a in e.args:
                p = self._emit(a)
                out = _Rational(b.mul(out.num, p.num), out.den * p.den)
            return out
        if isinstance(e, sympy.Pow) and e.args[1].is_Integer and int(e.args[1]) >= 0:
            base = self._emit(e.args[0])
            out = _Rational(_const(1), 1)
            for _ in range(int(e.args[1])):
                out = _Rational(b.mul(out.num, base.num), out.den * base.den)
            return out
        if isinstance(e, sympy.floor | sympy.ceiling):
            r = self._emit(e.args[0])
            if isinstance(e, sympy.floor):
                return _Rational(self._floor_div(r.num, r.den), 1)
            negated = self._floor_div(b.neg(r.num), r.den)  # ⌈x⌉ = -⌊-x⌋
            return _Rational(b.neg(negated), 1)
        raise UnsupportedSizeExpression(f"size expression {e} cannot be computed in exported code")


def in_parameter_set(b: ll.IRBuilder, params: isl.Set, values: Mapping[str, ll.Value]) -> ll.Value:
    """Whether the isl parameters' `values` lie in `params` (a set over parameters only): an OR
    over its basic sets of an AND over their affine constraints."""
    kind = isl.dim_type.param
    inside = ll.Constant(V.I1, 0)
    for basic in params.get_basic_sets():
        if basic.dim(isl.dim_type.div) or basic.dim(isl.dim_type.set):  # no existentials in plain IR
            raise UnsupportedSizeExpression(
                f"the call-time bounds check {params} is not a plain affine condition"
            )
        names = [basic.get_dim_name(kind, i) for i in range(basic.dim(kind))]
        every = ll.Constant(V.I1, 1)
        for c in basic.get_constraints():
            total = _const(int(c.get_constant_val().to_python()))
            for i, name in enumerate(names):
                coeff = int(c.get_coefficient_val(kind, i).to_python())
                if coeff:
                    total = b.add(total, b.mul(values[name], _const(coeff)))
            every = b.and_(every, b.icmp_signed("==" if c.is_equality() else ">=", total, _const(0)))
        inside = b.or_(inside, every)
    return inside
