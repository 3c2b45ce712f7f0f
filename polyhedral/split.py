"""polyhedral: statements with affine selects → statement pieces with exact domains.

Index-set splitting (Pluto's term). A statement `X(i) = c ? a : b` whose condition `c` is affine
in its indices and the sizes (comparisons joined by `&&`, `||` and `!`) becomes two statement
pieces: `X(i) = a` over domain ∩ c and `X(i) = b` over domain ∖ c; a select in a chosen branch
splits again (`c1 ? a : (c2 ? b : d)` gives three pieces). Each piece has straight-line code, its
own exact accesses (a boundary instance no longer "reads" its neighbours), and the loop AST keeps
the pieces apart, so an interior loop runs without a guard.

Pieces keep the user's statement: the same ir position and span (errors, warnings and fusion see
one statement), an ir.Statement whose right-hand side is the chosen branch, and the names
`S<k>_<n>` (n = 1, 2, .. in the order of the branches). A piece empty for every size is dropped;
a statement left with one piece keeps its name `S<k>` (its select is then decided statically).

Only assignments are split: a reduction's pieces would accumulate in another order than the
statement's (the order is unspecified, but the unsplit kernel is the reference), and the
contraction path expects a reduction over a box.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tensorlang import ir

from .accesses import ExprConverter


@dataclass(frozen=True)
class Piece:
    """One part of a statement's domain and the branch of its select that runs there."""

    domain: isl.Set
    rhs: ir.Expr


def splittable(st: ir.Statement) -> bool:
    """An assignment (not a reduction or a scatter) whose value is a select."""
    return st.op == "=" and not st.is_scatter and isinstance(st.rhs, ir.Select)


def split_pieces(st: ir.Statement, conv: ExprConverter, domain: isl.Set) -> tuple[Piece, ...]:
    """The pieces of `st` over `domain`: one per branch of its top-level (nested) affine selects
    that runs for some sizes, in the order of the branches. A single piece (the statement
    itself) when there is nothing to split."""
    if not splittable(st):
        return (Piece(domain, st.rhs),)

    def pieces(expr: ir.Expr, where: isl.Set) -> list[Piece]:
        if where.is_empty():
            return []
        if isinstance(expr, ir.Select):
            cond = conv.condition(expr.cond)
            if cond is not None:
                cond = cond.intersect(where)
                return pieces(expr.if_true, cond.coalesce()) + pieces(
                    expr.if_false, where.subtract(cond).coalesce()
                )
        return [Piece(where, expr)]

    found = pieces(st.rhs, domain)
    if not found:  # the domain is empty for every size: keep the statement as it is
        return (Piece(domain, st.rhs),)
    return tuple(found)


def piece_name(base: str, n: int, count: int) -> str:
    """`S3` for a statement of one piece, else `S3_1`, `S3_2`, .. (n counts from 0)."""
    return base if count == 1 else f"{base}_{n + 1}"
