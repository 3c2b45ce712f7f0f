"""ranges: tensor accesses + where ranges of one statement → index ranges (TC range inference, §7).

Every affine subscript `e` of dimension d of tensor T gives the constraint 0 <= e < shape(T)[d]
(data-dependent subscripts give none). Variables with a `where` range are solved up front; each
round then solves every variable that is the only unsolved one in some constraint, eliminating
the solved ones "for all values in their ranges" (interval arithmetic) and intersecting the
bounds of several constraints with Min/Max. Ranges are half-open sympy intervals [lo, hi).

Guarded reads. TC lets a read under `?:`, `&&` or `||` narrow every index as if it always ran,
so a same-padding convolution sums only its centre tap. tensorlang drops each half (`0 <= e`,
`e < extent`) of a guarded read's subscript constraint from the inference of the reduction
indices when one affine conjunct of the guard implies it (compared exactly with sympy): the read
runs only where that half holds anyway. Left-hand-side indices keep TC's rule, so no output size
changes for a program TC accepts. Where a guarded read still narrows an index below what the
other accesses allow (an LHS index, or a guard that does not imply the bound), the narrowing
stays and is reported as a `Narrowing` (a located warning). "Guarded" here means that some part
of the guard uses only indices of that subscript (`(X(i) > 0) ? A(i, k) * B(k)` says nothing
about k, so A and B narrow k quietly, as unguarded reads would). An index that only such
constraints bound keeps them silently (nothing wider was possible), also when dropping the
implied halves would leave it unbounded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy
from sympy.core.parameters import distribute

from . import ir
from .errors import SemanticError, Span

Range = tuple[sympy.Expr, sympy.Expr]


@dataclass(frozen=True)
class Guard:
    """What holds where a read runs, from the `?:`, `&&` and `||` conditions that decide whether it
    runs: `facts` are affine expressions known to be >= 0 there (a sound subset of the conditions);
    `vague` are the index variables of each part that gives no fact (a non-affine comparison, `!=`,
    a disjunction), which may still be meant to keep a read in bounds."""

    facts: tuple[sympy.Expr, ...] = ()
    vague: tuple[frozenset[str], ...] = ()

    def also(self, cond: ir.Expr, holds: bool, variables: set[str]) -> Guard:
        facts, vague = _facts(cond, holds, variables)
        return Guard(self.facts + tuple(facts), self.vague + tuple(vague))

    def is_about(self, coeffs: tuple[tuple[str, int], ...]) -> bool:
        """Whether the guard speaks of a subscript with these index coefficients: some part of it
        uses only indices of the subscript (`h + kh - 1 >= 0` or `h >= 1` of `h + kh - 1`, but
        not of `kh`, which the same guard may surround in a padded convolution)."""
        names = {n for n, _ in coeffs}
        parts = [_index_names(f) for f in self.facts] + [set(v) for v in self.vague]
        return any(part and part <= names for part in parts)


@dataclass(frozen=True)
class Constraint:
    """0 <= sum(coeffs[v] * v) + offset < extent, from one subscript of one access."""

    coeffs: tuple[tuple[str, int], ...]  # index variables only, no zero coefficients
    offset: sympy.Expr
    extent: sympy.Expr
    access: str  # how the access reads in messages, e.g. "I(10 + i - j, i + j)"
    under_guard: bool = False  # a condition deciding whether the access runs speaks of this subscript
    implied: tuple[bool, bool] = (False, False)  # that guard implies (0 <= e, e < extent)
    halves: tuple[bool, bool] = (True, True)  # which of the two take part in inference
    span: Span | None = None

    @property
    def variables(self) -> set[str]:
        return {v for v, _ in self.coeffs}


@dataclass(frozen=True)
class Narrowing:
    """An index range a guarded read narrowed below what the other accesses allow."""

    var: str
    on_lhs: bool
    range: Range
    allowed: Range
    access: str
    span: Span | None


@dataclass(frozen=True)
class Inference:
    """The ranges of one statement's indices and the narrowings to report."""

    ranges: dict[str, Range]
    narrowings: tuple[Narrowing, ...]


