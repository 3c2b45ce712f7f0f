"""Probe: does software-pipelining softmax's rows overlap the exp's arithmetic with the stores?

"plain" is the loop nest tensorlang generated for softmax before row pipelining (per row: max, exp and sum into a row
buffer, divide into the output); "piped" divides row n in the same loop that computes the exp of
row n + 1 (two row buffers). Both are hand-written LLVM IR built with tensorlang's own exp, JIT
and row prefetching; float32 4096×1024, one thread, steady-state medians in rotating order.
It measured the gain before the compiler did this itself (codegen/pipeline.py; README.md, Findings).

Run: python papers/2026-11-fusion/probe_row_pipelining.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import paperbench as pb  # noqa: E402, I001 - first: unsets the OpenBLAS presets before NumPy is imported

import ctypes  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import llvmlite.binding as llvm  # noqa: E402
import llvmlite.ir as ir  # noqa: E402
import numpy as np  # noqa: E402

from codegen.emit.values import float_minmax  # noqa: E402
from codegen.emit.vecmath import emit_vecmath  # noqa: E402
from codegen.lowering.jit import _lock, new_target_machine, optimise  # noqa: E402

F, I64, I32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
I8P = ir.IntType(8).as_pointer()


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def counted_loop(b: ir.IRBuilder, fn: ir.Function, n, body, name: str) -> None:
    """for (i = 0; i < n; i++) body(i)"""
    pre = b.block
    head, blk, done = (fn.append_basic_block(name + s) for s in (".head", ".body", ".done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(c64(0), pre)
    b.cbranch(b.icmp_signed("<", i, n), blk, done)
    b.position_at_end(blk)
    body(i)
    nxt = b.add(i, c64(1), flags=["nsw"])
    i.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


def build(mod: ir.Module, name: str, pipelined: bool) -> None:
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [F.as_pointer()] * 3 + [I64, I64]), name)
    x, out, ebuf, n_rows, d = fn.args
    for a in (x, out, ebuf):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    mx_slot, sum_slot = b.alloca(F), b.alloca(F)
    prefetch = mod.globals.get("llvm.prefetch.p0") or ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [I8P, I32, I32, I32]), "llvm.prefetch.p0"
    )

    def prefetch_row(row) -> None:
        base = b.mul(row, d)

        def line(j):
            p = b.bitcast(b.gep(x, [b.add(base, b.mul(j, c64(16)))]), I8P)
            b.call(prefetch, [p, ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])

        counted_loop(b, fn, b.udiv(d, c64(16)), line, "pf")

    def row_max(row):
        base = b.mul(row, d)
        b.store(ir.Constant(F, float("-inf")), mx_slot)
        counted_loop(
            b, fn, d,
            lambda j: b.store(float_minmax(b, "max", b.load(mx_slot), b.load(b.gep(x, [b.add(base, j)]))), mx_slot),
            "max",
        )  # fmt: skip
        return b.load(mx_slot)

    def exp_step(row_base, m, buf, j) -> None:
        e = emit_vecmath(b, "exp", [b.fsub(b.load(b.gep(x, [b.add(row_base, j)])), m)])
        b.store(e, b.gep(ebuf, [b.add(buf, j)]))
        b.store(b.fadd(b.load(sum_slot), e, flags=["reassoc"]), sum_slot)

    def divide_step(row_base, buf, s, j) -> None:
        b.store(b.fdiv(b.load(b.gep(ebuf, [b.add(buf, j)])), s), b.gep(out, [b.add(row_base, j)]))

    def exp_row(row, buf) -> None:
        m = row_max(row)
        b.store(ir.Constant(F, 0.0), sum_slot)
        counted_loop(b, fn, d, lambda j: exp_step(b.mul(row, d), m, buf, j), "exp")

    if not pipelined:

        def plain_row(row):
            prefetch_row(b.add(row, c64(1)))
            exp_row(row, c64(0))
            s = b.load(sum_slot)
            counted_loop(b, fn, d, lambda j: divide_step(b.mul(row, d), c64(0), s, j), "div")

        counted_loop(b, fn, n_rows, plain_row, "row")
    else:
        exp_row(c64(0), c64(0))

        def piped_row(row):
            this_buf = b.mul(b.and_(row, c64(1)), d)
            next_buf = b.mul(b.and_(b.add(row, c64(1)), c64(1)), d)
            s = b.load(sum_slot)  # row `row`'s sum, finished in the previous iteration
            base = b.mul(row, d)
            with b.if_else(b.icmp_signed("<", b.add(row, c64(1)), n_rows)) as (then, last):
                with then:
                    prefetch_row(b.add(row, c64(2)))
                    m = row_max(b.add(row, c64(1)))
                    next_base = b.mul(b.add(row, c64(1)), d)
                    b.store(ir.Constant(F, 0.0), sum_slot)

                    def fused(j):
                        exp_step(next_base, m, next_buf, j)
                        divide_step(base, this_buf, s, j)

                    counted_loop(b, fn, d, fused, "fused")
                with last:
                    counted_loop(b, fn, d, lambda j: divide_step(base, this_buf, s, j), "div")

        counted_loop(b, fn, n_rows, piped_row, "row")
    b.ret_void()


def main() -> None:
    print(pb.env_note(), flush=True)
    mod = ir.Module("probe")
    build(mod, "piped", True)
    build(mod, "plain", False)
    with _lock:
        ref = optimise(mod)
        engine = llvm.create_mcjit_compiler(ref, new_target_machine())
        engine.finalize_object()
    sig = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int64, ctypes.c_int64)
    fns = {k: sig(engine.get_function_address(k)) for k in ("plain", "piped")}
    n, d = 4096, 1024
    x = np.random.default_rng(0).random((n + 4, d), dtype=np.float32)  # rows past n: prefetched only
    ebuf = np.empty(2 * d, np.float32)

    def run(f):
        o = np.empty((n, d), np.float32)
        f(x.ctypes.data, o.ctypes.data, ebuf.ctypes.data, n, d)
        return o

    xs = x[:n]
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    for k, f in fns.items():
        assert np.allclose(run(f), want, rtol=1e-5, atol=1e-9), k
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(16):
        for k in keys[r % 2 :] + keys[: r % 2]:
            for i in range(5):
                t0 = time.perf_counter()
                run(fns[k])
                if i:
                    times[k].append(time.perf_counter() - t0)
    for k, v in times.items():
        print(f"{k}: {statistics.median(v) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
