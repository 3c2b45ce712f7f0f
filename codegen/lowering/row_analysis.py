"""lowering: an innermost loop's statement instance → RowPlan (which accesses move one element per iteration, and whether vectors keep its order).

An innermost loop of unit step whose one statement writes the element one past the last at each
iteration, and whose reads are either invariant or also move one element per iteration, can run
as explicit vectors (`row_vectors.py`): the reads of one tensor that differ only by a constant
offset along the contiguous dimension (jacobi's `B(t-1, i, j-1)`, `B(t-1, i, j)`,
`B(t-1, i, j+1)`) form a *group*, loaded as aligned vectors once, their neighbours taken by lane
shifts. The plan is made only when that is legal: vectors run every read of a block of
iterations before its stores, so no read may see an element that an earlier iteration of the
loop writes. Proven from the subscripts alone (reads of another tensor, or of the written one
at a constant distance in some other dimension, or at a non-negative offset in the same row);
anything else is left to the scalar loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tensorlang import ir
from tensorlang.dtypes import ScalarType

# offsets further apart than this many vectors are not worth the carried registers
MAX_GROUP_SPAN_VECTORS = 2


VECTOR_DTYPES = (ScalarType.FLOAT32, ScalarType.FLOAT64)


def vectorisable(e: ir.Expr, dtype: ScalarType) -> bool:
    """Whether `e` is made of what the vector loop evaluates lane by lane exactly as the scalar
    code does: constants, reads, negation and + - * / of `dtype` alone."""
    match e:
        case ir.Const():
            return e.dtype == dtype
        case ir.Read():
            return e.dtype == dtype
        case ir.Unary(op="-", operand=o):
            return e.dtype == dtype and vectorisable(o, dtype)
        case ir.Binary(op="+" | "-" | "*" | "/", lhs=a, rhs=b):
            return e.dtype == dtype and vectorisable(a, dtype) and vectorisable(b, dtype)
    return False


@dataclass(frozen=True)
class ReadGroup:
    """Reads of `tensor` equal but for the constant `offsets` along its contiguous dimension;
    `rep` is one of them, at offset `rep_offset` (its address locates the group)."""

    tensor: str
    rep: ir.Read
    rep_offset: int
    offsets: tuple[int, ...]

    def vector_range(self, lanes: int) -> tuple[int, int]:
        """(qlo, qhi): the vectors, in units of `lanes` from the group's offset 0, that an
        iteration's shifted values come from."""
        lo, hi = min(self.offsets), max(self.offsets)
        return lo // lanes, -(-hi // lanes)


@dataclass(frozen=True)
class RowPlan:
    """How one innermost loop runs as vectors: its moving read groups and invariant reads."""

    groups: tuple[ReadGroup, ...]
    slots: tuple[tuple[ir.Read, int, int], ...]  # read → (group index, offset)
    invariant: tuple[ir.Read, ...]
    end: isl.AstExpr  # the loop's exclusive upper bound ...
    end_inclusive: bool  # ... or inclusive


def iterator_coeff(e: isl.AstExpr, name: str) -> int | None:
    """The coefficient of the iterator `name` in the AST expression `e`, or None when `e` is
    not affine in it (it may be anything in the other variables)."""
    et = e.get_type()
    if et == isl.ast_expr_type.int:
        return 0
    if et == isl.ast_expr_type.id:
        return 1 if e.get_id().get_name() == name else 0
    T = isl.ast_expr_op_type
    op = e.get_op_type()
    args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
    cs = [iterator_coeff(a, name) for a in args]
    if any(c is None for c in cs):
        return None
    if op == T.add:
        return cs[0] + cs[1]
    if op == T.sub:
        return cs[0] - cs[1]
    if op == T.minus:
        return -cs[0]
    if op == T.mul:
        for k, other in ((0, 1), (1, 0)):
            if args[k].get_type() == isl.ast_expr_type.int:
                return args[k].get_val().to_python() * cs[other]
    return 0 if all(c == 0 for c in cs) else None


def _loop_end(node: isl.AstNode, name: str) -> tuple[isl.AstExpr, bool] | None:
    """The loop's bound from its condition `name <= e` or `name < e` (e free of `name`)."""
    cond = node.for_get_cond()
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_n_arg() != 2:
        return None
    T = isl.ast_expr_op_type
    op = cond.get_op_type()
    lhs, rhs = cond.get_op_arg(0), cond.get_op_arg(1)
    if op not in (T.le, T.lt) or lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != name:
        return None
    if iterator_coeff(rhs, name) != 0:
        return None
    return rhs, op == T.le


def _derivs(form: ir.AffineForm, dvar: dict[str, int]) -> int:
    return sum(c * dvar.get(n, 0) for n, c in form.coeffs)


