"""polyhedral: ir.Program → Scop (isl domains, access relations, bounds proofs, dependences).

Each ir.Statement becomes one polyhedral statement `S<k>` over the box of its index ranges, or
several pieces `S<k>_1`, `S<k>_2`, .. when its value selects on an affine condition (split.py);
a `op=!` statement on a fresh tensor also gets an init statement `I<k>` (identity over the LHS
box) scheduled just before it. Statement names are ours, never the user's, so isl objects are
built from the IR without formatting user text.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import islpy as isl
import sympy

from tensorlang import ir
from tensorlang.errors import InternalError, SemanticError

from .accesses import Access, ExprConverter, access_relation, guarded_reads
from .sizes import ParamSpace, make_param_space, to_pwaff
from .split import Piece, piece_name, split_pieces


class StatementKind(enum.StrEnum):
    """What a polyhedral statement does: set a tensor to its reduction's identity, or compute."""

    INIT = "init"
    BODY = "body"


@dataclass(frozen=True)
class PolyStatement:
    """One polyhedral statement: an ir.Statement's init or its body, or a piece of its body.

    A piece (split.py) has the user's position and span, and as `statement` the user's statement
    with the branch of its select that runs over the piece's domain as the right-hand side;
    `program.statements[position]` is always the statement as the user wrote it.
    """

    name: str  # "S3" (body of statement 3), "S3_1" (a piece of it) or "I3" (its initialisation)
    kind: StatementKind
    position: int  # index of the ir.Statement in the program
    statement: ir.Statement
    domain: isl.Set  # dims named after the statement's index variables
    accesses: tuple[Access, ...]  # the write first, then the reads in evaluation order
    projected: tuple[str, ...] | None = None  # the loops kept when a contraction plan runs the rest

    @property
    def index_vars(self) -> tuple[str, ...]:
        if self.projected is not None:
            return self.projected
        return self.statement.indices if self.kind is StatementKind.INIT else self.statement.all_indices

    @property
    def write(self) -> Access:
        return self.accesses[0]

    @property
    def reads(self) -> tuple[Access, ...]:
        return self.accesses[1:]


@dataclass(frozen=True)
class BoundsCheck:
    """An access that could not be proved in bounds for all sizes.

    dynamic_dims: subscripts checked in the generated code at each execution (gathers, or
        accesses under a non-affine condition).
    violation: parameter values for which an affine access leaves the tensor; checked once
        per set of sizes at call time. None when there is no such static part.
    """

    statement: str
    tensor: str
    read: ir.Read | None
    dynamic_dims: tuple[int, ...]
    violation: isl.Set | None


@dataclass(frozen=True)
class Dependences:
    """Value-based flow (RAW) and memory-based anti (WAR) and output (WAW) dependences."""

    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap

    @property
    def all(self) -> isl.UnionMap:
        return self.raw.union(self.war).union(self.waw).coalesce()

    def __str__(self) -> str:
        return f"RAW: {self.raw}\nWAR: {self.war}\nWAW: {self.waw}"


