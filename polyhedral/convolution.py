"""polyhedral: a Scop statement `O(.., f, .., x) += I(.., x·s + u·d, ..) * W(f, .., u)` → a direct-convolution plan.

A contraction is convolution-shaped when one operand, the filter W, is subscripted by plain
variables only: one output variable f (the output channel) and every reduction variable (the
taps: input channels and window offsets), and the other operand, the input I, slides: one of its
subscripts combines an output variable with a tap (`h + kh`, `2*w + 3*kw`). Such a statement is
not handed to the GEMM path (which runs one small GEMM per window offset) but to a register-tiled
direct convolution (codegen/emit/conv_kernel.py): vectors over f, a block of output positions
along x, the taps looped inside and the window tap `u` that shares x's input subscript unrolled.
The statement is projected onto its remaining output variables (the outer loops, which the
scheduler keeps and may split over threads); the kernel covers all f, x and taps at each point.

Supported: any such affine window (stride, dilation, NCHW, NHWC, 1-D to 3-D), float32 and float64;
zero padding written as a guard, `cond ? I·W : 0` with cond an `&&` of affine comparisons each
over x and its window tap only or over the other variables only; groups as a dimension of their
own (`Wt(g, f, c, kh, kw)`, `I(n, g, c, ..)`: a filter subscript in the output and the input).
Not recognised (they stay on the GEMM or loop path): groups folded into the channel subscript
(`g*F + f` is no plain filter subscript), depthwise convolution (no output channel apart from
the input's), a 1×1 window (a plain GEMM), fewer output channels than half a vector, a filter
that is not a kernel input.

Without sizes (the generic kernel, `Options(specialize=False)`) the plan is the same, with its
first values, trip counts and guard constants size expressions (sympy) that the generated code
evaluates at run time; the tests that need sizes are made where the extent is a constant of
the source and left to the kernel otherwise (it handles any extents, empty ones included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import sympy

from tensorlang import ir

from .contraction import (
    MIN_CONTRACTION_WORK,
    ContractionPlan,
    Operand,
    _operands,
    _project,
    calls_cover,
    plan_contraction,
    project_call,
)
from .scop import PolyStatement, Scop, StatementKind, compute_dependences
from .sizes import compile_size_expr

#: The widest unrolled window tap (a 1×17 filter loops over all its taps instead).
MAX_UNROLLED_TAP = 16
#: The largest packed filter (every thread packs its own copy into its workspace).
MAX_PACKED_BYTES = 64 << 20
#: Window widths the generic kernel unrolls (chosen at run time; other widths loop over the tap).
GENERIC_WINDOWS = (3, 5, 7)
_WINDOWS_TEXT = ", ".join(map(str, GENERIC_WINDOWS))
#: Vector registers are 512 bits: 16 float32 or 8 float64 output channels per vector.
VECTOR_BYTES = 64


Size = int | sympy.Expr  # a constant of specialised code, else a size expression (generic)
Guard = tuple[tuple[tuple[str, int], ...], Size]  # Σ coeff·var + constant ≥ 0


@dataclass(frozen=True)
class ConvPlan:
    """O[outer, f, x] += Σ_taps I[...] · W[f, taps] at each point of `outer`, for these sizes."""

    statement: str  # polyhedral statement name (S<k>)
    out: Operand
    inp: Operand
    wt: Operand
    f: str  # output channel: vector lanes
    x: str  # output position blocked in registers
    u: str | None  # the window tap sharing x's input subscript, unrolled (None: none)
    taps: tuple[str, ...]  # the other reduction variables, looped (outermost first)
    outer: tuple[str, ...]  # output variables looped around the call, in statement order
    lo: tuple[tuple[str, Size], ...]  # first value of f, x, u, the taps and the groups
    extent: tuple[tuple[str, Size], ...]  # trip counts of f, x, u and the taps
    itemsize: int  # bytes per element (4 or 8)
    offset: int  # bytes into the per-thread workspace where the packed filter lives
    # a padded convolution's guard `cond ? I·W : 0`, as conjuncts Σ coeff·var + constant ≥ 0:
    # over x and u (decided per position when the kernel is generated), and over the outer
    # variables and the looped taps (tested per tap at run time)
    col_guards: tuple[Guard, ...] = ()
    row_guards: tuple[Guard, ...] = ()
    # group variables (in the output, the filter and the input; looped outside the call) and
    # their trip counts: the filter is packed per group
    groups: tuple[tuple[str, Size], ...] = ()
    # planned without sizes (the generic kernel): first values, trip counts and guard constants
    # are size expressions (or constants of the source) that the kernel evaluates at run time
    generic: bool = False

    @property
    def lanes(self) -> int:
        return VECTOR_BYTES // self.itemsize

    def trips(self, var: str | None) -> int:
        return 1 if var is None else dict(self.extent)[var]

    @property
    def f_blocks(self) -> int:
        return -(-self.trips(self.f) // self.lanes)

    @property
    def packed_bytes(self) -> int:
        """The filter laid out [f-block][taps][u][lanes], zero-padded past the last channel (0 in
        a generic plan: the kernel allocates it at run time)."""
        if self.generic:
            return 0
        taps = math.prod(self.trips(t) for t in self.taps)
        groups = math.prod(n for _, n in self.groups)
        return groups * self.f_blocks * taps * self.trips(self.u) * self.lanes * self.itemsize

    def describe(self) -> str:
        taps = ", ".join(self.taps)
        unrolled = f"; {self.u} unrolled" if self.u is not None else ""
        if self.groups:
            unrolled += f"; groups {', '.join(v for v, _ in self.groups)}"
        if self.col_guards or self.row_guards:
            unrolled += (
                f"; padding guards ({len(self.col_guards)} along {self.x}, {len(self.row_guards)} per tap)"
            )
        packed = "sized at run time" if self.generic else f"{self.packed_bytes} bytes"
        if self.generic and self.u is not None:
            unrolled = unrolled.replace(
                f"{self.u} unrolled", f"{self.u} unrolled for {_WINDOWS_TEXT}, else looped"
            )
        return (
            f"direct convolution {self.out.tensor} += {self.inp.tensor} * {self.wt.tensor}: "
            f"{self.lanes}-lane vectors over {self.f}, {self.x} in register blocks, "
            f"taps {taps or '-'} looped{unrolled}; filter packed per call ({packed})"
        )


def _plain(form: ir.AffineForm) -> str | None:
    """The variable of a subscript that is exactly one variable, else None."""
    if form.constant == 0 and len(form.coeffs) == 1 and form.coeffs[0][1] == 1:
        return form.coeffs[0][0]
    return None


def _match(
    stmt: PolyStatement,
    out: Operand,
    inp: Operand,
    wt: Operand,
    extent: Mapping[str, Size],
    lo: Mapping[str, Size],
) -> ConvPlan | None:
    """The plan of `out += inp * wt` with `wt` the filter, or None. Extents are ints (specialised)
    or size expressions (generic): a test on an extent that is not a constant is left out (the
    generic kernel is correct for every extent; only its speed depends on them)."""
    st = stmt.statement
    known = {v: _known(e) for v, e in extent.items()}
    outputs = tuple(st.indices)
    reductions = tuple(v for v in st.all_indices if v not in outputs)
    wt_vars = [_plain(f) for f in wt.forms]
    if None in wt_vars or len(set(wt_vars)) != len(wt_vars):
        return None
    # output variables of the filter: the output channel f (not in the input) and group
    # variables (also in the input: `Wt(g, f, c, kh, kw)` with `I(n, g, c, ..)`)
    channels = [v for v in wt_vars if v in outputs and not inp.uses(v)]
    groups = tuple(v for v in wt_vars if v in outputs and inp.uses(v))
    if len(channels) != 1:
        return None
    f = channels[0]
    taps_all = tuple(v for v in wt_vars if v != f and v not in groups)
    if set(taps_all) != set(reductions) or not taps_all or not all(inp.uses(t) for t in taps_all):
        return None
    if any(not inp.uses(v) for v in outputs if v != f):
        return None  # an output variable neither operand reads: not a convolution
    size_names = {n for form in inp.forms for n, _ in form.coeffs} - set(st.all_indices)
    if size_names:
        return None  # a subscript scaled by a size: leave it to the general path
    window = [
        form
        for form in inp.forms
        if any(form.coeff(v) for v in outputs)
        and any(form.coeff(t) and (known[t] is None or known[t] > 1) for t in taps_all)
    ]
    if not window:
        return None  # no window wider than one: a plain contraction (the GEMM path)
    xs = [v for v in outputs if v != f and any(form.coeff(v) for form in window)]
    x = xs[-1]  # the innermost window output: unit stride in NCHW and NHWC alike
    dims_x = [form for form in inp.forms if form.coeff(x)]
    if len(dims_x) != 1:
        return None
    if any(_above(known[t], known[x]) for t in taps_all if dims_x[0].coeff(t)):
        return None  # a window wider than the output (a weight gradient): the GEMM path
    partners = [t for t in taps_all if dims_x[0].coeff(t) and not _above(known[t], MAX_UNROLLED_TAP)]
    u = partners[-1] if partners else None
    taps = tuple(t for t in taps_all if t != u)
    bytes_ = st.rhs.dtype.bits // 8
    lanes = VECTOR_BYTES // bytes_
    if _above(lanes // 2, known[f]) or any(known[v] is not None and known[v] <= 0 for v in st.all_indices):
        return None  # too few channels to fill half a vector (or nothing to do)
    work = [known[v] for v in st.all_indices]
    if None not in work and math.prod(work) < MIN_CONTRACTION_WORK:
        return None
    inner = (f, x, *((u,) if u else ()), *taps)
    group_extents = tuple((v, extent[v]) for v in groups)
    return ConvPlan(
        stmt.name, out, inp, wt, f, x, u, taps,
        tuple(v for v in outputs if v not in (f, x)),
        tuple((v, lo[v]) for v in (*inner, *groups)), tuple((v, extent[v]) for v in inner), bytes_, 0,
        groups=group_extents,
    )  # fmt: skip


def _known(e: Size) -> int | None:
    """An extent's value where it is a constant (always in specialised plans), else None."""
    if isinstance(e, int):
        return e
    return int(e) if e.is_Integer else None


