"""exprcheck: syntax expressions → typed ir expressions (name resolution, TC typing, explicit casts).

Typing follows TC (`dtypes.match_types`), with one rule for float literals, the one NumPy applies
to Python floats (NEP 50): a float literal is *weak*. It is float32, as in TC, but it takes the
precision of the floating type it meets: in `0.2 * A(i)` with a double `A` it is the double
nearest 0.2, with a float `A` the float nearest 0.2. Weakness spreads to every expression whose
float type comes only from literals (`-0.2`, `0.1 + 0.2`, `exp(0.2)`, `0.5 * i`, `I(i) * 0.5` for
an integer tensor `I`, `c ? 0.2 : 1`), so `A(i) * (0.1 + 0.2)` adds in double too. A weak
expression becomes double when it meets a double operand (arithmetic, comparison, `min`/`max`,
`?:` branches, builtin arguments), an explicit `double(...)`, or a double tensor it is stored
into; otherwise it is float32 from the moment it meets anything else (a float32 operand, a
comparison with another weak operand, an explicit cast, a float32 or integer destination).
Integer literals are int32 and never weak. A literal that float32 cannot hold (it would become
inf, or 0 though it is not zero) is a located SemanticError once it is float32: the value is known
at compile time, so the mistake is certain, and Python floats passed at call time get the same
error (NumPy 2 only warns, "overflow encountered in cast", and computes with inf).

The checker walks left-associative chains (`a + b + ...`) in a loop, not by recursion; the checked
expression, with its let bindings inlined, obeys the parser's height limit, which keeps the later
stages (which recurse) far from Python's recursion limit.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

from . import ir, syntax
from .builtins import BUILTINS
from .dtypes import TYPE_NAMES, ScalarType, match_types
from .errors import SemanticError, Span
from .parser import MAX_EXPRESSION_DEPTH, MAX_EXPRESSION_HEIGHT

BOOL = ScalarType.BOOL
INT32 = ScalarType.INT32
FLOAT32 = ScalarType.FLOAT32
FLOAT64 = ScalarType.FLOAT64
INT32_MAX = 2**31 - 1


def tc_type_name(dtype: ScalarType) -> str:
    """TC's spelling of a type in messages (`float`, not `float32`)."""
    return {ScalarType.FLOAT32: "float", ScalarType.FLOAT64: "double"}.get(dtype, dtype.value)


def scalar_type(name: str, span: Span | None) -> ScalarType:
    dtype = TYPE_NAMES[name]
    if dtype is ScalarType.FLOAT16:
        raise SemanticError("half precision (float16) is not supported", span)
    return dtype


def literal(number: syntax.Number) -> ir.Const:
    """Integer literals are int32; float literals are weak float32, as in TC but see the module doc.

    A float literal's `value` is the double nearest its text (Python's `float`), which is exact when
    the literal is widened to double and is rounded to float32 when it is emitted as float32.
    """
    text = number.text
    if number.is_float:
        return ir.Const(value=float(text), dtype=FLOAT32, span=number.span, weak=True)
    # Check the length first: int() of a huge digit string is slow (and limited in Python 3.11).
    if len(text.lstrip("0")) > 10 or int(text) > INT32_MAX:
        raise SemanticError(f"integer literal {text[:20]} does not fit in int32", number.span)
    return ir.Const(value=int(text), dtype=INT32, span=number.span)


def is_weak(expr: ir.Expr) -> bool:
    """Typed float32 only because of float literals, so still free to become double."""
    return getattr(expr, "weak", False)


def convert(expr: ir.Expr, dtype: ScalarType) -> ir.Expr:
    """`expr` as `dtype`, through an explicit Cast when the types differ.

    A weak expression converted to double is computed in double (`widen`); converted to anything
    else it is float32 from here on (`settle`), and then cast if need be.
    """
    if is_weak(expr):
        if dtype == FLOAT64:
            return widen(expr)
        expr = settle(expr)
    return expr if expr.dtype == dtype else ir.Cast(operand=expr, dtype=dtype, span=expr.span)


