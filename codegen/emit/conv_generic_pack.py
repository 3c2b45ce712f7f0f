"""emit: run-time loops and index arithmetic of the generic direct convolution → LLVM IR, and its filter packing.

Helpers of codegen/emit/conv_generic.py: loops whose trip counts are values (with values carried
around them), conditions, and `define_generic_pack`, which lays the filter out
[groups][f-block][taps][u][lanes] (zero past the last channel) with every count and stride an
argument.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir

from .conv_kernel import counted
from .gemm_pack import c64, define_function, gep, load, store
from .values import F32, F64, I1, I64


def nest(b: ir.IRBuilder, counts: list, carried: list, body: Callable, ivs=()) -> list:
    if not counts:
        return body(ivs, carried)
    return counted(
        b, counts[0], carried, lambda i, vals: nest(b, counts[1:], vals, body, (*ivs, i)), f"g{len(ivs)}"
    )


def when(b: ir.IRBuilder, cond: ir.Value, emit: Callable[[], None], name: str) -> None:
    """`if (cond) emit()`."""
    then = b.append_basic_block(f"{name}.then")
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(cond, then, done)
    b.position_at_end(then)
    emit()
    b.branch(done)
    b.position_at_end(done)


def dot(b: ir.IRBuilder, values, coeffs) -> ir.Value:
    total = c64(0)
    for v, c in zip(values, coeffs):
        if c:
            total = b.add(total, b.mul(v, c64(c)))
    return total


def positive(b: ir.IRBuilder, values: list) -> ir.Value:
    ok = ir.Constant(I1, 1)
    for v in values:
        ok = b.and_(ok, b.icmp_signed(">", v, c64(0)))
    return ok


def define_generic_pack(module: ir.Module, name: str, itemsize: int, taps: int, groups: int) -> ir.Function:
    """`pack(w, wp, F, wt_f, U, wt_u, T.., wt_t.., G.., wt_g..)`: wp[groups][fb][taps][u][lane] =
    w[groups, f = fb·lanes + lane, taps, u], 0 past the last f; nothing when a count is not
    positive or wp is null (its allocation failed: the call reports it)."""
    t = F32 if itemsize == 4 else F64
    lanes = 64 // itemsize
    names = ["F", "wt_f", "U", "wt_u", *(f"T{k}" for k in range(taps)), *(f"wt_t{k}" for k in range(taps))]
    names += [*(f"G{k}" for k in range(groups)), *(f"wt_g{k}" for k in range(groups))]
    tp = t.as_pointer()
    fn = define_function(module, name, ir.VoidType(), [tp, tp] + [I64] * len(names), ["w", "wp", *names])
    w, wp, nf, wt_f, nu, wt_u, *rest = fn.args
    counts_t, wt_t = rest[:taps], rest[taps : 2 * taps]
    counts_g, wt_g = rest[2 * taps : 2 * taps + groups], rest[2 * taps + groups :]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fblocks = b.sdiv(b.add(nf, c64(lanes - 1)), c64(lanes))
    counts = [*counts_g, fblocks, *counts_t, nu]
    work = b.append_basic_block("work")
    done = b.append_basic_block("done")
    live = b.icmp_unsigned("!=", b.ptrtoint(wp, I64), c64(0))
    b.cbranch(b.and_(live, positive(b, [nf, nu, *counts_t, *counts_g])), work, done)
    b.position_at_end(work)

    def body(ivs, _):
        gs, (fb, *ts, u) = ivs[:groups], ivs[groups:]
        dst = c64(0)
        for i, count in zip(ivs, counts):
            dst = b.add(b.mul(dst, count), i)
        dst = b.mul(dst, c64(lanes))
        base = b.add(b.add(strided_sum(b, gs, wt_g), strided_sum(b, ts, wt_t)), b.mul(u, wt_u))
        f0 = b.mul(fb, c64(lanes))
        for lane in range(lanes):  # constant lanes: straight-line stores into one vector
            f = b.add(f0, c64(lane))
            inside = b.icmp_signed("<", f, nf)
            src = b.select(inside, b.add(base, b.mul(f, wt_f)), c64(0))  # padding lanes read w[0]
            value = b.select(inside, load(b, gep(b, w, src), itemsize), ir.Constant(t, 0.0))
            store(b, value, gep(b, wp, b.add(dst, c64(lane))), itemsize)
        return []

    nest(b, counts, [], body)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def strided_sum(b: ir.IRBuilder, ivs, strides) -> ir.Value:
    """Σ ivs[k]·strides[k] (run-time strides)."""
    total = c64(0)
    for i, s in zip(ivs, strides):
        total = b.add(total, b.mul(i, s))
    return total


def imin(b: ir.IRBuilder, x, y) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def imax(b: ir.IRBuilder, x, y) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def floor_div(b: ir.IRBuilder, a, d: int) -> ir.Value:
    """⌊a / d⌋ for a constant d > 0 (sdiv truncates towards zero)."""
    q = b.sdiv(a, c64(d))
    below = b.and_(b.icmp_signed("<", a, c64(0)), b.icmp_signed("!=", b.srem(a, c64(d)), c64(0)))
    return b.sub(q, b.zext(below, I64))