def _above(a: int | None, b: int | None) -> bool:
    """a > b, known to hold (False where either is unknown)."""
    return a is not None and b is not None and a > b


def _size_expr(e: sympy.Expr) -> Size:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else e


def plan_convolution(scop: Scop, stmt: PolyStatement, sizes: Mapping[str, int] | None) -> ConvPlan | None:
    """The direct-convolution plan of a body statement for these sizes, or None. `sizes` None
    plans the generic kernel: first values, trip counts and guard constants are then size
    expressions the kernel evaluates at run time."""
    if stmt.kind is not StatementKind.BODY or any(
        c.statement == stmt.name and c.dynamic_dims for c in scop.checks
    ):
        return None
    st = stmt.statement
    if stmt.projected is not None:
        return None  # already projected
    guard = None
    rhs = st.rhs
    if isinstance(rhs, ir.Select) and isinstance(rhs.if_false, ir.Const) and rhs.if_false.value == 0:
        guard, st = rhs.cond, replace(st, rhs=rhs.if_true)  # `cond ? I·W : 0`: padding
    found = _operands(st, descending=True)  # `h - kh`: a transposed convolution (an input gradient)
    if found is None:
        return None
    out, a, b = found
    if out.tensor in (a.tensor, b.tensor):
        return None
    if sizes is None:
        lo = {r.var: _size_expr(r.lo) for r in st.ranges}
        extent = {r.var: _size_expr(sympy.sympify(r.hi) - sympy.sympify(r.lo)) for r in st.ranges}
    else:
        lo = {r.var: compile_size_expr(r.lo)(sizes) for r in st.ranges}
        extent = {r.var: compile_size_expr(r.hi)(sizes) - lo[r.var] for r in st.ranges}
    found = _match(stmt, out, a, b, extent, lo) or _match(stmt, out, b, a, extent, lo)
    if found is None or scop.program.tensor(found.wt.tensor).role != "input":
        return None  # the filter is packed before the phase's loops: it must not change in a call
    found = replace(found, generic=sizes is None)
    if found.packed_bytes > MAX_PACKED_BYTES:
        return None  # one copy per thread: the GEMM path copies less
    if guard is None:
        return found
    values = {
        s.name: (ir.size_symbol(s.name) if sizes is None else int(sizes[s.name])) for s in scop.program.sizes
    }
    return _guarded(found, guard, values, set(st.all_indices))


