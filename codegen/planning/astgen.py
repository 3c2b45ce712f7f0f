"""planning: Schedule → isl AST, cut into phases whose outermost loop may run on several threads.

A *phase* is one top-level node of the AST (one loop nest of the sequence). Phases run one after
the other; a phase whose outermost loop carries no dependence (checked exactly against the
dependences, as PPCG does) can have that loop's iterations split among threads. For each
phase's outermost loop the box of elements that one iteration reads from each tensor is kept
(as AST expressions of the iterator), so that code generation can prefetch the next iteration's
data while this one computes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

import islpy as isl

from polyhedral import Scop
from polyhedral.privatise import privatised_dependences
from polyhedral.split import separate_pieces
from scheduler import Schedule

from .wavefront import WaveLags, flat_schedule, wave_lags


class LoopKind(enum.StrEnum):
    """Whether a loop's iterations may run on several threads (it carries no dependence)."""

    PARALLEL = "parallel"
    SERIAL = "serial"


@dataclass(frozen=True)
class LoopInfo:
    """What the AST builder found for one for loop; the loop's annotation names it in `LoopAst.loops`
    (annotations are opaque keys: nothing parses them)."""

    kind: LoopKind
    footprints: tuple[Footprint, ...]  # for a phase's outer loop: what one iteration reads
    # for a parallel loop inside a loop that carries dependences: (most outer, least inner, most
    # inner) difference of the two loops' values over those dependences (lowering/doacross.py)
    lags: tuple[int, int, int] | None = None
    # for a phase's sequential outer loop: the window of its parallel pieces' tiles (wavefront.py)
    wave: WaveLags | None = None
    # for a phase's sequential outer loop that carries only reductions into these tensors: threads
    # may split it, each accumulating into its own copies (polyhedral/privatise.py)
    private: tuple[tuple[str, str], ...] = ()  # (tensor, its reduction operator)


@dataclass(frozen=True)
class Leaf:
    """A statement instance at an AST leaf: index variable name → isl AST expression."""

    statement: str
    index_exprs: tuple[tuple[str, isl.AstExpr], ...]


@dataclass(frozen=True)
class Footprint:
    """The bounding box of the elements of `tensor` that one iteration of a loop reads: per
    dimension, the least and greatest index as AST expressions of the loop iterator."""

    tensor: str
    lo: tuple[isl.AstExpr, ...]
    hi: tuple[isl.AstExpr, ...]


@dataclass(frozen=True)
class Phase:
    """One top-level loop nest. `loop` is its outermost for node when that loop is parallel;
    `outer` that for node whether parallel or not, and `footprints` what one of its iterations
    reads."""

    node: isl.AstNode
    loop: isl.AstNode | None
    statements: tuple[str, ...]
    outer: isl.AstNode | None = None
    footprints: tuple[Footprint, ...] = ()


@dataclass(frozen=True)
class LoopAst:
    """The isl AST of a schedule, its phases, and the statement instance at each leaf."""

    root: isl.AstNode
    leaves: Mapping[str, Leaf]  # annotation id name → leaf
    loops: Mapping[str, LoopInfo]  # annotation id name of a for node → what was found for it
    phases: tuple[Phase, ...]
    sizes: Mapping[str, int] | None  # concrete sizes when specialised, else None


