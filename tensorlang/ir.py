"""ir: the checked program that the front end hands to the polyhedral stage.

Every expression is typed, implicit conversions are explicit `Cast` nodes (so both operands of a
`Binary` have one type), `let` bindings are inlined, and every statement carries the inferred
range of each of its index variables as sympy expressions over the size symbols.

`weak` (on Const, Unary, Binary, Select, Cast and Call; never compared or printed) marks a float32
expression whose type comes only from float literals: while the checker types a statement it may
still widen such an expression to float64 when it meets a double (see exprcheck). Later stages
ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from .dtypes import ScalarType
from .errors import Source, Span

# ---------------------------------------------------------------- expressions

ARITHMETIC_OPS = ("+", "-", "*", "/", "%", "min", "max")
COMPARISON_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGICAL_OPS = ("&&", "||")


@dataclass(frozen=True, kw_only=True)
class Const:
    """A literal. `value` is a Python int, float or bool matching `dtype`."""

    value: int | float | bool
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        if self.dtype.is_bool:
            return "true" if self.value else "false"
        if self.dtype.is_float:
            return (
                f"{self.dtype}({self.value!r})"
                if self.dtype != ScalarType.FLOAT32
                else repr(float(self.value))
            )
        return str(self.value) if self.dtype == ScalarType.INT32 else f"{self.dtype}({self.value})"


@dataclass(frozen=True, kw_only=True)
class IndexRef:
    """The value of a loop index variable (an LHS or reduction index). Typed int32 as in TC."""

    name: str
    dtype: ScalarType = ScalarType.INT32
    span: Span | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, kw_only=True)
class SizeRef:
    """The value of a size symbol bound from the input shapes. Typed int32 as in TC."""

    name: str
    dtype: ScalarType = ScalarType.INT32
    span: Span | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, kw_only=True)
class Read:
    """An element read `T(e0, e1, ...)`; a 0-d tensor has no indices. Indices are integral."""

    tensor: str
    indices: tuple[Expr, ...]
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        if not self.indices:
            return self.tensor
        return f"{self.tensor}({', '.join(map(str, self.indices))})"


@dataclass(frozen=True, kw_only=True)
class Unary:
    """`-x` (arithmetic negation, dtype of x) or `!x` (x bool, result bool)."""

    op: str
    operand: Expr
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"({self.op}{self.operand})"


@dataclass(frozen=True, kw_only=True)
class Binary:
    """A binary operation; lhs.dtype == rhs.dtype always.

    Arithmetic (`ARITHMETIC_OPS`) yields that dtype; comparisons and `&&`/`||` yield bool.
    Integer `/` is floor division and `%` the matching floor modulo (sign of the divisor),
    as in Python and NumPy; float `%` is also floor modulo.
    """

    op: str
    lhs: Expr
    rhs: Expr
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True, kw_only=True)
class Select:
    """`cond ? if_true : if_false`; evaluated lazily (only the taken branch is read)."""

    cond: Expr
    if_true: Expr
    if_false: Expr
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"({self.cond} ? {self.if_true} : {self.if_false})"


@dataclass(frozen=True, kw_only=True)
class Cast:
    """Conversion of `operand` to `dtype` (explicit in source, or inserted by the checker).

    float → integer truncates toward zero and saturates (NaN → 0); integer → integer wraps.
    """

    operand: Expr
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        operand = self.operand
        if isinstance(operand, Const) and operand.dtype.is_float and self.dtype.is_float:
            # a float32 literal widened to double reads differently from a double literal
            return f"{self.dtype}({operand.dtype}({operand.value!r}))"
        return f"{self.dtype}({operand})"


@dataclass(frozen=True, kw_only=True)
class Call:
    """A builtin math function; all args already converted to `dtype` (float32 or float64)."""

    function: str
    args: tuple[Expr, ...]
    dtype: ScalarType
    span: Span | None = field(default=None, compare=False, repr=False)
    weak: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.function}({', '.join(map(str, self.args))})"


Expr = Const | IndexRef | SizeRef | Read | Unary | Binary | Select | Cast | Call


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `expr`, in evaluation order."""
    match expr:
        case Read(indices=indices):
            return indices
        case Unary(operand=operand) | Cast(operand=operand):
            return (operand,)
        case Binary(lhs=lhs, rhs=rhs):
            return (lhs, rhs)
        case Select(cond=c, if_true=t, if_false=f):
            return (c, t, f)
        case Call(args=args):
            return args
    return ()


def walk(expr: Expr):
    """Pre-order iteration over `expr` and all its sub-expressions."""
    yield expr
    for child in children(expr):
        yield from walk(child)


