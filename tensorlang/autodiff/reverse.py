"""autodiff: the forward steps in SSA form → the adjoint statements, visiting the steps in reverse.

Each version V with a gradient has an adjoint tensor dV of V's shape. Its first contribution
defines it (`=` or `+=!` over the whole shape), later ones accumulate (`+=`); when a statement is
reached, every statement that reads its result has been visited, so the adjoint of what it wrote
is complete. Per statement kind (T_new = what it wrote, T_old = the target before, g = dT_new):
- `=`: the right-hand side's reads receive g by the chain rule; a partial update passes g on to
  T_old outside its box. A read of the target at a shifted point is a scan, below.
- `+=`, `+=!`: every term receives g (broadcast over the reduction indices); T_old receives g.
  `+=` without `!` onto a fresh output accumulates onto the caller's buffer, which is not an
  input of the def: the gradients are those of `+=!`.
- `*=`: the product of the other terms, computed without dividing by zero: the gradient program
  counts the zero terms and multiplies the non-zero ones (one zero: only it gets a gradient).
- `max=`, `min=`: the adjoint is split evenly among the tied extrema (the terms equal to the
  result, and T_old if it ties), as `torch.amax` does: a count of the ties, then
  `E == T ? g / ties : 0`.
- a scan `T(i) = f(T(i - c), ...) where i in lo:hi` has the adjoint recurrence
  λ(i) = g(i) + Σ_c [i + c in lo:hi] ∂f(i + c)/∂T(i) λ(i + c), which runs backwards; it is written
  as a forward scan over the reversed index r = extent - 1 - i (the language runs a statement's
  recurrence forwards).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from ..errors import SemanticError
from ..lint import read_span
from .exprs import (
    BOOL,
    FLOAT32,
    INT32,
    add,
    compare,
    const,
    div,
    from_sympy,
    mul,
    read,
    select,
    substitute,
)
from .invert import NotInvertible, in_box, invert
from .names import Names
from .rules import Contribution, backprop
from .versions import Step, Version


@dataclass(frozen=True)
class Generated:
    """A statement of the gradient program, before its where clauses are chosen.

    ranges: every index (left-hand side first) with its intended range.
    indices: per dimension an index name, or (a scatter-add, the adjoint of a gather) an expression
        that reads a tensor, such as `I(b)` in `dT(I(b), e) += dO(b, e)`.
    """

    tensor: str
    indices: tuple[str | ir.Expr, ...]
    op: str
    rhs: ir.Expr
    ranges: tuple[tuple[str, sympy.Expr, sympy.Expr], ...]

    @property
    def lhs_vars(self) -> tuple[str, ...]:
        """The left-hand side's index variables (without a scatter's data-dependent subscripts)."""
        return tuple(i for i in self.indices if isinstance(i, str))

    @property
    def write(self) -> tuple[ir.Expr, ...]:
        return tuple(ir.IndexRef(name=i) if isinstance(i, str) else i for i in self.indices)

    @property
    def subscript_reads(self) -> list[ir.Read]:
        """The reads of a scatter's left-hand side (the index tensors)."""
        return [
            n for i in self.indices if not isinstance(i, str) for n in ir.walk(i) if isinstance(n, ir.Read)
        ]


@dataclass
class _Adjoint:
    name: str
    readonly: bool  # an input of the gradient program (or an alias of one): copy before accumulating