@dataclass(frozen=True)
class Scop:
    """The polyhedral model of one program."""

    program: ir.Program
    params: ParamSpace
    statements: tuple[PolyStatement, ...]
    checks: tuple[BoundsCheck, ...]
    dependences: Dependences

    @property
    def ctx(self) -> isl.Context:
        return self.params.ctx

    @property
    def context(self) -> isl.Set:
        return self.params.context()

    def statement(self, name: str) -> PolyStatement:
        for s in self.statements:
            if s.name == name:
                return s
        raise KeyError(name)

    def domain(self) -> isl.UnionSet:
        out = isl.UnionSet.empty(self.params.param_space())
        for s in self.statements:
            out = out.union(isl.UnionSet.from_set(s.domain))
        return out.align_params(self.context.get_space())

    def __str__(self) -> str:
        lines = [f"params: [{', '.join(self.params.names)}]"]
        for name, expr in self.params.derived:
            lines.append(f"derived {name} = {expr}")
        for s in self.statements:
            lines.append(f"{s.name}: {s.domain}")
            for a in s.accesses:
                tag = "write" if a.is_write else "read "
                lines.append(f"  {tag} {a.relation}")
        for c in self.checks:
            what = f"{c.tensor}({', '.join(map(str, c.read.indices))})" if c.read else f"{c.tensor} (write)"
            parts = []
            if c.dynamic_dims:
                parts.append(f"run-time check of dims {list(c.dynamic_dims)}")
            if c.violation is not None:
                parts.append(f"call-time check: out of bounds when {c.violation}")
            lines.append(f"check {c.statement} {what}: {'; '.join(parts)}")
        return "\n".join(lines)

    def verify(self) -> None:
        """Check the model's invariants; raise InternalError (a compiler bug) when one breaks."""
        names = [s.name for s in self.statements]
        if len(set(names)) != len(names):
            raise InternalError(f"{self.program.name}: duplicate polyhedral statements {names}")
        for s in self.statements:
            if s.domain.get_tuple_name() != s.name:
                raise InternalError(
                    f"{self.program.name}: {s.name}'s domain is named {s.domain.get_tuple_name()}"
                )
            if not s.write.is_write or any(a.is_write for a in s.reads):
                raise InternalError(f"{self.program.name}: {s.name} must have one write, first")
            for a in s.accesses:
                if not a.relation.domain().is_subset(s.domain):
                    raise InternalError(
                        f"{self.program.name}: {s.name}'s access to {a.tensor} reaches outside its domain"
                    )
        for c in self.checks:
            if c.statement not in names:
                raise InternalError(f"{self.program.name}: a bounds check of unknown statement {c.statement}")
            rank = self.program.tensor(c.tensor).rank
            if any(not 0 <= d < rank for d in c.dynamic_dims):
                raise InternalError(f"{self.program.name}: a check of {c.tensor} names a dimension it lacks")


def original_order(statements: tuple[PolyStatement, ...], params: ParamSpace) -> isl.UnionMap:
    """The textual execution order: { S[x] -> [q, x0, .., xn, 0..] } with q the sequence number
    of the statement (pieces of one statement share it: their domains are disjoint, and together
    they run in the statement's order)."""
    depth = max((len(s.index_vars) for s in statements), default=0)
    out = None
    slots = {key: q for q, key in enumerate(dict.fromkeys((s.position, s.kind) for s in statements))}
    for s in statements:
        q = slots[s.position, s.kind]
        n = len(s.index_vars)
        target = isl.Space.create_from_names(
            params.ctx, set=[f"t{d}" for d in range(depth + 1)], params=list(params.names)
        )
        m = isl.Map.from_domain_and_range(s.domain, isl.Set.universe(target))
        m = m.fix_val(isl.dim_type.out, 0, isl.Val.int_from_si(params.ctx, q))
        for d in range(n):
            m = m.equate(isl.dim_type.in_, d, isl.dim_type.out, d + 1)
        for d in range(n, depth):
            m = m.fix_val(isl.dim_type.out, d + 1, isl.Val.zero(params.ctx))
        um = isl.UnionMap.from_map(m)
        out = um if out is None else out.union(um)
    return out if out is not None else isl.UnionMap.empty(params.param_space())


def _size_exprs(program: ir.Program) -> list[sympy.Expr]:
    exprs = [d for t in program.tensors for d in t.shape]
    exprs += [x for st in program.statements for r in st.ranges for x in (r.lo, r.hi)]
    return exprs


def tensor_box(params: ParamSpace, tensor: ir.Tensor) -> isl.Set:
    """{ tensor[e] : 0 <= e_d < shape_d }"""
    dims = [f"e{d}" for d in range(tensor.rank)]
    space = params.set_space(dims, tensor.name)
    box = isl.Set.universe(space)
    ls = isl.LocalSpace.from_space(space)
    zero = isl.PwAff.from_aff(isl.Aff.zero_on_domain(ls))
    for d, extent in enumerate(tensor.shape):
        var = isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.set, d))
        box = box.intersect(zero.le_set(var)).intersect(var.lt_set(to_pwaff(extent, params, space)))
    return box


