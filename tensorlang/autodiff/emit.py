"""autodiff: generated statements (ir right-hand sides, intended ranges) → readable source statements.

Three clean-ups make the output read like hand-written code: guards the statement's own ranges
imply are dropped; a `where` range is written only where TC's range inference (run here with the
gradient program's shapes) would not infer the intended range by itself, or would narrow an index
through a guarded read; and statements whose result nothing needs are removed.
"""

from __future__ import annotations

import sympy

from .. import ir, ranges, syntax
from ..dtypes import ScalarType
from ..errors import SemanticError
from .exprs import affine_sympy, from_sympy, rewrite
from .reverse import Generated

Shapes = dict[str, tuple[sympy.Expr, ...]]
_TYPE_NAMES = {ScalarType.FLOAT32: "float", ScalarType.FLOAT64: "double"}


# ---------------------------------------------------------------- ir → syntax


def type_name(dtype: ScalarType) -> str:
    return _TYPE_NAMES.get(dtype, dtype.value)


def to_syntax(e: ir.Expr, in_float_cast: bool = False) -> syntax.Expression:
    match e:
        case ir.Const(value=v, dtype=t):
            if t.is_bool:
                return syntax.BinaryOp(
                    op="==", lhs=syntax.Number(text="0"), rhs=syntax.Number(text="0" if v else "1")
                )
            if t.is_float:
                text = repr(float(v))
                if text.startswith("-"):
                    return syntax.UnaryOp(
                        op="-",
                        operand=to_syntax(ir.Const(value=-float(v), dtype=t, weak=e.weak), in_float_cast),
                    )
                number = syntax.Number(text=text)
                if in_float_cast and not e.weak:  # a literal whose precision differs from the cast's
                    return syntax.CastExpr(type_name=type_name(t), operand=number)
                return number
            number = syntax.Number(text=str(abs(int(v))))
            out: syntax.Expression = (
                number if t == ScalarType.INT32 else syntax.CastExpr(type_name=t.value, operand=number)
            )
            return syntax.UnaryOp(op="-", operand=out) if int(v) < 0 else out
        case ir.IndexRef(name=n) | ir.SizeRef(name=n):
            return syntax.Name(name=n)
        case ir.Read(tensor=n, indices=ix):
            return syntax.Apply(name=n, args=tuple(to_syntax(i) for i in ix)) if ix else syntax.Name(name=n)
        case ir.Unary(op=op, operand=o):
            return syntax.UnaryOp(op=op, operand=to_syntax(o))
        case ir.Binary(op=op, lhs=a, rhs=b):
            return syntax.BinaryOp(op=op, lhs=to_syntax(a), rhs=to_syntax(b))
        case ir.Select(cond=c, if_true=t, if_false=f):
            return syntax.Ternary(cond=to_syntax(c), if_true=to_syntax(t), if_false=to_syntax(f))
        case ir.Cast(operand=ir.Const(value=v, dtype=it), dtype=t) if (
            t.is_float and it.is_integer and abs(v) < 2**24
        ):
            return to_syntax(ir.Const(value=float(v), dtype=t, weak=True))  # `float(0)` is `0.0`
        case ir.Cast(operand=o, dtype=t):
            return syntax.CastExpr(type_name=type_name(t), operand=to_syntax(o, t.is_float and o.dtype != t))
        case ir.Call(function=f, args=args):
            return syntax.Apply(name=f, args=tuple(to_syntax(a) for a in args))
    raise AssertionError(f"unexpected ir node {e!r}")  # pragma: no cover


def bound(x: sympy.Expr, sizes: set[str]) -> syntax.Expression:
    return to_syntax(from_sympy(x, sizes))


# ---------------------------------------------------------------- guards the ranges imply


def _interval_low(e: sympy.Expr, box: dict[str, tuple[sympy.Expr, sympy.Expr]]) -> sympy.Expr | None:
    """A lower bound of the affine e over the box (sizes stay symbolic), or None."""
    low = sympy.Integer(0)
    for sym, c in sympy.expand(e).as_coefficients_dict().items():
        if sym == 1:
            low += c
        elif getattr(sym, "name", None) in box:
            lo, hi = box[sym.name]
            low += c * (lo if c > 0 else hi - 1)
        elif sym.is_Symbol:
            low += c * sym
        else:
            return None
    return low


def _implied(cond: ir.Expr, box, sizes: set[str]) -> bool:
    if not (isinstance(cond, ir.Binary) and cond.op in (">=", ">", "<", "<=") and cond.lhs.dtype.is_integer):
        return False
    fa, fb = ir.affine_form(cond.lhs), ir.affine_form(cond.rhs)
    if fa is None or fb is None:
        return False
    d = affine_sympy(fa, sizes) - affine_sympy(fb, sizes)
    target = {">=": d, ">": d - 1, "<=": -d, "<": -d - 1}[cond.op]
    low = _interval_low(target, box)  # index symbols are named like the box; sizes are >= 0
    return low is not None and sympy.simplify(low).is_nonnegative is True


def _conjuncts(c: ir.Expr) -> list[ir.Expr]:
    if isinstance(c, ir.Binary) and c.op == "&&":
        return _conjuncts(c.lhs) + _conjuncts(c.rhs)
    return [c]


