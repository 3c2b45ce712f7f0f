"""autodiff: one statement's right-hand side + the adjoint of its value → the adjoint of each read.

Reverse mode over the expression tree (a tree, not a DAG: the checker inlines lets). Each read of
a tensor that needs a gradient receives `guard ? seed * ∂E/∂read : 0`, where the guard collects
the `?:` conditions on the way down, so that a contribution is evaluated exactly where the
forward read ran (a padded convolution's read of the input stays in bounds). Ties follow
PyTorch: `min`/`max` (NaN-propagating) split the adjoint evenly between equal operands, as
`torch.maximum` does; `fmax`/`fmin` give it to the first operand on a tie and to the other one
when an operand is NaN, as `torch.fmax` does. Piecewise-constant functions (floor, ceil, round,
trunc, logb) have a zero derivative; functions with no rule here (lgamma, tgamma, nextafter,
remainder) are a located error when a gradient has to pass through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .. import ir
from ..errors import SemanticError
from .exprs import (
    BOOL,
    add,
    call,
    cast,
    compare,
    conj,
    const,
    div,
    guarded,
    is_const,
    mul,
    neg,
    select,
    sub,
)

ZERO_DERIVATIVE = frozenset({"floor", "ceil", "round", "trunc", "logb"})
NO_RULE = frozenset({"lgamma", "tgamma", "nextafter", "remainder"})


@dataclass(frozen=True)
class Contribution:
    """`value` is the adjoint that `read` (a node of the statement's right-hand side) receives."""

    read: ir.Read
    value: ir.Expr


Adjoint = Callable[[ir.Expr], ir.Expr]


def backprop(
    expr: ir.Expr,
    seed: ir.Expr,
    wanted: Callable[[ir.Read], bool],
    root_value: ir.Expr | None = None,
) -> list[Contribution]:
    """The contribution of `seed` (the adjoint of `expr`'s value) to every wanted read in `expr`.

    root_value: an expression equal to `expr`'s value (the tensor element the statement wrote),
    reused by rules that need f(x) (exp, tanh, sqrt, ...) when f is the whole right-hand side.
    """
    memo: dict[int, bool] = {}

    def live(e: ir.Expr) -> bool:
        """Whether a gradient can reach a wanted read below `e` (float paths only)."""
        key = id(e)
        if key not in memo:
            match e:
                case ir.Read():
                    memo[key] = e.dtype.is_float and wanted(e)
                case _ if not e.dtype.is_float:
                    memo[key] = False
                case ir.Select(if_true=t, if_false=f):
                    memo[key] = live(t) or live(f)
                case _:
                    memo[key] = any(live(c) for c in ir.children(e))
        return memo[key]

    out: list[Contribution] = []

    def visit(
        e: ir.Expr, g: ir.Expr, guards: tuple[tuple[ir.Expr, bool], ...], value: ir.Expr | None
    ) -> None:
        if is_const(g, 0) or not live(e):
            return
        match e:
            case ir.Read():
                out.append(Contribution(e, _wrap(guards, g)))
            case ir.Unary(op="-", operand=o):
                visit(o, neg(g), guards, None)
            case ir.Cast(operand=o) if o.dtype.is_float:
                visit(o, cast(g, o.dtype), guards, None)
            case ir.Select(cond=c, if_true=t, if_false=f):
                visit(t, g, guards + ((c, True),), None)
                visit(f, g, guards + ((c, False),), None)
            case ir.Binary(op=op, lhs=a, rhs=b):
                for arg, adjoint in zip((a, b), _binary(op, a, b, e, value)):
                    if adjoint is not None:
                        visit(arg, adjoint(g), guards, None)
            case ir.Call(function=f, args=args):
                if f in NO_RULE:
                    raise SemanticError(
                        f"tl.grad: {f} has no derivative rule, and a gradient has to pass through it here",
                        e.span,
                    )
                for arg, adjoint in zip(args, _call(f, args, value if value is not None else e)):
                    if adjoint is not None:
                        visit(arg, adjoint(g), guards, None)

    visit(expr, seed, (), root_value)
    return out


def _wrap(guards: tuple[tuple[ir.Expr, bool], ...], value: ir.Expr) -> ir.Expr:
    """`pos1 && pos2 ? (neg1 || neg2 ? 0 : value) : 0`, keeping the forward's laziness."""
    negatives = [c for c, holds in guards if not holds]
    if negatives:
        either = negatives[0]
        for c in negatives[1:]:
            either = ir.Binary(op="||", lhs=either, rhs=c, dtype=BOOL)
        value = select(either, const(0.0, value.dtype), value)
    return guarded(conj([c for c, holds in guards if holds]), value)


def _binary(op: str, a: ir.Expr, b: ir.Expr, e: ir.Expr, value: ir.Expr | None) -> list[Adjoint | None]:
    match op:
        case "+":
            return [lambda g: g, lambda g: g]
        case "-":
            return [lambda g: g, lambda g: neg(g)]
        case "*":
            return [lambda g: mul(g, b), lambda g: mul(g, a)]
        case "/":
            return [lambda g: div(g, b), lambda g: neg(div(mul(g, a), mul(b, b)))]
        case "%":  # float floor modulo: a - b * floor(a / b)
            return [lambda g: g, lambda g: neg(mul(g, call("floor", div(a, b))))]
        case "max" | "min":
            # torch.maximum / torch.minimum: an even split on a tie
            wins = ">" if op == "max" else "<"

            def share(x: ir.Expr, y: ir.Expr) -> Adjoint:
                return lambda g: select(
                    compare(wins, x, y),
                    g,
                    select(compare("==", x, y), mul(const(0.5), g), const(0.0, g.dtype)),
                )

            return [share(a, b), share(b, a)]
    return [None, None]  # comparisons and logical operators carry no gradient


def _call(f: str, args: tuple[ir.Expr, ...], value: ir.Expr) -> list[Adjoint | None]:
    """The adjoint of each argument of the builtin call `f(args)` whose value is `value`."""
    x = args[0]
    one = const(1.0)

    def times(factor: ir.Expr) -> Adjoint:
        return lambda g: mul(g, factor)

    def over(factor: ir.Expr) -> Adjoint:
        return lambda g: div(g, factor)

    sq = mul(x, x)
    pi = const(math.pi)
    match f:
        case _ if f in ZERO_DERIVATIVE:
            return [None] * len(args)
        case "exp":
            return [times(value)]
        case "exp2":
            return [times(mul(value, const(math.log(2.0))))]
        case "exp10":
            return [times(mul(value, const(math.log(10.0))))]
        case "expm1":
            return [times(add(value, one))]
        case "log":
            return [over(x)]
        case "log2":
            return [over(mul(x, const(math.log(2.0))))]
        case "log10":
            return [over(mul(x, const(math.log(10.0))))]
        case "log1p":
            return [over(add(one, x))]
        case "sqrt":
            return [over(mul(const(2.0), value))]
        case "rsqrt":  # d x^-1/2 = -x^-3/2 / 2
            return [lambda g: neg(div(mul(g, value), mul(const(2.0), x)))]
        case "cbrt":
            return [over(mul(const(3.0), mul(value, value)))]
        case "rcbrt":
            return [lambda g: neg(div(mul(g, value), mul(const(3.0), x)))]
        case "tanh":
            return [times(sub(one, mul(value, value)))]
        case "sin":
            return [times(call("cos", x))]
        case "cos":
            return [lambda g: neg(mul(g, call("sin", x)))]
        case "tan":
            return [times(add(one, mul(value, value)))]
        case "sinpi":
            return [times(mul(pi, call("cospi", x)))]
        case "cospi":
            return [lambda g: neg(mul(g, mul(pi, call("sinpi", x))))]
        case "sinh":
            return [times(call("cosh", x))]
        case "cosh":
            return [times(call("sinh", x))]
        case "asin":
            return [times(call("rsqrt", sub(one, sq)))]
        case "acos":
            return [lambda g: neg(mul(g, call("rsqrt", sub(one, sq))))]
        case "atan":
            return [over(add(one, sq))]
        case "asinh":
            return [times(call("rsqrt", add(sq, one)))]
        case "acosh":
            return [times(call("rsqrt", sub(sq, one)))]
        case "atanh":
            return [over(sub(one, sq))]
        case "erf":
            return [times(mul(const(2.0 / math.sqrt(math.pi)), call("exp", neg(sq))))]
        case "erfc":
            return [lambda g: neg(mul(g, mul(const(2.0 / math.sqrt(math.pi)), call("exp", neg(sq)))))]
        case "erfcx":  # d/dx e^{x²} erfc(x) = 2x erfcx(x) - 2/√π
            return [times(sub(mul(mul(const(2.0), x), value), const(2.0 / math.sqrt(math.pi))))]
        case "erfinv":
            return [times(mul(const(math.sqrt(math.pi) / 2.0), call("exp", mul(value, value))))]
        case "erfcinv":
            return [
                lambda g: neg(mul(g, mul(const(math.sqrt(math.pi) / 2.0), call("exp", mul(value, value)))))
            ]
        case "normcdf":
            return [times(mul(const(1.0 / math.sqrt(2.0 * math.pi)), call("exp", neg(div(sq, const(2.0))))))]
        case "normcdfinv":
            return [
                times(mul(const(math.sqrt(2.0 * math.pi)), call("exp", div(mul(value, value), const(2.0)))))
            ]
        case "j0":
            return [lambda g: neg(mul(g, call("j1", x)))]
        case "y0":
            return [lambda g: neg(mul(g, call("y1", x)))]
        case "j1" | "y1":
            zeroth = "j0" if f == "j1" else "y0"
            return [times(sub(call(zeroth, x), div(value, x)))]
        case "cyl_bessel_i0":
            return [times(call("cyl_bessel_i1", x))]
        case "cyl_bessel_i1":
            return [times(sub(call("cyl_bessel_i0", x), div(value, x)))]
        case "fabs":  # sign(x) * g, with sign(0) = 0 as torch.abs
            return [
                lambda g: select(
                    compare(">", x, const(0.0)),
                    g,
                    select(compare("<", x, const(0.0)), neg(g), const(0.0, g.dtype)),
                )
            ]
        case "fmax" | "fmin":
            y = args[1]
            first = compare(">=" if f == "fmax" else "<=", x, y)
            takes_x = first
            if any(isinstance(n, (ir.Read, ir.Call)) for n in ir.walk(y)):  # y may be NaN
                takes_x = ir.Binary(op="||", lhs=first, rhs=compare("!=", y, y), dtype=BOOL)
            return [
                lambda g: select(takes_x, g, const(0.0, g.dtype)),
                lambda g: select(takes_x, const(0.0, g.dtype), g),
            ]
        case "pow":
            y = args[1]
            return [
                times(mul(y, call("pow", x, sub(y, one)))),
                times(mul(value, call("log", x))),
            ]
        case "hypot":
            y = args[1]
            return [times(div(x, value)), times(div(y, value))]
        case "rhypot":  # d (x²+y²)^-1/2 / dx = -x r³
            y = args[1]
            cube = mul(mul(value, value), value)
            return [lambda g: neg(mul(g, mul(x, cube))), lambda g: neg(mul(g, mul(y, cube)))]
        case "norm3d" | "norm4d":
            return [times(div(a, value)) for a in args]
        case "rnorm3d" | "rnorm4d":
            cube = mul(mul(value, value), value)

            def scaled(a: ir.Expr) -> Adjoint:
                return lambda g: neg(mul(g, mul(a, cube)))

            return [scaled(a) for a in args]
        case "atan2":  # atan2(y, x): d/dy = x / (x² + y²), d/dx = -y / (x² + y²)
            yv, xv = args
            r2 = add(mul(xv, xv), mul(yv, yv))
            return [times(div(xv, r2)), lambda g: neg(mul(g, div(yv, r2)))]
        case "fma":
            return [times(args[1]), times(args[0]), lambda g: g]
        case "fdim":  # max(x - y, 0)
            y = args[1]
            return [
                lambda g: select(compare(">", x, y), g, const(0.0, g.dtype)),
                lambda g: select(compare(">", x, y), neg(g), const(0.0, g.dtype)),
            ]
        case "fdivide":
            y = args[1]
            return [over(y), lambda g: neg(div(mul(g, x), mul(y, y)))]
        case "fmod":  # x - y * trunc(x / y)
            y = args[1]
            return [lambda g: g, lambda g: neg(mul(g, call("trunc", div(x, y))))]
        case "copysign":  # |x| sign(y): d/dx = sign(x) sign(y), nothing to y
            y = args[1]
            return [times(mul(call("copysign", one, x), call("copysign", one, y))), None]
    raise AssertionError(f"no derivative rule for builtin {f}")  # pragma: no cover


def wrap_guards(guards: list[ir.Expr], value: ir.Expr) -> ir.Expr:
    """`c1 && c2 ? value : 0`."""
    return guarded(conj(guards), value)
