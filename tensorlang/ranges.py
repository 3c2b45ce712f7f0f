"""ranges: tensor accesses + where ranges of one statement → index ranges (TC range inference, §7).

Every affine subscript `e` of dimension d of tensor T gives the constraint 0 <= e < shape(T)[d]
(data-dependent subscripts give none). Variables with a `where` range are solved up front; each
round then solves every variable that is the only unsolved one in some constraint, eliminating
the solved ones "for all values in their ranges" (interval arithmetic) and intersecting the
bounds of several constraints with Min/Max. Ranges are half-open sympy intervals [lo, hi).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy.core.parameters import distribute

from . import ir, syntax
from .errors import SemanticError, Span


@dataclass(frozen=True)
class Constraint:
    """0 <= sum(coeffs[v] * v) + offset < extent, from one subscript of one access."""

    coeffs: tuple[tuple[str, int], ...]  # index variables only, no zero coefficients
    offset: sympy.Expr
    extent: sympy.Expr
    access: str  # how the access reads in messages, e.g. "I(10 + i - j, i + j)"

    @property
    def variables(self) -> set[str]:
        return {v for v, _ in self.coeffs}


def access_constraints(
    tensor: str, subscripts: tuple[ir.Expr, ...], shape: tuple[sympy.Expr, ...], variables: set[str]
) -> list[Constraint]:
    """The constraints of one access; subscripts that are not affine (gathers, `%`) give none."""
    forms = [ir.affine_form(s) for s in subscripts]
    text = f"{tensor}({', '.join(str(s) if f is None else str(_affine_sympy(f)) for s, f in zip(subscripts, forms))})"
    constraints = []
    for form, extent in zip(forms, shape):
        if form is None:
            continue
        coeffs = tuple((n, c) for n, c in form.coeffs if n in variables)
        if not coeffs:
            continue  # no unknowns: a run-time bounds check for later stages, not an inference input
        offset = sympy.Integer(form.constant) + sum(
            (c * ir.size_symbol(n) for n, c in form.coeffs if n not in variables), sympy.Integer(0)
        )
        constraints.append(Constraint(coeffs, offset, extent, text))
    return constraints


def _affine_sympy(form: ir.AffineForm) -> sympy.Expr:
    return sum((c * sympy.Symbol(n) for n, c in form.coeffs), sympy.Integer(form.constant))


def accesses_of(expr: ir.Expr) -> list[ir.Read]:
    """Every tensor read in `expr` that has subscripts, including reads nested in subscripts."""
    return [e for e in ir.walk(expr) if isinstance(e, ir.Read) and e.indices]


def infer(
    *,
    tensor: str,
    lhs: tuple[tuple[str, Span | None], ...],
    reduction: tuple[tuple[str, Span | None], ...],
    where: dict[str, tuple[sympy.Expr, sympy.Expr]],
    constraints: list[Constraint],
    statement_span: Span | None,
) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
    """The range [lo, hi) of every LHS and reduction index of one statement writing `tensor`."""
    variables = [name for name, _ in lhs + reduction]
    solved = {v: where[v] for v in variables if v in where}
    while True:
        round_result = {}
        for var in variables:
            if var in solved:
                continue
            bounds = [_solve(c, var, solved) for c in constraints if c.variables - solved.keys() == {var}]
            if bounds:
                round_result[var] = (sympy.Max(*(b[0] for b in bounds)), sympy.Min(*(b[1] for b in bounds)))
        if not round_result:
            break
        solved.update(round_result)
    unsolved = [v for v in variables if v not in solved]
    if unsolved:
        _report_unsolved(tensor, unsolved, dict(lhs), dict(reduction), constraints, statement_span)
    return solved


def check_nonempty(var: str, lo: sympy.Expr, hi: sympy.Expr, span: Span | None) -> None:
    """A range that is empty whatever the sizes is a mistake (TC silently gave negative extents)."""
    extent = sympy.simplify(hi - lo)
    if extent.is_number and extent.is_nonpositive:
        raise SemanticError(f"Inferred an empty range for variable {var}: {lo}:{hi}", span)


def _solve(c: Constraint, var: str, solved: dict) -> tuple[sympy.Expr, sympy.Expr]:
    """Bounds of `var` from c, for all values of the other (solved) variables in their ranges."""
    rest_min = rest_max = c.offset
    coeff = 0
    for name, k in c.coeffs:
        if name == var:
            coeff = k
            continue
        lo, hi = solved[name]
        low_term, high_term = k * lo, k * (hi - 1)
        if k < 0:
            low_term, high_term = high_term, low_term
        rest_min, rest_max = rest_min + low_term, rest_max + high_term
    # 0 <= coeff*var + rest and coeff*var + rest <= extent - 1, for every rest in [rest_min, rest_max].
    if coeff > 0:
        k = sympy.Integer(coeff)
        lo_num, hi_num = -rest_min, c.extent - 1 - rest_max + k
    else:
        k = sympy.Integer(-coeff)
        lo_num, hi_num = rest_max - c.extent + 1, rest_min + k
    # distribute(False) keeps `floor((M + 4)/5)` from becoming `floor(M/5 + 4/5)` (same value, uglier).
    with distribute(False):
        return sympy.ceiling(lo_num / k), sympy.floor(hi_num / k)


def _report_unsolved(tensor, unsolved, lhs_spans, reduction_spans, constraints, statement_span):
    mentioned = set().union(*(c.variables for c in constraints)) if constraints else set()
    for var in unsolved:
        if var in mentioned:
            continue
        if var in lhs_spans:
            raise SemanticError(
                f"Free variable {var} was not solved in range inference: no tensor access of the "
                f"right-hand side constrains the index {var} of {tensor}. "
                f"Use a where clause to set its range, e.g. `where {var} in 0:N`",
                lhs_spans[var],
            )
        raise SemanticError(
            f"Free variable {var} is unconstrained. Use a 'where' clause to set its range "
            f"(e.g. `where {var} in 0:N`)",
            reduction_spans[var],
        )
    coupled = [c.access for c in constraints if c.variables & set(unsolved)]
    first = next((lhs_spans[v] for v in unsolved if v in lhs_spans), statement_span)
    raise SemanticError(
        f"Could not infer ranges for free variables {', '.join(unsolved)}: every access that uses them "
        f"({', '.join(dict.fromkeys(coupled))}) also uses another unsolved variable. Use a where clause "
        f"to set the range of one of them, e.g. `where {unsolved[0]} in 0:N`",
        first,
    )


def require_zero_based(
    tensor: str, var: str, lo: sympy.Expr, hi: sympy.Expr, span: Span | None
) -> ir.Requirement | None:
    """tensorlang's rule: the statement that first defines a tensor covers it from index 0.

    A start that is provably not 0 is an error now; one that depends on the sizes (`KH - 1`,
    which is 0 only for KH = 1) becomes a requirement checked at call time.
    """
    lo = sympy.simplify(lo)
    if lo == 0:
        return None
    shifted = sympy.Symbol(var) + lo
    advice = (
        f"(tensorlang tensors start at index 0, and the first statement writing {tensor} defines its "
        f"shape). Shift the index so that it starts at 0 (replace {var} by {shifted} on the right-hand "
        f"side), or set its range with `where {var} in 0:...`"
    )
    if lo.is_number or lo.is_zero is False:
        raise SemanticError(
            f"index {var} of {tensor} ranges over {lo}:{hi}, which does not start at 0 {advice}", span
        )
    return ir.Requirement(
        lo, f"index {var} of {tensor} starts at {lo}, not 0, for these sizes {advice}", span
    )


def check_within(tensor: str, var: str, lo, hi, extent, span: Span | None) -> None:
    """A later statement's `where` range must not provably leave the tensor its first statement shaped."""
    if lo.is_negative is True or sympy.simplify(hi - extent).is_positive is True:
        raise SemanticError(
            f"index {var} ranges over {lo}:{hi}, outside {tensor}'s dimension of extent {extent}", span
        )


