"""polyhedral: sympy size expressions → isl piecewise-affine expressions and exact evaluators.

Size expressions (tensor shapes, index ranges) come from range inference as sympy expressions
over the size symbols. Quasi-affine ones (sums, integer multiples, floor/ceil of rational
multiples, min, max, modulo by a constant) become isl `PwAff`s. Anything else (a product of two
sizes, say) becomes a *derived parameter*: an extra isl parameter whose value is computed from
the sizes at call time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import islpy as isl
import sympy

# isl AST iterators are called c0, c1, ...; a size of that name would be ambiguous.
_RESERVED_PREFIX = "c"


def isl_param_name(size_name: str) -> str:
    """The isl parameter name of a size symbol (user names kept unless they clash)."""
    if size_name.startswith(_RESERVED_PREFIX) and size_name[1:].isdigit():
        return size_name + "_size"
    return size_name


def _is_quasi_affine(expr: sympy.Expr) -> bool:
    if expr.is_Integer or expr.is_Symbol:
        return True
    if expr.is_Rational:
        return True  # only meaningful under floor/ceiling; checked by the converter
    if isinstance(expr, sympy.Add):
        return all(_is_quasi_affine(a) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        consts = [a for a in expr.args if a.is_Rational]
        rest = [a for a in expr.args if not a.is_Rational]
        return len(rest) <= 1 and len(consts) >= 1 and all(_is_quasi_affine(a) for a in rest)
    if isinstance(expr, (sympy.Min, sympy.Max, sympy.floor, sympy.ceiling)):
        return all(_is_quasi_affine(a) for a in expr.args)
    if isinstance(expr, sympy.Mod):
        return expr.args[1].is_Integer and expr.args[1] > 0 and _is_quasi_affine(expr.args[0])
    return False


def non_affine_atoms(expr: sympy.Expr) -> list[sympy.Expr]:
    """Maximal sub-expressions that isl cannot represent (to become derived parameters)."""
    if _is_quasi_affine(expr):
        return []
    if isinstance(expr, (sympy.Add, sympy.Min, sympy.Max, sympy.floor, sympy.ceiling)):
        return [atom for a in expr.args for atom in non_affine_atoms(a)]
    if isinstance(expr, sympy.Mul):
        rest = [a for a in expr.args if not a.is_Rational]
        if len(rest) == 1:
            return non_affine_atoms(rest[0])
    return [expr]


@dataclass(frozen=True)
class ParamSpace:
    """The isl parameters of a program: its sizes, then its derived parameters."""

    ctx: isl.Context
    sizes: tuple[str, ...]  # user size names, in order
    derived: tuple[tuple[str, sympy.Expr], ...]  # (isl name, defining expression)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(isl_param_name(s) for s in self.sizes) + tuple(n for n, _ in self.derived)

    def set_space(self, dims: list[str], tuple_name: str | None = None) -> isl.Space:
        space = isl.Space.create_from_names(self.ctx, set=list(dims), params=list(self.names))
        return space.set_tuple_name(isl.dim_type.set, tuple_name) if tuple_name else space

    def param_space(self) -> isl.Space:
        return isl.Space.create_from_names(self.ctx, set=[], params=list(self.names)).params()

    def context(self) -> isl.Set:
        """Parameter assumptions: every size is non-negative."""
        context = isl.Set.universe(self.param_space())
        for s in self.sizes:
            pos = self.names.index(isl_param_name(s))
            context = context.lower_bound_val(isl.dim_type.param, pos, isl.Val.zero(self.ctx))
        return context

    def values(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Every isl parameter's value for the given sizes."""
        out = {isl_param_name(s): int(sizes[s]) for s in self.sizes}
        for name, expr in self.derived:
            out[name] = evaluate(expr, sizes)
        return out

    def fixed_context(self, sizes: Mapping[str, int]) -> isl.Set:
        """The parameter set holding exactly these sizes."""
        ctx_set = isl.Set.universe(self.param_space())
        for pos, (_name, value) in enumerate(self.values(sizes).items()):
            ctx_set = ctx_set.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(self.ctx, value))
        return ctx_set


def make_param_space(ctx: isl.Context, sizes: tuple[str, ...], exprs: list[sympy.Expr]) -> ParamSpace:
    derived: dict[sympy.Expr, str] = {}
    for e in exprs:
        for atom in non_affine_atoms(sympy.sympify(e)):
            derived.setdefault(atom, f"d{len(derived)}_")
    return ParamSpace(ctx, sizes, tuple((name, atom) for atom, name in derived.items()))


