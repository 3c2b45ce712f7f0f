"""planning: a phase's isl AST → whether a loop team runs it (a sequential loop with parallel loops inside, barriers between).

A phase whose outermost loop carries a dependence (a stencil's time loop, a wavefront over time
tiles) cannot have that loop split. It can still run on several threads as a *team*: every
thread runs the sequential loops (their control only: they compute the same iterators), each
takes a static share of every parallel loop met at that level, one thread runs the remaining
work (statements, serial loop nests), and all meet at a barrier after each such unit, so that
every dependence between two units is honoured. The shapes a team runs, at "team level" (the
phase's node, and inside loops and branches that hold a parallel loop):

- a non-degenerate for loop that carries no dependence (given the loops around it) and whose
  condition bounds its iterator by an expression (`c <= e` or `c < e`): split by thread index;
- a sequential for loop, a degenerate one, a block or a mark that holds such a loop: every
  thread runs it, and team level continues inside;
- an `if`: every thread evaluates its condition (the same on all), team level continues inside
  the branch taken (so that work under a condition false for this iteration costs no barrier);
- anything else: one thread runs it.

Conditions and bounds at team level depend only on parameters and on the iterators of loops
every thread runs, so all threads take the same branches and run the same iterations.
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from .astgen import LoopAst, LoopKind, Phase, evaluate_ast_int, expr_mentions, unwrap
from .runs import TEAM_STEP_WORK

# phases of at least this much work whose teams could not pay (team_pays) are planned on one
# thread; smaller ones keep the team's code and the runtime decides per call (tests lower its
# thresholds to run teams on small sizes)
PLANNED_SERIAL_WORK = 1 << 20


def split_bound(node: isl.AstNode) -> isl.AstExpr | None:
    """For a for node whose condition is `iterator <= e` or `iterator < e`: that condition's
    bound `e` (which does not mention the iterator), else None."""
    cond = node.for_get_cond()
    T = isl.ast_expr_op_type
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() not in (T.le, T.lt):
        return None
    lhs = cond.get_op_arg(0)
    name = node.for_get_iterator().get_id().get_name()
    if lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != name:
        return None
    return None if expr_mentions(cond.get_op_arg(1), name) else cond.get_op_arg(1)


def is_team_split(node: isl.AstNode, ast: LoopAst) -> bool:
    """Whether a team splits this for node among its threads (a parallel loop it can bound)."""
    if node.get_type() != isl.ast_node_type.for_ or node.for_is_degenerate():
        return False
    annotation = node.get_annotation()
    info = ast.loops.get(annotation.get_name()) if annotation is not None else None
    return info is not None and info.kind is LoopKind.PARALLEL and split_bound(node) is not None


def holds_team_split(node: isl.AstNode, ast: LoopAst) -> bool:
    """Whether a loop a team splits lies at team level inside `node` (or is `node`)."""
    node = unwrap(node)
    t = node.get_type()
    NT = isl.ast_node_type
    if t == NT.block:
        children = node.block_get_children()
        return any(holds_team_split(children.get_at(i), ast) for i in range(children.n_ast_node()))
    if t == NT.if_:
        return holds_team_split(node.if_get_then_node(), ast) or (
            node.if_has_else_node() and holds_team_split(node.if_get_else_node(), ast)
        )
    if t == NT.for_:
        return is_team_split(node, ast) or holds_team_split(node.for_get_body(), ast)
    return False


def team_phase(phase: Phase, ast: LoopAst) -> bool:
    """Whether a team of threads can run the phase: its outermost loop is sequential (else the
    runtime splits that loop) and holds, at team level, a parallel loop a team splits."""
    if phase.loop is not None or phase.outer is None:
        return False
    return holds_team_split(phase.outer.for_get_body(), ast)


def team_barriers(phase: Phase, ast: LoopAst, values: Mapping[str, int]) -> int | None:
    """About how many barriers a team meets running the phase for these parameter values (the
    runtime compares the work per barrier with the cost of one); None when a bound at team level
    is not known. A loop whose bounds depend on outer iterators is counted as in its outer
    loops' first iteration (a time loop inside a tile loop: the first tile's steps)."""
    return _barriers(phase.node, ast, dict(values))


def _barriers(node: isl.AstNode, ast: LoopAst, env: dict[str, int]) -> int | None:
    node = unwrap(node)
    NT = isl.ast_node_type
    t = node.get_type()
    if t != NT.if_ and (not holds_team_split(node, ast) or is_team_split(node, ast)):
        return 1
    if t == NT.block:
        children = node.block_get_children()
        total, solo = 0, False
        for i in range(children.n_ast_node()):
            child = children.get_at(i)
            if unwrap(child).get_type() == NT.if_ or holds_team_split(child, ast):
                count = _barriers(child, ast, env)
                if count is None:
                    return None
                total, solo = total + count + solo, False
            else:
                solo = True  # consecutive children without a split: one unit
        return total + solo
    if t == NT.if_:  # the branch with more (an estimate on the side of fewer teams)
        counts = [_barriers(node.if_get_then_node(), ast, env)]
        if node.if_has_else_node():
            counts.append(_barriers(node.if_get_else_node(), ast, env))
        return None if None in counts else max(counts)
    # a for loop every thread runs
    name = node.for_get_iterator().get_id().get_name()
    first = evaluate_ast_int(node.for_get_init(), env)
    if first is None:
        return None
    if node.for_is_degenerate():
        return _barriers(node.for_get_body(), ast, {**env, name: first})
    step = evaluate_ast_int(node.for_get_inc(), env)
    bound = split_bound(node)
    last = evaluate_ast_int(bound, env) if bound is not None else None
    if step is None or step <= 0 or last is None:
        return None
    if node.for_get_cond().get_op_type() == isl.ast_expr_op_type.le:
        last += 1
    trips = max(0, -(-(last - first) // step))
    inner = _barriers(node.for_get_body(), ast, {**env, name: first})
    return None if inner is None else trips * inner


def team_pays(phase: Phase, ast: LoopAst, values: Mapping[str, int], work: int) -> bool:
    """Whether a loop team may run the phase (`work` statement instances) at these sizes. False
    where it never would: at least PLANNED_SERIAL_WORK of work with less than TEAM_STEP_WORK per
    barrier, which the runtime runs on one thread, where the team's code (its claims and waits
    around every parallel loop) is slower than plain loops: jacobi-2d 1000² T=10 on 2 threads ran
    3.62 ms as a team's code, 2.24 ms as loops, and 2.31 ms as the one-thread kernel."""
    if work < PLANNED_SERIAL_WORK:
        return True
    barriers = team_barriers(phase, ast, values)
    return not barriers or work // barriers >= TEAM_STEP_WORK
