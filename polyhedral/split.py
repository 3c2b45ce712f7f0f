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
contraction path expects a reduction over a box. Nor a condition that divides an index (`i % 2
== 0`): its pieces would be strided loops, which vectorise worse than the select.

The isl AST generator keeps pieces apart only where the schedule does; where one band runs
several pieces of a statement, `separate_pieces` asks it to separate the band's innermost loop,
so that loop runs one piece without a guard (the boundary elements peeled before and after it).
"""

from __future__ import annotations

from collections.abc import Iterable
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


def _divides_an_index(cond: ir.Expr) -> bool:
    """`/` or `%` applied to an expression of the indices (dividing sizes alone is harmless)."""
    return any(
        isinstance(e, ir.Binary)
        and e.op in ("/", "%")
        and any(isinstance(x, ir.IndexRef) for x in ir.walk(e.lhs))
        for e in ir.walk(cond)
    )


def split_pieces(st: ir.Statement, conv: ExprConverter, domain: isl.Set) -> tuple[Piece, ...]:
    """The pieces of `st` over `domain`: one per branch of its top-level (nested) affine selects
    that runs for some sizes, in the order of the branches. A single piece (the statement
    itself) when there is nothing to split."""
    if not splittable(st):
        return (Piece(domain, st.rhs),)

    def pieces(expr: ir.Expr, where: isl.Set) -> list[Piece]:
        if where.is_empty():
            return []
        if isinstance(expr, ir.Select) and not _divides_an_index(expr.cond):
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


def separate_pieces(tree: isl.Schedule, statements: Iterable) -> isl.Schedule:
    """`tree` with the innermost loop of every innermost band that runs two or more pieces of one
    statement marked `separate` for the AST generator (isl then emits one loop per set of active
    statements instead of a guard in the loop). `statements`: the Scop's PolyStatements."""
    base = {s.name: (s.position, s.kind) for s in statements if s.name != f"{s.name[0]}{s.position}"}
    if not base:
        return tree
    band = isl.schedule_node_type.band

    def has_band_below(node: isl.ScheduleNode) -> bool:
        found = []

        def look(n: isl.ScheduleNode) -> bool:
            if n.get_type() == band and n.get_tree_depth() > node.get_tree_depth():
                found.append(n)
            return not found

        node.foreach_descendant_top_down(look)
        return bool(found)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != band or node.band_n_member() == 0 or has_band_below(node):
            return node
        names: list[str] = []
        node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
        owners = [base[n] for n in names if n in base]
        if len(owners) == len(set(owners)):
            return node  # no two pieces of one statement under this band
        return node.band_member_set_ast_loop_type(node.band_n_member() - 1, isl.ast_loop_type.separate)

    return tree.map_schedule_node_bottom_up(visit)
