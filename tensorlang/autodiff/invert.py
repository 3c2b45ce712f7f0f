"""autodiff: one affine read `X(f(V))` of a statement → the gather form of its adjoint over X's indices.

The adjoint of a read is a scatter, `dX(f(V)) += c(V)`, which the language cannot write (a
left-hand side holds plain indices). Solving each subscript for one index variable (as Halide's
`solve_inverse` does) turns it into a gather over X's own index space: for `I(h + kh)` read by
`O(h) +=! I(h + kh) * W(kh)`, h = x - kh, so `dI(x) +=! (x - kh >= 0 && x - kh < HO) ? dO(x - kh)
* W(kh) : 0` with kh left as a reduction index. The new index takes the name of the index it
replaces (`dI(h) ... dO(h - kh)`), as in TC's hand-written igrad. A stride `I(2*h + kh)` adds a
divisibility guard `(h - kh) % 2 == 0` and reads `dO((h - kh) / 2)`; a subscript with no index
left to solve (`A(i, i)`, `W(f, 1)`) becomes an equality guard. Guards the new ranges imply are
dropped (interval arithmetic, proved with sympy for all sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from ..ranges import index_symbol
from .exprs import BOOL, INT32, compare, const, from_sympy

Range = tuple[sympy.Expr, sympy.Expr]


class NotInvertible(Exception):
    """The read's subscripts cannot be solved for the statement's indices (the message says why)."""


@dataclass(frozen=True)
class Gather:
    """The adjoint of a read, as a statement over the read tensor's indices.

    lhs: the new left-hand-side indices, one per dimension of the read tensor, with `ranges`.
    substitution: each solved forward index as an expression of the new indices.
    reduction: the forward indices left free, which keep their forward ranges.
    guards: conditions under which a point of the new statement is an instance of the forward one.
    """

    lhs: tuple[str, ...]
    ranges: dict[str, Range]
    substitution: dict[str, ir.Expr]
    reduction: tuple[str, ...]
    guards: tuple[ir.Expr, ...]


def invert(
    read: ir.Read,
    ranges: dict[str, Range],
    lhs_vars: tuple[str, ...],
    shape: tuple[sympy.Expr, ...],
    sizes: set[str],
    fresh,
    narrow: bool,
) -> Gather:
    """Solve `read`'s subscripts (over the statement's indices with `ranges`) for its tensor's indices.

    narrow: the new statement accumulates onto an existing tensor, so a dimension read by a bare
    index may take that index's range instead of the whole dimension and a guard.
    fresh(base): a new index name.
    """
    variables = list(ranges)
    vsym = {v: index_symbol(v) for v in variables}
    exprs = []
    for d, sub in enumerate(read.indices):
        form = ir.affine_form(sub)
        if form is None:
            raise NotInvertible(f"subscript {d} ({sub}) is not an affine expression of the indices")
        e = sympy.Integer(form.constant)
        for name, c in form.coeffs:
            e += c * (vsym[name] if name in vsym else ir.size_symbol(name))
        exprs.append(e)

    usym = [sympy.Symbol(f"_u{d}", integer=True) for d in range(len(exprs))]
    solved: dict[str, sympy.Expr] = {}  # forward index → expression over usym and free indices
    divisor: dict[str, tuple[sympy.Expr, int]] = {}  # index solved with a stride: numerator, coeff
    names: list[str | None] = [None] * len(exprs)
    equalities: list[sympy.Expr] = []
    for d, e in enumerate(exprs):
        e = sympy.expand(e.subs({vsym[v]: x for v, x in solved.items()}, simultaneous=True))
        if any(not c.is_Integer for c in e.as_coefficients_dict().values()):
            raise NotInvertible(f"subscript {d} couples a strided index with another subscript")
        candidates = [v for v in variables if v not in solved and e.coeff(vsym[v]) != 0]
        if not candidates:
            equalities.append(usym[d] - e)
            continue

        def later_uses(v: str, d: int = d) -> int:
            return sum(1 for x in exprs[d + 1 :] if x.coeff(vsym[v]) != 0)

        # Prefer an index that no other subscript uses, an output index of the forward statement
        # (its range is the big one, so the reduction left over is the small kernel window),
        # then a unit coefficient (no divisibility guard).
        v = min(candidates, key=lambda v: (later_uses(v), v not in lhs_vars, abs(int(e.coeff(vsym[v]))) != 1))
        a = int(e.coeff(vsym[v]))
        rest = sympy.expand(e - a * vsym[v])
        if abs(a) != 1:
            if later_uses(v):
                raise NotInvertible(f"index {v} has stride {a} and appears in several subscripts")
            divisor[v] = (usym[d] - rest, a)
            solved[v] = (usym[d] - rest) / a
        else:
            solved[v] = sympy.expand((usym[d] - rest) * a)
        names[d] = v

    free = [v for v in variables if v not in solved]
    taken = set(free) | {n for n in names if n is not None}
    for d, n in enumerate(names):
        if n is None:
            names[d] = fresh("i", taken)
            taken.add(names[d])
    rename = {usym[d]: index_symbol(names[d]) for d in range(len(exprs))}

    new_ranges: dict[str, Range] = {names[d]: (sympy.Integer(0), shape[d]) for d in range(len(exprs))}
    plain = {}
    if narrow:
        for d, n in enumerate(names):
            v = n
            if v in solved and sympy.expand(solved[v] - usym[d]) == 0:
                new_ranges[n] = ranges[v]
                plain[v] = n
    box = dict(new_ranges) | {v: ranges[v] for v in free}

    def holds(e: sympy.Expr) -> bool:
        """Whether e >= 0 on the whole box (interval arithmetic; sizes are non-negative)."""
        low = sympy.Integer(0)
        e = sympy.expand(e)
        for sym, c in e.as_coefficients_dict().items():
            if sym == 1:
                low += c
                continue
            name = getattr(sym, "name", None)
            if name in box:
                lo, hi = box[name]
                low += c * (lo if c > 0 else hi - 1)
            else:
                low += c * sym
        return sympy.simplify(low).is_nonnegative is True

    guards: list[ir.Expr] = []

    def emit(lhs: sympy.Expr, op: str, rhs: sympy.Expr) -> None:
        guards.append(compare(op, from_sympy(lhs, sizes), from_sympy(rhs, sizes)))

    substitution: dict[str, ir.Expr] = {}
    for v, x in solved.items():
        x = x.subs(rename, simultaneous=True)
        lo, hi = ranges[v]
        if v in divisor:
            num, a = divisor[v]
            num = sympy.expand(num.subs(rename, simultaneous=True))
            num_ir = from_sympy(num, sizes)
            guards.append(
                compare(
                    "==",
                    ir.Binary(op="%", lhs=num_ir, rhs=const(abs(a), INT32), dtype=INT32),
                    const(0, INT32),
                )
            )
            substitution[v] = (
                ir.Binary(op="/", lhs=num_ir, rhs=const(a, INT32), dtype=INT32)
                if a > 0
                else ir.Binary(
                    op="/",
                    lhs=ir.Unary(op="-", operand=num_ir, dtype=INT32),
                    rhs=const(-a, INT32),
                    dtype=INT32,
                )
            )
            # lo <= num / a < hi; num is a multiple of a there, so the division is exact
            low, high = (a * lo, a * (hi - 1)) if a > 0 else (a * (hi - 1), a * lo)
            if not holds(num - low):
                emit(num, ">=", low)
            if not holds(high - num):
                guards.append(compare("<", substitution[v], from_sympy(hi, sizes)))
            continue
        substitution[v] = from_sympy(x, sizes)
        if v in plain:
            continue
        if not holds(x - lo):
            emit(x, ">=", lo)
        if not holds(hi - 1 - x):
            emit(x, "<", hi)
    for eq in equalities:
        eq = sympy.expand(eq.subs(rename, simultaneous=True))
        lhs = [t for t in sympy.Add.make_args(eq) if t.free_symbols & set(rename.values())]
        left = sympy.Add(*lhs)
        emit(left, "==", sympy.expand(left - eq))
    return Gather(
        lhs=tuple(names),  # type: ignore[arg-type]
        ranges=new_ranges,
        substitution=substitution,
        reduction=tuple(free),
        guards=tuple(guards),
    )


def in_box(
    indices: tuple[str, ...], box: list[Range], full: tuple[sympy.Expr, ...], sizes: set[str]
) -> ir.Expr | None:
    """The condition that `indices` lie in `box`, leaving out the sides that span the full extent."""
    conds: list[ir.Expr] = []
    for i, (lo, hi), extent in zip(indices, box, full):
        if sympy.simplify(lo) != 0:
            conds.append(compare(">=", ir.IndexRef(name=i), from_sympy(lo, sizes)))
        if sympy.simplify(hi - extent) != 0:
            conds.append(compare("<", ir.IndexRef(name=i), from_sympy(hi, sizes)))
    out = None
    for c in conds:
        out = c if out is None else ir.Binary(op="&&", lhs=out, rhs=c, dtype=BOOL)
    return out
