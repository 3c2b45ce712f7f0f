"""gpu: the body of a phase's mapped row loop(s) → RowMapping, the row spread over a block or a warp.

A phase whose mapped (parallel) loops leave loops inside each thread — softmax, layer norm, a
row sum — runs one row per block (or per warp, for short rows) instead of one row per thread.
The row's body is cut into steps, separated by barriers:

* a *scalar* step: statements outside any inner loop (an `s(n) = 0` init, a per-row division),
  run by the row's first thread;
* a *loop* step: an inner loop whose body is straight-line statements, its iterations strided
  across the row's threads (thread t runs t, t + T, ...: neighbouring threads touch neighbouring
  elements, coalesced). A statement that accumulates onto an element the loop's iterator does
  not move (`mx(n) max= X(n, d)`) is a *reduction*: each thread accumulates privately, the
  partial results are combined by warp shuffles and, across warps, through shared memory, and
  the row's first thread adds the total to memory before the barrier that ends the step.

Legality (checked on the affine subscripts, in terms of the AST's iterators, of every access in
the loop): a tensor a reduction writes has no other access in the loop; a tensor another
statement writes is accessed, in the loop, only at the element that statement writes, and that
element moves with the loop's iterator. So iterations touch disjoint elements except for the
reductions, whose order the language leaves unspecified. Anything else keeps the one-thread-per-
row mapping, and the plan text says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl

from polyhedral.sizes import compile_size_expr
from tensorlang import ir

from ..planning.astgen import contains_loop, expr_mentions, leaves_under, loop_range, unwrap

WARP = 32
#: rows shorter than this keep one thread per row (a warp would leave most of its lanes idle)
ROW_MIN = 16
#: rows of at most this many iterations run one per warp (<= 4 per lane); longer rows, a block
WARP_ROW_MAX = 128
#: threads per block in warp-per-row mode (8 rows per block)
WARP_BLOCK = 256
#: elements per thread a block aims for; the block has 64 to 512 threads
PER_THREAD = 8
MIN_BLOCK, MAX_BLOCK = 64, 512
#: bytes of shared memory a block may give to row-local temporaries (48 KiB static in all)
LOCAL_BUDGET = 40 * 1024


@dataclass(frozen=True)
class RowStep:
    """`kind` "scalar": the leaves in `nodes` run by the row's first thread; "loop": the for
    loop `nodes[0]` strided over the row's threads, `reductions` the statements accumulated
    privately and combined across the row."""

    kind: str
    nodes: tuple = field(compare=False)
    statements: tuple[str, ...]
    reductions: tuple[str, ...] = ()
    iterator: str = ""
    coalesced: bool = False  # accesses of the loop walk stride-1 dimensions more than across them
    accesses: tuple = field(default=(), compare=False)  # (tensor, affine subscripts or None)


@dataclass(frozen=True)
class RowLocal:
    """A temporary that lives only inside each row: kept in shared memory, `extent` elements
    of `bytes` each per row, indexed by its subscript `dim` (its other subscripts name the row),
    at `offset` bytes in the row's region. With `first_step` >= 0, a *copy* instead: a tensor
    the row only reads, in several loop steps, loaded from global memory in step `first_step`
    (and stored into the region as it is) and read from the region in the later steps."""

    tensor: str
    dim: int
    extent: int
    bytes: int
    offset: int
    first_step: int = -1


@dataclass(frozen=True)
class RowMapping:
    """`threads` per row (32: a warp per row, else the block), `rows` in all, `per_block` rows
    per block, `length` the longest inner loop's trip count (None where it depends on the row)."""

    threads: int
    rows: int
    per_block: int
    length: int | None
    steps: tuple[RowStep, ...]
    local: tuple[RowLocal, ...] = ()

    @property
    def cells(self) -> int:
        """Private 8-byte cells per thread: an accumulator and an exchange cell per reduction."""
        return max(2, 2 * self.reductions)

    @property
    def row_bytes(self) -> int:
        """Shared memory per row for its row-local temporaries (8-byte aligned)."""
        return max((-(-(v.offset + v.extent * v.bytes) // 8) * 8 for v in self.local), default=0)

    @property
    def block(self) -> int:
        return self.threads * self.per_block

    @property
    def blocks(self) -> int:
        return max(1, -(-self.rows // self.per_block))

    @property
    def warps(self) -> int:
        """Warps per row."""
        return self.threads // WARP

    @property
    def reductions(self) -> int:
        """The most reductions one step combines (the shared-memory rows needed)."""
        return max((len(s.reductions) for s in self.steps), default=0)

    def describe(self) -> str:
        if self.per_block > 1:
            unit = f"one warp per row ({self.per_block} rows per block)"
            why = f"rows of {self.length} <= {WARP_ROW_MAX} iterations"
        else:
            unit = f"one block of {self.threads} threads per row"
            length = "an unknown number of" if self.length is None else str(self.length)
            why = f"rows of {length} iterations, ~{PER_THREAD} per thread"
        parts = []
        for step in self.steps:
            if step.kind == "scalar":
                parts.append(f"[first thread: {', '.join(step.statements)}]")
                continue
            text = f"[{step.iterator} strided over the row's threads: {', '.join(step.statements)}"
            if step.reductions:
                combine = "warp shuffles" + (" + shared memory across warps" if self.warps > 1 else "")
                text += f"; {', '.join(step.reductions)} reduced by {combine}, broadcast through memory"
            parts.append(text + "]")
        sync = "warp barrier" if self.per_block > 1 else "barrier"
        text = f"{unit}, grid {self.blocks} x {self.block} ({why}); steps {f' {sync} '.join(parts)}"
        for v in self.local:
            if v.first_step >= 0:
                text += (
                    f"; {v.tensor}'s row read once from global memory (step {v.first_step + 1}) and kept "
                    "in shared memory for the later steps"
                )
                continue
            text += (
                f"; {v.tensor} lives in shared memory ({v.extent} elements per row, never in global memory)"
            )
        return text


def row_mapping(
    plan, body: isl.AstNode, rows: int, values: Mapping, mapped: tuple[str, ...], statements: tuple[str, ...]
) -> tuple[RowMapping | None, str]:
    """The block-level mapping of a row body (the body of the innermost mapped loop), or None and
    why not. `rows`: the number of rows (the mapped loops' iterations), `mapped` their
    iterators, `statements` the phase's."""
    leaves = plan.ast.leaves
    items = _flatten(body)
    steps: list[RowStep] = []
    scalar: list = []
    lengths: list[int | None] = []

    def flush() -> None:
        if scalar:
            names = [leaf.statement for n in scalar for leaf in leaves_under(n, leaves) or ()]
            steps.append(RowStep("scalar", tuple(scalar), tuple(names)))
            scalar.clear()

    for item in items:
        t = item.get_type()
        is_loop = t == isl.ast_node_type.for_ and not item.for_is_degenerate()
        if not is_loop:
            if t not in (isl.ast_node_type.user, isl.ast_node_type.if_, isl.ast_node_type.for_):
                return None, f"an AST node of type {t} in the row"
            if contains_loop(item):
                return None, "a loop under an if in the row"
            scalar.append(item)
            continue
        flush()
        step, why = _loop_step(plan, item)
        if step is None:
            return None, why
        steps.append(step)
        found = loop_range(item, values)
        lengths.append(None if found is None else max(0, -(-(found[1] - found[0]) // found[2])))
    flush()
    loops = [s for s in steps if s.kind == "loop"]
    if not loops:
        return None, "no loop inside the row"
    if not any(s.coalesced for s in loops):
        # threads of a row would read far apart; the mapped loops may do better side by side
        return None, "no loop inside the row walks a stride-1 dimension"
    length = None if None in lengths else max(lengths)
    if length is not None and length < ROW_MIN:
        return None, f"rows of {length} < {ROW_MIN} iterations, too short to share"
    if length is not None and length <= WARP_ROW_MAX:
        found = RowMapping(WARP, rows, WARP_BLOCK // WARP, length, tuple(steps))
    else:
        threads = MAX_BLOCK
        if length is not None:
            want = -(-length // PER_THREAD)
            threads = MIN_BLOCK
            while threads < want and threads < MAX_BLOCK:
                threads *= 2
        found = RowMapping(threads, rows, 1, length, tuple(steps))
    found = dataclasses.replace(found, local=_row_locals(plan, found, set(mapped), set(statements)))
    copies = _row_copies(plan, found, set(mapped), values)
    return dataclasses.replace(found, local=found.local + copies), ""


def _row_locals(plan, rows: RowMapping, mapped: set[str], statements: set[str]) -> tuple[RowLocal, ...]:
    """The temporaries that can live in shared memory: accessed by no other phase and in no
    scalar step, and in this row only where one subscript moves with the loop and the others
    are the same function of the row's iterators — so each row reads only what it wrote."""
    temporaries = {t.name for t in plan.program.temporaries} - set(plan.folded)
    elsewhere = [p.name for p in plan.scop.statements if p.name not in statements]
    elsewhere += [name for step in rows.steps if step.kind == "scalar" for name in step.statements]
    for name in elsewhere:
        temporaries -= _tensors(plan.scop.statement(name))
    found: dict[str, tuple[int, tuple]] = {}  # tensor -> (dim, the other subscripts)
    for step in rows.steps:
        for tensor, subs in step.accesses:
            if tensor not in temporaries:
                continue
            dims = [d for d, sub in enumerate(subs or ()) if dict(sub).get(step.iterator, 0)]
            rest = tuple(sub for d, sub in enumerate(subs or ()) if d not in dims)
            known = found.setdefault(tensor, (dims[0] if len(dims) == 1 else -1, rest))
            ok = subs is not None and len(dims) == 1 and known == (dims[0], rest)
            if not ok or any(name and name not in mapped for sub in rest for name, _ in sub):
                temporaries.discard(tensor)
    out: list[RowLocal] = []
    offset = 0
    for tensor in sorted(temporaries & set(found)):
        t = plan.program.tensor(tensor)
        dim = found[tensor][0]
        extent = compile_size_expr(t.shape[dim])(plan.ast.sizes)
        size = max(1, -(-t.dtype.bits // 8))
        need = -(-(offset + extent * size) // 8) * 8
        if need * rows.per_block > LOCAL_BUDGET:
            continue
        out.append(RowLocal(tensor, dim, extent, size, offset))
        offset = need
    return tuple(out)


def _row_copies(plan, rows: RowMapping, mapped: set[str], values: Mapping) -> tuple[RowLocal, ...]:
    """The tensors the row only reads, in two or more loop steps, that can be read from global
    memory once: a softmax reads its input row for the maximum and again for the exponentials.
    Each is read, in every step, at the element the step's iterator names in one subscript (the
    others name the row), by loops over the same range (so the first covers what the later ones
    read), outside any conditional expression (so every element is loaded in the first)."""
    statements = [name for step in rows.steps for name in step.statements]
    written = {plan.scop.statement(name).statement.tensor for name in statements}
    unsure = set(written)  # tensors read in scalar steps or under a conditional: never copied
    for step in rows.steps:
        for name in step.statements:
            st = plan.scop.statement(name).statement
            if step.kind == "scalar":
                unsure |= _tensors(plan.scop.statement(name))
            for node in ir.walk(st.rhs):
                if isinstance(node, ir.Select) or (isinstance(node, ir.Binary) and node.op in ("&&", "||")):
                    unsure |= {r.tensor for r in ir.walk(node) if isinstance(r, ir.Read)}
    reads: dict[str, list[tuple[int, tuple | None, str]]] = {}
    for k, step in enumerate(rows.steps):
        if step.kind == "loop":
            for tensor, subs in step.accesses:
                if tensor not in unsure:
                    reads.setdefault(tensor, []).append((k, subs, step.iterator))
    out: list[RowLocal] = []
    offset = rows.row_bytes  # after the row-local temporaries
    for tensor, found in sorted(reads.items()):
        steps = sorted({k for k, _, _ in found})
        if len(steps) < 2:
            continue
        shapes, ranges = set(), set()  # ranges: the elements each step reads along the moving subscript
        for k, subs, iterator in found:
            # the subscript that is the step's iterator (plus a constant)
            moving = [
                d
                for d, sub in enumerate(subs or ())
                if dict(sub).get(iterator) == 1 and set(dict(sub)) <= {iterator, ""}
            ]
            rest = tuple(sub for d, sub in enumerate(subs or ()) if d not in moving)
            names = {name for sub in rest for name, _ in sub if name}
            if subs is None or len(moving) != 1 or not names <= mapped:
                shapes.add(None)
                continue
            shapes.add((moving[0], rest))
            span = loop_range(rows.steps[k].nodes[0], values)
            shift = dict(subs[moving[0]]).get("", 0)
            ranges.add(None if span is None else (span[0] + shift, span[1] + shift, span[2]))
        if len(shapes) != 1 or None in shapes or len(ranges) != 1 or None in ranges:
            continue
        ((dim, _),) = shapes
        t = plan.program.tensor(tensor)
        extent = compile_size_expr(t.shape[dim])(plan.ast.sizes)
        size = max(1, -(-t.dtype.bits // 8))
        need = -(-(offset + extent * size) // 8) * 8
        if need * rows.per_block > LOCAL_BUDGET:
            continue
        out.append(RowLocal(tensor, dim, extent, size, offset, steps[0]))
        offset = need
    return tuple(out)


def _flatten(node: isl.AstNode) -> list:
    """The nodes of a (nested) block in order, marks removed."""
    node = unwrap(node)
    if node.get_type() != isl.ast_node_type.block:
        return [node]
    children = node.block_get_children()
    return [x for i in range(children.n_ast_node()) for x in _flatten(children.get_at(i))]


def _tensors(poly) -> set[str]:
    """The tensors a statement instance touches (an init only its target)."""
    st = poly.statement
    if poly.kind == "init":
        return {st.tensor}
    reads = {r.tensor for r in ir.walk(st.rhs) if isinstance(r, ir.Read)}
    return reads | {st.tensor} | {r.tensor for sub in st.lhs for r in ir.walk(sub) if isinstance(r, ir.Read)}


def _loop_step(plan, loop: isl.AstNode) -> tuple[RowStep | None, str]:
    j = loop.for_get_iterator().get_id().get_name()
    body = unwrap(loop.for_get_body())
    if contains_loop(body):
        return None, f"the loop {j} inside the row contains loops"
    leaves = leaves_under(body, plan.ast.leaves, through_ifs=False)
    if not leaves:
        return None, f"an if inside the loop {j}"
    accesses: list[tuple[str, str, tuple | None, bool]] = []  # (statement, tensor, subscripts, write)
    reductions: list[str] = []
    writers: dict[str, list[str]] = {}
    walk = [0, 0]  # accesses moving with j along their stride-1 dimension, and across it
    for leaf in leaves:
        poly = plan.scop.statement(leaf.statement)
        st = poly.statement
        exprs = dict(leaf.index_exprs)
        lhs = _subscripts(st.lhs, exprs)
        if lhs is None:
            return None, f"{leaf.statement} writes {st.tensor} at a data-dependent element"
        moves = any(dict(sub).get(j, 0) for sub in lhs)
        if poly.kind != "init" and st.op != "=" and not moves:
            if st.op not in ir.REDUCTION_OPS:
                return None, f"{leaf.statement}'s operator {st.op} is not a reduction"
            reductions.append(leaf.statement)
        elif not moves:
            return None, f"{leaf.statement} writes the same element of {st.tensor} in every iteration of {j}"
        else:
            _walk(walk, st.lhs, exprs, j)
        writers.setdefault(st.tensor, []).append(leaf.statement)
        accesses.append((leaf.statement, st.tensor, lhs, True))
        if poly.kind != "init":
            for read in ir.walk(st.rhs):
                if isinstance(read, ir.Read):
                    accesses.append((leaf.statement, read.tensor, _subscripts(read.indices, exprs), False))
                    _walk(walk, read.indices, exprs, j)
    for tensor, names in writers.items():
        mine = [a for a in accesses if a[1] == tensor]
        if any(n in reductions for n in names):
            if len(mine) != 1:
                return None, f"{tensor}, reduced in the loop {j}, is accessed there otherwise too"
            continue
        if any(a[2] is None or a[2] != mine[0][2] for a in mine):
            return None, f"{tensor} is written in the loop {j} and accessed there at another element"
    names = tuple(leaf.statement for leaf in leaves)
    coalesced = walk[0] > walk[1]
    seen = tuple((a[1], a[2]) for a in accesses)
    return RowStep("loop", (loop,), names, tuple(reductions), j, coalesced, seen), ""


def _walk(walk: list[int], subs: tuple[ir.Expr, ...], exprs: Mapping[str, isl.AstExpr], j: str) -> None:
    """Count an access that moves with the loop `j`: walk[0] when along its stride-1 dimension
    (neighbouring threads, neighbouring elements), walk[1] when across another dimension (far
    apart); a data-dependent last subscript (a gather within the row) counts as neither."""

    def mentions(sub: ir.Expr) -> bool:
        names = {x.name for x in ir.walk(sub) if isinstance(x, ir.IndexRef)}
        return any(n in exprs and expr_mentions(exprs[n], j) for n in names)

    if not subs or not any(mentions(sub) for sub in subs):
        return
    last = _subscripts(subs[-1:], exprs)
    if last is None:
        walk[1] += 0 if mentions(subs[-1]) else 1
        return
    step = abs(dict(last[0]).get(j, 0))
    walk[0 if step == 1 else 1] += 1


def _subscripts(subs: tuple[ir.Expr, ...], exprs: Mapping[str, isl.AstExpr]) -> tuple | None:
    """Each subscript as an affine combination of AST iterators and sizes (a sorted tuple of
    (name, coefficient), "" the constant), or None if one is not affine."""
    out = []
    for sub in subs:
        form = ir.affine_form(sub)
        if form is None:
            return None
        total: dict[str, int] = {"": form.constant}
        for var, coeff in form.coeffs:
            term = _ast_affine(exprs[var]) if var in exprs else {var: 1}
            if term is None:
                return None
            for k, v in term.items():
                total[k] = total.get(k, 0) + coeff * v
        out.append(tuple(sorted((k, v) for k, v in total.items() if v)))
    return tuple(out)


def _ast_affine(e: isl.AstExpr) -> dict[str, int] | None:
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return {"": e.get_val().to_python()}
    if t == isl.ast_expr_type.id:
        return {e.get_id().get_name(): 1}
    T = isl.ast_expr_op_type
    op = e.get_op_type()
    args = [_ast_affine(e.get_op_arg(i)) for i in range(e.get_op_n_arg())]
    if any(a is None for a in args):
        return None
    if op == T.minus:
        return {k: -v for k, v in args[0].items()}
    if op in (T.add, T.sub):
        sign = 1 if op == T.add else -1
        out = dict(args[0])
        for k, v in args[1].items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if op == T.mul:
        for a, b in ((args[0], args[1]), (args[1], args[0])):
            if set(a) <= {""}:
                c = a.get("", 0)
                return {k: c * v for k, v in b.items()}
    return None
