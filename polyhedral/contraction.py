"""polyhedral: a Scop statement `C(..) += A(..) * B(..)` → a contraction plan (GEMM dims M, N, K).

A statement is a contraction when its right-hand side is the product of two reads whose
subscripts are affine with non-negative coefficients. Its index variables then fall into
classes by where they occur: in C and A only (M-like), in C and B only (N-like), in A and B but
not C (K-like), and the rest (batch and other outer loops). With concrete sizes the plan picks the
largest M, N and K variables; without them (the generic kernel, sizes known only at run time) it
picks by structure: a variable whose extent is a constant of the source below a size symbol's,
else the innermost. The code generator runs a packed GEMM for them at each point of the
remaining (outer) variables. The decision comes from the polyhedral description of the
statement, not from pattern-matching generated code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import islpy as isl
import sympy

from tensorlang import ir

from .scop import PolyStatement, Scop, StatementKind, compute_dependences
from .sizes import compile_size_expr

# Below this many multiply-adds a GEMM call (packing, blocking) does not pay for itself.
MIN_CONTRACTION_WORK = 4096


@dataclass(frozen=True)
class Operand:
    """One tensor of a contraction: its subscripts as affine forms."""

    tensor: str
    forms: tuple[ir.AffineForm, ...]

    def uses(self, var: str) -> bool:
        return any(f.coeff(var) for f in self.forms)


@dataclass(frozen=True)
class ContractionPlan:
    """C[m, n] += A[m, k] · B[k, n] over the chosen variables; `outer` are looped around it."""

    statement: str  # polyhedral statement name (S<k>)
    c: Operand
    a: Operand  # the operand that holds m (and k)
    b: Operand  # the operand that holds n (and k)
    m: str
    n: str
    k: str
    outer: tuple[str, ...]


def _operands(st: ir.Statement, descending: bool = False) -> tuple[Operand, Operand, Operand] | None:
    """`C += X·Y` as (C, X, Y) with affine subscripts; subscripts that step backwards along a
    variable (`h - kh`) only with `descending` (the direct convolution walks any strides; the
    GEMM path's packing does not)."""
    rhs = st.rhs
    if st.op != "+" or not isinstance(rhs, ir.Binary) or rhs.op != "*" or not rhs.dtype.is_float:
        return None
    if st.is_scatter:
        return None  # a data-dependent left-hand side is no GEMM
    if rhs.dtype.bits not in (32, 64):
        return None
    reads = (rhs.lhs, rhs.rhs)
    if not all(isinstance(r, ir.Read) and r.dtype == rhs.dtype for r in reads):
        return None
    ops = []
    for r in reads:
        forms = tuple(ir.affine_form(i) for i in r.indices)
        if any(f is None for f in forms):
            return None
        if not descending and any(c < 0 for f in forms for name, c in f.coeffs if name in st.all_indices):
            return None
        ops.append(Operand(r.tensor, forms))
    c = Operand(st.tensor, tuple(ir.AffineForm(((v, 1),), 0) for v in st.indices))
    return c, ops[0], ops[1]


@dataclass(frozen=True)
class _Roles:
    """The operands of `C += X·Y` and the candidates for each GEMM role among its variables."""

    c: Operand
    x: Operand
    y: Operand
    m: tuple[str, ...]  # in C and X only
    n: tuple[str, ...]  # in C and Y only
    k: tuple[str, ...]  # reduced, in X and Y


def _roles(st: ir.Statement) -> _Roles | None:
    """The one definition of a contraction: `C += X·Y` with M-, N- and K-like variables, not
    reading the tensor it accumulates into."""
    found = _operands(st)
    if found is None:
        return None
    c, x, y = found
    if c.tensor in (x.tensor, y.tensor):
        return None  # reads the tensor it accumulates into: not a plain C += A·B
    in_c = set(st.indices)
    m = tuple(v for v in st.indices if x.uses(v) and not y.uses(v))
    n = tuple(v for v in st.indices if y.uses(v) and not x.uses(v))
    k = tuple(v for v in st.reduction_indices if x.uses(v) and y.uses(v) and v not in in_c)
    if not (m and n and k):
        return None
    return _Roles(c, x, y, m, n, k)


def is_contraction(st: ir.Statement) -> bool:
    """A statement the GEMM path can run (for large enough sizes)."""
    return _roles(st) is not None


def plan_contraction(
    scop: Scop, stmt: PolyStatement, sizes: Mapping[str, int] | None
) -> ContractionPlan | None:
    """The GEMM decomposition of a body statement for these sizes, or None. `sizes` None plans the
    generic kernel: extents are then known only where a range is a constant of the source, and
    the GEMM (which handles any extents, empty ones included) runs whatever the sizes."""
    if stmt.kind is not StatementKind.BODY or any(
        c.statement == stmt.name and c.dynamic_dims for c in scop.checks
    ):
        return None
    st = stmt.statement
    roles = _roles(st)
    if roles is None:
        return None
    extent = {r.var: _extent(r, sizes) for r in st.ranges}

    def best(candidates: tuple[str, ...], plain_first: bool = False) -> str:
        # the largest extent; among equals the later (inner, smaller-stride) variable
        if sizes is not None:
            return max(candidates, key=lambda v: (extent[v], st.all_indices.index(v)))
        # generic: an unknown extent (a size symbol's) counts as larger than any constant one;
        # for K, among unknown ones a variable that is a whole subscript wherever it occurs comes
        # first (a convolution's channel c, not its window offset kh in `h + kh`: windows are small)
        return max(
            candidates,
            key=lambda v: (
                _LARGE if extent[v] is None else extent[v],
                plain_first and _plain_everywhere(v, (roles.x, roles.y)),
                st.all_indices.index(v),
            ),
        )

    m, n, k = best(roles.m), best(roles.n), best(roles.k, plain_first=True)
    work = [extent[v] for v in (m, n, k)]
    if None not in work and work[0] * work[1] * work[2] < MIN_CONTRACTION_WORK:
        return None  # known small (every size, or the constant extents of a generic kernel)
    outer = tuple(v for v in st.all_indices if v not in (m, n, k))
    return ContractionPlan(stmt.name, roles.c, roles.x, roles.y, m, n, k, outer)


# The extent an unknown (run-time) range counts as when choosing among candidates: larger than any
# constant range of a source.
_LARGE = 2**62


def _plain_everywhere(var: str, operands: Sequence[Operand]) -> bool:
    """Whether every subscript of the operands that uses `var` is `var` alone."""
    return all(
        f.coeffs == ((var, 1),) and f.constant == 0 for op in operands for f in op.forms if f.coeff(var)
    )


def _extent(r: ir.IndexRange, sizes: Mapping[str, int] | None) -> int | None:
    """A range's trip count for these sizes; with sizes None, its trip count when that is a
    constant of the source (`i in 0:3`), else None."""
    if sizes is not None:
        return compile_size_expr(r.hi)(sizes) - compile_size_expr(r.lo)(sizes)
    diff = sympy.sympify(r.hi - r.lo)
    return int(diff) if diff.is_Integer else None


def _project(stmt: PolyStatement, plan: ContractionPlan) -> PolyStatement:
    """The statement over its outer variables only; accesses become their unions over m, n, k.

    One call runs at every point of the outer box, whatever the extents of m, n and k: a GEMM
    with an empty M or N does nothing, and one with an empty K adds nothing (or, storing C
    because its zeroing was folded into it, zeroes C): see `project_call`."""
    return project_call(stmt, (plan.m, plan.n, plan.k), (plan.k,), plan.outer)


def project_call(
    stmt: PolyStatement, inner: Sequence[str], reduced: Sequence[str], outer: tuple[str, ...]
) -> PolyStatement:
    """The statement of a library call (a GEMM, a direct convolution) over its `outer` variables,
    the call covering the `inner` ones, of which `reduced` are summed over.

    The call runs at every outer point whatever the inner extents: with an empty output extent it
    does nothing, with nothing to sum it adds nothing (or, storing because the zeroing was folded
    into it, zeroes). So where the domain is a box (the inner variables' constraints apart from the
    outer ones'), the projection keeps no condition on the inner extents: else a generic kernel
    would hide the call, and every statement sharing its region, behind `if (K >= 1)`, one phase
    the threads cannot split. The write then covers the output's box at every outer point (an
    over-approximated write, which kills nothing: dependences only grow). Not a box: the exact
    projection."""
    positions = [stmt.index_vars.index(v) for v in inner]
    domain, outer_part = stmt.domain, stmt.domain
    for pos in positions:
        domain = domain.drop_constraints_involving_dims(isl.dim_type.set, pos, 1)
    for pos in range(len(stmt.index_vars)):
        if pos not in positions:
            outer_part = outer_part.drop_constraints_involving_dims(isl.dim_type.set, pos, 1)
    if not domain.intersect(outer_part).is_equal(stmt.domain):
        return project_onto_outer(stmt, inner, outer)  # not a box: keep it exact
    write = stmt.write
    relation = write.relation
    for v in reduced:
        relation = relation.drop_constraints_involving_dims(isl.dim_type.in_, stmt.index_vars.index(v), 1)
    widened = replace(
        stmt, domain=domain, accesses=(replace(write, relation=relation, guard=domain), *stmt.reads)
    )
    return project_onto_outer(widened, inner, outer)


def calls_cover(init: PolyStatement, projected: PolyStatement, written: Sequence[str]) -> bool:
    """Whether a call runs at every outer point where its init zeroes something, for every size
    (`project_call` kept no condition on the inner extents): the init's domain without the
    `written` inner variables (a GEMM's m, n; a convolution's f, x) within the projected one."""
    domain = init.domain
    for pos in sorted((init.index_vars.index(v) for v in written), reverse=True):
        domain = domain.project_out(isl.dim_type.set, pos, 1)
    return domain.set_tuple_name(projected.name).is_subset(projected.domain)


def project_onto_outer(stmt: PolyStatement, inner: Sequence[str], outer: tuple[str, ...]) -> PolyStatement:
    """The statement with the `inner` variables projected out (what one library call at an outer
    point covers: a GEMM's m, n, k, a direct convolution's window); accesses become their unions
    over them."""
    positions = sorted((stmt.index_vars.index(v) for v in inner), reverse=True)
    domain = stmt.domain
    for pos in positions:
        domain = domain.project_out(isl.dim_type.set, pos, 1)
    domain = domain.set_tuple_name(stmt.name)  # projecting every dimension out drops the name
    accesses = []
    for a in stmt.accesses:
        rel = a.relation
        for pos in positions:
            rel = rel.project_out(isl.dim_type.in_, pos, 1)
        rel = rel.set_tuple_name(isl.dim_type.in_, stmt.name)
        accesses.append(type(a)(a.tensor, a.is_write, rel, tuple(None for _ in a.subscripts), domain, a.read))
    return PolyStatement(stmt.name, stmt.kind, stmt.position, stmt.statement, domain, tuple(accesses), outer)


def plan_contractions(scop: Scop, sizes: Mapping[str, int]) -> tuple[Scop, dict[str, ContractionPlan]]:
    """The Scop with every contraction statement projected onto its outer loops, and the plans."""
    plans = {}
    statements = []
    for s in scop.statements:
        plan = plan_contraction(scop, s, sizes)
        if plan is None:
            statements.append(s)
            continue
        plans[s.name] = plan
        statements.append(_project(s, plan))
    if not plans:
        return scop, plans
    stmts = tuple(statements)
    projected = Scop(scop.program, scop.params, stmts, scop.checks, compute_dependences(stmts, scop.params))
    return projected, plans
