"""planning: Phase + LoopAst → row-pipelining plan (the last loop of an iteration runs one iteration late).

A fused row loop such as softmax's runs, per row n, a few inner loops one after the other: the
row max, then exp and sum into a row buffer, then the division that writes the output. The last
loop is nearly all stores and the one before it nearly all arithmetic, and run one after the
other they do not overlap. Pipelining runs the last loop of row n - 1 inside the loop before it
of row n, element by element (B(n - 1, j) then A(n, j)), with a prologue (row 0's A alone) and
an epilogue (the last row's B alone): the exp of one row now overlaps the stores of the previous
one (softmax on 4096×1024 floats here: 2.0 → 1.65–1.75 ms on one thread, 1.19 → 0.97 ms on
two).

The transformation moves B(n - 1) after everything the iteration n runs before it, so it is
only made when that cannot change a result (checked on the statements, conservatively):

* sizes are specialised, and the phase's outer loop body ends with two inner loops A and B of
  equal constant trip count, A doing enough arithmetic per element to be worth it
  (MIN_A_ARITHMETIC). Threads that split the outer loop each pipeline their own rows, so every
  row's work stays with one thread;
* B holds only `=` statements; nothing else in the phase reads or writes what B writes;
* every value B reads that the phase writes is either the same for the whole row (a row max or
  sum: loaded once at the end of row n - 1, before row n overwrites it, and kept in a register),
  or an element of a contracted row buffer that A writes at the very position j where B reads
  it (B reads before A writes, and the positions before j hold the new row already).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop, StatementKind
from tensorlang import ir

from .astgen import Leaf, LoopAst, Phase, evaluate_ast_int, expr_mentions, leaves_under, loop_range, unwrap


@dataclass(frozen=True)
class PipelinePlan:
    """How to pipeline one phase. `step`: the outer loop's; `prefix`: the outer body's children
    before A; `a_loop`, `b_loop`: the last two inner loops, both `trip` iterations from `a_first`
    / `b_first`; `b_leaves`: B's statements and their leaves; `captured`: (statement, read) of
    B's row-invariant reads of values the phase writes."""

    step: int
    prefix: tuple[isl.AstNode, ...]
    a_loop: isl.AstNode
    b_loop: isl.AstNode
    a_first: int
    b_first: int
    trip: int
    b_leaves: tuple[tuple[str, Leaf], ...]
    captured: tuple[tuple[str, ir.Read], ...]


def _children(node: isl.AstNode) -> list[isl.AstNode]:
    """The nodes a block runs in order, nested blocks (and marks) flattened."""
    node = unwrap(node)
    if node.get_type() != isl.ast_node_type.block:
        return [node]
    kids = node.block_get_children()
    return [leaf for i in range(kids.n_ast_node()) for leaf in _children(kids.get_at(i))]


def _constant_loop(node: isl.AstNode, values: Mapping[str, int]) -> tuple[int, int] | None:
    """(first, trip count) of a unit-step for loop whose bounds are constants."""
    node = unwrap(node)
    if node.get_type() != isl.ast_node_type.for_ or node.for_is_degenerate():
        return None
    found = loop_range(node, values)
    if found is None or found[2] != 1:
        return None
    first, stop, _ = found
    return (first, stop - first) if stop > first else None


#: Pipelining pays when A computes enough per element to hide B's stores (softmax's exp, not
#: layer norm's subtraction and square, where it measured 5% slower): A's arithmetic, with a
#: call of a math builtin counting CALL_COST operations, must reach MIN_A_ARITHMETIC.
MIN_A_ARITHMETIC = 8
CALL_COST = 10


def _arithmetic(scop: Scop, names: list[str]) -> int:
    total = 0
    for name in names:
        stmt = scop.statement(name)
        if stmt.kind is not StatementKind.BODY:
            continue
        for e in ir.walk(stmt.statement.rhs):
            if isinstance(e, ir.Call):
                total += CALL_COST
            elif isinstance(e, ir.Binary | ir.Unary | ir.Select):
                total += 1
        total += stmt.statement.op != "="  # the accumulation
    return total


def _written(scop: Scop, name: str) -> str:
    return scop.statement(name).statement.tensor


def _accessed(scop: Scop, name: str) -> set[str]:
    return {a.tensor for a in scop.statement(name).accesses}


def _subscript_values(
    leaf_exprs: Mapping[str, isl.AstExpr], subscripts: tuple[ir.Expr, ...], env: Mapping[str, int]
) -> tuple[int, ...] | None:
    """The subscripts' values with the loop iterators set as in `env` (None if not affine)."""
    index = {}
    for var, expr in leaf_exprs.items():
        value = evaluate_ast_int(expr, env)
        if value is not None:
            index[var] = value
    out = []
    for s in subscripts:
        form = ir.affine_form(s)
        if form is None or any(n not in index for n, _ in form.coeffs):
            return None
        out.append(form.constant + sum(c * index[n] for n, c in form.coeffs))
    return tuple(out)