@dataclass(frozen=True)
class AffineForm:
    """`sum(coeffs[v] * v) + constant` over index and size names, integer coefficients."""

    coeffs: tuple[tuple[str, int], ...]  # sorted by name, no zero entries
    constant: int

    def coeff(self, name: str) -> int:
        return dict(self.coeffs).get(name, 0)


def affine_form(expr: Expr) -> AffineForm | None:
    """The affine form of an integral index expression, or None if it is not affine.

    Affine: integer constants, index and size references, +, -, unary -, and * where one side
    is a constant. Integer casts between integer types are looked through. Division and modulo
    are not affine here (the polyhedral stage may still handle them as quasi-affine).
    """
    terms: dict[str, int] = {}

    def visit(e: Expr, scale: int) -> int | None:
        match e:
            case Const(value=v) if not e.dtype.is_float:
                return int(v) * scale
            case IndexRef(name=n) | SizeRef(name=n):
                terms[n] = terms.get(n, 0) + scale
                return 0
            case Cast(operand=o) if e.dtype.is_integer and o.dtype.is_integer:
                return visit(o, scale)
            case Unary(op="-", operand=o):
                return visit(o, -scale)
            case Binary(op="+" | "-", lhs=a, rhs=b):
                x = visit(a, scale)
                y = visit(b, scale if e.op == "+" else -scale)
                return None if x is None or y is None else x + y
            case Binary(op="*", lhs=a, rhs=b):
                for k, other in ((a, b), (b, a)):
                    c = constant_value(k)
                    if c is not None:
                        return visit(other, scale * c)
                return None
        return None

    const = visit(expr, 1)
    if const is None:
        return None
    return AffineForm(tuple(sorted((n, c) for n, c in terms.items() if c != 0)), const)


def constant_value(expr: Expr) -> int | None:
    """The integer value of a constant integral expression built from literals, else None."""
    match expr:
        case Const(value=v) if not expr.dtype.is_float:
            return int(v)
        case Cast(operand=o) if expr.dtype.is_integer and o.dtype.is_integer:
            return constant_value(o)
        case Unary(op="-", operand=o):
            v = constant_value(o)
            return None if v is None else -v
        case Binary(op="+" | "-" | "*", lhs=a, rhs=b):
            x, y = constant_value(a), constant_value(b)
            if x is None or y is None:
                return None
            return x + y if expr.op == "+" else x - y if expr.op == "-" else x * y
    return None


# ---------------------------------------------------------------- tensors and statements


@dataclass(frozen=True)
class Tensor:
    """A tensor of the def. `shape` holds sympy expressions over the size symbols.

    role is "input", "output" or "temporary" (written by statements, not returned).
    Every dimension's index range is [0, shape[d]).
    """

    name: str
    dtype: ScalarType
    shape: tuple[sympy.Expr, ...]
    role: str
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.role} {self.dtype}({dims}) {self.name}"


@dataclass(frozen=True)
class IndexRange:
    """The inferred (or `where`-given) half-open range lo <= var < hi of one index variable."""

    var: str
    lo: sympy.Expr
    hi: sympy.Expr
    span: Span | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.var} in {self.lo}:{self.hi}"


REDUCTION_OPS = ("+", "*", "min", "max")


@dataclass(frozen=True)
class Statement:
    """`tensor(indices) op rhs` over the box of `ranges`.

    op: "=" for plain assignment, or one of REDUCTION_OPS for `op=` / `op=!`.
    bang: the source wrote `op=!`.
    initializes: this statement first sets tensor(indices) to the identity of `op` over the
        LHS ranges (`op=!` on a tensor no earlier statement wrote).
    uninitialized: a reduction without `!` onto a tensor no earlier statement wrote; it
        accumulates onto the caller's `out=` buffer, or onto zeros (with a warning).
    For op "=" the RHS is evaluated once per LHS point (there are no reduction indices);
    otherwise tensor(indices) = tensor(indices) op rhs for every point of LHS × reduction ranges,
    in an unspecified order of the reduction indices.
    subscripts: a scatter (a reduction whose left-hand side reads a tensor, `O(idx(b), e) += ...`)
        gives here the written element's subscripts, one per dimension of the target; `indices`
        are then only the bare index variables among them (in order), and the indices that only
        data-dependent subscripts use are reduction indices. None for every other statement.
        A scatter never initializes: the checker emits `+=!`'s identity as an `=` statement before.
    """

    tensor: str
    indices: tuple[str, ...]
    op: str
    bang: bool
    rhs: Expr
    reduction_indices: tuple[str, ...]
    ranges: tuple[IndexRange, ...]  # LHS indices first, in order, then the reduction indices
    initializes: bool = False
    uninitialized: bool = False
    span: Span | None = field(default=None, compare=False, repr=False)
    subscripts: tuple[Expr, ...] | None = None

    @property
    def all_indices(self) -> tuple[str, ...]:
        return self.indices + self.reduction_indices

    @property
    def is_scatter(self) -> bool:
        return self.subscripts is not None

    @property
    def lhs(self) -> tuple[Expr, ...]:
        """The written element's subscripts, one per dimension of the target."""
        if self.subscripts is not None:
            return self.subscripts
        return tuple(IndexRef(name=v) for v in self.indices)

    def range_of(self, var: str) -> IndexRange:
        for r in self.ranges:
            if r.var == var:
                return r
        raise KeyError(var)

    def __str__(self) -> str:
        lhs = f"{self.tensor}({', '.join(map(str, self.lhs))})" if self.lhs else self.tensor
        op = "=" if self.op == "=" else f"{self.op}={'!' if self.bang else ''}"
        where = ", ".join(str(r) for r in self.ranges)
        flags = " [init]" if self.initializes else " [uninitialized]" if self.uninitialized else ""
        return f"{lhs} {op} {self.rhs} where {where}{flags}" if where else f"{lhs} {op} {self.rhs}{flags}"


