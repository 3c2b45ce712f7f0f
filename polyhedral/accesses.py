"""polyhedral: ir expressions → quasi-affine isl objects, access relations and their guards.

A subscript that is quasi-affine in the index variables and sizes becomes an exact isl
expression; any other subscript (a gather such as `T(I(i), j)`, or `k % c` with `c` an index)
is over-approximated as "any element" of that dimension. Reads under `?:`, `&&` and `||` carry
the affine condition that guards them, so that `(rf - D >= 0) ? X(rf - D) : 0` is provably in
bounds; a read under a condition that is not affine carries an unknown guard.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tensorlang import ir

from .sizes import ParamSpace, isl_param_name


@dataclass(frozen=True)
class Access:
    """One tensor access of a polyhedral statement.

    relation: statement domain → tensor element, exact in the `exact_dims`, unconstrained in
        the others (an over-approximation for dependence analysis).
    subscripts: per dimension the isl expression of the subscript, or None where not affine.
    guard: the affine condition under which the access executes (subset of the domain), or
        None when a non-affine condition guards it.
    read: the ir.Read node, or None for the statement's write of its LHS.
    """

    tensor: str
    is_write: bool
    relation: isl.Map
    subscripts: tuple[isl.PwAff | None, ...]
    guard: isl.Set | None
    read: ir.Read | None

    @property
    def exact(self) -> bool:
        return all(s is not None for s in self.subscripts)


class ExprConverter:
    """Converts integer ir expressions over one statement's index variables into isl."""

    def __init__(self, params: ParamSpace, space: isl.Space, index_vars: tuple[str, ...]):
        self.params = params
        self.space = space
        self.ls = isl.LocalSpace.from_space(space)
        self.dims = {v: i for i, v in enumerate(index_vars)}
        self.universe = isl.Set.universe(space)

    def _val(self, value: int) -> isl.Val:
        return isl.Val.int_from_si(self.params.ctx, int(value))

    def const(self, value: int) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.val_on_domain(self.ls, self._val(value)))

    def pwaff(self, e: ir.Expr) -> isl.PwAff | None:
        """The quasi-affine isl form of an integral expression, or None."""
        if e.dtype.is_float or e.dtype.is_bool:
            return None
        match e:
            case ir.Const(value=v):
                return self.const(int(v))
            case ir.IndexRef(name=n) if n in self.dims:
                return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, isl.dim_type.set, self.dims[n]))
            case ir.SizeRef(name=n):
                pos = self.params.names.index(isl_param_name(n))
                return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, isl.dim_type.param, pos))
            case ir.Cast(operand=o) if o.dtype.is_integer and e.dtype.bits >= 32:
                return self.pwaff(o)
            case ir.Unary(op="-", operand=o):
                a = self.pwaff(o)
                return None if a is None else a.neg()
            case ir.Binary(op=op, lhs=lhs, rhs=rhs):
                return self._binary(op, lhs, rhs)
        return None

    def _constant(self, pa: isl.PwAff | None) -> int | None:
        """The integer value of a constant expression (e.g. the 2 of `2 * i`), else None."""
        if pa is None or not pa.is_cst():
            return None
        value = pa.min_val()
        return value.to_python() if value.is_int() else None

    def _binary(self, op: str, lhs: ir.Expr, rhs: ir.Expr) -> isl.PwAff | None:
        if not lhs.dtype.is_signed:
            return None  # unsigned wrap-around is not affine
        a, b = self.pwaff(lhs), self.pwaff(rhs)
        if a is None or b is None:
            return None
        if op == "+":
            return a.add(b)
        if op == "-":
            return a.sub(b)
        if op == "min":
            return a.min(b)
        if op == "max":
            return a.max(b)
        if op == "*":
            ca, cb = self._constant(a), self._constant(b)
            if cb is not None:
                return a.scale_val(self._val(cb))
            if ca is not None:
                return b.scale_val(self._val(ca))
            return None
        c = self._constant(b)
        if c is None or c == 0:
            return None
        quotient = (a if c > 0 else a.neg()).scale_down_val(self._val(abs(c))).floor()  # floor(a / c)
        if op == "/":
            return quotient
        if op == "%":
            return a.sub(quotient.scale_val(self._val(c)))  # floor modulo: a - c * floor(a / c)
        return None

    def condition(self, e: ir.Expr) -> isl.Set | None:
        """The set of domain points where a bool expression holds, if it is affine."""
        match e:
            case ir.Const(value=v) if e.dtype.is_bool:
                return self.universe if v else isl.Set.empty(self.space)
            case ir.Unary(op="!", operand=o):
                s = self.condition(o)
                return None if s is None else self.universe.subtract(s)
            case ir.Binary(op="&&" | "||", lhs=lhs, rhs=rhs):
                x, y = self.condition(lhs), self.condition(rhs)
                if x is None or y is None:
                    return None
                return x.intersect(y) if e.op == "&&" else x.union(y)
            case ir.Binary(op="<" | "<=" | ">" | ">=" | "==" | "!=", lhs=lhs, rhs=rhs):
                a, b = self.pwaff(lhs), self.pwaff(rhs)
                if a is None or b is None:
                    return None
                make = {
                    "<": a.lt_set,
                    "<=": a.le_set,
                    ">": a.gt_set,
                    ">=": a.ge_set,
                    "==": a.eq_set,
                    "!=": a.ne_set,
                }
                return make[e.op](b)
        return None


