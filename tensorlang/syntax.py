"""syntax: the parse tree of a source file (frozen nodes with spans) and its formatter back to source.

Spans are excluded from equality, so two trees compare equal when they have the same structure;
`str(node)` prints valid source text with the fewest parentheses that keep the structure, and
parse(str(tree)) == tree (the round-trip property the tests check).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Span

# Binary operator precedence (TC's SharedParserData); higher binds tighter. `?:` is 1, unary 7.
BINARY_PRECEDENCE = {
    "||": 2,
    "&&": 3,
    ">": 4, "<": 4, "<=": 4, ">=": 4, "==": 4, "!=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6, "%": 6,
}  # fmt: skip
TERNARY_PRECEDENCE = 1
UNARY_PRECEDENCE = 7
ATOM_PRECEDENCE = 8

ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!")


def _span() -> Span | None:
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True, kw_only=True)
class Ident:
    name: str
    span: Span | None = _span()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, kw_only=True)
class Number:
    """A numeric literal, kept as written; a float if the text holds `.`, `e` or `E`."""

    text: str
    span: Span | None = _span()

    @property
    def is_float(self) -> bool:
        # Deviation from TC: TC only looks for '.' and 'e', so `3E-5` was an int32 (= 0). We treat
        # any exponent as a float, which is what every reader of `3E-5` expects.
        return any(c in self.text for c in ".eE")

    def __str__(self) -> str:
        return self.text


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True, kw_only=True)
class Name:
    """A bare identifier: index, size, let, 0-d tensor or (implicitly) a new reduction index."""

    name: str
    span: Span | None = _span()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, kw_only=True)
class Apply:
    """`name(args)`: a tensor access or a builtin call; span covers the name, paren_span the `(`."""

    name: str
    args: tuple[Expression, ...]
    span: Span | None = _span()
    paren_span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, kw_only=True)
class UnaryOp:
    op: str  # "-" or "!"
    operand: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.op}{_wrap(self.operand, UNARY_PRECEDENCE)}"


@dataclass(frozen=True, kw_only=True)
class BinaryOp:
    """An infix operation, or `min(a, b)` / `max(a, b)` (op "min" / "max")."""

    op: str
    lhs: Expression
    rhs: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        prec = BINARY_PRECEDENCE[self.op]
        return f"{_wrap(self.lhs, prec)} {self.op} {_wrap(self.rhs, prec + 1)}"


@dataclass(frozen=True, kw_only=True)
class Ternary:
    cond: Expression
    if_true: Expression
    if_false: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        # A nested ternary in the true branch parses without parentheses, but they help the reader.
        cond = _wrap(self.cond, TERNARY_PRECEDENCE + 1)
        if_true = _wrap(self.if_true, TERNARY_PRECEDENCE + 1)
        return f"{cond} ? {if_true} : {_wrap(self.if_false, TERNARY_PRECEDENCE)}"


@dataclass(frozen=True, kw_only=True)
class CastExpr:
    type_name: str
    operand: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.type_name}({self.operand})"


Expression = Number | Name | Apply | UnaryOp | BinaryOp | Ternary | CastExpr


def precedence(expr: Expression) -> int:
    match expr:
        case BinaryOp(op=op) if op in BINARY_PRECEDENCE:
            return BINARY_PRECEDENCE[op]
        case Ternary():
            return TERNARY_PRECEDENCE
        case UnaryOp():
            return UNARY_PRECEDENCE
    return ATOM_PRECEDENCE


def _wrap(expr: Expression, min_precedence: int) -> str:
    return f"({expr})" if precedence(expr) < min_precedence else str(expr)


# ---------------------------------------------------------------- where clauses


@dataclass(frozen=True, kw_only=True)
class WhereRange:
    """`var in lo:hi`, the half-open range lo <= var < hi."""

    var: Ident
    lo: Expression
    hi: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.var} in {self.lo}:{self.hi}"


@dataclass(frozen=True, kw_only=True)
class WhereLet:
    """`name = value`, inlined wherever `name` is used."""

    var: Ident
    value: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.var} = {self.value}"


@dataclass(frozen=True, kw_only=True)
class WhereExists:
    """`exists e`: e's accesses constrain range inference; e is never evaluated."""

    expr: Expression
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"exists {self.expr}"


WhereClause = WhereRange | WhereLet | WhereExists


# ---------------------------------------------------------------- statements and defs


@dataclass(frozen=True, kw_only=True)
class Statement:
    """`tensor(indices) op rhs [<=> equivalent] [where ...]`; span covers the whole statement.

    An entry of `indices` is an index variable (Ident) or, in a scatter such as
    `O(idx(b), e) +=! V(b, e)`, an expression that reads a tensor (a data-dependent subscript).
    """

    tensor: Ident
    indices: tuple[Ident | Expression, ...]
    op: str
    rhs: Expression
    equivalent: Apply | None = None
    wheres: tuple[WhereClause, ...] = ()
    span: Span | None = _span()

    def __str__(self) -> str:
        lhs = f"{self.tensor}({', '.join(map(str, self.indices))})" if self.indices else str(self.tensor)
        text = f"{lhs} {self.op} {self.rhs}"
        if self.equivalent is not None:
            text += f" <=> {self.equivalent}"
        if self.wheres:
            text += " where " + ", ".join(map(str, self.wheres))
        return text


@dataclass(frozen=True, kw_only=True)
class TensorType:
    """`type_name(dims)`; dims is None for a 0-d tensor written without a dimension list."""

    type_name: str
    dims: tuple[Ident | Number, ...] | None
    span: Span | None = _span()

    def __str__(self) -> str:
        if self.dims is None:
            return self.type_name
        return f"{self.type_name}({', '.join(map(str, self.dims))})"


@dataclass(frozen=True, kw_only=True)
class Param:
    """An input or return-list entry; type is None when only the name is given."""

    name: Ident
    type: TensorType | None = None
    span: Span | None = _span()

    def __str__(self) -> str:
        return f"{self.type} {self.name}" if self.type is not None else str(self.name)


@dataclass(frozen=True, kw_only=True)
class Def:
    name: Ident
    params: tuple[Param, ...]
    returns: tuple[Param, ...]
    statements: tuple[Statement, ...]
    span: Span | None = _span()

    def __str__(self) -> str:
        head = (
            f"def {self.name}({', '.join(map(str, self.params))}) -> ({', '.join(map(str, self.returns))}) {{"
        )
        return "\n".join([head, *(f"    {s}" for s in self.statements), "}"])


@dataclass(frozen=True, kw_only=True)
class Module:
    defs: tuple[Def, ...]
    span: Span | None = _span()

    def __str__(self) -> str:
        return "\n\n".join(map(str, self.defs)) + "\n"

    def def_names(self) -> list[str]:
        return [d.name.name for d in self.defs]