def _forms(subscripts: tuple[ir.Expr, ...]) -> list[ir.AffineForm] | None:
    forms = [ir.affine_form(s) for s in subscripts]
    return None if any(f is None for f in forms) else forms


def _distinct_from_write(
    forms: list[ir.AffineForm], wforms: list[ir.AffineForm], contiguous: int, fold: tuple[int, int] | None
) -> bool | None:
    """True when the read never touches a row the loop writes (a constant non-zero distance in
    some other dimension, modulo a folded dimension's modulus); False when it reads the written
    row itself; None when the subscripts do not say."""
    same_row = True
    for d, (f, w) in enumerate(zip(forms, wforms)):
        if d == contiguous:
            continue
        if f.coeffs != w.coeffs:
            return None
        diff = f.constant - w.constant
        if fold is not None and d == fold[0]:
            diff %= fold[1]
        if diff != 0:
            return True
        same_row = same_row and diff == 0
    return False if same_row else None


def plan_row(
    node: isl.AstNode,
    name: str,
    index_exprs: tuple[tuple[str, isl.AstExpr], ...],
    statement: ir.Statement,
    dtype: ScalarType,
    lanes: int,
    storage_order: dict[str, tuple[int, ...]],
    folds: dict[str, tuple[int, int]],
    excluded: set[str],
) -> RowPlan | None:
    """The RowPlan of the innermost for loop `node` (iterator `name`) around one instance of
    `statement`, or None when its accesses do not move as vectors need or order forbids it.
    `storage_order`: tensor → storage order of its dimensions (row-major when absent);
    `folds`: tensor → (dimension, modulus); `excluded`: tensors stored otherwise."""
    inc = node.for_get_inc()
    if inc.get_type() != isl.ast_expr_type.int or inc.get_val().to_python() != 1:
        return None
    end = _loop_end(node, name)
    if (
        end is None
        or statement.op != "="
        or dtype not in VECTOR_DTYPES
        or not vectorisable(statement.rhs, dtype)
    ):
        return None
    dvar: dict[str, int] = {}
    for var, expr in index_exprs:
        c = iterator_coeff(expr, name)
        if c is None:
            return None
        dvar[var] = c

    def contiguous_dim(tensor: str, rank: int) -> int:
        return storage_order.get(tensor, tuple(range(rank)))[-1]

    def moves(tensor: str, forms: list[ir.AffineForm]) -> int | None:
        """1: moves one element per iteration along the contiguous dim; 0: invariant; None: else."""
        if not forms:
            return 0
        ds = [_derivs(f, dvar) for f in forms]
        c = contiguous_dim(tensor, len(forms))
        fold = folds.get(tensor)
        if fold is not None and ds[fold[0]] != 0:
            return None
        if all(x == 0 for x in ds):
            return 0
        if ds[c] == 1 and all(x == 0 for d, x in enumerate(ds) if d != c):
            return 1
        return None

    target = statement.tensor
    if target in excluded:
        return None
    wforms = _forms(statement.lhs)
    if wforms is None or moves(target, wforms) != 1:
        return None
    wc = contiguous_dim(target, len(wforms))
    groups: dict[tuple, list[tuple[ir.Read, int]]] = {}
    invariant: list[ir.Read] = []
    for e in ir.walk(statement.rhs):
        if not isinstance(e, ir.Read):
            continue
        if e.tensor in excluded:
            return None
        forms = _forms(e.indices)
        if forms is None:
            return None
        how = moves(e.tensor, forms)
        if how is None:
            return None
        if e.tensor == target:
            apart = _distinct_from_write(forms, wforms, wc, folds.get(target))
            if apart is None:
                return None
            if not apart and (how == 0 or forms[wc].coeffs != wforms[wc].coeffs):
                return None
            if not apart and forms[wc].constant < wforms[wc].constant:
                return None  # reads what an earlier iteration of this loop wrote
        if how == 0:
            invariant.append(e)
            continue
        c = contiguous_dim(e.tensor, len(forms))
        key = (
            e.tensor,
            tuple((f.coeffs, f.constant) if d != c else (f.coeffs, None) for d, f in enumerate(forms)),
        )
        groups.setdefault(key, []).append((e, forms[c].constant))
    plan_groups, slots = [], []
    for members in groups.values():
        offsets = tuple(sorted({o for _, o in members}))
        if offsets[-1] - offsets[0] > MAX_GROUP_SPAN_VECTORS * lanes:
            return None
        rep, rep_offset = members[0]
        plan_groups.append(ReadGroup(rep.tensor, rep, rep_offset, offsets))
        slots += [(r, len(plan_groups) - 1, o) for r, o in members]
    if not any(len(g.offsets) > 1 for g in plan_groups):
        return None  # no neighbours to shift: LLVM's own vectoriser does as well
    return RowPlan(tuple(plan_groups), tuple(slots), tuple(dict.fromkeys(invariant)), end[0], end[1])
