"""planning: folded temporaries + Scop + sizes → planes kept in an input's or an output's memory (their copies not run).

A time recurrence written in TC starts from a copy of an input into its first plane and ends with
a copy of its last plane into the output:

    B(t, i, j) = A(i, j) where t in 0:1, ...          (S0)
    B(t, i, j) = f(B(t-1, ...)) where t in 1:T, ...
    O(i, j) = B(T - 1, i, j) ...                       (S2)

With B folded modulo 2 each copy is one more pass over a plane: S0 writes plane 0 only for the
first step to read it back, and S2 reads back what the last step has just written. Skipping both
copies (wrong results, the right memory traffic for S0) made jacobi-2d 1000² T=100 7.7 % faster
on one thread (README, *Planes kept in the input's and output's memory*). So:

- **A plane that is a copy of an input** (a statement `B(.., p, ..) = X(..)` writes the whole
  plane p, element for element from the whole of input X, and no other statement writes plane p)
  is read from X itself: every read of B's plane p reads X, and the copy does not run.
- **A plane copied into an output** (a statement `Y(..) = B(.., q, ..)` writes the whole of
  output Y, element for element from the whole plane q, no other statement writes Y, and no
  statement after it writes B) is stored in Y itself: the writes and reads of plane q go to Y,
  and the copy does not run.

Both need the plane's shape to be the other tensor's, the same dtype, and a plane other than the
one the input holds (a recurrence of one step copies its input to its output through one plane:
the copy out then runs, from the input's memory). Inputs are never written (plane p has no
writer but the copy), outputs never share memory with inputs (runtime/arguments.py), and the
lowering keeps every other plane of B where folding put it. The checks are exact, with isl, at
the call's sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import islpy as isl

from polyhedral import Scop, StatementKind
from polyhedral.scop import PolyStatement
from polyhedral.sizes import compile_size_expr
from tensorlang import ir

from .folding import FoldedTemporary, PlaneAlias


def alias_planes(
    scop: Scop, folds: Mapping[str, FoldedTemporary], sizes: Mapping[str, int]
) -> dict[str, FoldedTemporary]:
    """`folds`, each with the planes (PlaneAlias) kept in an input's or an output's memory."""
    if not folds:
        return dict(folds)
    program = scop.program
    context = scop.params.fixed_context(sizes)
    shapes = {t.name: tuple(compile_size_expr(d)(sizes) for d in t.shape) for t in program.tensors}
    out: dict[str, FoldedTemporary] = {}
    for name, fold in folds.items():
        first = _input_plane(scop, fold, shapes, context)
        last = _output_plane(scop, fold, shapes, context, None if first is None else first.plane)
        aliases = tuple(a for a in (first, last) if a is not None)
        out[name] = dataclasses.replace(fold, aliases=aliases) if aliases else fold
    return out


def _plain_copy(s: PolyStatement, program: ir.Program) -> ir.Read | None:
    """The one read of a statement `X(..) = Y(..)` (no conversion, every subscript affine), or None."""
    st = s.statement
    if s.kind is not StatementKind.BODY or s.projected is not None or st.op != "=":
        return None
    if not isinstance(st.rhs, ir.Read) or st.rhs.dtype != program.tensor(st.tensor).dtype:
        return None
    if len(s.accesses) != 2 or not all(a.exact and a.guard is not None for a in s.accesses):
        return None
    return st.rhs


def _plane_map(
    space: isl.Space, dim: int, plane: int, other_shape: tuple[int, ...], context: isl.Set
) -> isl.Map:
    """{B[.., plane, ..] → X[..]}: each element of B's plane `plane` and the element of X at the
    same subscripts, for the whole of X."""
    ctx = space.get_ctx()
    m = isl.Map.universe(space).intersect_params(context)
    m = m.fix_val(isl.dim_type.in_, dim, isl.Val.int_from_si(ctx, plane))
    for k, extent in enumerate(other_shape):
        m = m.equate(isl.dim_type.in_, k if k < dim else k + 1, isl.dim_type.out, k)
        m = m.lower_bound_val(isl.dim_type.out, k, isl.Val.int_from_si(ctx, 0))
        m = m.upper_bound_val(isl.dim_type.out, k, isl.Val.int_from_si(ctx, extent - 1))
    return m


def _single_plane(writes: isl.Map, dim: int) -> int | None:
    """The one index along `dim` of the elements `writes` reaches, or None."""
    rng = writes.range()
    if rng.is_empty():
        return None
    lo, hi = rng.dim_min_val(dim), rng.dim_max_val(dim)
    if not (lo.is_int() and hi.is_int()) or lo.to_python() != hi.to_python():
        return None
    return lo.to_python()


def _plane_shape(fold: FoldedTemporary, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(e for d, e in enumerate(shape) if d != fold.dim)


def _writes_plane(scop: Scop, tensor: str, dim: int, plane: int, context: isl.Set, skip: str) -> bool:
    """Whether a statement other than `skip` writes an element of `tensor` at `plane` along `dim`."""
    for s in scop.statements:
        if s.name == skip or s.write.tensor != tensor:
            continue
        rng = s.write.relation.intersect_params(context).range()
        if not rng.fix_val(isl.dim_type.set, dim, isl.Val.int_from_si(rng.get_ctx(), plane)).is_empty():
            return True
    return False


def _input_plane(
    scop: Scop, fold: FoldedTemporary, shapes: Mapping[str, tuple[int, ...]], context: isl.Set
) -> PlaneAlias | None:
    """The plane of `fold` that a statement copies whole from a whole input, written by nothing
    else, or None."""
    program = scop.program
    plane_shape = _plane_shape(fold, shapes[fold.tensor])
    for s in scop.statements:
        read = _plain_copy(s, program)
        if read is None or s.write.tensor != fold.tensor:
            continue
        source = program.tensor(read.tensor)
        if source.role != "input" or shapes[source.name] != plane_shape:
            continue
        writes = s.write.relation.intersect_params(context)
        plane = _single_plane(writes, fold.dim)
        if plane is None:
            continue
        copied = writes.reverse().apply_range(s.reads[0].relation.intersect_params(context))
        expected = _plane_map(copied.get_space(), fold.dim, plane, plane_shape, context)
        if not copied.is_equal(expected):
            continue
        if _writes_plane(scop, fold.tensor, fold.dim, plane, context, skip=s.name):
            continue
        return PlaneAlias(plane, source.name, s.name)
    return None


def _output_plane(
    scop: Scop,
    fold: FoldedTemporary,
    shapes: Mapping[str, tuple[int, ...]],
    context: isl.Set,
    taken: int | None,
) -> PlaneAlias | None:
    """The plane of `fold` that a statement copies whole into a whole output that nothing else
    writes, with no write of the temporary after it, or None. `taken`: the plane an input holds."""
    program = scop.program
    plane_shape = _plane_shape(fold, shapes[fold.tensor])
    for s in scop.statements:
        read = _plain_copy(s, program)
        if read is None or read.tensor != fold.tensor:
            continue
        target = program.tensor(s.statement.tensor)
        if target.role != "output" or shapes[target.name] != plane_shape:
            continue
        if any(o.name != s.name and o.write.tensor == target.name for o in scop.statements):
            continue  # another statement writes the output
        if any(o.position > s.position and o.write.tensor == fold.tensor for o in scop.statements):
            continue  # the temporary is written again after the copy
        reads = s.reads[0].relation.intersect_params(context)
        plane = _single_plane(reads, fold.dim)
        if plane is None or plane == taken:
            continue
        copied = reads.reverse().apply_range(s.write.relation.intersect_params(context))
        expected = _plane_map(copied.get_space(), fold.dim, plane, plane_shape, context)
        if not copied.is_equal(expected):
            continue
        return PlaneAlias(plane, target.name, s.name)
    return None