def _and(guard: isl.Set | None, cond: isl.Set | None) -> isl.Set | None:
    return None if guard is None or cond is None else guard.intersect(cond)


def guarded_reads(
    expr: ir.Expr, conv: ExprConverter, guard: isl.Set | None
) -> list[tuple[ir.Read, isl.Set | None]]:
    """Every Read in `expr` with the affine condition under which it executes."""
    out: list[tuple[ir.Read, isl.Set | None]] = []

    def visit(e: ir.Expr, g: isl.Set | None) -> None:
        match e:
            case ir.Read(indices=indices):
                out.append((e, g))
                for i in indices:
                    visit(i, g)
            case ir.Select(cond=c, if_true=t, if_false=f):
                visit(c, g)
                cs = conv.condition(c)
                visit(t, _and(g, cs))
                visit(f, None if cs is None or g is None else g.subtract(cs))
            case ir.Binary(op="&&" | "||", lhs=lhs, rhs=rhs):
                visit(lhs, g)
                cs = conv.condition(lhs)
                if cs is not None and e.op == "||":
                    cs = conv.universe.subtract(cs)
                visit(rhs, _and(g, cs))
            case _:
                for child in ir.children(e):
                    visit(child, g)

    visit(expr, guard)
    return out


def access_relation(
    conv: ExprConverter,
    domain: isl.Set,
    tensor: str,
    subscripts: tuple[isl.PwAff | None, ...],
) -> isl.Map:
    """domain → tensor[...] with the exact subscripts; unconstrained where None."""
    ctx = conv.params.ctx
    tensor_space = isl.Space.create_from_names(
        ctx, set=[f"e{d}" for d in range(len(subscripts))], params=list(conv.params.names)
    )
    tensor_space = tensor_space.set_tuple_name(isl.dim_type.set, tensor)
    rel = isl.Map.from_domain_and_range(domain, isl.Set.universe(tensor_space))
    for d, pa in enumerate(subscripts):
        if pa is None:
            continue
        # { [x] -> [y] : y_d = pa(x) } as a constraint on the map
        rel = rel.intersect(_pin_output(isl.Map.from_pw_aff(pa), d, len(subscripts), tensor))
    return rel


def _pin_output(dim_map: isl.Map, d: int, rank: int, tensor: str) -> isl.Map:
    """{ x -> tensor[y] : y_d = f(x) } from dim_map = { x -> [f(x)] }."""
    # The other output dimensions are inserted unconstrained around position d.
    m = dim_map.insert_dims(isl.dim_type.out, 0, d).add_dims(isl.dim_type.out, rank - d - 1)
    return m.set_tuple_name(isl.dim_type.out, tensor)