def index_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of an index variable (any integer), distinct from the size symbols."""
    return sympy.Symbol(name, integer=True)


def access_constraints(
    tensor: str,
    subscripts: tuple[ir.Expr, ...],
    shape: tuple[sympy.Expr, ...],
    variables: set[str],
    guard: Guard = Guard(),
    span: Span | None = None,
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
        value = offset + sum((c * index_symbol(n) for n, c in coeffs), sympy.Integer(0))
        implied = (_implied(value, guard.facts), _implied(extent - 1 - value, guard.facts))
        constraints.append(
            Constraint(coeffs, offset, extent, text, guard.is_about(coeffs), implied, span=span)
        )
    return constraints


def _affine_sympy(form: ir.AffineForm) -> sympy.Expr:
    return sum((c * sympy.Symbol(n) for n, c in form.coeffs), sympy.Integer(form.constant))


def _implied(target: sympy.Expr, facts: tuple[sympy.Expr, ...]) -> bool:
    """Whether `target >= 0` follows from one fact `f >= 0`: target - f is provably >= 0 for all
    sizes (the index terms must cancel exactly, as in `h + kh - 1` against `h + kh >= 1`)."""
    return any(sympy.expand(target - fact).is_nonnegative is True for fact in facts)


def guarded_accesses(expr: ir.Expr, variables: set[str]) -> list[tuple[ir.Read, Guard]]:
    """Every tensor read in `expr` with subscripts, with the guard under which it runs (as in
    polyhedral/accesses.py: the branches of `?:` and the right operand of `&&` / `||`)."""
    out: list[tuple[ir.Read, Guard]] = []

    def visit(e: ir.Expr, guard: Guard) -> None:
        match e:
            case ir.Read(indices=indices):
                if indices:
                    out.append((e, guard))
                for index in indices:
                    visit(index, guard)
            case ir.Select(cond=c, if_true=t, if_false=f):
                visit(c, guard)
                visit(t, guard.also(c, True, variables))
                visit(f, guard.also(c, False, variables))
            case ir.Binary(op="&&" | "||", lhs=a, rhs=b):
                visit(a, guard)
                visit(b, guard.also(a, e.op == "&&", variables))
            case _:
                for child in ir.children(e):
                    visit(child, guard)

    visit(expr, Guard())
    return out


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _facts(cond: ir.Expr, holds: bool, variables: set[str]) -> tuple[list[sympy.Expr], list[frozenset[str]]]:
    """Affine expressions that are >= 0 wherever `cond` evaluates to `holds`, and the index
    variables of each part that gives none."""
    match cond:
        case ir.Unary(op="!", operand=o):
            return _facts(o, not holds, variables)
        case ir.Binary(op="&&" | "||", lhs=a, rhs=b) if (cond.op == "&&") == holds:
            (fa, va), (fb, vb) = _facts(a, holds, variables), _facts(b, holds, variables)
            return fa + fb, va + vb  # a conjunction: both sides hold
        case ir.Binary(op=op, lhs=a, rhs=b) if op in _NEGATED and a.dtype.is_signed:
            x, y = _affine_value(a, variables), _affine_value(b, variables)
            op = op if holds else _NEGATED[op]
            if x is not None and y is not None and op != "!=":
                d = x - y  # integers: a > b is a - b - 1 >= 0
                return {">=": [d], ">": [d - 1], "<=": [-d], "<": [-d - 1], "==": [d, -d]}[op], []
    return [], [frozenset(n.name for n in ir.walk(cond) if isinstance(n, ir.IndexRef))]


def _index_names(expr: sympy.Expr) -> set[str]:
    return {s.name for s in expr.free_symbols if s == index_symbol(s.name)}


def _affine_value(expr: ir.Expr, variables: set[str]) -> sympy.Expr | None:
    form = ir.affine_form(expr)
    if form is None:
        return None
    symbol = {n: index_symbol(n) if n in variables else ir.size_symbol(n) for n, _ in form.coeffs}
    return sum((c * symbol[n] for n, c in form.coeffs), sympy.Integer(form.constant))


def infer(
    *,
    tensor: str,
    lhs: tuple[tuple[str, Span | None], ...],
    reduction: tuple[tuple[str, Span | None], ...],
    where: dict[str, Range],
    constraints: list[Constraint],
    statement_span: Span | None,
) -> Inference:
    """The range [lo, hi) of every LHS and reduction index of one statement writing `tensor`."""
    variables = [name for name, _ in lhs + reduction]
    on_lhs = {name for name, _ in lhs}
    reductions = [v for v in variables if v not in on_lhs]
    tc = _rounds(variables, {v: where[v] for v in variables if v in where}, constraints)
    unsolved = [v for v in variables if v not in tc]
    if unsolved:
        _report_unsolved(tensor, unsolved, dict(lhs), dict(reduction), constraints, statement_span)
    # Reduction indices are solved again with the LHS ranges TC gives (so output sizes stay TC's).
    fixed = {v: tc[v] for v in on_lhs} | {v: where[v] for v in reductions if v in where}
    chosen = dict(tc)
    kept = [dataclasses.replace(c, halves=(not c.implied[0], not c.implied[1])) for c in constraints]
    kept = [c for c in kept if any(c.halves)]
    if any(any(c.implied) for c in constraints):
        for var, new in _rounds_with_fallback(reductions, fixed, kept, tc).items():
            if not _same(new, tc[var]):
                chosen[var] = new
    others = [c for c in constraints if not c.under_guard]
    if len(others) == len(constraints):
        return Inference(chosen, ())
    allowed = _rounds(variables, {v: where[v] for v in variables if v in where}, others)
    allowed |= {v: r for v, r in _rounds(reductions, fixed, others).items() if v in reductions}
    narrowings = []
    for var in variables:
        if var in allowed and not _same(chosen[var], allowed[var]):
            used = constraints if var in on_lhs else kept
            culprit = _culprit(var, variables, where, fixed if var not in on_lhs else {}, used, others)
            narrowings.append(Narrowing(var, var in on_lhs, chosen[var], allowed[var], *culprit))
    return Inference(chosen, tuple(narrowings))


def _rounds(
    variables: list[str], solved: dict[str, Range], constraints: list[Constraint]
) -> dict[str, Range]:
    """TC's rounds from the `solved` ranges; variables no constraint bounds stay missing."""
    solved = dict(solved)
    while True:
        round_result = {}
        for var in variables:
            if var in solved:
                continue
            bounds = [_solve(c, var, solved) for c in constraints if c.variables - solved.keys() == {var}]
            lows, highs = (
                [b[0] for b in bounds if b[0] is not None],
                [b[1] for b in bounds if b[1] is not None],
            )
            if lows and highs:
                round_result[var] = (sympy.Max(*lows), sympy.Min(*highs))
        if not round_result:
            return solved
        solved.update(round_result)


