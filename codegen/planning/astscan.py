"""planning: LoopAst + sizes → the statement instances its loops run (a check of isl's AST generator).

The loops the kernel runs come from isl's AST generator, which can be wrong: with a wavefront
over shifted point loops it once dropped iterations (fdtd-2d, tiles (2, 3, 5), scheduler/
timetile.py `_tile`), and the kernel returned a wrong result without a word. This
module runs the AST the way the lowering does (C division and remainder, every bound evaluated
as the generated code evaluates it), counting the instances each leaf runs, and
`check_instances` compares them with the Scop's domain at those sizes: every instance exactly
once. It interprets the loops in Python, so plan_kernel runs it only where that is cheap: on
every specialised plan of at most ALWAYS_CHECKED instances (tiny calls, where the generator's
corner cases showed), and up to MAX_INSTANCES under TENSORLANG_VERIFY (the tests).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping

import islpy as isl

from polyhedral import Scop

from .astgen import LoopAst

Env = dict[str, int]
Eval = Callable[[Env], int]

#: The most statement instances `check_instances` interprets (a few µs each) under
#: TENSORLANG_VERIFY (the tests); larger domains are not checked.
MAX_INSTANCES = 20_000

#: ... and on every specialised plan: tiny calls, where the AST generator's corner cases are
#: (the dropped iterations were at 1×1 and 2×3 grids), cost a millisecond or two to check.
ALWAYS_CHECKED = 2_000


class TooMany(Exception):
    """The AST runs more instances than the scan's limit."""


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _trunc_rem(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


@functools.cache
def _binary() -> dict[object, Callable[[int, int], int]]:
    """The binary operations of isl's AST expressions, with the lowering's semantics: `/` of a
    `div` or `pdiv_q` truncates (its operands are such that it is exact or non-negative), `%`
    truncates too (LLVM's srem), `fdiv_q` floors."""
    T = isl.ast_expr_op_type
    return {
        T.add: lambda x, y: x + y,
        T.sub: lambda x, y: x - y,
        T.mul: lambda x, y: x * y,
        T.div: _trunc_div,
        T.pdiv_q: _trunc_div,
        T.fdiv_q: lambda x, y: x // y,
        T.pdiv_r: _trunc_rem,
        T.zdiv_r: _trunc_rem,
        T.eq: lambda x, y: int(x == y),
        T.le: lambda x, y: int(x <= y),
        T.lt: lambda x, y: int(x < y),
        T.ge: lambda x, y: int(x >= y),
        T.gt: lambda x, y: int(x > y),
        T.and_: lambda x, y: int(bool(x) and bool(y)),
        T.and_then: lambda x, y: int(bool(x) and bool(y)),
        T.or_: lambda x, y: int(bool(x) or bool(y)),
        T.or_else: lambda x, y: int(bool(x) or bool(y)),
    }


def _compile(e: isl.AstExpr) -> Eval:
    """An isl AST expression as a function of the loop counters and parameters, with the
    semantics the lowering gives it (lowering/loops.py ast_expr)."""
    et = e.get_type()
    if et == isl.ast_expr_type.int:
        value = e.get_val().to_python()
        return lambda env: value
    if et == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        return lambda env: env[name]
    T = isl.ast_expr_op_type
    op = e.get_op_type()
    a = [_compile(e.get_op_arg(i)) for i in range(e.get_op_n_arg())]
    binary = _binary()
    if op in binary:
        f, x, y = binary[op], a[0], a[1]
        return lambda env: f(x(env), y(env))
    if op == T.minus:
        x = a[0]
        return lambda env: -x(env)
    if op in (T.min, T.max):
        pick = min if op == T.min else max
        return lambda env: pick(f(env) for f in a)
    if op in (T.select, T.cond):
        c, x, y = a
        return lambda env: x(env) if c(env) else y(env)
    raise NotImplementedError(f"isl AST expression {op}")


def scan(ast: LoopAst, params: Mapping[str, int], limit: int = MAX_INSTANCES) -> Counter:
    """(statement, instance) → how many times the AST runs it, with `params` (isl parameter
    name → value) for the parameters it still names. Raises TooMany past `limit` runs."""
    runs: Counter = Counter()
    total = [0]  # instances run, repeats included (bounds the scan's time)
    NT = isl.ast_node_type

    def compile_node(node: isl.AstNode) -> Callable[[Env], None]:
        t = node.get_type()
        if t == NT.block:
            children = node.block_get_children()
            parts = [compile_node(children.get_at(i)) for i in range(children.n_ast_node())]

            def block(env: Env) -> None:
                for part in parts:
                    part(env)

            return block
        if t == NT.mark:
            return compile_node(node.mark_get_node())
        if t == NT.user:
            leaf = ast.leaves[node.get_annotation().get_name()]
            name, exprs = leaf.statement, tuple(_compile(x) for _, x in leaf.index_exprs)

            def user(env: Env) -> None:
                runs[(name, tuple(f(env) for f in exprs))] += 1
                total[0] += 1
                if total[0] > limit:
                    raise TooMany

            return user
        if t == NT.if_:
            cond, then = _compile(node.if_get_cond()), compile_node(node.if_get_then_node())
            other = compile_node(node.if_get_else_node()) if node.if_has_else_node() else None

            def if_(env: Env) -> None:
                if cond(env):
                    then(env)
                elif other is not None:
                    other(env)

            return if_
        if t == NT.for_:
            var = node.for_get_iterator().get_id().get_name()
            init, body = _compile(node.for_get_init()), compile_node(node.for_get_body())
            if node.for_is_degenerate():
                return lambda env: body({**env, var: init(env)})
            cond, inc = _compile(node.for_get_cond()), _compile(node.for_get_inc())

            def for_(env: Env) -> None:
                inner = dict(env)
                inner[var] = init(env)
                while cond(inner):
                    body(inner)
                    inner[var] += inc(inner)

            return for_
        raise NotImplementedError(f"isl AST node {t}")

    compile_node(ast.root)(dict(params))
    return runs


def _points(s: isl.Set) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    n = s.dim(isl.dim_type.set)
    s.foreach_point(
        lambda p: out.append(tuple(p.get_coordinate_val(isl.dim_type.set, d).to_python() for d in range(n)))
    )
    return out


def box_size(domain: isl.UnionSet) -> int | None:
    """An upper bound on the number of points of `domain` (parameters fixed): the sum of its
    sets' bounding boxes, without enumerating them. None when a set is unbounded."""
    sets: list[isl.Set] = []
    domain.foreach_set(sets.append)
    total = 0
    for s in sets:
        if s.is_empty():
            continue
        volume = 1
        for d in range(s.dim(isl.dim_type.set)):
            lo, hi = s.dim_min_val(d), s.dim_max_val(d)
            if not (lo.is_int() and hi.is_int()):
                return None
            volume *= hi.to_python() - lo.to_python() + 1
        total += volume
    return total


def check_instances(
    scop: Scop, ast: LoopAst, sizes: Mapping[str, int], limit: int = MAX_INSTANCES
) -> list[str]:
    """What is wrong with the instances `ast` runs at `sizes` against the Scop's domain: each
    instance must run exactly once. Empty when nothing is, or when the domain's bounding boxes
    hold more than `limit` points (not checked)."""
    domain = scop.domain().intersect_params(scop.params.fixed_context(sizes))
    bound = box_size(domain)
    if bound is None or bound > limit:
        return []
    try:
        runs = scan(ast, scop.params.values(sizes), limit=2 * limit)
    except TooMany:
        return [f"the loops run more than {2 * limit} instances where the domain has at most {bound}"]
    want: set[tuple[str, tuple[int, ...]]] = set()
    domain.foreach_set(lambda s: want.update((s.get_tuple_name(), p) for p in _points(s)))
    problems = []
    missing = sorted(want - set(runs))
    extra = sorted(set(runs) - want)
    twice = sorted(k for k, n in runs.items() if n > 1)
    for what, found in (
        ("never {run}", missing),
        ("{run} outside the domain", extra),
        ("{run} twice or more", twice),
    ):
        if found:
            examples = ", ".join(f"{name}{list(point)}" for name, point in found[:4])
            one = len(found) == 1
            said = f"{len(found)} instance{'' if one else 's'} " + what.format(run="runs" if one else "run")
            problems.append(f"{said}: {examples}" + (", ..." if len(found) > 4 else ""))
    return problems