@dataclass(frozen=True)
class SizeParam:
    """A size symbol and the first input dimension that binds it; (None, None) for a size that
    no input's shape gives, declared by a `where` bound and passed at the call (`k(A, T=100)`)."""

    name: str
    tensor: str | None
    dim: int | None

    @property
    def symbol(self) -> sympy.Symbol:
        return size_symbol(self.name)


def size_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of a size name (sizes are non-negative integers)."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


@dataclass(frozen=True)
class Requirement:
    """A condition on the sizes that could not be decided at compile time: `expr` must be 0.

    The kernel evaluates it at call time and raises ArgumentError with `message` otherwise.
    """

    expr: sympy.Expr
    message: str
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Program:
    """One checked def: its tensors, size symbols and statements in textual order."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    temporaries: tuple[Tensor, ...]
    sizes: tuple[SizeParam, ...]
    statements: tuple[Statement, ...]
    source: Source | None = field(default=None, compare=False, repr=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    requirements: tuple[Requirement, ...] = ()

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return self.inputs + self.outputs + self.temporaries

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def __str__(self) -> str:
        lines = [f"def {self.name}"]
        lines += [
            f"  size {s.name} = {s.tensor}.shape[{s.dim}]"
            if s.tensor is not None
            else f"  size {s.name} (given at the call)"
            for s in self.sizes
        ]
        lines += [f"  {t}" for t in self.tensors]
        lines += [f"  S{i}: {s}" for i, s in enumerate(self.statements)]
        lines += [f"  require {r.expr} == 0" for r in self.requirements]
        return "\n".join(lines)

    def verify(self) -> None:
        """Check the structural invariants the later stages rely on; raise AssertionError."""
        names = [t.name for t in self.tensors]
        assert len(names) == len(set(names)), f"duplicate tensor names {names}"
        size_names = {s.name for s in self.sizes}
        for s in self.sizes:
            assert (s.tensor is None) == (s.dim is None), s
            assert s.tensor is None or self.tensor(s.tensor).role == "input", s
        for t in self.tensors:
            for d in t.shape:
                assert {str(x) for x in d.free_symbols} <= size_names, (t, d)
        written = set()
        for st in self.statements:
            target = self.tensor(st.tensor)
            assert target.role != "input", f"statement writes input {st.tensor}"
            assert len(st.lhs) == target.rank, st
            assert not st.is_scatter or (st.op != "=" and not st.initializes), st
            assert [r.var for r in st.ranges] == list(st.all_indices), st
            assert st.op == "=" or st.op in REDUCTION_OPS, st
            assert not (st.op == "=" and st.reduction_indices), st
            assert not (st.initializes and st.uninitialized), st
            assert not ((st.initializes or st.uninitialized) and st.tensor in written), st
            variables = set(st.all_indices)
            for e in (x for root in (st.rhs, *(st.subscripts or ())) for x in walk(root)):
                match e:
                    case IndexRef(name=n):
                        assert n in variables, (st, n)
                    case SizeRef(name=n):
                        assert n in size_names, (st, n)
                    case Read(tensor=n, indices=ix):
                        assert len(ix) == self.tensor(n).rank, (st, e)
                        assert all(not i.dtype.is_float for i in ix), (st, e)
                    case Binary(lhs=a, rhs=b):
                        assert a.dtype == b.dtype, (st, e)
            written.add(st.tensor)
        for t in self.outputs + self.temporaries:
            assert t.name in written, f"{t.name} is never written"
