"""emit: GEMM operand blocks → packed panels in the workspace (LLVM IR), plus the IR helpers of the GEMM emitters."""

from __future__ import annotations

from contextlib import contextmanager

import llvmlite.ir as ir

from ..host import GemmBlocking
from .values import I32, I64

# --------------------------------------------------------------------------------------------------
# IR helpers (shared with gemm_kernel)


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def imin(b: ir.IRBuilder, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


@contextmanager
def loop(b: ir.IRBuilder, start, stop, step=1, name: str = "i"):
    """`for (i = start; i < stop; i += step)` with the body emitted inside the `with`."""
    step = c64(step) if isinstance(step, int) else step
    start = c64(start) if isinstance(start, int) else start
    pre = b.block
    header = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(I64, name=name)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, stop), body, done)
    b.position_at_end(body)
    yield i
    nxt = b.add(i, step, name=f"{name}.next", flags=["nsw"])
    i.add_incoming(nxt, b.block)
    b.branch(header)
    b.position_at_end(done)


def gep(b: ir.IRBuilder, ptr, index):
    return b.gep(ptr, [index], inbounds=True)


def vptr(b: ir.IRBuilder, ptr, index, vty: ir.VectorType):
    return b.bitcast(gep(b, ptr, index), vty.as_pointer())


def load(b, ptr, align):
    v = b.load(ptr)
    v.align = align
    return v


def store(b, value, ptr, align):
    s = b.store(value, ptr)
    s.align = align
    return s


def splat(b: ir.IRBuilder, x, vty: ir.VectorType):
    v = b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(
        v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, vty.count), None)
    )


def declare_intrinsic(module: ir.Module, name: str, ret, args) -> ir.Function:
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def define_function(module: ir.Module, name: str, ret, args, names, linkage: str = "internal"):
    fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    fn.linkage = linkage
    fn.attributes.add("nounwind")
    for a, n in zip(fn.args, names):
        a.name = n
    return fn


# --------------------------------------------------------------------------------------------------
# Packing


