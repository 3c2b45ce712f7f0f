"""emit: a ConvGeometry → the LLVM IR of its filter packing, wp[groups][f-block][taps][u][lane] = w[groups, f, taps, u].

The direct convolution (conv_kernel.py) reads one aligned weight vector per (f-block, tap): the
filter is relaid out with the output channels as lanes, zero past the last channel. Element by
element that is a gather along f (a stride of C·KH·KW elements in an NCHW filter): 0.83 ms of a
1.79 ms call of a 512-channel 3×3 layer on 7×7 outputs, whose filter is 9.4 MB. Where the filter's
taps and window are one contiguous run per channel (NCHW `Wt(f, c, kh, kw)`, and any layout whose
looped taps and window tap are row-major with unit stride), a block of `lanes` channels is a
lanes × L matrix (L = taps · window) and its packed form is the transpose: `lanes` vector loads,
a transpose in registers, `lanes` vector stores per `lanes` columns; the last columns with
masked loads, the channels past the last as zero vectors. Other layouts keep the element loop.
"""

from __future__ import annotations

import llvmlite.ir as ir

from .conv_kernel import ConvGeometry, _nest, _offset, counted
from .gemm_pack import _transpose, c64, declare_intrinsic, define_function, gep, load, store
from .values import I1, I32


def define_pack(module: ir.Module, name: str, g: ConvGeometry) -> ir.Function:
    """`pack(w, wp)`: wp[groups][fb][taps][u][lane] = w[groups, f = fb·lanes + lane, taps, u], 0 past
    the last f."""
    tp = g.element.as_pointer()
    fn = define_function(module, name, ir.VoidType(), [tp, tp], ["w", "wp"])
    w, wp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if contiguous_taps(g):
        _pack_by_transposes(module, b, g, w, wp)
    else:
        _pack_by_elements(b, g, w, wp)
    b.ret_void()
    return fn


def contiguous_taps(g: ConvGeometry) -> bool:
    """Whether each channel's taps and window tap are one run of unit stride, in the packed order."""
    expected = 1
    for count, stride in reversed(list(zip((*g.taps, g.window), (*g.wt_taps, g.wt_u)))):
        if count > 1 and stride != expected:
            return False
        expected *= count
    return True


def _pack_by_elements(b: ir.IRBuilder, g: ConvGeometry, w, wp) -> None:
    counts = (*g.groups, g.f_blocks, *g.taps, g.window, g.lanes)
    ngroups = len(g.groups)

    def body(ivs, _):
        groups, (fb, *taps, u, lane) = ivs[:ngroups], ivs[ngroups:]
        f = b.add(b.mul(fb, c64(g.lanes)), lane)
        src = b.add(b.mul(f, c64(g.wt_f)), b.add(_offset(b, taps, g.wt_taps), b.mul(u, c64(g.wt_u))))
        src = b.add(src, _offset(b, groups, g.wt_groups))
        inside = b.icmp_signed("<", f, c64(g.channels))
        safe = b.select(inside, src, c64(0))  # the padding lanes read w[0] and store zero
        value = b.select(inside, load(b, gep(b, w, safe), g.itemsize), ir.Constant(g.element, 0.0))
        store(b, value, gep(b, wp, _flat(b, ivs, counts)), g.itemsize)
        return []

    _nest(b, counts, [], body)


def _pack_by_transposes(module: ir.Module, b: ir.IRBuilder, g: ConvGeometry, w, wp) -> None:
    lanes, run = g.lanes, g.tap_count * g.window  # L: one channel's packed elements
    vty = ir.VectorType(g.element, lanes)
    mask_ty = ir.VectorType(I1, lanes)
    masked_load = declare_intrinsic(
        module, f"llvm.masked.load.{g.suffix}.p0", vty, [vty.as_pointer(), I32, mask_ty, vty]
    )
    zero = ir.Constant(vty, None)
    whole, rest = divmod(run, lanes)

    def columns(src, dst, valid: int, first, width: int) -> list:
        """Columns first .. first + width of a block whose first `valid` rows are channels
        (no values carried: `counted`'s body)."""
        rows = []
        for r in range(lanes):
            if r >= valid:
                rows.append(zero)
                continue
            at = b.bitcast(gep(b, src, b.add(c64(r * g.wt_f), first)), vty.as_pointer())
            if width == lanes:
                rows.append(load(b, at, g.itemsize))
            else:
                mask = ir.Constant(mask_ty, [int(e < width) for e in range(lanes)])
                rows.append(b.call(masked_load, [at, ir.Constant(I32, g.itemsize), mask, zero]))
        for i, column in enumerate(_transpose(b, rows)[:width]):
            at = gep(b, dst, b.mul(b.add(first, c64(i)), c64(lanes)))
            store(b, column, b.bitcast(at, vty.as_pointer()), g.itemsize)
        return []

    def block(src, dst, valid: int) -> None:
        if whole:
            counted(b, whole, [], lambda q, _: columns(src, dst, valid, b.mul(q, c64(lanes)), lanes), "col")
        if rest:
            columns(src, dst, valid, c64(whole * lanes), rest)

    full, partial = divmod(g.channels, lanes)

    def group_body(ivs, _):
        base = _offset(b, ivs, g.wt_groups)
        group_dst = b.mul(_flat(b, ivs, g.groups), c64(g.group_elements))
        if full:

            def one(fb, _):
                src = gep(b, w, b.add(base, b.mul(fb, c64(lanes * g.wt_f))))
                block(src, gep(b, wp, b.add(group_dst, b.mul(fb, c64(run * lanes)))), lanes)
                return []

            counted(b, full, [], one, "fb")
        if partial:
            src = gep(b, w, b.add(base, c64(full * lanes * g.wt_f)))
            block(src, gep(b, wp, b.add(group_dst, c64(full * run * lanes))), partial)
        return []

    _nest(b, g.groups, [], group_body)


def _flat(b: ir.IRBuilder, ivs, counts) -> ir.Value:
    """The row-major index of ivs in a grid of `counts`."""
    index = c64(0)
    for i, count in zip(ivs, counts):
        index = b.add(b.mul(index, c64(count)), i)
    return index
