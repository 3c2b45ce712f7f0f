"""emit: a plain-loop GEMM for small run-time extents (C += A·B, any strides) → LLVM IR.

A generic kernel does not know its extents until the call: below the work where packing pays
(planning/plan.SMALL_GEMM_WORK) its GEMM calls run this instead, as a specialised kernel runs
a small contraction on its loop path. With rows of B and C at unit stride
(the common case) each row of C is computed a vector at a time, the vector kept in a register
across K (one multiply-add per element of A), the last one masked; other strides take scalar
loops. Each element sums its products in K order.
"""

from __future__ import annotations

import llvmlite.ir as ir

from ..host import gemm_blocking
from .gemm_pack import c64, declare_intrinsic, define_function, gep, loop, splat
from .values import I1, I32, I64

_TYPES = {"float32": (ir.FloatType(), 4, "f32"), "float64": (ir.DoubleType(), 8, "f64")}


def small_gemm_symbol(dtype: str) -> str:
    return f"tl_small_gemm_{dtype}"


def define_small_gemm(module: ir.Module, dtype: str) -> ir.Function:
    """Define (once per module) `void tl_small_gemm_<dtype>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs,
    C, c_rs, c_cs, ow)`: C[m, n] += Σ_k A[m, k]·B[k, n] (strides in elements); `ow` nonzero
    computes C = A·B (with K = 0, zeros), as the packed GEMM's `ow` does."""
    name = small_gemm_symbol(dtype)
    if name in module.globals:
        return module.globals[name]
    t, size, suffix = _TYPES[dtype]
    tp = t.as_pointer()
    vw = gemm_blocking(dtype).vw  # the host's vector lanes
    vty, vb, vi = ir.VectorType(t, vw), ir.VectorType(I1, vw), ir.VectorType(I64, vw)
    fn = define_function(
        module,
        name,
        ir.VoidType(),
        [I64, I64, I64, tp, I64, I64, tp, I64, I64, tp, I64, I64, I64],
        ["M", "N", "K", "A", "a_rs", "a_cs", "B", "b_rs", "b_cs", "C", "c_rs", "c_cs", "ow"],
    )
    for i in (3, 6, 9):
        fn.args[i].add_attribute("noalias")
    M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, ow = fn.args
    fmuladd = declare_intrinsic(module, f"llvm.fmuladd.v{vw}{suffix}", vty, [vty] * 3)
    sfmuladd = declare_intrinsic(module, f"llvm.fmuladd.{suffix}", t, [t] * 3)
    mload = declare_intrinsic(
        module, f"llvm.masked.load.v{vw}{suffix}.p0", vty, [vty.as_pointer(), I32, vb, vty]
    )
    mstore = declare_intrinsic(
        module, f"llvm.masked.store.v{vw}{suffix}.p0", ir.VoidType(), [vty, vty.as_pointer(), I32, vb]
    )
    align = ir.Constant(I32, size)
    zero, vzero = ir.Constant(t, 0), ir.Constant(vty, None)
    lanes = ir.Constant(vi, list(range(vw)))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    unit = b.and_(b.icmp_signed("==", b_cs, c64(1)), b.icmp_signed("==", c_cs, c64(1)))
    overwrite = b.icmp_signed("!=", ow, c64(0))
    with b.if_else(unit) as (contiguous, strided):
        with contiguous:
            with loop(b, 0, M, name="m") as m:
                arow = gep(b, A, b.mul(m, a_rs))
                crow = gep(b, C, b.mul(m, c_rs))
                with loop(b, 0, N, vw, name="j") as j:
                    mask = b.icmp_signed("<", lanes, splat(b, b.sub(N, j), vi))
                    pc = b.bitcast(gep(b, crow, j), vty.as_pointer())
                    # storing C: an all-false load mask reads nothing and gives zeros
                    old = b.call(
                        mload, [pc, align, b.select(overwrite, ir.Constant(vb, [0] * vw), mask), vzero]
                    )

                    def vector_step(k, acc):
                        a = splat(b, b.load(gep(b, arow, b.mul(k, a_cs))), vty)
                        pb = b.bitcast(gep(b, gep(b, B, b.mul(k, b_rs)), j), vty.as_pointer())
                        row = b.call(mload, [pb, align, mask, vzero])
                        return b.call(fmuladd, [a, row, acc])

                    acc = _sum_over(b, K, old, vector_step, "k")
                    b.call(mstore, [acc, pc, align, mask])
        with strided:
            with loop(b, 0, M, name="sm") as m:
                arow = gep(b, A, b.mul(m, a_rs))
                crow = gep(b, C, b.mul(m, c_rs))
                with loop(b, 0, N, name="sn") as j:
                    pc = gep(b, crow, b.mul(j, c_cs))
                    bcol = gep(b, B, b.mul(j, b_cs))
                    old = b.select(overwrite, zero, b.load(pc))

                    def scalar_step(k, acc):
                        x = b.load(gep(b, arow, b.mul(k, a_cs)))
                        y = b.load(gep(b, bcol, b.mul(k, b_rs)))
                        return b.call(sfmuladd, [x, y, acc])

                    b.store(_sum_over(b, K, old, scalar_step, "sk"), pc)
    b.ret_void()
    return fn


def _sum_over(b: ir.IRBuilder, count: ir.Value, init: ir.Value, step, name: str) -> ir.Value:
    """`acc = init; for k in range(count): acc = step(k, acc)` with a run-time count ≥ 0 (tested
    before the first iteration: K may be 0); the final value."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, name=name)
    acc = b.phi(init.type, name=f"{name}.acc")
    k.add_incoming(c64(0), pre)
    acc.add_incoming(init, pre)
    b.cbranch(b.icmp_signed("<", k, count), body, done)
    b.position_at_end(body)
    new = step(k, acc)
    k.add_incoming(b.add(k, c64(1), flags=["nsw"]), b.block)
    acc.add_incoming(new, b.block)
    b.branch(head)
    b.position_at_end(done)
    return acc