def _transpose_store(b: ir.IRBuilder, rows: list, dst, vty: ir.VectorType, align: int) -> None:
    """Store len(rows) vectors (row r holds lanes k) interleaved as dst[k·R + r]: R stores of VW lanes."""
    nrows, vw = len(rows), vty.count
    undef = ir.Constant(vty, ir.Undefined)
    for o in range(nrows):
        lanes = [((o * vw + e) // nrows, (o * vw + e) % nrows) for e in range(vw)]  # (k, row)
        parts = []
        for g in range(0, nrows, 2):
            mask = []
            for k, r in lanes:
                if r == g:
                    mask.append(k)
                elif r == g + 1:
                    mask.append(vw + k)
                else:
                    mask.append(None)
            if all(x is None for x in mask):
                continue
            second = rows[g + 1] if g + 1 < nrows else undef
            mine = {e for e, (_, r) in enumerate(lanes) if r in (g, g + 1)}
            parts.append((b.shuffle_vector(rows[g], second, _mask(mask, vw)), mine))
        # blend the pair shuffles: each lane takes the part whose rows it holds
        out = parts[0][0]
        for vec, mine in parts[1:]:
            out = b.shuffle_vector(out, vec, _mask([vw + e if e in mine else e for e in range(vw)], vw))
        store(b, out, b.bitcast(gep(b, dst, c64(o * vw)), vty.as_pointer()), align)


def _transpose(b: ir.IRBuilder, rows: list) -> list:
    """Transpose n vectors of n lanes (n a power of two) with log2(n) butterfly stages of shuffles."""
    n = len(rows)
    rows = list(rows)
    h = 1
    while h < n:
        lo = [e if not e & h else n + (e ^ h) for e in range(n)]  # keep own lanes, bring partner's
        hi = [(e ^ h) if not e & h else n + e for e in range(n)]
        for i in range(n):
            if i & h:
                continue
            x, y = rows[i], rows[i | h]
            rows[i] = b.shuffle_vector(x, y, _mask(lo, n))
            rows[i | h] = b.shuffle_vector(x, y, _mask(hi, n))
        h *= 2
    return rows


def _mask(lanes: list, vw: int) -> ir.Constant:
    # undefined lanes read lane 0: a harmless defined choice that keeps the masks simple for LLVM
    return ir.Constant(ir.VectorType(I32, vw), [0 if x is None else x for x in lanes])


def _define_packer(
    module: ir.Module, name: str, t: ir.Type, names: list[str]
) -> tuple[ir.Function, ir.IRBuilder]:
    """`void name(i64, i64, T* src, i64 rs, i64 cs, T* dst)` with noalias src and dst, and a builder at its entry."""
    tp = t.as_pointer()
    fn = define_function(module, name, ir.VoidType(), [I64, I64, tp, I64, I64, tp], names)
    fn.args[2].add_attribute("noalias")
    fn.args[5].add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def define_pack_a(module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking) -> ir.Function:
    """Ap[strip][k][MR] = A[i0 + strip·MR + r, k0 + k] for an mc×kc block, rows past mc zero."""
    mr, vw = cfg.mr, cfg.vw
    vty = ir.VectorType(t, vw)
    fn, b = _define_packer(module, name, t, ["mc", "kc", "a", "a_rs", "a_cs", "ap"])
    mc, kc, a, a_rs, a_cs, ap = fn.args
    zero = ir.Constant(t, 0)
    unit = b.icmp_signed("==", a_cs, c64(1))
    kv = b.mul(b.sdiv(kc, c64(vw)), c64(vw))
    with loop(b, 0, mc, mr, name="s") as i:
        rows = b.sub(mc, i)
        dst = gep(b, ap, b.mul(i, kc))
        fast = b.and_(unit, b.icmp_signed(">=", rows, c64(mr)))
        with b.if_else(fast) as (then, otherwise):
            with then:
                # row-major A: VW×MR transposes in registers, then the k remainder one column at a time
                srcs = [gep(b, a, b.mul(b.add(i, c64(r)), a_rs)) for r in range(mr)]
                with loop(b, 0, kv, vw, name="kv") as k:
                    vecs = [load(b, vptr(b, src, k, vty), size) for src in srcs]
                    _transpose_store(b, vecs, gep(b, dst, b.mul(k, c64(mr))), vty, size)
                with loop(b, kv, kc, name="kt") as k:
                    d = gep(b, dst, b.mul(k, c64(mr)))
                    for r in range(mr):
                        store(b, load(b, gep(b, srcs[r], k), size), gep(b, d, c64(r)), size)
            with otherwise:
                colmajor = b.and_(b.icmp_signed("==", a_rs, c64(1)), b.icmp_signed(">=", rows, c64(mr)))
                with b.if_else(colmajor) as (then2, otherwise2):
                    with then2:
                        # column-major A: each k step copies MR contiguous elements
                        mty = ir.VectorType(t, mr).as_pointer()
                        src = gep(b, a, i)
                        with loop(b, 0, kc, name="kc") as k:
                            x = load(b, b.bitcast(gep(b, src, b.mul(k, a_cs)), mty), size)
                            store(b, x, b.bitcast(gep(b, dst, b.mul(k, c64(mr))), mty), size)
                    with otherwise2:
                        srcs, valid = [], []
                        for r in range(mr):
                            ok = b.icmp_signed("<", c64(r), rows)
                            rr = b.select(ok, c64(r), c64(0))
                            srcs.append(gep(b, a, b.mul(b.add(i, rr), a_rs)))
                            valid.append(ok)
                        with loop(b, 0, kc, name="k") as k:
                            off = b.mul(k, a_cs)
                            d = gep(b, dst, b.mul(k, c64(mr)))
                            for r in range(mr):
                                v = b.select(valid[r], load(b, gep(b, srcs[r], off), size), zero)
                                store(b, v, gep(b, d, c64(r)), size)
    b.ret_void()
    return fn


def define_pack_b(module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking) -> ir.Function:
    """Bp[panel][k][NR] = B[k0 + k, j0 + panel·NR + j] for a kc×nc panel, columns past nc zero."""
    nr, vw, nv = cfg.nr, cfg.vw, cfg.nv
    vty = ir.VectorType(t, vw)
    fn, b = _define_packer(module, name, t, ["kc", "nc", "b", "b_rs", "b_cs", "bp"])
    kc, nc, src, b_rs, b_cs, bp = fn.args
    zero = ir.Constant(t, 0)
    unit = b.icmp_signed("==", b_cs, c64(1))
    with loop(b, 0, nc, nr, name="p") as j0:
        cols = b.sub(nc, j0)
        dst = gep(b, bp, b.mul(j0, kc))

        def columns(k0):
            """Column by column from k0 on (reads run along k), columns past nc zero."""
            with loop(b, 0, c64(nr), name="j") as j:
                ok = b.icmp_signed("<", j, cols)
                jj = b.select(ok, j, c64(0))
                col = gep(b, src, b.mul(b.add(j0, jj), b_cs))
                d = gep(b, dst, j)
                with loop(b, k0, kc, name="kk") as k:
                    v = b.select(ok, load(b, gep(b, col, b.mul(k, b_rs)), size), zero)
                    store(b, v, gep(b, d, b.mul(k, c64(nr))), size)

        fast = b.and_(unit, b.icmp_signed(">=", cols, c64(nr)))
        with b.if_else(fast) as (then, otherwise):
            with then:
                col = gep(b, src, j0)
                with loop(b, 0, kc, name="k") as k:
                    row = gep(b, col, b.mul(k, b_rs))
                    d = gep(b, dst, b.mul(k, c64(nr)))
                    for v in range(nv):
                        x = load(b, vptr(b, row, c64(v * vw), vty), size)
                        store(b, x, vptr(b, d, c64(v * vw), vty), vw * size)
            with otherwise:
                trans = b.and_(b.icmp_signed("==", b_rs, c64(1)), b.icmp_signed(">=", cols, c64(nr)))
                with b.if_else(trans) as (then2, otherwise2):
                    with then2:
                        # transposed B (unit stride along k): VW×VW transposes in registers
                        kv = b.mul(b.sdiv(kc, c64(vw)), c64(vw))
                        colp = [gep(b, src, b.mul(b.add(j0, c64(j)), b_cs)) for j in range(nr)]
                        with loop(b, 0, kv, vw, name="kv") as k:
                            d = gep(b, dst, b.mul(k, c64(nr)))
                            for v in range(nv):
                                rows = [load(b, vptr(b, colp[v * vw + j], k, vty), size) for j in range(vw)]
                                for kk, vec in enumerate(_transpose(b, rows)):
                                    store(b, vec, vptr(b, d, c64(kk * nr + v * vw), vty), vw * size)
                        columns(kv)
                    with otherwise2:
                        columns(c64(0))
    b.ret_void()
    return fn