def _conjuncts(cond: ir.Expr, sizes: Mapping[str, Size], variables: set[str]) -> list[Guard] | None:
    """An `&&` of affine comparisons as `Σ coeff·var + constant ≥ 0` over index variables (sizes
    substituted: their values, or their symbols in a generic plan), or None."""
    if isinstance(cond, ir.Binary) and cond.op == "&&":
        lhs, rhs = _conjuncts(cond.lhs, sizes, variables), _conjuncts(cond.rhs, sizes, variables)
        return None if lhs is None or rhs is None else lhs + rhs
    if not isinstance(cond, ir.Binary) or cond.op not in (">=", ">", "<=", "<", "=="):
        return None
    a, b = ir.affine_form(cond.lhs), ir.affine_form(cond.rhs)
    if a is None or b is None:
        return None
    diff: dict[str, int] = {}
    constant: Size = a.constant - b.constant
    for form, sign in ((a, 1), (b, -1)):
        for name, coeff in form.coeffs:
            if name in variables:
                diff[name] = diff.get(name, 0) + sign * coeff
            elif name in sizes:
                constant = _size_expr(constant + sign * coeff * sizes[name])
            else:
                return None
    up = tuple(sorted((n, c) for n, c in diff.items() if c))
    down = tuple((n, -c) for n, c in up)
    neg = _size_expr(-constant)
    match cond.op:  # lhs - rhs = up + constant
        case ">=":
            return [(up, constant)]
        case ">":
            return [(up, _size_expr(constant - 1))]
        case "<=":
            return [(down, neg)]
        case "<":
            return [(down, _size_expr(neg - 1))]
    return [(up, constant), (down, neg)]


