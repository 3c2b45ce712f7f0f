"""lint: one checked statement (ir expressions, range-inference narrowings) → located warnings.

Two warnings of DESIGN §2 live here, both for legal programs whose TC meaning is kept:
- an index range a guarded read narrowed below what the other accesses allow (ranges.Narrowing);
- a product whose operands are each reduced over an index of their own, the usual sign of a
  mistyped index: `C(m, n) +=! A(m, k) * B(kk, n)` is (Σk A)·(Σkk B), not a matrix product.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass

from . import ir
from .errors import Span
from .ranges import Narrowing


@dataclass(frozen=True)
class Finding:
    """One warning: its message and where its caret goes."""

    message: str
    span: Span | None


def read_span(read: ir.Read) -> Span | None:
    """The whole read `T(...)` in the source (the ir keeps only the `(` of a read)."""
    paren = read.span
    if paren is None:
        return None
    text = paren.source.text
    start = paren.start - len(read.tensor)
    if start < 0 or text[start : paren.start] != read.tensor:
        start = paren.start  # whitespace between the name and `(`: point at the `(`
    depth = 0
    for end in range(paren.start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            return Span(start, end + 1, paren.source)
    return paren


def narrowing(n: Narrowing, tensor: str) -> Finding:
    """The warning for a range a guarded read narrowed (TC's rule, kept; never silent)."""
    got, allowed = f"{n.range[0]}:{n.range[1]}", f"{n.allowed[0]}:{n.allowed[1]}"
    if n.on_lhs:
        why = (
            f"Left-hand-side indices keep TC's rule, so {tensor} gets the narrower range; if the "
            f"guard keeps the read in bounds, set the range with `where {n.var} in {allowed}`"
        )
    else:
        why = (
            "Its guard does not imply the read's subscript bounds, so the read still narrows the "
            f"reduction (TC's rule); if the guard keeps the read in bounds, set the range with "
            f"`where {n.var} in {allowed}` or guard with 0 <= subscript < extent"
        )
    message = (
        f"index {n.var} narrowed to {got} by the guarded read {n.access} "
        f"(the other accesses allow {allowed}). {why}"
    )
    return Finding(message, n.span)


def separate_reductions(
    expressions: list[ir.Expr], lhs: tuple[str, ...], reductions: tuple[str, ...]
) -> list[Finding]:
    """Products in which two operands each own a reduction index that appears nowhere else in
    the statement (`expressions`: the right-hand side and the `exists` clauses)."""
    if len(reductions) < 2:
        return []  # two owners need two reduction indices
    everywhere = Counter(n.name for e in expressions for n in ir.walk(e) if isinstance(n, ir.IndexRef))
    findings = []
    for factors in (p for e in expressions for p in _products(e)):
        owners = [(f, own) for f in factors if (own := _own_indices(f, everywhere, reductions))]
        if len(owners) >= 2:
            findings.append(_separate_finding(owners, lhs + reductions))
    return findings


def _products(e: ir.Expr) -> list[list[ir.Expr]]:
    """The factors of every maximal product in `e`, outside subscripts (index arithmetic such as
    `T(k * kk)` multiplies indices, not reduced operands)."""
    if isinstance(e, ir.Read):
        return []
    if isinstance(e, ir.Binary) and e.op == "*":
        factors = _factors(e)
        return [factors] + [p for f in factors for p in _products(f)]
    return [p for child in ir.children(e) for p in _products(child)]


def _factors(e: ir.Expr) -> list[ir.Expr]:
    """A product tree flattened; casts and negations of a product are looked through."""
    match e:
        case ir.Binary(op="*", lhs=a, rhs=b):
            return _factors(a) + _factors(b)
        case ir.Cast(operand=o) | ir.Unary(op="-", operand=o) if isinstance(o, ir.Binary) and o.op == "*":
            return _factors(o)
    return [e]


def _own_indices(
    factor: ir.Expr, everywhere: Counter, reductions: tuple[str, ...]
) -> list[tuple[str, ir.Read]]:
    """The reduction indices all of whose uses lie in one tensor read of `factor`'s, with that read.
    Constants and scalars own none, so `A(i, k) * 2.0` or `A(i, k) * s` never warn."""
    here = Counter(n.name for n in ir.walk(factor) if isinstance(n, ir.IndexRef))
    own = []
    for r in reductions:
        if here[r] and here[r] == everywhere[r]:
            read = next((n for n in ir.walk(factor) if isinstance(n, ir.Read) and _mentions(n, r)), None)
            if read is not None:
                own.append((r, read))
    return own


def _mentions(read: ir.Read, index: str) -> bool:
    return any(isinstance(n, ir.IndexRef) and n.name == index for s in read.indices for n in ir.walk(s))


def _separate_finding(
    owners: list[tuple[ir.Expr, list[tuple[str, ir.Read]]]], names: tuple[str, ...]
) -> Finding:
    def shown(read: ir.Read) -> str:
        span = read_span(read)
        return span.text if span is not None else str(read)

    parts = ", ".join(f"{shown(own[0][1])} alone over {', '.join(r for r, _ in own)}" for _, own in owners)
    message = (
        f"the operands of this product are reduced over separate indices ({parts}): the reduction "
        f"runs over every combination of them, so a sum gives the product of separate sums "
        f"(TC's meaning, kept)"
    )
    # The typo is usually in a later operand: suggest the closest other index name for it.
    for _, own in owners[1:] + owners[:1]:
        for r, read in own:
            close = difflib.get_close_matches(r, [n for n in names if n != r], n=1)
            if close:
                message += f"; did you mean `{close[0]}` instead of `{r}` in {shown(read)}?"
                return Finding(message, read_span(read))
    return Finding(
        message + "; if a shared index was meant, use the same name", read_span(owners[1][1][0][1])
    )