# ---------------------------------------------------------------- where-range bounds


def bound_to_sympy(expr: syntax.Expression, sizes: set[str], tensors: set[str]) -> sympy.Expr:
    """A range bound as a sympy expression: integer literals and sizes under + - * / % min max."""
    match expr:
        case syntax.Number(text=text):
            if syntax.Number(text=text).is_float:
                raise SemanticError(" expected integral type but found float in a range bound", expr.span)
            if len(text.lstrip("0")) > 10:
                raise SemanticError(f"integer literal {text[:20]} does not fit in int32", expr.span)
            return sympy.Integer(int(text))
        case syntax.Name(name=name) | syntax.Apply(name=name):
            if name in tensors:
                raise SemanticError(
                    "tensor accesses cannot be used in this context (a range bound)", expr.span
                )
            if isinstance(expr, syntax.Name) and name in sizes:
                return ir.size_symbol(name)
            raise SemanticError(
                f"undefined variable {name} used here. A range bound may only use sizes and integer constants",
                expr.span,
            )
        case syntax.UnaryOp(op="-", operand=operand):
            return -bound_to_sympy(operand, sizes, tensors)
        case syntax.CastExpr(type_name=t, operand=operand) if t.startswith(("int", "uint")):
            return bound_to_sympy(operand, sizes, tensors)
        case syntax.BinaryOp(op=op, lhs=a, rhs=b) if op in ("+", "-", "*", "/", "%", "min", "max"):
            x, y = bound_to_sympy(a, sizes, tensors), bound_to_sympy(b, sizes, tensors)
            if op in ("/", "%") and y == 0:
                raise SemanticError("division by zero in a range bound", expr.span)
            return {
                "+": lambda: x + y,
                "-": lambda: x - y,
                "*": lambda: x * y,
                "/": lambda: sympy.floor(x / y),
                "%": lambda: sympy.Mod(x, y),
                "min": lambda: sympy.Min(x, y),
                "max": lambda: sympy.Max(x, y),
            }[op]()
    raise SemanticError("this expression cannot be used as a range bound", expr.span)