def _loop_dependences(build: isl.AstBuild, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences as pairs of values of the loops built so far, the new one last."""
    sched = build.get_schedule()
    return deps.apply_range(sched).apply_domain(sched)


def _lags(rel: isl.UnionMap) -> tuple[int, int, int] | None:
    """For the loop being built (last dimension of `rel`, _loop_dependences) and the loop around
    it: over the dependences between different iterations of that outer loop in one iteration
    of the loops further out, the greatest outer difference and the least and greatest inner
    one; None when one is unbounded or there is no outer loop. What the outer loop's iterations
    carry, as a window: an iteration needs at most `most outer` iterations back, and there only
    inner values within the inner range of its own (a doacross loop, lowering/doacross.py)."""
    found: list[tuple[int, int, int]] = []
    for m in _maps(rel):
        d = m.dim(isl.dim_type.out) - 1
        if d < 1:
            return None
        for i in range(d - 1):
            m = m.equate(isl.dim_type.in_, i, isl.dim_type.out, i)
        deltas = m.deltas().lower_bound_val(isl.dim_type.set, d - 1, isl.Val.one(m.get_ctx()))
        if deltas.is_empty():
            continue
        vals = (deltas.dim_max_val(d - 1), deltas.dim_min_val(d), deltas.dim_max_val(d))
        if not all(v.is_int() for v in vals):
            return None
        found.append(tuple(v.to_python() for v in vals))
    if not found:
        return None
    return max(f[0] for f in found), min(f[1] for f in found), max(f[2] for f in found)


def _carries_no_dependence(rel: isl.UnionMap) -> bool:
    """True when the loop being built (the last dimension of `rel`, _loop_dependences) has equal
    iterations for every dependence pair."""
    if rel.is_empty():
        return True
    for m in _maps(rel):
        d = m.dim(isl.dim_type.out) - 1
        if d < 0:
            continue
        for i in range(d):
            m = m.equate(isl.dim_type.in_, i, isl.dim_type.out, i)
        same = isl.Map.universe(m.get_space()).equate(isl.dim_type.in_, d, isl.dim_type.out, d)
        if not m.is_subset(same):
            return False
    return True


def _privatised(scop: Scop, build: isl.AstBuild, deps: isl.UnionMap) -> tuple[str, ...]:
    """For an outermost loop that carries dependences: the tensors whose privatisation leaves
    it carrying none (all of its statements' privatisable reductions), else ()."""
    names: set[str] = set()
    build.get_schedule().domain().foreach_set(lambda s: names.add(s.get_tuple_name()))
    private, rest = privatised_dependences(scop, sorted(names), deps)
    if not private or not _carries_no_dependence(_loop_dependences(build, rest)):
        return ()
    return tuple(sorted(private.items()))


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def unwrap(node: isl.AstNode) -> isl.AstNode:
    """`node` without the mark nodes around it."""
    while node.get_type() == isl.ast_node_type.mark:
        node = node.mark_get_node()
    return node


def contains_loop(node: isl.AstNode) -> bool:
    """Whether a for loop is nested anywhere in `node`."""
    t = node.get_type()
    NT = isl.ast_node_type
    if t == NT.for_:
        return True
    if t == NT.block:
        children = node.block_get_children()
        return any(contains_loop(children.get_at(i)) for i in range(children.n_ast_node()))
    if t == NT.mark:
        return contains_loop(node.mark_get_node())
    if t == NT.if_:
        return contains_loop(node.if_get_then_node()) or (
            node.if_has_else_node() and contains_loop(node.if_get_else_node())
        )
    return False


def leaves_under(
    node: isl.AstNode, leaves: Mapping[str, Leaf], *, through_ifs: bool = True
) -> list[Leaf] | None:
    """The statement instances under `node`, in AST order; None if `through_ifs` is False and
    there is an `if` on the way."""
    found: list[Leaf] = []

    def visit(n: isl.AstNode) -> bool:
        t = n.get_type()
        NT = isl.ast_node_type
        if t == NT.user:
            found.append(leaves[n.get_annotation().get_name()])
        elif t == NT.block:
            children = n.block_get_children()
            return all(visit(children.get_at(i)) for i in range(children.n_ast_node()))
        elif t == NT.mark:
            return visit(n.mark_get_node())
        elif t == NT.if_:
            if not through_ifs:
                return False
            return visit(n.if_get_then_node()) and (not n.if_has_else_node() or visit(n.if_get_else_node()))
        elif t == NT.for_:
            return visit(n.for_get_body())
        return True

    return found if visit(node) else None


def _statements_under(node: isl.AstNode, leaves: Mapping[str, Leaf]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(leaf.statement for leaf in leaves_under(node, leaves)))


def _iteration_footprints(build: isl.AstBuild, reads: isl.UnionMap) -> tuple[Footprint, ...]:
    """For the outermost loop being built: the box each tensor's reads cover in one iteration,
    for tensors where it moves with the iterator (a row of a matrix, not a bias vector)."""
    sched = build.get_schedule()
    maps = _maps(sched)
    if not maps or any(m.range_is_wrapping() or m.dim(isl.dim_type.out) != 1 for m in maps):
        return ()  # not an outermost loop
    found = []
    for m in _maps(sched.reverse().apply_range(reads)):
        if m.is_empty():
            continue
        n = m.dim(isl.dim_type.out)
        lo = [m.dim_min(d) for d in range(n)]
        hi = [m.dim_max(d) for d in range(n)]
        if not any(aff.involves_dims(isl.dim_type.in_, 0, 1) for pa in lo + hi for _, aff in pa.get_pieces()):
            continue  # the same elements every iteration: nothing new to fetch
        found.append(
            Footprint(
                m.get_tuple_name(isl.dim_type.out),
                tuple(build.expr_from_pw_aff(a) for a in lo),
                tuple(build.expr_from_pw_aff(a) for a in hi),
            )
        )
    return tuple(found)


def _affine_reads(scop: Scop) -> isl.UnionMap:
    """Statement instance → element read, for the reads whose subscripts are all affine."""
    reads = isl.UnionMap.empty(scop.domain().get_space())
    for s in scop.statements:
        for a in s.reads:
            if a.exact:
                rel = a.relation if a.guard is None else a.relation.intersect_domain(a.guard)
                reads = reads.union(isl.UnionMap.from_map(rel))
    return reads


def _nests(block: isl.AstNode) -> list[isl.AstNode]:
    """The nodes of a sequence in order, with the sequences inside it (through marks) flattened."""
    children = block.block_get_children()
    out = []
    for child in (children.get_at(i) for i in range(children.n_ast_node())):
        inner = unwrap(child)
        out += _nests(inner) if inner.get_type() == isl.ast_node_type.block else [child]
    return out


def _phases(
    root: isl.AstNode, leaves: Mapping[str, Leaf], loops: Mapping[str, LoopInfo]
) -> tuple[Phase, ...]:
    # one phase per fusion region, and a region that is a sequence of loop nests (an init, then a
    # GEMM call) gives one phase per nest, so that each gets its own split (the GEMM's threads,
    # the init's rows); sequences nested in it too (a tensor stacked from three, `O(f, i, j) =
    # f == 0 ? a(i, j) : ...`, or fdtd-2d's copies of its three fields in: isl puts the first two
    # in a sequence of their own, which ran as one serial phase)
    root = unwrap(root)
    tops = _nests(root) if root.get_type() == isl.ast_node_type.block else [root]
    phases = []
    for top in tops:
        inner = unwrap(top)
        is_for = inner.get_type() == isl.ast_node_type.for_ and not inner.for_is_degenerate()
        info = loops[inner.get_annotation().get_name()] if is_for else None
        is_parallel_for = info is not None and info.kind is LoopKind.PARALLEL
        phases.append(
            Phase(
                top,
                inner if is_parallel_for else None,
                _statements_under(top, leaves),
                inner if is_for else None,
                info.footprints if info is not None else (),
            )
        )
    return tuple(phases)


def build_ast(
    schedule: Schedule,
    sizes: Mapping[str, int] | None = None,
    *,
    footprints: bool = False,
    lags: bool = False,
) -> LoopAst:
    """Scan the schedule into loops; with `sizes`, specialise every bound to those sizes; with
    `footprints`, record what one iteration of each phase's outer loop reads (for prefetching);
    with `lags`, how far back each parallel loop's iterations depend on the loop around it."""
    scop = schedule.scop
    ctx = scop.ctx
    context = scop.context if sizes is None else scop.params.fixed_context(sizes)
    tree = schedule.tree.intersect_domain(scop.domain().intersect_params(context))
    tree = separate_pieces(tree, scop.statements)  # guard-free loops over a statement's pieces
    deps = scop.dependences.all.intersect_params(context)
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

    reads = _affine_reads(scop) if footprints else None
    loops: dict[str, LoopInfo] = {}
    enclosing: list[LoopKind] = []  # the kinds of the loops being built around this one
    keys: list[str] = []  # and their annotation names
    # a sequential outer loop's parallel pieces and the parallel loops inside those, with their
    # schedules (planning/wavefront.py)
    pieces: dict[str, list[tuple[str, isl.UnionMap | None]]] = {}
    inner: dict[str, list[tuple[str, isl.UnionMap | None]]] = {}
    names: dict[str, str] = {}  # annotation name → iterator name

    def before_each_for(build: isl.AstBuild) -> isl.Id:
        rel = _loop_dependences(build, deps)
        kind = LoopKind.PARALLEL if _carries_no_dependence(rel) else LoopKind.SERIAL
        key = f"loop{len(loops)}"
        footprints = _iteration_footprints(build, reads) if reads is not None else ()
        # lags only where a doacross loop can use them (lowering/doacross.py): a parallel loop
        # right inside a phase's sequential outer loop
        doacross = lags and kind is LoopKind.PARALLEL and enclosing == [LoopKind.SERIAL]
        loops[key] = LoopInfo(kind, footprints, _lags(rel) if doacross else None)
        if lags and kind is LoopKind.SERIAL and not enclosing:
            loops[key] = replace(loops[key], private=_privatised(scop, build, deps))
        if doacross:
            pieces.setdefault(keys[0], []).append((key, flat_schedule(build.get_schedule(), 2)))
        elif lags and kind is LoopKind.PARALLEL and enclosing == [LoopKind.SERIAL, LoopKind.PARALLEL]:
            inner.setdefault(keys[1], []).append((key, flat_schedule(build.get_schedule(), 3)))
        enclosing.append(kind)
        keys.append(key)
        return isl.Id(key, context=ctx)

    def after_each_for(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        enclosing.pop()
        key = keys.pop()
        names[key] = node.for_get_iterator().get_id().get_name()
        if key in pieces:  # the pieces at the same depth (iterators of the same names) as most
            depth = {p: (names[p], *(names[q] for q, _ in inner.get(p, []))) for p, _ in pieces[key]}
            common = max(depth.values(), key=list(depth.values()).count)
            alike = [(p, s) for p, s in pieces[key] if depth[p] == common]
            loops[key] = replace(loops[key], wave=wave_lags(deps, alike, inner))
        return node

    build = isl.AstBuild.from_context(context)
    # the callback handles must outlive the build (dropping them early crashes islpy)
    build, _keep_leaf = build.set_at_each_domain(at_each_domain)
    build, _keep_for = build.set_before_each_for(before_each_for)
    build, _keep_after = build.set_after_each_for(after_each_for)
    root = build.node_from_schedule(tree)
    del _keep_leaf, _keep_for, _keep_after
    sizes = dict(sizes) if sizes is not None else None
    return LoopAst(root, leaves, loops, _phases(root, leaves, loops), sizes)


def expr_mentions(expr: isl.AstExpr, name: str) -> bool:
    """Whether the AST expression uses the identifier `name` (an iterator, say)."""
    t = expr.get_type()
    if t == isl.ast_expr_type.id:
        return expr.get_id().get_name() == name
    if t == isl.ast_expr_type.op:
        return any(expr_mentions(expr.get_op_arg(i), name) for i in range(expr.get_op_n_arg()))
    return False


def evaluate_ast_int(expr: isl.AstExpr, values: Mapping[str, int]) -> int | None:
    """The value of an isl AST integer expression over parameters, or None if it has others."""
    t = expr.get_type()
    if t == isl.ast_expr_type.int:
        return expr.get_val().to_python()
    if t == isl.ast_expr_type.id:
        return values.get(expr.get_id().get_name())
    T = isl.ast_expr_op_type
    op = expr.get_op_type()
    args = [evaluate_ast_int(expr.get_op_arg(i), values) for i in range(expr.get_op_n_arg())]
    if any(a is None for a in args):
        return None
    if op == T.add:
        return args[0] + args[1]
    if op == T.sub:
        return args[0] - args[1]
    if op == T.mul:
        return args[0] * args[1]
    if op == T.minus:
        return -args[0]
    if op == T.min:
        return min(args)
    if op == T.max:
        return max(args)
    if op in (T.div, T.fdiv_q, T.pdiv_q):
        return args[0] // args[1]
    if op in (T.pdiv_r, T.zdiv_r):
        return args[0] % args[1]
    if op in (T.select, T.cond):
        return args[1] if args[0] else args[2]
    compare = {
        T.eq: lambda a, b: a == b,
        T.le: lambda a, b: a <= b,
        T.lt: lambda a, b: a < b,
        T.ge: lambda a, b: a >= b,
        T.gt: lambda a, b: a > b,
        T.and_: lambda a, b: bool(a and b),
        T.and_then: lambda a, b: bool(a and b),
        T.or_: lambda a, b: bool(a or b),
        T.or_else: lambda a, b: bool(a or b),
    }.get(op)
    return int(compare(*args)) if compare is not None else None


def loop_range(loop: isl.AstNode, values: Mapping[str, int]) -> tuple[int, int, int] | None:
    """(first, stop, step) of a for loop whose bounds depend on parameters only."""
    init = evaluate_ast_int(loop.for_get_init(), values)
    step = evaluate_ast_int(loop.for_get_inc(), values)
    cond = loop.for_get_cond()
    if init is None or step is None or step <= 0 or cond.get_type() != isl.ast_expr_type.op:
        return None
    op = cond.get_op_type()
    T = isl.ast_expr_op_type
    if op not in (T.le, T.lt) or cond.get_op_arg(0).get_type() != isl.ast_expr_type.id:
        return None
    bound = evaluate_ast_int(cond.get_op_arg(1), values)
    if bound is None:
        return None
    return init, bound + 1 if op == T.le else bound, step