def _rounds_with_fallback(
    variables: list[str], fixed: dict[str, Range], constraints: list[Constraint], tc: dict[str, Range]
) -> dict[str, Range]:
    """Rounds over `constraints`; a variable they leave unbounded takes its TC range, one at a time."""
    fixed = dict(fixed)
    while True:
        solved = _rounds(variables, fixed, constraints)
        missing = [v for v in variables if v not in solved]
        if not missing:
            return {v: solved[v] for v in variables}
        fixed[missing[0]] = tc[missing[0]]


def _culprit(var, variables, where, fixed, used, others) -> tuple[str, Span | None]:
    """The first guarded access that alone narrows `var` below the other accesses' range."""
    start = {v: where[v] for v in variables if v in where} | fixed
    base = _rounds(variables, start, others).get(var)
    guarded = [c for c in used if c.under_guard]
    for access in dict.fromkeys(c.access for c in guarded):
        alone = _rounds(variables, start, others + [c for c in guarded if c.access == access])
        if base is not None and var in alone and not _same(alone[var], base):
            return access, next(c.span for c in guarded if c.access == access)
    mentioning = [c for c in guarded if var in c.variables] or guarded
    return mentioning[0].access, mentioning[0].span


def _same(a: Range, b: Range) -> bool:
    return all(x == y or sympy.simplify(x - y) == 0 for x, y in zip(a, b))


def check_nonempty(var: str, lo: sympy.Expr, hi: sympy.Expr, span: Span | None) -> None:
    """A range that is empty whatever the sizes is a mistake (TC silently gave negative extents)."""
    extent = sympy.simplify(hi - lo)
    if extent.is_number and extent.is_nonpositive:
        raise SemanticError(f"Inferred an empty range for variable {var}: {lo}:{hi}", span)


def _solve(c: Constraint, var: str, solved: dict) -> tuple[sympy.Expr | None, sympy.Expr | None]:
    """Bounds of `var` from c, for all values of the other (solved) variables in their ranges;
    None for a bound that comes from a half of c that takes no part."""
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
    # With a negative coefficient the lower half 0 <= e bounds var from above, and vice versa.
    lo_active, hi_active = c.halves if coeff > 0 else c.halves[::-1]
    # distribute(False) keeps `floor((M + 4)/5)` from becoming `floor(M/5 + 4/5)` (same value, uglier).
    with distribute(False):
        lo, hi = sympy.ceiling(lo_num / k), sympy.floor(hi_num / k)
    return lo if lo_active else None, hi if hi_active else None


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


def hull(tensor: str, var: str, lo, hi, extent, span: Span | None) -> sympy.Expr:
    """A temporary's extent after a later statement writes [lo, hi) with a `where` range: the hull
    of [0, extent) and [lo, hi), i.e. max(extent, hi). The start stays 0 (the first statement's,
    which require_zero_based checks); a range that provably starts below it is an error, one that
    may for some sizes is checked at call time like every write."""
    if lo.is_negative is True:
        raise SemanticError(
            f"index {var} ranges over {lo}:{hi}, which starts below 0; a later statement may extend "
            f"temporary {tensor} upward only (its first statement starts it at 0)",
            span,
        )
    grown = sympy.simplify(hi - extent)
    if grown.is_nonpositive is True:
        return extent
    if grown.is_nonnegative is True:
        return hi
    return sympy.Max(extent, hi)


def check_within(tensor: str, var: str, lo, hi, extent, span: Span | None) -> None:
    """A later statement's `where` range must not provably leave the tensor its first statement shaped."""
    if lo.is_negative is True or sympy.simplify(hi - extent).is_positive is True:
        raise SemanticError(
            f"index {var} ranges over {lo}:{hi}, outside {tensor}'s dimension of extent {extent}", span
        )
