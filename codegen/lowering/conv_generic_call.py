"""lowering: a generic ConvPlan (size expressions) → its filter packed at the phase's entry and one kernel call per outer point.

The generic kernel's direct convolution (codegen/emit/conv_generic.py) takes its sizes and
strides as arguments, evaluated here from the kernel's size parameters. The packed filter's size
depends on the sizes, so it is not part of the fixed per-thread workspace: the phase function
allocates it at its entry (malloc, 64-byte aligned by hand), packs the filter into it once per
phase call, as the specialised code does, and frees it before each of its returns
(`release_conv_buffers`, run once the module's phases are emitted). A failed allocation is
reported by the call as ERROR_MEMORY. The window width picks the kernel at run time: one
unrolled function per width in GENERIC_WINDOWS, another that loops over the window tap.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ll

from polyhedral.convolution import GENERIC_WINDOWS, ConvPlan
from polyhedral.sizes import isl_param_name

from ..emit import values as V
from ..emit.conv_generic import GenericConv, define_generic_conv
from ..emit.conv_generic_pack import define_generic_pack
from ..planning.plan import Extent
from .abi import require
from .status import ERROR_MEMORY


def _c(v: int) -> ll.Constant:
    return ll.Constant(V.I64, v)


@dataclass
class _Prepared:
    """What a phase function computed at its entry for one convolution."""

    raw: ll.Value  # i8*: the allocation (null if it failed), freed before every return
    wp: ll.Value  # T*: the packed filter, 64-byte aligned
    nbytes: ll.Value
    first: dict[str, ll.Value]  # first value of f, x, u, the taps and the groups
    trips: dict[str, ll.Value]  # trip counts of f, x, u, the taps and the groups
    strides: dict[str, list[ll.Value]]  # tensor → element stride of each dimension


def _value(state, b: ll.IRBuilder, expr) -> ll.Value:
    """A size expression's value at `b` (the lowering's range_bound emits at state.b)."""
    if isinstance(expr, int):
        return _c(expr)
    saved = state.b
    state.b = b
    try:
        return state.range_bound(expr)
    finally:
        state.b = saved


def _strides(state, b: ll.IRBuilder, tensor: str) -> list[ll.Value]:
    """Row-major element strides from the run-time extents (a generic plan has no relayouts)."""
    rank = state.program.tensor(tensor).rank
    strides: list[ll.Value] = [_c(1)] * rank
    running: ll.Value = _c(1)
    for d in reversed(range(rank)):
        strides[d] = running
        running = b.mul(running, state.params[Extent(tensor, d)], flags=["nsw"])
    return strides


def _step(op, strides: list[ll.Value], var: str | None, b: ll.IRBuilder) -> ll.Value:
    """Elements the operand's address moves per step of `var`."""
    total: ll.Value = _c(0)
    if var is None:
        return total
    for form, stride in zip(op.forms, strides):
        if form.coeff(var):
            total = b.add(total, b.mul(stride, _c(form.coeff(var))))
    return total


def _pointer(state, b: ll.IRBuilder, op, values: dict[str, ll.Value], strides, t: ll.Type) -> ll.Value:
    """The operand's element at `values` (sizes read from the kernel's parameters)."""
    offset: ll.Value = _c(0)
    for form, stride in zip(op.forms, strides):
        sub: ll.Value = _c(form.constant)
        for name, coeff in form.coeffs:
            value = values[name] if name in values else state.params[isl_param_name(name)]
            sub = b.add(sub, b.mul(value, _c(coeff), flags=["nsw"]), flags=["nsw"])
        offset = b.add(offset, b.mul(sub, stride, flags=["nsw"]), flags=["nsw"])
    return b.bitcast(b.gep(state.pointers[op.tensor], [offset]), t.as_pointer())


def _unit(op, rank: int, var: str) -> bool:
    """`var` moves the operand by one element: it is exactly the last subscript, alone."""
    dims = [d for d, form in enumerate(op.forms) if form.coeff(var)]
    return dims == [rank - 1] and op.forms[-1].coeff(var) == 1