def _weak_nodes(expr: ir.Expr) -> list[ir.Expr]:
    """The weak nodes of `expr` reachable through weak nodes, children before parents, each once.

    Iterative: a weak chain `0.1 + 0.1 + ...` is as deep as it is long.
    """
    order: list[ir.Expr] = []
    seen: set[int] = set()
    stack: list[tuple[ir.Expr, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        # reversed: the first child is expanded first, so errors name the leftmost literal
        stack.extend((c, False) for c in reversed(ir.children(node)) if is_weak(c))
    return order


def widen(expr: ir.Expr) -> ir.Expr:
    """The weak float32 expression `expr` computed in double: each weak node becomes float64.

    A weak node's float children are weak themselves, and its other children are integers or bools
    (a weak Cast converts one of those), so no float32 value is left inside.
    """
    done: dict[int, ir.Expr] = {}

    def new(child: ir.Expr) -> ir.Expr:
        return done[id(child)] if is_weak(child) else child

    for node in _weak_nodes(expr):
        match node:
            case ir.Unary(operand=o):
                wide = dataclasses.replace(node, operand=new(o))
            case ir.Binary(lhs=a, rhs=b):
                wide = dataclasses.replace(node, lhs=new(a), rhs=new(b))
            case ir.Select(if_true=a, if_false=b):
                wide = dataclasses.replace(node, if_true=new(a), if_false=new(b))
            case ir.Call(args=args):
                wide = dataclasses.replace(node, args=tuple(new(a) for a in args))
            case _:  # Const (the value is already the double nearest the literal's text), Cast
                wide = node
        done[id(node)] = dataclasses.replace(wide, dtype=FLOAT64, weak=False)
    return done[id(expr)]


def settle(expr: ir.Expr) -> ir.Expr:
    """The weak expression `expr`, float32 from here on: check that float32 holds its literals."""
    if not is_weak(expr):
        return expr
    for node in _weak_nodes(expr):
        if isinstance(node, ir.Const):
            _require_float32(node)
    return dataclasses.replace(expr, weak=False)


def _require_float32(const: ir.Const) -> None:
    value = float(const.value)
    try:
        rounded = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # pack raises exactly when the rounded value would be inf
        rounded = math.copysign(math.inf, value)
    if (math.isfinite(value) and math.isinf(rounded)) or (value != 0.0 and rounded == 0.0):
        text = const.span.text if const.span is not None else repr(value)
        raise SemanticError(
            f"the literal {text} is {rounded!r} in float32 (the range of float32 is 1.4e-45 to "
            f"3.4e+38 in magnitude); write double({text}) or combine it with a double",
            const.span,
        )


def unify(operands: list[ir.Expr], floor: ScalarType | None = None) -> tuple[ScalarType, bool]:
    """The type in which `operands` meet (at least `floor`), and whether the result is weak.

    Weak operands take the type of the others when a float is among those; otherwise they make the
    result a weak float32 (int op float → float, as in TC).
    """
    strong = [e.dtype for e in operands if not is_weak(e)]
    if len(strong) < len(operands) and not any(t.is_float for t in strong):
        return reduce(match_types, strong, FLOAT32), True
    if floor is not None:
        strong.insert(0, floor)
    return reduce(match_types, strong), False


def coerce(expr: ir.Expr, dtype: ScalarType, weak: bool) -> ir.Expr:
    """One operand of an operation of type `dtype` (weak or not), converted to that type."""
    if weak:  # dtype is float32; expr is weak already or an integer or bool
        if is_weak(expr):
            return expr
        return ir.Cast(operand=expr, dtype=dtype, span=expr.span, weak=True)
    return convert(expr, dtype)


def height(expr: ir.Expr) -> int:
    """The height of `expr`'s tree, not counting the conversions the checker inserts. Iterative."""
    heights: dict[int, int] = {}
    stack: list[tuple[ir.Expr, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        kids = ir.children(node)
        if expanded:
            below = max((heights[id(c)] for c in kids), default=0)
            heights[id(node)] = below + (0 if isinstance(node, ir.Cast) else 1)
        elif id(node) not in heights:
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in heights)
    return heights[id(expr)]


@dataclass(frozen=True)
class TensorInfo:
    """What an expression needs to know about a tensor that may be read."""

    name: str
    dtype: ScalarType
    rank: int


@dataclass
class Scope:
    """The names one statement's expressions may use.

    tensors: readable tensors (inputs, and outputs/temporaries written by earlier statements).
    unreadable: outputs/temporaries not written yet (reading them is an error).
    indices: the statement's index variables so far (LHS first, then reduction indices in order of
        first use). A bare unknown name becomes a new reduction index while `introduce` is True.
    """

    tensors: dict[str, TensorInfo]
    unreadable: set[str]
    sizes: set[str]
    lhs_indices: tuple[str, ...]
    lets: dict[str, syntax.WhereLet] = field(default_factory=dict)
    reduction_indices: list[str] = field(default_factory=list)
    reduction_spans: dict[str, Span | None] = field(default_factory=dict)
    introduce: bool = True
    _let_values: dict[str, ir.Expr] = field(default_factory=dict)
    _lets_in_progress: set[str] = field(default_factory=set)

    def is_index(self, name: str) -> bool:
        return name in self.lhs_indices or name in self.reduction_indices

    def let_value(self, name: str, check: Callable[[syntax.Expression], ir.Expr], span) -> ir.Expr:
        if name in self._let_values:
            return self._let_values[name]
        if name in self._lets_in_progress:
            raise SemanticError(f"let binding {name} refers to itself", span)
        self._lets_in_progress.add(name)
        try:
            value = check(self.lets[name].value)
        finally:
            self._lets_in_progress.discard(name)
        self._let_values[name] = value
        return value

    def used_lets(self) -> set[str]:
        return set(self._let_values)


class ExpressionChecker:
    """Checks the expressions of one statement against a Scope."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.depth = 0  # recursion of `expr`, let bindings included (chains do not recurse)

    def check(self, expr: syntax.Expression) -> ir.Expr:
        """The typed `expr` (possibly still weak: `convert` it to where it goes)."""
        value = self.expr(expr)
        if height(value) > MAX_EXPRESSION_HEIGHT:
            raise SemanticError(
                f"expression too long: more than {MAX_EXPRESSION_HEIGHT} levels deep with its let "
                f"bindings inlined; compute part of it in a temporary tensor",
                expr.span,
            )
        return value

    def expr(self, expr: syntax.Expression, nested: bool = True) -> ir.Expr:
        """One sub-expression, typed. Each nested call counts one level of nesting, as in the
        parser; the head of a chain and the condition of `?:` (`nested=False`) do not, because the
        parser reads them at the depth of the whole."""
        self.depth += nested
        try:
            if self.depth > MAX_EXPRESSION_DEPTH:
                raise SemanticError(
                    f"expression nested too deeply with its let bindings inlined (more than "
                    f"{MAX_EXPRESSION_DEPTH} levels)",
                    expr.span,
                )
            return self._expr(expr)
        finally:
            self.depth -= nested

    def _expr(self, expr: syntax.Expression) -> ir.Expr:
        match expr:
            case syntax.Number():
                return literal(expr)
            case syntax.Name(name=name):
                return self.name(name, expr.span)
            case syntax.Apply():
                return self.apply(expr)
            case syntax.UnaryOp():
                return self.unary(expr)
            case syntax.BinaryOp():
                return self.binary(expr)
            case syntax.Ternary():
                cond = self.require_bool(self.expr(expr.cond, nested=False), expr.cond)
                a, b = self.expr(expr.if_true), self.expr(expr.if_false)
                dtype, weak = unify([a, b])
                return ir.Select(
                    cond=cond,
                    if_true=coerce(a, dtype, weak),
                    if_false=coerce(b, dtype, weak),
                    dtype=dtype,
                    span=expr.span,
                    weak=weak,
                )
            case syntax.CastExpr():
                dtype = scalar_type(expr.type_name, expr.span)
                # Explicit: `double(0.2)` is the double nearest 0.2, `float(0.2)` stays float32.
                return convert(self.expr(expr.operand), dtype)
        raise AssertionError(f"unknown expression {expr!r}")

    # ------------------------------------------------------------ names and accesses

    def name(self, name: str, span: Span | None) -> ir.Expr:
        scope = self.scope
        if scope.is_index(name):
            return ir.IndexRef(name=name, span=span)
        if name in scope.lets:
            return scope.let_value(name, self.expr, span)
        if name in scope.sizes:
            return ir.SizeRef(name=name, span=span)
        if name in scope.tensors:
            info = scope.tensors[name]
            if info.rank != 0:
                raise SemanticError(
                    f"expected a scalar but found a tensor expression. {name} has {info.rank} "
                    f"dimensions; index it as {name}(...)",
                    span,
                )
            return ir.Read(tensor=name, indices=(), dtype=info.dtype, span=span)
        if name in scope.unreadable:
            raise SemanticError(f"{name} is read here before any statement writes it", span)
        if name in BUILTINS:
            raise SemanticError(f"{name} is a built-in function; call it as {name}(...)", span)
        if not scope.introduce:
            raise SemanticError(f"undefined variable {name} used here.", span)
        # A name nothing defines is a reduction index, as in TC.
        scope.reduction_indices.append(name)
        scope.reduction_spans[name] = span
        return ir.IndexRef(name=name, span=span)

    def apply(self, expr: syntax.Apply) -> ir.Expr:
        scope, name = self.scope, expr.name
        if name in scope.tensors and not (scope.is_index(name) or name in scope.lets):
            info = scope.tensors[name]
            if len(expr.args) != info.rank:
                raise SemanticError(
                    f"expected {info.rank} dimensions but found {len(expr.args)} dimensions. "
                    f"({name} has rank {info.rank})",
                    expr.paren_span,
                )
            indices = tuple(self.subscript(arg) for arg in expr.args)
            return ir.Read(tensor=name, indices=indices, dtype=info.dtype, span=expr.paren_span)
        if name in BUILTINS and not (scope.is_index(name) or name in scope.lets):
            arity = BUILTINS[name]
            if len(expr.args) != arity:
                raise SemanticError(
                    f"expected {arity} but found {len(expr.args)} (arguments of {name})", expr.paren_span
                )
            args = [self.expr(arg) for arg in expr.args]
            dtype, weak = unify(args, floor=FLOAT32)
            return ir.Call(
                function=name,
                args=tuple(coerce(a, dtype, weak) for a in args),
                dtype=dtype,
                span=expr.span,
                weak=weak,
            )
        if name in scope.unreadable:
            raise SemanticError(f"{name} is read here before any statement writes it", expr.span)
        if scope.is_index(name) or name in scope.lets or name in scope.sizes:
            raise SemanticError(
                f"{name} is not a tensor or a built-in function; it cannot be called", expr.span
            )
        raise SemanticError(f"undefined variable {name} used here.", expr.span)

    def subscript(self, arg: syntax.Expression) -> ir.Expr:
        index = self.expr(arg)
        if not index.dtype.is_integer:
            raise SemanticError(f" expected integral type but found {tc_type_name(index.dtype)}", arg.span)
        return index

    # ------------------------------------------------------------ operators

    def unary(self, expr: syntax.UnaryOp) -> ir.Expr:
        operand = self.expr(expr.operand)
        if expr.op == "!":
            return ir.Unary(
                op="!", operand=self.require_bool(operand, expr.operand), dtype=BOOL, span=expr.span
            )
        if operand.dtype.is_bool:
            operand = convert(operand, INT32)  # -(a < b): arithmetic on a bool promotes it to int32
        return ir.Unary(op="-", operand=operand, dtype=operand.dtype, span=expr.span, weak=is_weak(operand))

    def binary(self, expr: syntax.BinaryOp) -> ir.Expr:
        # A chain a + b + c ... is a left-deep tree: walk down its left spine in a loop, then fold
        # the operands in from the left, so a long chain needs no deep recursion.
        spine = [expr]
        while isinstance(spine[-1].lhs, syntax.BinaryOp):
            spine.append(spine[-1].lhs)
        value = self.expr(spine[-1].lhs, nested=False)
        for node in reversed(spine):
            value = self.operation(node, value, self.expr(node.rhs))
        return value

    def operation(self, expr: syntax.BinaryOp, lhs: ir.Expr, rhs: ir.Expr) -> ir.Expr:
        op = expr.op
        if op in ir.LOGICAL_OPS:
            lhs, rhs = self.require_bool(lhs, expr.lhs), self.require_bool(rhs, expr.rhs)
            return ir.Binary(op=op, lhs=lhs, rhs=rhs, dtype=BOOL, span=expr.span)
        dtype, weak = unify([lhs, rhs])
        if op in ir.COMPARISON_OPS:
            # the result is bool, so weak operands settle: in double if they meet one, else float32
            weak, result = False, BOOL
        else:
            # bool op bool stays bool in match_types; arithmetic on bools works in int32.
            dtype = INT32 if dtype.is_bool else dtype
            result = dtype
        return ir.Binary(
            op=op,
            lhs=coerce(lhs, dtype, weak),
            rhs=coerce(rhs, dtype, weak),
            dtype=result,
            span=expr.span,
            weak=weak,
        )

    def require_bool(self, value: ir.Expr, source: syntax.Expression) -> ir.Expr:
        if not value.dtype.is_bool:
            raise SemanticError(f"expected boolean but found {tc_type_name(value.dtype)}", source.span)
        return value
