"""lowering: a statement's ConvPlan → one call of its direct-convolution kernel at the current outer point.

The kernel and its filter packing are defined once per module (codegen/emit/conv_kernel.py,
conv_pack.py).
The packing runs once per call of the phase function that holds the convolution, at its entry,
into this thread's workspace: the filter is relaid out on every kernel call (a few hundred KiB at
most, against the convolution's own work), so a filter changed between calls is always seen.
"""

from __future__ import annotations

import llvmlite.ir as ll

from polyhedral.convolution import ConvPlan, workspace_bytes
from polyhedral.sizes import isl_param_name
from tensorlang.dtypes import ScalarType
from tensorlang.errors import InternalError

from ..emit import values as V
from ..emit.conv_kernel import ConvGeometry, define_conv
from ..emit.conv_pack import define_pack
from ..planning.plan import Extent
from .conv_generic_call import emit_generic_conv_call


def _strides(state, tensor: str) -> list[int]:
    """Row-major element strides (in the storage order of a relayout), as integers: the code is
    specialised. Planning keeps a convolution's tensors out of contraction and folding."""
    if tensor in state.contracted or tensor in getattr(state.plan, "folded", {}):
        raise InternalError(f"direct convolution of {tensor}, whose storage is contracted or folded")
    rank = state.program.tensor(tensor).rank
    strides = [0] * rank
    running = 1
    for d in reversed(state.layouts.get(tensor, tuple(range(rank)))):
        strides[d] = running
        extent = state.params[Extent(tensor, d)]
        if not isinstance(extent, ll.Constant):
            raise InternalError(f"direct convolution of {tensor} without constant sizes")
        running *= int(extent.constant)
    return strides


def _stride(op, strides: list[int], var: str | None) -> int:
    """Elements the operand's address moves per step of `var`."""
    return 0 if var is None else sum(f.coeff(var) * s for f, s in zip(op.forms, strides))


def geometry(state, conv: ConvPlan) -> ConvGeometry:
    i, w, o = (_strides(state, op.tensor) for op in (conv.inp, conv.wt, conv.out))
    return ConvGeometry(
        itemsize=conv.itemsize,
        channels=conv.trips(conv.f),
        positions=conv.trips(conv.x),
        window=conv.trips(conv.u),
        taps=tuple(conv.trips(t) for t in conv.taps),
        in_x=_stride(conv.inp, i, conv.x),
        in_u=_stride(conv.inp, i, conv.u),
        in_taps=tuple(_stride(conv.inp, i, t) for t in conv.taps),
        out_f=_stride(conv.out, o, conv.f),
        out_x=_stride(conv.out, o, conv.x),
        wt_f=_stride(conv.wt, w, conv.f),
        wt_u=_stride(conv.wt, w, conv.u),
        wt_taps=tuple(_stride(conv.wt, w, t) for t in conv.taps),
        col_guards=tuple(_col_guard(conv, g) for g in conv.col_guards),
        row_guards=tuple(_row_guard(conv, g) for g in conv.row_guards),
        outer=len(conv.outer) if conv.row_guards else 0,
        groups=tuple(n for _, n in conv.groups),
        wt_groups=tuple(_stride(conv.wt, w, v) for v, _ in conv.groups),
    )


def _col_guard(conv: ConvPlan, guard) -> tuple[int, int, int]:
    """(cx, cu, c): cx·position + cu·u + c ≥ 0, positions and u counted from their first value."""
    coeffs, constant = dict(guard[0]), guard[1]
    first = dict(conv.lo)
    cx, cu = coeffs.get(conv.x, 0), coeffs.get(conv.u, 0) if conv.u is not None else 0
    return cx, cu, constant + cx * first[conv.x] + (cu * first[conv.u] if conv.u is not None else 0)