def _prepare(state, conv: ConvPlan, t: ll.Type) -> _Prepared:
    """At the phase function's entry: sizes, strides, the allocation and the packing."""
    fn = state.b.block.parent
    b = ll.IRBuilder()
    b.position_at_start(fn.entry_basic_block)
    first = {v: _value(state, b, lo) for v, lo in conv.lo}
    trips = {v: _value(state, b, n) for v, n in (*conv.extent, *conv.groups)}
    strides = {op.tensor: _strides(state, b, op.tensor) for op in (conv.inp, conv.wt, conv.out)}
    lanes = conv.lanes
    window = trips[conv.u] if conv.u is not None else _c(1)
    elements = b.mul(b.sdiv(b.add(trips[conv.f], _c(lanes - 1)), _c(lanes)), _c(lanes))
    for count in (*(trips[v] for v in (*conv.taps, *(g for g, _ in conv.groups))), window):
        # a count below zero is an empty range: nothing to pack (the pack tests every count)
        elements = b.mul(elements, b.select(b.icmp_signed("<", count, _c(0)), _c(0), count))
    elements = b.select(b.icmp_signed("<", elements, _c(0)), _c(0), elements)
    nbytes = b.add(b.mul(elements, _c(conv.itemsize)), _c(64))
    module = state.module
    malloc = module.globals.get("malloc") or ll.Function(
        module, ll.FunctionType(V.I8.as_pointer(), [V.I64]), name="malloc"
    )
    raw = b.call(malloc, [nbytes])
    aligned = b.and_(b.add(b.ptrtoint(raw, V.I64), _c(63)), _c(-64))  # null stays null
    wp = b.inttoptr(aligned, t.as_pointer())
    wt = conv.wt
    w = _pointer(state, b, wt, first, strides[wt.tensor], t)
    s = strides[wt.tensor]
    groups = [g for g, _ in conv.groups]
    pack_name = f"tl_convg_pack_{conv.statement}"
    pack = module.globals.get(pack_name) or define_generic_pack(
        module, pack_name, conv.itemsize, len(conv.taps), len(groups)
    )
    b.call(
        pack,
        [
            w, wp, trips[conv.f], _step(wt, s, conv.f, b), window, _step(wt, s, conv.u, b),
            *(trips[v] for v in conv.taps), *(_step(wt, s, v, b) for v in conv.taps),
            *(trips[v] for v in groups), *(_step(wt, s, v, b) for v in groups),
        ],
    )  # fmt: skip
    if state.b.block is fn.entry_basic_block:  # instructions went in before the builder's position
        state.b.position_at_end(state.b.block)
    return _Prepared(raw, wp, nbytes, first, trips, strides)


def emit_generic_conv_call(state, conv: ConvPlan, overwrite: bool) -> None:
    """O[outer, all f, all x] += Σ_taps I·W at the current outer point, sizes known at run time."""
    b = state.b
    t = V.F32 if conv.itemsize == 4 else V.F64
    fn = b.block.parent
    prepared = getattr(state, "_conv_generic", {})
    state._conv_generic = prepared
    key = (fn.name, conv.statement)
    if key not in prepared:
        prepared[key] = _prepare(state, conv, t)
    p = prepared[key]
    null = ll.Constant(V.I8.as_pointer(), None)
    require(b, state.error_ptr, b.icmp_unsigned("!=", p.raw, null), ERROR_MEMORY, (p.nbytes,))
    group_vars = {v for v, _ in conv.groups}
    indices = dict(state.leaf_statement.indices)
    values = {**indices, **{v: c for v, c in p.first.items() if v not in group_vars}}
    i = _pointer(state, b, conv.inp, values, p.strides[conv.inp.tensor], t)
    o = _pointer(state, b, conv.out, values, p.strides[conv.out.tensor], t)
    wp = p.wp
    if conv.groups:  # this point's group: its packed filter
        group: ll.Value = _c(0)
        for v, _ in conv.groups:
            group = b.add(b.mul(group, p.trips[v]), b.sub(indices[v], p.first[v]))
        per_group = b.mul(b.sdiv(b.add(p.trips[conv.f], _c(conv.lanes - 1)), _c(conv.lanes)), _c(conv.lanes))
        for v in conv.taps:
            per_group = b.mul(per_group, p.trips[v])
        per_group = b.mul(per_group, p.trips[conv.u] if conv.u is not None else _c(1))
        wp = b.gep(wp, [b.mul(group, per_group)])
    _dispatch(state, conv, p, i, wp, o, values, overwrite)


