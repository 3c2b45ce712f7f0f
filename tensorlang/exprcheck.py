"""exprcheck: syntax expressions → typed ir expressions (name resolution, TC typing, explicit casts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import ir, syntax
from .builtins import BUILTINS
from .dtypes import TYPE_NAMES, ScalarType, match_types
from .errors import SemanticError, Span

BOOL = ScalarType.BOOL
INT32 = ScalarType.INT32
FLOAT32 = ScalarType.FLOAT32
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
    """Integer literals are int32 and float literals float32, as in TC."""
    text = number.text
    if number.is_float:
        return ir.Const(value=float(text), dtype=FLOAT32, span=number.span)
    # Check the length first: int() of a huge digit string is slow (and limited in Python 3.11).
    if len(text.lstrip("0")) > 10 or int(text) > INT32_MAX:
        raise SemanticError(f"integer literal {text[:20]} does not fit in int32", number.span)
    return ir.Const(value=int(text), dtype=INT32, span=number.span)


def convert(expr: ir.Expr, dtype: ScalarType) -> ir.Expr:
    """`expr` as `dtype`, through an explicit Cast when the types differ."""
    return expr if expr.dtype == dtype else ir.Cast(operand=expr, dtype=dtype, span=expr.span)


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

    def check(self, expr: syntax.Expression) -> ir.Expr:
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
                cond = self.require_bool(self.check(expr.cond), expr.cond)
                a, b = self.check(expr.if_true), self.check(expr.if_false)
                dtype = match_types(a.dtype, b.dtype)
                return ir.Select(
                    cond=cond,
                    if_true=convert(a, dtype),
                    if_false=convert(b, dtype),
                    dtype=dtype,
                    span=expr.span,
                )
            case syntax.CastExpr():
                dtype = scalar_type(expr.type_name, expr.span)
                return convert(self.check(expr.operand), dtype)
        raise AssertionError(f"unknown expression {expr!r}")

    # ------------------------------------------------------------ names and accesses

    def name(self, name: str, span: Span | None) -> ir.Expr:
        scope = self.scope
        if scope.is_index(name):
            return ir.IndexRef(name=name, span=span)
        if name in scope.lets:
            return scope.let_value(name, self.check, span)
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
            args = [self.check(arg) for arg in expr.args]
            dtype = FLOAT32
            for arg in args:
                dtype = match_types(dtype, arg.dtype)
            return ir.Call(
                function=name, args=tuple(convert(a, dtype) for a in args), dtype=dtype, span=expr.span
            )
        if name in scope.unreadable:
            raise SemanticError(f"{name} is read here before any statement writes it", expr.span)
        if scope.is_index(name) or name in scope.lets or name in scope.sizes:
            raise SemanticError(
                f"{name} is not a tensor or a built-in function; it cannot be called", expr.span
            )
        raise SemanticError(f"undefined variable {name} used here.", expr.span)

    def subscript(self, arg: syntax.Expression) -> ir.Expr:
        index = self.check(arg)
        if not index.dtype.is_integer:
            raise SemanticError(f" expected integral type but found {tc_type_name(index.dtype)}", arg.span)
        return index

    # ------------------------------------------------------------ operators

    def unary(self, expr: syntax.UnaryOp) -> ir.Expr:
        operand = self.check(expr.operand)
        if expr.op == "!":
            return ir.Unary(
                op="!", operand=self.require_bool(operand, expr.operand), dtype=BOOL, span=expr.span
            )
        if operand.dtype.is_bool:
            operand = convert(operand, INT32)  # -(a < b): arithmetic on a bool promotes it to int32
        return ir.Unary(op="-", operand=operand, dtype=operand.dtype, span=expr.span)

    def binary(self, expr: syntax.BinaryOp) -> ir.Expr:
        lhs, rhs = self.check(expr.lhs), self.check(expr.rhs)
        op = expr.op
        if op in ir.LOGICAL_OPS:
            lhs, rhs = self.require_bool(lhs, expr.lhs), self.require_bool(rhs, expr.rhs)
            return ir.Binary(op=op, lhs=lhs, rhs=rhs, dtype=BOOL, span=expr.span)
        dtype = match_types(lhs.dtype, rhs.dtype)
        if op in ir.COMPARISON_OPS:
            result = BOOL
        else:
            # bool op bool stays bool in match_types; arithmetic on bools works in int32.
            dtype = INT32 if dtype.is_bool else dtype
            result = dtype
        return ir.Binary(
            op=op, lhs=convert(lhs, dtype), rhs=convert(rhs, dtype), dtype=result, span=expr.span
        )

    def require_bool(self, value: ir.Expr, source: syntax.Expression) -> ir.Expr:
        if not value.dtype.is_bool:
            raise SemanticError(f"expected boolean but found {tc_type_name(value.dtype)}", source.span)
        return value