def _guarded(
    plan: ConvPlan, cond: ir.Expr, sizes: Mapping[str, Size], variables: set[str]
) -> ConvPlan | None:
    """The plan with the padding guard split into conjuncts along x (and u) and conjuncts over the
    outer variables and looped taps; None if a conjunct mixes the two or reads anything else."""
    conjuncts = _conjuncts(cond, sizes, variables)
    if conjuncts is None:
        return None
    cols, rows = [], []
    along_x = {plan.x} | ({plan.u} if plan.u else set())
    per_tap = set(plan.outer) | set(plan.taps)
    for coeffs, constant in conjuncts:
        names = {n for n, _ in coeffs}
        if not names:
            if not isinstance(constant, int) or constant < 0:
                return None  # never true: no work (left to the general path)
        elif names <= along_x:
            cols.append((coeffs, constant))
        elif names <= per_tap:
            rows.append((coeffs, constant))
        else:
            return None
    return replace(plan, col_guards=tuple(cols), row_guards=tuple(rows))


def _project_conv(stmt: PolyStatement, plan: ConvPlan) -> PolyStatement:
    """The statement over its outer variables only (accesses: their unions over the rest). One
    call runs at every point of the outer box, whatever the extents of f, x and the taps: with no
    f or x it does nothing, with no taps it adds nothing (or, storing O because its zeroing was
    folded into it, zeroes O): see `contraction.project_call`."""
    reduced = (*((plan.u,) if plan.u else ()), *plan.taps)
    return project_call(stmt, [v for v, _ in plan.extent], reduced, plan.outer)


def plan_convolutions(
    scop: Scop, sizes: Mapping[str, int] | None, direct: bool = True
) -> tuple[Scop, dict[str, ContractionPlan], dict[str, ConvPlan]]:
    """The Scop with every contraction projected onto its outer loops, the GEMM plans and the
    direct-convolution plans (`direct` False: every contraction goes to the GEMM path, as
    `plan_contractions` does). Packed filters are laid out one after another in the workspace."""
    gemms: dict[str, ContractionPlan] = {}
    convs: dict[str, ConvPlan] = {}
    statements = []
    offset = 0
    for s in scop.statements:
        conv = plan_convolution(scop, s, sizes) if direct else None
        if conv is not None:
            conv = ConvPlan(**{**conv.__dict__, "offset": offset})
            offset += -(-conv.packed_bytes // 64) * 64
            convs[s.name] = conv
            statements.append(_project_conv(s, conv))
            continue
        plan = plan_contraction(scop, s, sizes)
        if plan is None:
            statements.append(s)
            continue
        gemms[s.name] = plan
        statements.append(_project(s, plan))
    if not gemms and not convs:
        return scop, gemms, convs
    stmts = tuple(statements)
    projected = Scop(scop.program, scop.params, stmts, scop.checks, compute_dependences(stmts, scop.params))
    return projected, gemms, convs


def workspace_bytes(convs: Mapping[str, ConvPlan]) -> int:
    """Per-thread scratch the packed filters take (each at its plan's offset)."""
    return max((-(-c.packed_bytes // 64) * 64 + c.offset for c in convs.values()), default=0)


def folded_inits(scop: Scop, phases: Sequence[Sequence[str]], convs: Mapping[str, ConvPlan]) -> set[int]:
    """Phases (given by their statements) that only zero the output of the direct convolution
    the next phase runs alone: it can store its sums instead of adding them to O. Each call
    covers every f and x at its outer point and reduces every tap, and the init and the
    convolution are one statement (the same output box), so the calls write each zeroed cell
    exactly once. In a generic plan (sizes unknown) the calls must also run for every size."""
    found = set()
    for n in range(len(phases) - 1):
        inits, body = phases[n], phases[n + 1]
        if len(inits) != 1 or len(body) != 1 or body[0] not in convs:
            continue
        init, stmt = scop.statement(inits[0]), scop.statement(body[0])
        if init.kind is not StatementKind.INIT or init.position != stmt.position:
            continue
        if convs[body[0]].generic and not calls_cover(init, stmt, (convs[body[0]].f, convs[body[0]].x)):
            continue  # a generic kernel: a call must run wherever the init zeroes, for every size
        found.add(n)
    return found