def _dispatch(state, conv: ConvPlan, p: _Prepared, i, wp, o, values, overwrite: bool) -> None:
    """One kernel call: the function unrolled for the window's width, else the looped one."""
    b = state.b
    inp, out = conv.inp, conv.out
    si, so = p.strides[inp.tensor], p.strides[out.tensor]
    x_dim = next(d for d, form in enumerate(inp.forms) if form.coeff(conv.x))
    in_cx = inp.forms[x_dim].coeff(conv.x)
    # u unrolled only where it moves the input along x's dimension alone (a constant multiple of S)
    u_along_x = conv.u is not None and all(
        form.coeff(conv.u) == 0 for d, form in enumerate(inp.forms) if d != x_dim
    )
    rank = state.program.tensor(out.tensor).rank
    first = dict(p.first)
    col = [(dict(c).get(conv.x, 0), dict(c).get(conv.u, 0) if conv.u else 0, k) for c, k in conv.col_guards]
    row = [(tuple(dict(c).get(v, 0) for v in conv.outer), tuple(dict(c).get(v, 0) for v in conv.taps), k)
           for c, k in conv.row_guards]  # fmt: skip
    col_c = []
    for cx, cu, k in col:
        c = b.add(_value(state, b, k), b.mul(first[conv.x], _c(cx)))
        col_c.append(b.add(c, b.mul(first[conv.u], _c(cu))) if conv.u is not None else c)
    row_c = []
    for _, tc, k in row:
        c = _value(state, b, k)
        for v, coeff in zip(conv.taps, tc):
            c = b.add(c, b.mul(first[v], _c(coeff)))
        row_c.append(c)
    outer = [values[v] for v in conv.outer] if conv.row_guards else []

    def call(window: int, looped_u: bool) -> None:
        taps = [*conv.taps, conv.u] if looped_u else list(conv.taps)
        g = GenericConv(
            itemsize=conv.itemsize,
            window=window,
            taps=len(taps),
            in_cx=in_cx,
            in_cu=0 if looped_u or conv.u is None else inp.forms[x_dim].coeff(conv.u),
            out_f_unit=_unit(out, rank, conv.f),
            out_x_unit=_unit(out, rank, conv.x),
            col_guards=tuple((cx, cu) for cx, cu, _ in col),
            row_guards=tuple((oc, tc + ((0,) if looped_u else ())) for oc, tc, _ in row),
            outer=len(outer),
            looped_u=looped_u and bool(col),
        )
        name = (
            f"tl_convg_{conv.statement}_{'loop' if looped_u else f'u{window}'}{'_store' if overwrite else ''}"
        )
        kernel = state.module.globals.get(name) or define_generic_conv(state.module, name, g, overwrite)
        args = [
            i, wp, o, p.trips[conv.f], p.trips[conv.x], si[x_dim],
            _step(out, so, conv.f, b), _step(out, so, conv.x, b),
            *(p.trips[v] for v in taps), *(_step(inp, si, v, b) for v in taps),
            *outer, *row_c, *col_c,
        ]  # fmt: skip
        b.call(kernel, args)

    if conv.u is None:
        call(1, False)
        return
    if not u_along_x:
        call(1, True)
        return
    done = b.append_basic_block("conv.done")
    other = b.append_basic_block("conv.looped")
    switch = b.switch(p.trips[conv.u], other)
    for width in GENERIC_WINDOWS:
        case = b.append_basic_block(f"conv.u{width}")
        switch.add_case(_c(width), case)
        b.position_at_end(case)
        call(width, False)
        b.branch(done)
    b.position_at_end(other)
    call(1, True)
    b.branch(done)
    b.position_at_end(done)


def release_conv_buffers(state) -> None:
    """Free each phase function's packed filters before every return it has (run once all
    phases are emitted)."""
    prepared = getattr(state, "_conv_generic", {})
    if not prepared:
        return
    module = state.module
    free = module.globals.get("free") or ll.Function(
        module, ll.FunctionType(ll.VoidType(), [V.I8.as_pointer()]), name="free"
    )
    for (name, _), p in prepared.items():
        fn = module.get_global(name)  # the function that allocated it (a phase's, whatever emits it)
        for block in fn.blocks:
            term = block.instructions[-1] if block.is_terminated else None
            if isinstance(term, ll.Ret):
                b = ll.IRBuilder(block)
                b.position_before(term)
                b.call(free, [p.raw])