def to_pwaff(
    expr: sympy.Expr, params: ParamSpace, space: isl.Space, dims: Mapping[str, int] | None = None
) -> isl.PwAff:
    """A sympy size expression as an isl PwAff on the domain `space`.

    Symbols resolve to set dimensions (by `dims`: name → position) first, then to size
    parameters; non-affine sub-expressions to their derived parameter.
    """
    ls = isl.LocalSpace.from_space(space)
    ctx = params.ctx
    derived = {atom: name for name, atom in params.derived}
    dims = dims or {}

    def const(value: int) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.val_on_domain(ls, isl.Val.int_from_si(ctx, int(value))))

    def param(name: str) -> isl.PwAff:
        pos = params.names.index(name)
        return isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.param, pos))

    def rational(e: sympy.Expr) -> isl.PwAff:
        if e in derived:
            return param(derived[e])
        if e.is_Integer:
            return const(int(e))
        if e.is_Rational:
            return const(e.p).scale_down_val(isl.Val.int_from_si(ctx, e.q))
        if e.is_Symbol:
            if e.name in dims:
                return isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.set, dims[e.name]))
            return param(isl_param_name(e.name))
        if isinstance(e, sympy.Add):
            terms = [rational(a) for a in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = out.add(t)
            return out
        if isinstance(e, sympy.Mul):
            coeff, rest = split_coefficient(e)
            if len(rest) == 1:
                base = rational(rest[0]).scale_val(isl.Val.int_from_si(ctx, int(coeff.p)))
                return base.scale_down_val(isl.Val.int_from_si(ctx, int(coeff.q))) if coeff.q != 1 else base
        if isinstance(e, sympy.Min | sympy.Max):
            parts = [rational(a) for a in e.args]
            out = parts[0]
            for p in parts[1:]:
                out = out.min(p) if isinstance(e, sympy.Min) else out.max(p)
            return out
        if isinstance(e, sympy.floor):
            return rational(e.args[0]).floor()
        if isinstance(e, sympy.ceiling):
            return rational(e.args[0]).ceil()
        if isinstance(e, sympy.Mod) and e.args[1].is_Integer:
            return rational(e.args[0]).mod_val(isl.Val.int_from_si(ctx, int(e.args[1])))
        raise ValueError(f"size expression {e} has no derived parameter")

    return rational(sympy.sympify(expr))


def evaluate(expr: sympy.Expr, sizes: Mapping[str, int]) -> int:
    """The exact integer value of a size expression (integer arithmetic, no floats)."""
    return compile_size_expr(expr)(sizes)


def compile_size_expr(expr: sympy.Expr) -> Callable[[Mapping[str, int]], int]:
    """A fast exact evaluator of a size expression, built once per expression."""
    fn = _compile(sympy.sympify(expr))

    def run(sizes: Mapping[str, int]) -> int:
        value = fn(sizes)
        if isinstance(value, Fraction) and value.denominator != 1:
            raise ValueError(f"size expression {expr} is not integral")
        return int(value)

    return run


def _compile(e: sympy.Expr) -> Callable[[Mapping[str, int]], object]:
    if e.is_Integer:
        v = int(e)
        return lambda s: v
    if e.is_Rational:
        v = Fraction(int(e.p), int(e.q))
        return lambda s: v
    if e.is_Symbol:
        name = e.name
        return lambda s: int(s[name])
    args = [_compile(a) for a in e.args]
    if isinstance(e, sympy.Add):
        return lambda s: sum(a(s) for a in args)
    if isinstance(e, sympy.Mul):
        return lambda s: math.prod(a(s) for a in args)
    if isinstance(e, sympy.Min):
        return lambda s: min(a(s) for a in args)
    if isinstance(e, sympy.Max):
        return lambda s: max(a(s) for a in args)
    if isinstance(e, sympy.floor):
        return lambda s: math.floor(args[0](s))
    if isinstance(e, sympy.ceiling):
        return lambda s: math.ceil(args[0](s))
    if isinstance(e, sympy.Mod):
        return lambda s: args[0](s) % args[1](s)
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer:
        exponent = int(e.args[1])
        return lambda s: Fraction(args[0](s)) ** exponent
    raise ValueError(f"cannot evaluate size expression {e}")


def split_coefficient(product: sympy.Mul) -> tuple[sympy.Rational, list[sympy.Expr]]:
    """A product of size expressions as its rational coefficient and the other factors."""
    coeff = sympy.Integer(1)
    rest = []
    for a in product.args:
        if a.is_Rational:
            coeff *= a
        else:
            rest.append(a)
    return coeff, rest