class Reverse:
    def __init__(
        self, versions: dict[str, Version], steps: list[Step], needs: set[str], names: Names, sizes: set[str]
    ):
        self.versions = versions
        self.steps = steps
        self.needs = needs  # version names that depend on a wrt input
        self.names = names
        self.sizes = sizes
        self.adjoint: dict[str, _Adjoint] = {}
        self.out: list[Generated] = []
        self.shapes: dict[str, tuple[sympy.Expr, ...]] = {}  # of every tensor this pass creates
        self.declared: set[str] = set()  # the gradient program's outputs (returned with their shape)

    # ------------------------------------------------------------ adjoint tensors

    def seed_output(self, version: Version, name: str) -> None:
        self.adjoint[version.name] = _Adjoint(name, readonly=True)

    def fix_name(self, version: Version, name: str) -> None:
        """The adjoint of a wrt input is an output of the gradient program, with a given name."""
        self.adjoint[version.name] = _Adjoint(name, readonly=False)
        self.shapes[name] = version.shape
        self.declared.add(name)

    def full_ranges(self, indices: tuple[str, ...], shape) -> tuple[tuple[str, sympy.Expr, sympy.Expr], ...]:
        return tuple((i, sympy.Integer(0), e) for i, e in zip(indices, shape))

    def target(self, version: Version) -> tuple[str, bool]:
        """The adjoint tensor to write a contribution to, and whether this write defines it."""
        adj = self.adjoint.get(version.name)
        if adj is None:
            name = self.names.take(f"d{version.name}")
            self.adjoint[version.name] = _Adjoint(name, readonly=False)
            self.shapes[name] = version.shape
            return name, True
        if adj.name not in self.written and not adj.readonly:
            return adj.name, True
        if adj.readonly:  # the caller's adjoint of an output that later statements also read
            name = self.names.take(f"{adj.name}_total")
            idx = tuple(self.names.index("i") for _ in version.shape)
            self.emit(
                name, idx, "=", read(adj.name, idx, version.dtype), self.full_ranges(idx, version.shape)
            )
            self.adjoint[version.name] = _Adjoint(name, readonly=False)
            self.shapes[name] = version.shape
            return name, False
        return adj.name, False

    @property
    def written(self) -> set[str]:
        return {g.tensor for g in self.out}

    def emit(self, tensor, indices, op, rhs, ranges) -> None:
        self.out.append(Generated(tensor, tuple(indices), op, rhs, tuple(ranges)))

    def contribute(self, version: Version, indices, rhs, ranges, reduction: bool) -> None:
        """Add `rhs` (over `ranges`, the left-hand side `indices` first) to version's adjoint."""
        name, first = self.target(version)
        # A first contribution that is a plain copy of another adjoint is that adjoint: alias it.
        if (
            first
            and version.role != "input"
            and not reduction
            and isinstance(rhs, ir.Read)
            and all(isinstance(i, ir.IndexRef) and i.name == v for i, v in zip(rhs.indices, indices))
            and len(rhs.indices) == len(indices)
            and all(
                sympy.simplify(lo) == 0 and sympy.simplify(hi - e) == 0
                for (_, lo, hi), e in zip(ranges, version.shape)
            )
            and any(a.name == rhs.tensor for a in self.adjoint.values())
        ):
            readonly = any(a.name == rhs.tensor and a.readonly for a in self.adjoint.values())
            self.adjoint[version.name] = _Adjoint(rhs.tensor, readonly)
            return
        op = ("+=!" if reduction else "=") if first else "+="
        self.emit(name, indices, op, rhs, ranges)

    def scatter(self, step: Step, contributions: list[Contribution], ranges: dict, lhs_vars) -> None:
        """Turn each read's contribution into a gather statement on its version's adjoint."""
        groups: dict[tuple[str, str], list[Contribution]] = {}
        for c in contributions:
            groups.setdefault((c.read.tensor, str(c.read.indices)), []).append(c)
        for items in groups.values():
            rd = items[0].read
            version = self.versions[rd.tensor]
            total = items[0].value
            for c in items[1:]:
                total = add(total, c.value)
            adj = self.adjoint.get(version.name)
            narrow = adj is not None and (adj.name in self.written or adj.readonly)
            try:
                gather = invert(rd, ranges, lhs_vars, version.shape, self.sizes, self.names.index, narrow)
            except NotInvertible as why:
                if _scatter_form(rd, ranges):
                    self.scatter_add(version, rd, total, ranges)
                    continue
                original = ir.Read(tensor=version.tensor, indices=rd.indices, dtype=rd.dtype, span=rd.span)
                span = read_span(original)
                raise SemanticError(
                    f"tl.grad: the gradient of the read {span.text if span else original} needs scatter-add onto "
                    f"{version.tensor}({', '.join(map(str, rd.indices))}), which the language cannot write: a "
                    f"scatter's left-hand subscript must be an index or read an integer tensor ({why}); "
                    f"leave {version.tensor} out of wrt",
                    span,
                ) from None
            value = substitute(total, gather.substitution)
            value = _guard(gather.guards, value)
            # a reduction index the contribution does not mention sums equal terms: a factor
            present = {n.name for n in ir.walk(value) if isinstance(n, ir.IndexRef)}
            reduction = [v for v in gather.reduction if v in present]
            for v in gather.reduction:
                if v not in present:
                    count = ir.Cast(
                        operand=from_sympy(ranges[v][1] - ranges[v][0], self.sizes), dtype=value.dtype
                    )
                    value = mul(value, count)
            lhs_ranges = tuple((i, *gather.ranges[i]) for i in gather.lhs)
            red_ranges = tuple((v, *ranges[v]) for v in reduction)
            self.contribute(version, gather.lhs, value, lhs_ranges + red_ranges, bool(reduction))

    def scatter_add(self, version: Version, rd: ir.Read, value: ir.Expr, ranges: dict) -> None:
        """The adjoint of a gather `T(I(b), e)` as a scatter-add over the forward statement's own
        indices, `dT(I(b), e) +=! dO(b, e)`: duplicate indices sum their contributions."""
        indices: list[str | ir.Expr] = [i.name if isinstance(i, ir.IndexRef) else i for i in rd.indices]
        lhs_vars = [i for i in indices if isinstance(i, str)]
        used = {n.name for e in (value, *rd.indices) for n in ir.walk(e) if isinstance(n, ir.IndexRef)}
        for v in ranges:
            if v not in used:  # an index nothing mentions sums equal terms: a factor
                count = ir.Cast(
                    operand=from_sympy(ranges[v][1] - ranges[v][0], self.sizes), dtype=value.dtype
                )
                value = mul(value, count)
        order = lhs_vars + [v for v in ranges if v in used and v not in lhs_vars]
        box = tuple((v, *ranges[v]) for v in order)
        name, first = self.target(version)
        if first and name not in self.declared:
            # a temporary adjoint has no declared extent along the scattered dimension: zeros first
            idx = tuple(self.names.index("i") for _ in version.shape)
            zero = ir.Cast(operand=const(0.0), dtype=value.dtype) if value.dtype != FLOAT32 else const(0.0)
            self.emit(name, idx, "=", zero, self.full_ranges(idx, version.shape))
        self.emit(name, tuple(indices), "+=!" if first and name in self.declared else "+=", value, box)

    # ------------------------------------------------------------ the pass

    def run(self) -> list[Generated]:
        for step in reversed(self.steps):
            adj = self.adjoint.get(step.new.name)
            if adj is None or step.new.name not in self.needs:
                continue
            self.statement(step, adj.name)
        return self.out

    def wanted(self, step: Step):
        shifted = {id(r) for r in step.shifted}
        return lambda r: r.tensor in self.needs and id(r) not in shifted

    def statement(self, step: Step, g_name: str) -> None:
        st = step.ir
        lhs = st.indices
        ranges = step.ranges()
        dtype = step.new.dtype
        g = read(g_name, lhs, dtype)
        op = st.op
        if op != "=" and not st.reduction_indices and step.old is None:
            op = "="  # `+=!` (or any `op=!`) onto a fresh tensor without reduction indices is `=`
        if st.uninitialized and op in ("*", "max", "min"):
            raise SemanticError(
                f"tl.grad: `{op}=` without `!` onto a fresh tensor starts from the caller's out= buffer, "
                f"which the gradient cannot see; write `{op}=!`",
                step.syntax.tensor.span,
            )
        if op in ("*", "max", "min") and step.old is not None and not step.full:
            raise SemanticError(
                f"tl.grad: a `{op}=` update of part of {st.tensor} is not supported; update all of it",
                step.syntax.tensor.span,
            )
        wanted = self.wanted(step)
        old_needs = step.old is not None and step.old.name in self.needs
        if op == "=":
            if step.shifted:
                self.scan(step, g_name)
                return
            root = read(step.new.name, lhs, dtype)
            self.scatter(step, backprop(step.rhs, g, wanted, root), ranges, lhs)
            if old_needs and not step.full:
                self.pass_through(step, g_name, outside_box=True)
            return
        if op == "+":
            self.scatter(step, backprop(step.rhs, g, wanted), ranges, lhs)
            if old_needs:
                self.pass_through(step, g_name, outside_box=False)
            return
        if op == "*":
            self.product(step, g, wanted, old_needs)
            return
        self.extremum(step, g, wanted, old_needs)

    def pass_through(self, step: Step, g_name: str, outside_box: bool) -> None:
        """dT_old += g (everywhere, or only outside the statement's box)."""
        idx = step.lhs
        shape = step.new.shape
        value: ir.Expr = read(g_name, idx, step.new.dtype)
        if outside_box:
            box = [(step.ranges()[v]) for v in idx]
            value = select(in_box(idx, box, shape, self.sizes), const(0.0, step.new.dtype), value)
        self.contribute(step.old, idx, value, self.full_ranges(idx, shape), False)

    def helper(self, base: str, step: Step, op: str, rhs: ir.Expr) -> ir.Read:
        """A forward helper tensor over the statement's left-hand side (counts, products)."""
        name = self.names.take(base)
        self.shapes[name] = step.new.shape
        rng = tuple((r.var, r.lo, r.hi) for r in step.ir.ranges)
        self.emit(name, step.lhs, op, rhs, rng)
        return read(name, step.lhs, FLOAT32 if op == "+=!" else step.new.dtype)

    def extremum(self, step: Step, g: ir.Read, wanted, old_needs: bool) -> None:
        st = step.ir
        lhs = st.indices
        value = read(step.new.name, lhs, step.new.dtype)
        is_max = compare("==", step.rhs, value)
        one, zero = const(1.0), const(0.0)
        ties = self.helper(f"{step.new.name}_ties", step, "+=!", select(is_max, one, zero))
        old_ties = None
        if step.old is not None:
            old = read(step.old.name, lhs, step.old.dtype)
            old_ties = compare("==", old, value)
            self.emit(
                ties.tensor, lhs, "+=", select(old_ties, one, zero), self.full_ranges(lhs, step.new.shape)
            )
        share = div(g, ties)
        contributions = [
            Contribution(c.read, _guard((is_max,), c.value)) for c in backprop(step.rhs, share, wanted)
        ]
        self.scatter(step, contributions, step.ranges(), lhs)
        if old_needs and old_ties is not None:
            self.contribute(
                step.old,
                lhs,
                select(old_ties, share, const(0.0, step.new.dtype)),
                self.full_ranges(lhs, step.new.shape),
                False,
            )

    def product(self, step: Step, g: ir.Read, wanted, old_needs: bool) -> None:
        st = step.ir
        lhs = st.indices
        dtype = step.new.dtype
        old = read(step.old.name, lhs, dtype) if step.old is not None else None
        e = step.rhs
        if not st.reduction_indices:  # T_new = T_old * E, pointwise
            self.scatter(step, backprop(e, mul(g, old), wanted), step.ranges(), lhs)
            if old_needs:
                self.contribute(step.old, lhs, mul(g, e), self.full_ranges(lhs, step.new.shape), False)
            return
        is_zero = compare("==", e, const(0.0))
        zeros = self.helper(f"{step.new.name}_zeros", step, "+=!", select(is_zero, const(1.0), const(0.0)))
        nonzero = self.helper(f"{step.new.name}_nonzero", step, "*=!", select(is_zero, const(1.0), e))
        # the product of the other terms: one zero term gets the product of the rest
        others = select(
            is_zero,
            select(compare("==", zeros, const(1.0)), nonzero, const(0.0)),
            select(compare("==", zeros, const(0.0)), div(nonzero, e), const(0.0)),
        )
        seed = mul(mul(g, old), others) if old is not None else mul(g, others)
        self.scatter(step, backprop(e, seed, wanted), step.ranges(), lhs)
        if old_needs:
            all_terms = select(compare("==", zeros, const(0.0)), nonzero, const(0.0))
            self.contribute(step.old, lhs, mul(g, all_terms), self.full_ranges(lhs, step.new.shape), False)

    def scan(self, step: Step, g_name: str) -> None:
        st = step.ir
        lhs = st.indices
        dtype = step.new.dtype
        shape = step.new.shape
        ranges = step.ranges()
        dim, shifts = None, {}
        for r in step.shifted:
            d, c = _shift(r, lhs)
            if d is None or (dim is not None and d != dim):
                raise SemanticError(
                    f"tl.grad: this recurrence reads {step.new.tensor} at a point other than an earlier "
                    f"one along a single index (the scan form {step.new.tensor}(..., i - c, ...) with a "
                    f"constant c >= 1); its gradient is not supported",
                    read_span(ir.Read(tensor=step.new.tensor, indices=r.indices, dtype=r.dtype, span=r.span)),
                )
            dim = d
            shifts.setdefault(c, []).append(r)
        i = lhs[dim]
        lo, hi = ranges[i]
        last = shape[dim] - 1
        r_name = self.names.index("r", set(lhs) | set(ranges))
        rev_idx = tuple(r_name if k == dim else v for k, v in enumerate(lhs))
        lam = self.names.take(f"{g_name}_scan")
        self.shapes[lam] = shape

        def at(name: str, position: ir.Expr) -> ir.Read:
            ix = tuple(position if k == dim else ir.IndexRef(name=v) for k, v in enumerate(rev_idx))
            return ir.Read(tensor=name, indices=ix, dtype=dtype)

        r_ref = ir.IndexRef(name=r_name)
        mirrored = ir.Binary(op="-", lhs=from_sympy(last, self.sizes), rhs=r_ref, dtype=INT32)  # E1 - r
        # lam(r) = g(last - r), then lam(r) += Σ_c [last - r + c in lo:hi] ∂f/∂T * lam(r - c)
        self.emit(lam, rev_idx, "=", at(g_name, mirrored), self.full_ranges(rev_idx, shape))
        total = None
        for c, rds in sorted(shifts.items()):
            ids = {id(x) for x in rds}
            partial = None
            for contrib in backprop(step.rhs, const(1.0), lambda x, ids=ids: id(x) in ids):
                partial = contrib.value if partial is None else add(partial, contrib.value)
            if partial is None:
                continue
            reader = sympy.Symbol(r_name, integer=True)
            reader_pos = last - reader + c  # the index i + c of the step that read T(i)
            conds = []
            conds.append(compare(">=", from_sympy(reader_pos, self.sizes), from_sympy(lo, self.sizes)))
            conds.append(compare("<", from_sympy(reader_pos, self.sizes), from_sympy(hi, self.sizes)))
            other = [(v, ranges[v]) for k, v in enumerate(lhs) if k != dim]
            for v, (vlo, vhi) in other:
                conds += _range_conds(v, vlo, vhi, shape[lhs.index(v)], self.sizes)
            partial = substitute(partial, {i: from_sympy(reader_pos, self.sizes)})
            term = mul(partial, at(lam, ir.Binary(op="-", lhs=r_ref, rhs=const(c, INT32), dtype=INT32)))
            term = _guard(tuple(conds), term)
            total = term if total is None else add(total, term)
        if total is not None:
            rec_ranges = tuple(
                (v, sympy.Integer(min(shifts)), shape[k]) if k == dim else (v, sympy.Integer(0), shape[k])
                for k, v in enumerate(rev_idx)
            )
            self.emit(lam, rev_idx, "=", add(at(lam, r_ref), total), rec_ranges)
        # the other reads of the statement receive lam at their own point
        seed = ir.Read(
            tensor=lam,
            indices=tuple(
                ir.Binary(op="-", lhs=from_sympy(last, self.sizes), rhs=ir.IndexRef(name=i), dtype=INT32)
                if k == dim
                else ir.IndexRef(name=v)
                for k, v in enumerate(lhs)
            ),
            dtype=dtype,
        )
        self.scatter(step, backprop(step.rhs, seed, self.wanted(step)), ranges, lhs)
        if step.old is not None and step.old.name in self.needs:
            box = [ranges[v] for v in lhs]
            value = select(in_box(lhs, box, shape, self.sizes), const(0.0, dtype), seed)
            self.contribute(step.old, lhs, value, self.full_ranges(lhs, shape), False)


