"""planning: LoopAst + Scop → storage plan (temporaries contracted to one outer-loop iteration's slice).

After fusion a temporary is often produced and consumed inside one iteration of a phase's outer
loop: softmax's `e(n, d)` lives for one row `n`. If every access to it indexes one of its
dimensions by exactly that loop's iterator, different iterations touch disjoint slices and a slice
is dead once its iteration ends, so the temporary needs only one slice of storage (a row buffer
instead of a matrix). The slice lives in the per-thread workspace, so threads that split the
outer loop each get their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop, StatementKind
from polyhedral.contraction import ContractionPlan
from tensorlang import ir

from .astgen import Leaf, LoopAst, Phase
from .folding import FoldedTemporary

_ALIGN = 64


@dataclass(frozen=True)
class ContractedTemporary:
    """Temporary `tensor` stored as one slice along `dim`, at `offset` bytes into the workspace."""

    tensor: str
    dim: int
    phase: int
    offset: int
    slice_bytes: int
    full_bytes: int

    @property
    def saved_bytes(self) -> int:
        return self.full_bytes - self.slice_bytes


def _outer_iterator(phase: Phase) -> str | None:
    if phase.outer is None:  # the phase is not a loop (or a degenerate one)
        return None
    return phase.outer.for_get_iterator().get_id().get_name()


def _leaves_by_statement(ast: LoopAst) -> dict[str, list[Leaf]]:
    out: dict[str, list[Leaf]] = {}
    for leaf in ast.leaves.values():
        out.setdefault(leaf.statement, []).append(leaf)
    return out


def _subscripts(scop: Scop, name: str, tensor: str) -> list[tuple[ir.Expr, ...]]:
    stmt = scop.statement(name)
    st = stmt.statement
    found = []
    if st.tensor == tensor:
        found.append(st.lhs)
    if stmt.kind is StatementKind.BODY:
        found += [e.indices for e in ir.walk(st.rhs) if isinstance(e, ir.Read) and e.tensor == tensor]
    return found


def _contractible_dim(scop: Scop, ast: LoopAst, tensor: str, users: list[str], iterator: str) -> int | None:
    """The dimension of `tensor` indexed by the phase iterator in every access, if any."""
    leaves = _leaves_by_statement(ast)
    candidates: set[int] | None = None
    for name in users:
        per_leaf = [
            {
                var
                for var, expr in leaf.index_exprs
                if expr.get_type() == isl.ast_expr_type.id and expr.get_id().get_name() == iterator
            }
            for leaf in leaves.get(name, [])
        ]
        if not per_leaf or any(vs != per_leaf[0] for vs in per_leaf):
            return None  # every instance must run with the same variable as the outer iterator
        by_iterator = per_leaf[0]
        dims: set[int] | None = None
        for subscripts in _subscripts(scop, name, tensor):
            here = {
                d for d, s in enumerate(subscripts) if isinstance(s, ir.IndexRef) and s.name in by_iterator
            }
            dims = here if dims is None else dims & here
        if dims is None or len(by_iterator) != 1:
            return None
        candidates = dims if candidates is None else candidates & dims
    return min(candidates) if candidates else None


def plan_storage(
    scop: Scop, ast: LoopAst, shapes: Mapping[str, tuple[int, ...]],
    plans: Mapping[str, ContractionPlan], first_offset: int, skip: set[str] = frozenset(),
) -> dict[str, ContractedTemporary]:  # fmt: skip
    """Which temporaries to contract for this specialisation, and where their slices live
    (`skip`: temporaries stored otherwise, folded ones)."""
    program = scop.program
    users: dict[str, set[str]] = {}
    for s in scop.statements:
        for a in s.accesses:
            users.setdefault(a.tensor, set()).add(s.name)
    phases_of: dict[str, set[int]] = {}
    for n, phase in enumerate(ast.phases):
        for name in phase.statements:
            phases_of.setdefault(name, set()).add(n)
    out: dict[str, ContractedTemporary] = {}
    offset = -(-first_offset // _ALIGN) * _ALIGN
    for tensor in program.temporaries:
        if tensor.name in skip:
            continue
        names = sorted(users.get(tensor.name, ()))
        statements = [scop.statement(n) for n in names]
        if not names or any(s.statement.uninitialized or s.name in plans for s in statements):
            continue  # zero-filled accumulators and GEMM operands keep their full storage
        phases = set().union(*(phases_of.get(n, {None}) for n in names))
        if len(phases) != 1 or None in phases:
            continue
        phase = phases.pop()
        iterator = _outer_iterator(ast.phases[phase])
        if iterator is None:
            continue
        dim = _contractible_dim(scop, ast, tensor.name, names, iterator)
        if dim is None:
            continue
        shape = shapes[tensor.name]
        itemsize = tensor.dtype.storage_bytes
        full = math.prod(shape) * itemsize
        slice_bytes = math.prod(e for d, e in enumerate(shape) if d != dim) * itemsize
        out[tensor.name] = ContractedTemporary(tensor.name, dim, phase, offset, slice_bytes, full)
        offset += -(-slice_bytes // _ALIGN) * _ALIGN
    return out


def workspace_end(contracted: Mapping[str, ContractedTemporary], gemm_bytes: int) -> int:
    """Bytes of workspace one thread needs: GEMM panels first, then the contracted slices."""
    return max([gemm_bytes] + [c.offset + c.slice_bytes for c in contracted.values()])


def storage_report(
    contracted: Mapping[str, ContractedTemporary], folded: Mapping[str, FoldedTemporary]
) -> str:
    lines = [f.describe() for f in folded.values()]
    for c in contracted.values():
        lines.append(
            f"// {c.tensor}: contracted along dimension {c.dim} to one slice of {c.slice_bytes} bytes "
            f"per outer iteration of phase {c.phase} (saves {c.saved_bytes / 2**20:.2f} MiB)"
        )
    return "\n".join(lines)


def plan_layouts(
    program: ir.Program, plans: Mapping[str, ContractionPlan], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Inputs to relayout before the call: GEMM operands walked with no unit stride.

    The GEMM packs its operands fast when one of their two GEMM strides is 1 (row- or
    column-major); a convolution's weights `Wt(f, c, kh, kw)` are strided along both `c` and `f`.
    Such an input is copied once per call with its GEMM dimensions innermost (storage order
    returned as the tuple of logical dimensions), which costs little next to the GEMM work.
    """
    layouts: dict[str, tuple[int, ...]] = {}
    for plan in plans.values():
        for operand, roles in ((plan.a, (plan.m, plan.k)), (plan.b, (plan.k, plan.n))):
            tensor = program.tensor(operand.tensor)
            if tensor.role != "input" or tensor.name in layouts:
                continue
            dims = [[d for d, f in enumerate(operand.forms) if f.coeff(v)] for v in roles]
            if any(len(found) != 1 for found in dims) or dims[0][0] == dims[1][0]:
                continue
            outer, inner = dims[0][0], dims[1][0]
            shape = shapes[tensor.name]
            if math.prod(shape[inner + 1 :]) == 1 or math.prod(shape[outer + 1 :]) == 1:
                continue  # already row- or column-major for the GEMM
            rest = [d for d in range(tensor.rank) if d not in (outer, inner)]
            layouts[tensor.name] = (*rest, outer, inner)
    return layouts


def plan_buffer_sharing(
    scop: Scop,
    ast: LoopAst,
    shapes: Mapping[str, tuple[int, ...]],
    skip: set[str],
) -> dict[str, int]:
    """Temporaries → shared buffer slots: temporaries whose lifetimes (the phases that touch
    them) do not overlap reuse one allocation. Zero-filled accumulators and `skip` are left out."""
    program = scop.program
    phases_of: dict[str, list[int]] = {}
    for n, phase in enumerate(ast.phases):
        for name in phase.statements:
            for a in scop.statement(name).accesses:
                phases_of.setdefault(a.tensor, []).append(n)
    lifetimes = []
    for t in program.temporaries:
        touched = phases_of.get(t.name)
        uninitialized = any(st.tensor == t.name and st.uninitialized for st in program.statements)
        if t.name in skip or not touched or uninitialized:
            continue
        lifetimes.append((min(touched), max(touched), t.name))
    slots: list[int] = []  # last phase using each slot
    assignment: dict[str, int] = {}
    for start, end, name in sorted(lifetimes):
        for slot, busy_until in enumerate(slots):
            if busy_until < start:
                slots[slot] = end
                assignment[name] = slot
                break
        else:
            assignment[name] = len(slots)
            slots.append(end)
    return assignment