def _domain(params: ParamSpace, name: str, ranges: tuple[ir.IndexRange, ...]) -> isl.Set:
    space = params.set_space([r.var for r in ranges], name)
    ls = isl.LocalSpace.from_space(space)
    dom = isl.Set.universe(space)
    for d, r in enumerate(ranges):
        var = isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.set, d))
        dom = dom.intersect(to_pwaff(r.lo, params, space).le_set(var)).intersect(
            var.lt_set(to_pwaff(r.hi, params, space))
        )
    return dom.intersect_params(params.context())  # sizes are non-negative


def _poly_statements(
    params: ParamSpace, pos: int, st: ir.Statement, kind: StatementKind, split: bool
) -> list[PolyStatement]:
    """The statement's init or body; a body that selects on an affine condition as pieces."""
    ranges = st.ranges[: len(st.indices)] if kind is StatementKind.INIT else st.ranges
    base = f"{'I' if kind == 'init' else 'S'}{pos}"
    domain = _domain(params, base, ranges)
    variables = tuple(r.var for r in ranges)
    pieces = (Piece(domain, st.rhs),)
    if split and kind is StatementKind.BODY:
        pieces = split_pieces(st, ExprConverter(params, domain.get_space(), variables), domain)
    out = []
    for n, piece in enumerate(pieces):
        name = piece_name(base, n, len(pieces))
        body = st if piece.rhs is st.rhs else dataclasses.replace(st, rhs=piece.rhs)
        out.append(
            _poly_statement(params, name, pos, body, kind, piece.domain.set_tuple_name(name), variables)
        )
    return out


def _poly_statement(
    params: ParamSpace,
    name: str,
    pos: int,
    st: ir.Statement,
    kind: StatementKind,
    domain: isl.Set,
    variables: tuple[str, ...],
) -> PolyStatement:
    conv = ExprConverter(params, domain.get_space(), variables)
    # a scatter's data-dependent subscript (None) writes "any element" of its dimension: a sound
    # over-approximation for dependences, checked at run time (a dynamic bounds check)
    lhs = tuple(conv.pwaff(e) for e in st.lhs)
    accesses = [Access(st.tensor, True, access_relation(conv, domain, st.tensor, lhs), lhs, domain, None)]
    if kind is StatementKind.BODY:
        if st.op != "=":  # a reduction reads its own LHS element
            accesses.append(Access(st.tensor, False, accesses[0].relation, lhs, domain, None))
        roots = (*(st.subscripts or ()), st.rhs)  # a scatter reads its index tensors first
        for read, guard in (x for root in roots for x in guarded_reads(root, conv, domain)):
            subs = tuple(conv.pwaff(i) for i in read.indices)
            rel = access_relation(conv, domain, read.tensor, subs)
            accesses.append(Access(read.tensor, False, rel, subs, guard, read))
    return PolyStatement(name, kind, pos, st, domain, tuple(accesses))


def _bounds_check(params: ParamSpace, program: ir.Program, s: PolyStatement, a: Access) -> BoundsCheck | None:
    tensor = program.tensor(a.tensor)
    box_space = s.domain.get_space()
    dynamic: list[int] = []
    violation = None
    for d, sub in enumerate(a.subscripts):
        if sub is None:
            dynamic.append(d)
            continue
        zero = sub.sub(sub)  # 0 on the same domain
        extent = to_pwaff(tensor.shape[d], params, box_space)
        outside = sub.lt_set(zero).union(sub.ge_set(extent))
        if outside.intersect(s.domain).is_empty():
            continue  # in bounds wherever the statement runs
        if a.guard is None:
            dynamic.append(d)  # only a non-affine condition could keep it in bounds
            continue
        bad = outside.intersect(a.guard)
        if bad.is_empty():
            continue
        bad_params = bad.params()
        violation = bad_params if violation is None else violation.union(bad_params)
    if not dynamic and violation is None:
        return None
    return BoundsCheck(s.name, a.tensor, a.read, tuple(dynamic), violation)


