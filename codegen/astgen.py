"""codegen: Schedule → isl AST whose leaves know each statement's index variables as AST expressions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from scheduler import Schedule


@dataclass(frozen=True)
class Leaf:
    """A statement instance at an AST leaf: index variable name → isl AST expression."""

    statement: str
    index_exprs: tuple[tuple[str, isl.AstExpr], ...]


@dataclass(frozen=True)
class LoopAst:
    """The isl AST of a schedule, and the statement instance at each annotated leaf."""

    root: isl.AstNode
    leaves: Mapping[str, Leaf]  # annotation id name → leaf
    sizes: Mapping[str, int] | None  # concrete sizes when specialised, else None


def build_ast(schedule: Schedule, sizes: Mapping[str, int] | None = None) -> LoopAst:
    """Scan the schedule into loops; with `sizes`, specialise every bound to those sizes."""
    scop = schedule.scop
    ctx = scop.ctx
    context = scop.context if sizes is None else scop.params.fixed_context(sizes)
    tree = schedule.tree.intersect_domain(scop.domain().intersect_params(context))
    leaves: dict[str, Leaf] = {}

    def at_each_domain(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        sched = isl.Map.from_union_map(build.get_schedule())
        name = sched.get_tuple_name(isl.dim_type.in_)
        inverse = isl.PwMultiAff.from_map(sched.reverse())
        stmt = scop.statement(name)
        exprs = tuple(
            (var, build.expr_from_pw_aff(inverse.get_pw_aff(d))) for d, var in enumerate(stmt.index_vars)
        )
        key = f"leaf{len(leaves)}"
        leaves[key] = Leaf(name, exprs)
        return node.set_annotation(isl.Id(key, context=ctx))

    build = isl.AstBuild.from_context(context)
    build, _keep_alive = build.set_at_each_domain(at_each_domain)  # the handle must outlive the build
    root = build.node_from_schedule(tree)
    del _keep_alive
    return LoopAst(root, leaves, dict(sizes) if sizes is not None else None)