def simplify_guards(g: Generated, sizes: set[str]) -> ir.Expr:
    """The right-hand side with the guard conditions that the statement's ranges decide folded away
    (a condition that always holds is dropped, a select whose condition never holds is its other
    branch)."""
    box = {v: (lo, hi) for v, lo, hi in g.ranges}

    def fold(e: ir.Expr) -> ir.Expr | None:
        if not isinstance(e, ir.Select):
            return None
        if_true, if_false = rewrite(e.if_true, fold), rewrite(e.if_false, fold)
        parts = _conjuncts(e.cond)
        if any(_implied(_negation(c), box, sizes) for c in parts):
            return if_false
        kept = [c for c in parts if not _implied(c, box, sizes)]
        if not kept:
            return if_true
        cond = kept[0]
        for c in kept[1:]:
            cond = ir.Binary(op="&&", lhs=cond, rhs=c, dtype=ScalarType.BOOL)
        return ir.Select(cond=cond, if_true=if_true, if_false=if_false, dtype=e.dtype)

    return rewrite(g.rhs, fold)


_NEGATED = {">=": "<", "<": ">=", ">": "<=", "<=": ">"}


def _negation(c: ir.Expr) -> ir.Expr:
    if isinstance(c, ir.Binary) and c.op in _NEGATED and c.lhs.dtype.is_integer:
        return ir.Binary(op=_NEGATED[c.op], lhs=c.lhs, rhs=c.rhs, dtype=c.dtype)
    return ir.Const(value=False, dtype=ScalarType.BOOL)  # never "implied"


# ---------------------------------------------------------------- where clauses


def _same(a, b) -> bool:
    return all(x == y or sympy.simplify(x - y) == 0 for x, y in zip(a, b))


def needed_wheres(g: Generated, rhs: ir.Expr, shapes: Shapes, written: bool) -> list[str]:
    """The indices that need a `where` range for range inference to give the intended ranges."""
    intended = {v: (lo, hi) for v, lo, hi in g.ranges}
    variables = set(intended)
    constraints = []
    subscripts = [i for i in g.indices if not isinstance(i, str)]  # a scatter's
    for root in (rhs, *subscripts):
        for rd, guard in ranges.guarded_accesses(root, variables):
            constraints += ranges.access_constraints(
                rd.tensor, rd.indices, shapes[rd.tensor], variables, guard
            )
    if written:
        constraints += ranges.access_constraints(g.tensor, g.write, shapes[g.tensor], variables)
    lhs = tuple((v, None) for v in g.lhs_vars)
    reduction = tuple((v, None) for v in intended if v not in g.lhs_vars)

    def works(where: list[str]) -> bool:
        try:
            result = ranges.infer(
                tensor=g.tensor,
                lhs=lhs,
                reduction=reduction,
                where={v: intended[v] for v in where},
                constraints=constraints,
                statement_span=None,
            )
        except SemanticError:
            return False
        if result.narrowings:
            return False
        return all(_same(result.ranges[v], intended[v]) for v in variables)

    if any(isinstance(n, ir.Read) and n.tensor == g.tensor for n in ir.walk(rhs)):
        return [v for v, lo, _ in g.ranges if sympy.simplify(lo) != 0]  # a scan: say where it starts
    if works([]):
        return []
    keep = list(intended)
    for v in list(intended):
        trial = [k for k in keep if k != v]
        if works(trial):
            keep = trial
    return keep


def to_statement(g: Generated, shapes: Shapes, sizes: set[str], written: bool) -> syntax.Statement:
    rhs = simplify_guards(g, sizes)
    wheres = needed_wheres(g, rhs, shapes, written)
    ranges_of = {v: (lo, hi) for v, lo, hi in g.ranges}
    clauses = tuple(
        syntax.WhereRange(
            var=syntax.Ident(name=v), lo=bound(ranges_of[v][0], sizes), hi=bound(ranges_of[v][1], sizes)
        )
        for v in wheres
    )
    return syntax.Statement(
        tensor=syntax.Ident(name=g.tensor),
        indices=tuple(syntax.Ident(name=i) if isinstance(i, str) else to_syntax(i) for i in g.indices),
        op=g.op,
        rhs=to_syntax(rhs),
        wheres=clauses,
    )


# ---------------------------------------------------------------- dead statements


def syntax_reads(st: syntax.Statement, tensors: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(e: syntax.Expression) -> None:
        match e:
            case syntax.Name(name=n):
                if n in tensors:
                    found.add(n)
            case syntax.Apply(name=n, args=args):
                if n in tensors:
                    found.add(n)
                for a in args:
                    visit(a)
            case syntax.UnaryOp(operand=o) | syntax.CastExpr(operand=o):
                visit(o)
            case syntax.BinaryOp(lhs=a, rhs=b):
                visit(a)
                visit(b)
            case syntax.Ternary(cond=c, if_true=t, if_false=f):
                visit(c)
                visit(t)
                visit(f)

    visit(st.rhs)
    for w in st.wheres:
        if isinstance(w, syntax.WhereLet):
            visit(w.value)
        elif isinstance(w, syntax.WhereExists):
            visit(w.expr)
    return found


def live_statements(statements: list[syntax.Statement], outputs: set[str], tensors: set[str]) -> list[bool]:
    """Which statements contribute to `outputs` (one backward sweep: reads refer to earlier writes)."""
    needed = set(outputs)
    keep = [False] * len(statements)
    for k in range(len(statements) - 1, -1, -1):
        st = statements[k]
        if st.tensor.name in needed:
            keep[k] = True
            needed |= syntax_reads(st, tensors)
    return keep


# ---------------------------------------------------------------- the def


def print_def(
    name: str,
    params: list[str],
    returns: list[str],
    forward: list[syntax.Statement],
    backward: list[syntax.Statement],
) -> str:
    head = f"def {name}({', '.join(params)}) -> ({', '.join(returns)}) {{"
    lines = [head]
    if forward:
        lines.append("    # the forward, recomputed")
        lines += [f"    {s}" for s in forward]
    lines.append("    # adjoints, last statement first")
    lines += [f"    {s}" for s in backward]
    lines.append("}")
    return "\n".join(lines) + "\n"