def plan_pipeline(
    scop: Scop,
    ast: LoopAst,
    phase: Phase,
    values: Mapping[str, int] | None,
    contracted: Mapping[str, int],
    excluded_statements: set[str],
) -> PipelinePlan | None:
    """The pipelining of `phase`, or None when it does not apply or cannot be proved safe.
    `contracted`: tensor → contracted dimension; `excluded_statements`: GEMM calls."""
    if values is None or phase.outer is None or any(s in excluded_statements for s in phase.statements):
        return None
    outer = phase.outer
    iterator = outer.for_get_iterator().get_id().get_name()
    step = evaluate_ast_int(outer.for_get_inc(), values)
    if step is None or step <= 0:
        return None
    kids = _children(outer.for_get_body())
    if len(kids) < 2:
        return None
    a_loop, b_loop = unwrap(kids[-2]), unwrap(kids[-1])
    a_range, b_range = _constant_loop(a_loop, values), _constant_loop(b_loop, values)
    if a_range is None or b_range is None or a_range[1] != b_range[1]:
        return None
    # an `if` on the way would make the per-statement reasoning below unsound
    prefix_leaves = [leaves_under(k, ast.leaves, through_ifs=False) for k in kids[:-2]]
    a_leaves = leaves_under(a_loop, ast.leaves, through_ifs=False)
    b_nodes = [unwrap(n) for n in _children(b_loop.for_get_body())]
    if (
        None in prefix_leaves
        or a_leaves is None
        or any(n.get_type() != isl.ast_node_type.user for n in b_nodes)
    ):
        return None  # B's body must be statements only
    b_leaves = {leaf.statement: leaf for leaf in (ast.leaves[n.get_annotation().get_name()] for n in b_nodes)}
    prefix_names = [leaf.statement for leaves in prefix_leaves for leaf in leaves]
    a_names = [leaf.statement for leaf in a_leaves]
    b_names = list(b_leaves)
    if len(b_names) != len(b_nodes) or _arithmetic(scop, a_names) < MIN_A_ARITHMETIC:
        return None  # a statement split over several leaves, or too little to overlap
    before = prefix_names + a_names
    b_writes = {_written(scop, n) for n in b_names}
    for name in b_names:
        stmt = scop.statement(name)
        if stmt.kind is not StatementKind.BODY or stmt.statement.op != "=":
            return None
    if any(_accessed(scop, n) & b_writes for n in before):
        return None
    phase_writes = {_written(scop, n) for n in before}
    prefix_writes = {_written(scop, n) for n in prefix_names}
    b_iter = b_loop.for_get_iterator().get_id().get_name()
    a_iter = a_loop.for_get_iterator().get_id().get_name()
    captured: list[tuple[str, ir.Read]] = []
    for name in b_names:
        exprs = dict(b_leaves[name].index_exprs)
        for read in (e for e in ir.walk(scop.statement(name).statement.rhs) if isinstance(e, ir.Read)):
            if read.tensor not in phase_writes:
                continue  # an input, or written by an earlier phase
            forms = [ir.affine_form(s) for s in read.indices]
            if any(f is None for f in forms):
                return None  # a gather of a value the phase writes
            used = {n for f in forms for n, _ in f.coeffs}
            if not any(v in exprs and expr_mentions(exprs[v], b_iter) for v in used):
                captured.append((name, read))  # the same for the whole row: load it once
                continue
            dim = contracted.get(read.tensor)
            if dim is None or read.tensor in prefix_writes:
                return None
            if not _same_position(
                scop, a_leaves, read, exprs, dim, values, (iterator, a_iter, b_iter), a_range, b_range, step
            ):
                return None
    return PipelinePlan(
        step,
        tuple(kids[:-2]),
        a_loop,
        b_loop,
        a_range[0],
        b_range[0],
        a_range[1],
        tuple(b_leaves.items()),
        tuple(captured),
    )


def _same_position(
    scop: Scop,
    a_leaves: list[Leaf],
    read: ir.Read,
    b_exprs: Mapping[str, isl.AstExpr],
    dim: int,
    values: Mapping[str, int],
    iterators: tuple[str, str, str],
    a_range: tuple[int, int],
    b_range: tuple[int, int],
    step: int,
) -> bool:
    """Every write of `read.tensor` in A at inner position j hits the slot B reads at j (the
    contracted dimension `dim` aside), for j at the start, the middle and the end (affine)."""
    outer, a_iter, b_iter = iterators
    writers = [leaf for leaf in a_leaves if _written(scop, leaf.statement) == read.tensor]
    if not writers:
        return False
    trip = a_range[1]
    for j in sorted({0, trip // 2, trip - 1}):
        want = _subscript_values(b_exprs, read.indices, {**values, outer: 0, b_iter: b_range[0] + j})
        if want is None:
            return False
        for leaf in writers:
            st = scop.statement(leaf.statement).statement
            lhs = st.lhs
            got = _subscript_values(
                dict(leaf.index_exprs), lhs, {**values, outer: step, a_iter: a_range[0] + j}
            )
            if got is None or any(g != w for d, (g, w) in enumerate(zip(got, want)) if d != dim):
                return False
    return True