def _shift(r: ir.Read, lhs: tuple[str, ...]) -> tuple[int | None, int]:
    """(dimension, c) when `r` reads the target at lhs with lhs[d] - c (c >= 1) in one dimension."""
    if len(r.indices) != len(lhs):
        return None, 0
    found = None
    for d, (ix, v) in enumerate(zip(r.indices, lhs)):
        if isinstance(ix, ir.IndexRef) and ix.name == v:
            continue
        form = ir.affine_form(ix)
        if form is None or found is not None or form.coeffs != ((v, 1),) or form.constant >= 0:
            return None, 0
        found = (d, -form.constant)
    return found if found is not None else (None, 0)


def _range_conds(v: str, lo, hi, extent, sizes) -> list[ir.Expr]:
    conds = []
    if sympy.simplify(lo) != 0:
        conds.append(compare(">=", ir.IndexRef(name=v), from_sympy(lo, sizes)))
    if sympy.simplify(hi - extent) != 0:
        conds.append(compare("<", ir.IndexRef(name=v), from_sympy(hi, sizes)))
    return conds


def _guard(conds: tuple[ir.Expr, ...], value: ir.Expr) -> ir.Expr:
    """`c1 && ... ? value : 0`, merging with a guard `value` already has (outer conditions first)."""
    if not conds:
        return value
    cond = conds[0]
    for c in conds[1:]:
        cond = ir.Binary(op="&&", lhs=cond, rhs=c, dtype=BOOL)
    if isinstance(value, ir.Select) and isinstance(value.if_false, ir.Const) and value.if_false.value == 0:
        return ir.Select(
            cond=ir.Binary(op="&&", lhs=cond, rhs=value.cond, dtype=BOOL),
            if_true=value.if_true,
            if_false=value.if_false,
            dtype=value.dtype,
        )
    return select(cond, value, const(0.0, value.dtype))


def _scatter_form(rd: ir.Read, ranges: dict) -> bool:
    """Whether the adjoint of `rd` can be written as a scatter: each subscript a distinct index
    of the statement, or an expression that reads a tensor (at least one does)."""
    bare = [i.name for i in rd.indices if isinstance(i, ir.IndexRef) and i.name in ranges]
    data = [i for i in rd.indices if any(isinstance(n, ir.Read) for n in ir.walk(i))]
    return bool(data) and len(bare) + len(data) == len(rd.indices) and len(set(bare)) == len(bare)
