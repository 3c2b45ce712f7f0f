"""autodiff: ir expressions → simplified ir expressions (smart constructors, rewriting, sympy ↔ ir).

The derivative rules build expressions with these constructors so that the generated program
reads like hand-written code: `1 * g` is `g`, `-(-g)` is `g`, and a literal zero is ZERO, which
the rules use to drop a contribution altogether. Dtypes on built nodes follow the operands (both
operands of a Binary have one dtype in the checked IR, and the rules keep it so); the printed
program is checked again by the real checker, so they only need to be right about float or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy

from .. import ir
from ..dtypes import ScalarType
from ..ranges import index_symbol

BOOL = ScalarType.BOOL
INT32 = ScalarType.INT32
FLOAT32 = ScalarType.FLOAT32


def const(value: float, dtype: ScalarType = FLOAT32) -> ir.Const:
    """A float literal that takes the precision of what it meets (weak), or an int32."""
    if dtype.is_float:
        return ir.Const(value=float(value), dtype=dtype, weak=True)
    return ir.Const(value=int(value), dtype=INT32)


def is_const(e: ir.Expr, value: float) -> bool:
    if isinstance(e, ir.Cast) and isinstance(e.operand, ir.Const) and e.dtype.is_float:
        e = e.operand  # `1 / x` holds float(1)
    return isinstance(e, ir.Const) and not e.dtype.is_bool and e.value == value


def zero(dtype: ScalarType) -> ir.Const:
    return const(0.0, dtype)


def float_of(*exprs: ir.Expr) -> ScalarType:
    """The float type among the operands (float32 if none is float)."""
    floats = [e.dtype for e in exprs if e.dtype.is_float and not getattr(e, "weak", False)]
    if not floats:
        floats = [e.dtype for e in exprs if e.dtype.is_float]
    return max(floats, key=lambda t: t.bits, default=FLOAT32)


def neg(a: ir.Expr) -> ir.Expr:
    if isinstance(a, ir.Unary) and a.op == "-":
        return a.operand
    if isinstance(a, ir.Const) and a.dtype.is_float:
        return const(-a.value, a.dtype)
    return ir.Unary(op="-", operand=a, dtype=a.dtype)


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if is_const(a, 0):
        return b
    if is_const(b, 0):
        return a
    if isinstance(b, ir.Unary) and b.op == "-":
        return sub(a, b.operand)
    return ir.Binary(op="+", lhs=a, rhs=b, dtype=float_of(a, b))


def sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if is_const(b, 0):
        return a
    if is_const(a, 0):
        return neg(b)
    return ir.Binary(op="-", lhs=a, rhs=b, dtype=float_of(a, b))


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if is_const(a, 0) or is_const(b, 0):
        return zero(float_of(a, b))
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if is_const(a, -1):
        return neg(b)
    if is_const(b, -1):
        return neg(a)
    # pull signs out, so that `-(g * x)` reads instead of `-g * x` or `g * -x`
    if isinstance(a, ir.Unary) and a.op == "-":
        return neg(mul(a.operand, b))
    if isinstance(b, ir.Unary) and b.op == "-":
        return neg(mul(a, b.operand))
    return ir.Binary(op="*", lhs=a, rhs=b, dtype=float_of(a, b))


def div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if is_const(a, 0):
        return a
    if is_const(b, 1):
        return a
    if isinstance(a, ir.Unary) and a.op == "-":
        return neg(div(a.operand, b))
    return ir.Binary(op="/", lhs=a, rhs=b, dtype=float_of(a, b))


def call(function: str, *args: ir.Expr) -> ir.Call:
    return ir.Call(function=function, args=tuple(args), dtype=float_of(*args))


def compare(op: str, a: ir.Expr, b: ir.Expr) -> ir.Binary:
    return ir.Binary(op=op, lhs=a, rhs=b, dtype=BOOL)


def conj(conditions: list[ir.Expr]) -> ir.Expr | None:
    """`c1 && c2 && ...`, or None for no condition (always true)."""
    out = None
    for c in conditions:
        out = c if out is None else ir.Binary(op="&&", lhs=out, rhs=c, dtype=BOOL)
    return out


def select(cond: ir.Expr | None, if_true: ir.Expr, if_false: ir.Expr) -> ir.Expr:
    if cond is None:
        return if_true
    return ir.Select(cond=cond, if_true=if_true, if_false=if_false, dtype=float_of(if_true, if_false))


def guarded(cond: ir.Expr | None, value: ir.Expr) -> ir.Expr:
    """`cond ? value : 0` (lazy: reads in value run only where cond holds)."""
    return select(cond, value, zero(value.dtype))


def cast(e: ir.Expr, dtype: ScalarType) -> ir.Expr:
    if e.dtype == dtype or isinstance(e, ir.Const):
        return e
    return ir.Cast(operand=e, dtype=dtype)


def read(tensor: str, indices: tuple[ir.Expr, ...] | tuple[str, ...], dtype: ScalarType) -> ir.Read:
    ix = tuple(ir.IndexRef(name=i) if isinstance(i, str) else i for i in indices)
    return ir.Read(tensor=tensor, indices=ix, dtype=dtype)


# ---------------------------------------------------------------- rewriting


def rewrite(e: ir.Expr, fn: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr:
    """Bottom-up rewrite: `fn(node)` returns a replacement (not visited again) or None to recurse."""
    new = fn(e)
    if new is not None:
        return new
    kids = ir.children(e)
    rebuilt = tuple(rewrite(k, fn) for k in kids)
    if all(a is b for a, b in zip(kids, rebuilt)):
        return e  # unchanged nodes keep their identity (the scan rule recognises reads by it)
    match e:
        case ir.Read(indices=ix):
            return dataclasses.replace(e, indices=tuple(rewrite(i, fn) for i in ix))
        case ir.Unary(operand=o) | ir.Cast(operand=o):
            return dataclasses.replace(e, operand=rewrite(o, fn))
        case ir.Binary(lhs=a, rhs=b):
            return dataclasses.replace(e, lhs=rewrite(a, fn), rhs=rewrite(b, fn))
        case ir.Select(cond=c, if_true=t, if_false=f):
            return dataclasses.replace(
                e, cond=rewrite(c, fn), if_true=rewrite(t, fn), if_false=rewrite(f, fn)
            )
        case ir.Call(args=args):
            return dataclasses.replace(e, args=tuple(rewrite(a, fn) for a in args))
    return e


def substitute(e: ir.Expr, values: dict[str, ir.Expr]) -> ir.Expr:
    """Replace index variables by expressions, all at once (no re-substitution)."""
    if not values:
        return e
    return rewrite(e, lambda n: values.get(n.name) if isinstance(n, ir.IndexRef) else None)


def rename_tensors(e: ir.Expr, names: dict[str, str]) -> ir.Expr:
    def fn(n: ir.Expr) -> ir.Expr | None:
        if isinstance(n, ir.Read) and n.tensor in names:
            return dataclasses.replace(
                n, tensor=names[n.tensor], indices=tuple(rename_tensors(i, names) for i in n.indices)
            )
        return None

    return rewrite(e, fn)


def reads(e: ir.Expr) -> list[ir.Read]:
    return [n for n in ir.walk(e) if isinstance(n, ir.Read)]


# ---------------------------------------------------------------- sympy ↔ ir (integer index arithmetic)


def to_sympy(e: ir.Expr) -> sympy.Expr | None:
    """An affine integral ir expression as sympy (index symbols, size symbols), or None."""
    form = ir.affine_form(e)
    if form is None:
        return None
    return affine_sympy(form, set())


def affine_sympy(form: ir.AffineForm, sizes: set[str] | None = None) -> sympy.Expr:
    """Index names become index symbols unless they are in `sizes` (size symbols)."""
    sizes = sizes or set()
    total = sympy.Integer(form.constant)
    for name, c in form.coeffs:
        total += c * (ir.size_symbol(name) if name in sizes else index_symbol(name))
    return total


def from_sympy(x: sympy.Expr, sizes: set[str]) -> ir.Expr:
    """An integral sympy expression (sums, integer products, floor division, Mod, Min, Max) as ir."""
    x = sympy.sympify(x)
    if x.is_Integer:
        v = int(x)
        return const(v, INT32) if v >= 0 else ir.Unary(op="-", operand=const(-v, INT32), dtype=INT32)
    if x.is_Symbol:
        if x.name in sizes:
            return ir.SizeRef(name=x.name)
        return ir.IndexRef(name=x.name)
    if isinstance(x, sympy.Add):
        terms = sorted(x.args, key=_term_order)
        out = from_sympy(terms[0], sizes)
        for t in terms[1:]:
            coeff, rest = t.as_coeff_Mul()
            if coeff.is_negative:
                out = ir.Binary(op="-", lhs=out, rhs=from_sympy(-t, sizes), dtype=INT32)
            else:
                out = ir.Binary(op="+", lhs=out, rhs=from_sympy(t, sizes), dtype=INT32)
        return out
    if isinstance(x, sympy.Mul):
        coeff, rest = x.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            # a rational coefficient only comes from a floor that sympy split; keep it exact
            num, den = _over_common_denominator(x)
            return ir.Binary(op="/", lhs=from_sympy(num, sizes), rhs=from_sympy(den, sizes), dtype=INT32)
        if coeff == -1:
            return ir.Unary(op="-", operand=from_sympy(rest, sizes), dtype=INT32)
        factors = [
            from_sympy(f, sizes) for f in ([coeff] if coeff != 1 else []) + list(sympy.Mul.make_args(rest))
        ]
        out = factors[0]
        for f in factors[1:]:
            out = ir.Binary(op="*", lhs=out, rhs=f, dtype=INT32)
        return out
    if isinstance(x, sympy.Pow) and x.exp.is_Integer and x.exp > 0:
        base = from_sympy(x.base, sizes)
        out = base
        for _ in range(int(x.exp) - 1):
            out = ir.Binary(op="*", lhs=out, rhs=base, dtype=INT32)
        return out
    if isinstance(x, sympy.floor):
        num, den = _over_common_denominator(x.args[0])
        return ir.Binary(op="/", lhs=from_sympy(num, sizes), rhs=from_sympy(den, sizes), dtype=INT32)
    if isinstance(x, sympy.ceiling):
        num, den = _over_common_denominator(x.args[0])
        return ir.Binary(
            op="/", lhs=from_sympy(num + den - 1, sizes), rhs=from_sympy(den, sizes), dtype=INT32
        )
    if isinstance(x, sympy.Mod):
        return ir.Binary(
            op="%", lhs=from_sympy(x.args[0], sizes), rhs=from_sympy(x.args[1], sizes), dtype=INT32
        )
    if isinstance(x, (sympy.Min, sympy.Max)):
        op = "min" if isinstance(x, sympy.Min) else "max"
        args = [from_sympy(a, sizes) for a in x.args]
        out = args[0]
        for a in args[1:]:
            out = ir.Binary(op=op, lhs=out, rhs=a, dtype=INT32)
        return out
    raise ValueError(f"cannot express {x} in the language")


def _over_common_denominator(x: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """x as num / den with an integral num (x a sum of terms with rational coefficients)."""
    x = sympy.expand(x)
    den = sympy.ilcm(1, *(sympy.fraction(c)[1] for c in x.as_coefficients_dict().values()))
    return sympy.expand(x * den), sympy.Integer(den)


def _term_order(t: sympy.Expr) -> tuple[int, str]:
    """Positive symbolic terms first, then negative ones, constants last: `h - kh + 1`."""
    if t.is_number:
        return (2, "")
    coeff, _ = t.as_coeff_Mul()
    return (1 if coeff.is_negative else 0, str(t))