def compute_dependences(statements: tuple[PolyStatement, ...], params: ParamSpace) -> Dependences:
    empty = isl.UnionMap.empty(params.param_space())
    writes, may_writes, reads = empty, empty, empty
    for s in statements:
        for a in s.accesses:
            um = isl.UnionMap.from_map(a.relation)
            if a.is_write and a.exact:
                writes = writes.union(um)
            elif a.is_write:  # a scatter's over-approximated write kills nothing
                may_writes = may_writes.union(um)
            else:
                reads = reads.union(um)
    order = original_order(statements, params)

    def flow(sink: isl.UnionMap, must: isl.UnionMap, may: isl.UnionMap) -> isl.UnionFlow:
        info = isl.UnionAccessInfo.from_sink(sink).set_must_source(must)
        return info.set_may_source(may).set_schedule_map(order).compute_flow()

    raw = flow(reads, writes, may_writes)
    waw = flow(writes.union(may_writes), writes, may_writes)
    war = flow(writes.union(may_writes), empty, reads)
    return Dependences(
        raw.get_must_dependence().union(raw.get_may_dependence()).coalesce(),
        war.get_may_dependence().coalesce(),
        waw.get_must_dependence().union(waw.get_may_dependence()).coalesce(),
    )


def check_written_before_read(
    program: ir.Program, statements: tuple[PolyStatement, ...], params: ParamSpace
) -> None:
    """A read of a temporary's element inside its extent that no statement instance before it
    (in textual order) wrote would read garbage: a SemanticError at the read, with sizes for which
    it happens. A temporary's extent is the hull of what its statements write, so this catches a
    hole in the hull, and a recurrence that reads a value its statements only write later (two
    statements each looping over all of t). Reads under a non-affine condition are not checked,
    nor a temporary that a reduction without `!` accumulates onto (it starts from zeros)."""
    zeroed = {st.tensor for st in program.statements if st.uninitialized}  # `+=` starts from zeros
    temporaries = {t.name: t for t in program.temporaries if t.name not in zeroed}
    sinks = [
        (a, a.relation.intersect_domain(a.guard))
        for s in statements
        for a in s.reads
        if a.read is not None and a.tensor in temporaries and a.guard is not None and a.exact
    ]
    if not sinks:
        return
    empty = isl.UnionMap.empty(params.param_space())
    writes, reads = empty, empty
    for s in statements:
        if s.write.tensor in temporaries:
            writes = writes.union(isl.UnionMap.from_map(s.write.relation))
    for _, rel in sinks:
        reads = reads.union(isl.UnionMap.from_map(rel))
    order = original_order(statements, params)
    flow = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(order).compute_flow()
    unwritten = flow.get_may_no_source()
    for a, rel in sinks:
        box = tensor_box(params, temporaries[a.tensor])
        bad = isl.UnionMap.from_map(rel.intersect_range(box)).intersect(unwritten)
        if bad.is_empty():
            continue
        sizes = bad.params().intersect(params.context()).sample_point()
        example = ", ".join(
            f"{name} = {sizes.get_coordinate_val(isl.dim_type.param, pos).to_python()}"
            for pos, name in enumerate(params.names[: len(params.sizes)])
        )
        raise SemanticError(
            f"this reads elements of temporary {a.tensor} that no earlier statement writes"
            + (f" (for example when {example})" if example else "")
            + f". Statements run in textual order, each over all of its ranges: every element of "
            f"{a.tensor} that is read must be written before, by an earlier statement or by an "
            f"earlier iteration of this one (a time recurrence over several tensors must be one "
            f"statement, with the fields as an index)",
            a.read.span,
        )


def build_scop(program: ir.Program, ctx: isl.Context | None = None, *, split: bool = True) -> Scop:
    """The program's polyhedral model. split=False keeps every statement whole (no index-set
    splitting of affine selects: the untransformed reference, Options(optimize=False))."""
    ctx = ctx or isl.Context()
    params = make_param_space(ctx, tuple(s.name for s in program.sizes), _size_exprs(program))
    statements: list[PolyStatement] = []
    for pos, st in enumerate(program.statements):
        if st.initializes:
            statements += _poly_statements(params, pos, st, StatementKind.INIT, split)
        statements += _poly_statements(params, pos, st, StatementKind.BODY, split)
    checks = [
        c for s in statements for a in s.accesses if (c := _bounds_check(params, program, s, a)) is not None
    ]
    stmts = tuple(statements)
    check_written_before_read(program, stmts, params)
    return Scop(program, params, stmts, tuple(checks), compute_dependences(stmts, params))