def _row_guard(conv: ConvPlan, guard) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(outer coefficients, tap coefficients, c), taps counted from their first value."""
    coeffs, constant = dict(guard[0]), guard[1]
    first = dict(conv.lo)
    taps = tuple(coeffs.get(t, 0) for t in conv.taps)
    return (
        tuple(coeffs.get(v, 0) for v in conv.outer),
        taps,
        constant + sum(c * first[t] for c, t in zip(taps, conv.taps)),
    )


def _pointer(
    state, b: ll.IRBuilder, op, values: dict[str, ll.Value], strides: list[int], t: ll.Type
) -> ll.Value:
    """The operand's element at `values` (the outer point; f, x and the taps at their first value)."""
    offset = ll.Constant(V.I64, 0)
    for form, stride in zip(op.forms, strides):
        sub = ll.Constant(V.I64, form.constant)
        for name, coeff in form.coeffs:
            value = values[name] if name in values else state.params[isl_param_name(name)]
            sub = b.add(sub, b.mul(value, ll.Constant(V.I64, coeff), flags=["nsw"]), flags=["nsw"])
        offset = b.add(offset, b.mul(sub, ll.Constant(V.I64, stride), flags=["nsw"]), flags=["nsw"])
    return b.bitcast(b.gep(state.pointers[op.tensor], [offset]), t.as_pointer())


def emit_conv_call(state, conv: ConvPlan, dtype: ScalarType) -> None:
    """O[outer, all f, all x] += Σ_taps I·W at the current outer point (the leaf being lowered).
    `state` is the kernel's lowering (LoweringState with the statement jobs)."""
    if conv.generic:  # Options(specialize=False): sizes and strides known at run time
        emit_generic_conv_call(state, conv, state.gemm_overwrite)
        return
    b = state.b
    module = state.module
    g = geometry(state, conv)
    t = g.element
    overwrite = state.gemm_overwrite  # the phase's init is folded in: store, do not add
    kernel_name = f"tl_conv_{conv.statement}{'_store' if overwrite else ''}"
    pack_name = f"tl_conv_pack_{conv.statement}"
    kernel = module.globals.get(kernel_name) or define_conv(module, kernel_name, g, overwrite)
    pack = module.globals.get(pack_name) or define_pack(module, pack_name, g)
    first = {v: ll.Constant(V.I64, lo) for v, lo in conv.lo}
    group_vars = {v for v, _ in conv.groups}  # outer variables: their values at this point
    values = {**dict(state.leaf_statement.indices), **{v: c for v, c in first.items() if v not in group_vars}}
    # the packed filter: at the end of the workspace, after GEMM panels and contracted slices
    base = state.plan.workspace_bytes - workspace_bytes(state.plan.convolutions) + conv.offset
    fn = b.block.parent
    packed_in = getattr(state, "_conv_packed", set())
    state._conv_packed = packed_in
    entry = ll.IRBuilder()
    entry.position_at_start(fn.entry_basic_block)
    wp = entry.bitcast(entry.gep(state.workspace, [ll.Constant(V.I64, base)]), t.as_pointer())
    if (fn.name, conv.statement) not in packed_in:  # once per phase call, before its loops
        packed_in.add((fn.name, conv.statement))
        w = _pointer(state, entry, conv.wt, first, _strides(state, conv.wt.tensor), t)
        entry.call(pack, [w, wp])
    if b.block is fn.entry_basic_block:  # instructions went in before the builder's position
        b.position_at_end(b.block)
    i = _pointer(state, b, conv.inp, values, _strides(state, conv.inp.tensor), t)
    o = _pointer(state, b, conv.out, values, _strides(state, conv.out.tensor), t)
    outer = [values[v] for v in conv.outer] if conv.row_guards else []
    group = ll.Constant(V.I64, 0)  # this point's group: its packed filter
    for v, n in conv.groups:
        index = b.sub(state.leaf_statement.indices[v], first[v])
        group = b.add(b.mul(group, ll.Constant(V.I64, n)), index)
    wp_group = b.gep(wp, [b.mul(group, ll.Constant(V.I64, g.group_elements))]) if conv.groups else wp
    b.call(kernel, [i, wp_group, o, *outer])
