"""codegen: BLIS-style packed GEMM (C += A·B, any strides) → LLVM IR with an explicit-vector micro-kernel."""

from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir

from .host import GemmBlocking, gemm_blocking, gemm_workspace_layout

I64 = ir.IntType(64)
I32 = ir.IntType(32)
I8P = ir.IntType(8).as_pointer()
BOOL = ir.IntType(1)

_TYPES = {"float32": (ir.FloatType(), 4, "f32"), "float64": (ir.DoubleType(), 8, "f64")}


# --------------------------------------------------------------------------------------------------
# IR helpers


def _c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _min(b: ir.IRBuilder, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


@contextmanager
def _loop(b: ir.IRBuilder, start, stop, step=1, name: str = "i"):
    """`for (i = start; i < stop; i += step)` with the body emitted inside the `with`."""
    step = _c64(step) if isinstance(step, int) else step
    start = _c64(start) if isinstance(start, int) else start
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


def _gep(b: ir.IRBuilder, ptr, index):
    return b.gep(ptr, [index], inbounds=True)


def _vptr(b: ir.IRBuilder, ptr, index, vty: ir.VectorType):
    return b.bitcast(_gep(b, ptr, index), vty.as_pointer())


def _load(b, ptr, align):
    v = b.load(ptr)
    v.align = align
    return v


def _store(b, value, ptr, align):
    s = b.store(value, ptr)
    s.align = align
    return s


def _splat(b: ir.IRBuilder, x, vty: ir.VectorType):
    v = b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(
        v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, vty.count), None)
    )


def _intrinsic(module: ir.Module, name: str, ret, args) -> ir.Function:
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def _function(module: ir.Module, name: str, ret, args, names, linkage: str = "internal"):
    fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    fn.linkage = linkage
    fn.attributes.add("nounwind")
    for a, n in zip(fn.args, names):
        a.name = n
    return fn


# --------------------------------------------------------------------------------------------------
# The micro-kernel: C[0:mr, 0:nr] += Ap(kc×MR strip) · Bp(kc×NR panel), accumulators in registers


def _define_microkernel(
    module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking
) -> ir.Function:
    tp = t.as_pointer()
    vty = ir.VectorType(t, cfg.vw)
    mr, nv, nr, vw = cfg.mr, cfg.nv, cfg.nr, cfg.vw
    fn = _function(
        module,
        name,
        ir.VoidType(),
        [I64, tp, tp, tp, I64, I64, I64, I64],
        ["kc", "ap", "bp", "c", "c_rs", "c_cs", "m", "n"],
    )
    for i in (1, 2, 3):
        fn.args[i].add_attribute("noalias")
    kc, ap, bp, c, c_rs, c_cs, m, n = fn.args
    fma = _intrinsic(module, f"llvm.fma.v{cfg.vw}{'f32' if size == 4 else 'f64'}", vty, [vty] * 3)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    tmp = b.alloca(t, size=mr * nr, name="tile")
    tmp.align = 64
    zero = ir.Constant(vty, None)

    def step(accs, a_ptr, b_ptr, u):
        bs = [_load(b, _vptr(b, b_ptr, _c64(u * nr + j * vw), vty), vw * size) for j in range(nv)]
        out = []
        for r in range(mr):
            a = _splat(b, _load(b, _gep(b, a_ptr, _c64(u * mr + r)), size), vty)
            out.append([b.call(fma, [a, bs[j], accs[r][j]]) for j in range(nv)])
        return out

    def k_loop(label, count, unroll, accs, a0, b0):
        """`count // unroll` iterations of `unroll` k steps; returns (accs, a, b) after it."""
        pre = b.block
        head = b.append_basic_block(f"{label}.head")
        body = b.append_basic_block(f"{label}.body")
        done = b.append_basic_block(f"{label}.done")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name=f"{label}.k")
        pa = b.phi(tp, name=f"{label}.a")
        pb = b.phi(tp, name=f"{label}.b")
        phis = [[b.phi(vty, name=f"acc{r}_{j}") for j in range(nv)] for r in range(mr)]
        k.add_incoming(_c64(0), pre)
        pa.add_incoming(a0, pre)
        pb.add_incoming(b0, pre)
        for r in range(mr):
            for j in range(nv):
                phis[r][j].add_incoming(accs[r][j], pre)
        b.cbranch(b.icmp_signed("<", k, count), body, done)
        b.position_at_end(body)
        new = phis
        for u in range(unroll):
            new = step(new, pa, pb, u)
        k.add_incoming(b.add(k, _c64(1), flags=["nsw"]), b.block)
        pa.add_incoming(_gep(b, pa, _c64(unroll * mr)), b.block)
        pb.add_incoming(_gep(b, pb, _c64(unroll * nr)), b.block)
        for r in range(mr):
            for j in range(nv):
                phis[r][j].add_incoming(new[r][j], b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis, pa, pb

    if cfg.prefetch_c:
        prefetch = _intrinsic(module, "llvm.prefetch.p0", ir.VoidType(), [I8P, I32, I32, I32])
        for r in range(mr):
            row = b.gep(c, [b.mul(_c64(r), c_rs)])  # not inbounds: rows past m are only prefetched
            for j in range(0, nr * size, 64):
                p = b.gep(b.bitcast(row, I8P), [_c64(j)])
                b.call(prefetch, [p, ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)])
    u = cfg.unroll
    accs = [[zero] * nv for _ in range(mr)]
    accs, pa, pb = k_loop("ku", b.sdiv(kc, _c64(u)), u, accs, ap, bp)
    accs, pa, pb = k_loop("kr", b.srem(kc, _c64(u)), 1, accs, pa, pb)

    def scalar_update():
        """Any C strides: spill the tile, then C[r, j] += tile[r, j] one element at a time."""
        for r in range(mr):
            for j in range(nv):
                _store(b, accs[r][j], _vptr(b, tmp, _c64(r * nr + j * vw), vty), vw * size)
        with _loop(b, 0, m, name="er") as r:
            row = _gep(b, c, b.mul(r, c_rs))
            trow = _gep(b, tmp, b.mul(r, _c64(nr)))
            with _loop(b, 0, n, name="ec") as j:
                p = _gep(b, row, b.mul(j, c_cs))
                b.store(b.fadd(b.load(p), b.load(_gep(b, trow, j))), p)

    full = b.and_(
        b.and_(b.icmp_signed("==", m, _c64(mr)), b.icmp_signed("==", n, _c64(nr))),
        b.icmp_signed("==", c_cs, _c64(1)),
    )
    with b.if_else(full) as (then, otherwise):
        with then:
            for r in range(mr):
                row = _gep(b, c, b.mul(_c64(r), c_rs))
                for j in range(nv):
                    p = _vptr(b, row, _c64(j * vw), vty)
                    _store(b, b.fadd(_load(b, p, size), accs[r][j]), p, size)
        with otherwise:
            unit = b.icmp_signed("==", c_cs, _c64(1))
            with b.if_else(unit) as (then2, otherwise2):
                with then2:
                    # partial tile of a row-major C: masked loads and stores (an all-false mask touches nothing)
                    vb = ir.VectorType(BOOL, vw)
                    vi = ir.VectorType(I64, vw)
                    mty = "f32" if size == 4 else "f64"
                    mload = _intrinsic(
                        module, f"llvm.masked.load.v{vw}{mty}.p0", vty, [vty.as_pointer(), I32, vb, vty]
                    )
                    mstore = _intrinsic(
                        module,
                        f"llvm.masked.store.v{vw}{mty}.p0",
                        ir.VoidType(),
                        [vty, vty.as_pointer(), I32, vb],
                    )
                    nvec = _splat(b, n, vi)
                    align = ir.Constant(I32, size)
                    for r in range(mr):
                        ok = b.icmp_signed("<", _c64(r), m)
                        row = _gep(b, c, b.mul(b.select(ok, _c64(r), _c64(0)), c_rs))  # stays inside C
                        live = _splat(b, ok, vb)
                        for j in range(nv):
                            lanes = ir.Constant(vi, [j * vw + e for e in range(vw)])
                            mask = b.and_(b.icmp_signed("<", lanes, nvec), live)
                            p = b.bitcast(b.gep(row, [_c64(j * vw)]), vty.as_pointer())
                            old = b.call(mload, [p, align, mask, ir.Constant(vty, None)])
                            b.call(mstore, [b.fadd(old, accs[r][j]), p, align, mask])
                with otherwise2:
                    scalar_update()
    b.ret_void()
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
        _store(b, out, b.bitcast(_gep(b, dst, _c64(o * vw)), vty.as_pointer()), align)


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


def _define_pack_a(module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking) -> ir.Function:
    """Ap[strip][k][MR] = A[i0 + strip·MR + r, k0 + k] for an mc×kc block, rows past mc zero."""
    tp = t.as_pointer()
    mr, vw = cfg.mr, cfg.vw
    vty = ir.VectorType(t, vw)
    fn = _function(
        module, name, ir.VoidType(), [I64, I64, tp, I64, I64, tp], ["mc", "kc", "a", "a_rs", "a_cs", "ap"]
    )
    fn.args[2].add_attribute("noalias")
    fn.args[5].add_attribute("noalias")
    mc, kc, a, a_rs, a_cs, ap = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(t, 0)
    unit = b.icmp_signed("==", a_cs, _c64(1))
    kv = b.mul(b.sdiv(kc, _c64(vw)), _c64(vw))
    with _loop(b, 0, mc, mr, name="s") as i:
        rows = b.sub(mc, i)
        dst = _gep(b, ap, b.mul(i, kc))
        fast = b.and_(unit, b.icmp_signed(">=", rows, _c64(mr)))
        with b.if_else(fast) as (then, otherwise):
            with then:
                # row-major A: VW×MR transposes in registers, then the k remainder one column at a time
                srcs = [_gep(b, a, b.mul(b.add(i, _c64(r)), a_rs)) for r in range(mr)]
                with _loop(b, 0, kv, vw, name="kv") as k:
                    vecs = [_load(b, _vptr(b, src, k, vty), size) for src in srcs]
                    _transpose_store(b, vecs, _gep(b, dst, b.mul(k, _c64(mr))), vty, size)
                with _loop(b, kv, kc, name="kt") as k:
                    d = _gep(b, dst, b.mul(k, _c64(mr)))
                    for r in range(mr):
                        _store(b, _load(b, _gep(b, srcs[r], k), size), _gep(b, d, _c64(r)), size)
            with otherwise:
                colmajor = b.and_(b.icmp_signed("==", a_rs, _c64(1)), b.icmp_signed(">=", rows, _c64(mr)))
                with b.if_else(colmajor) as (then2, otherwise2):
                    with then2:
                        # column-major A: each k step copies MR contiguous elements
                        mty = ir.VectorType(t, mr).as_pointer()
                        src = _gep(b, a, i)
                        with _loop(b, 0, kc, name="kc") as k:
                            x = _load(b, b.bitcast(_gep(b, src, b.mul(k, a_cs)), mty), size)
                            _store(b, x, b.bitcast(_gep(b, dst, b.mul(k, _c64(mr))), mty), size)
                    with otherwise2:
                        srcs, valid = [], []
                        for r in range(mr):
                            ok = b.icmp_signed("<", _c64(r), rows)
                            rr = b.select(ok, _c64(r), _c64(0))
                            srcs.append(_gep(b, a, b.mul(b.add(i, rr), a_rs)))
                            valid.append(ok)
                        with _loop(b, 0, kc, name="k") as k:
                            off = b.mul(k, a_cs)
                            d = _gep(b, dst, b.mul(k, _c64(mr)))
                            for r in range(mr):
                                v = b.select(valid[r], _load(b, _gep(b, srcs[r], off), size), zero)
                                _store(b, v, _gep(b, d, _c64(r)), size)
    b.ret_void()
    return fn


def _define_pack_b(module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking) -> ir.Function:
    """Bp[panel][k][NR] = B[k0 + k, j0 + panel·NR + j] for a kc×nc panel, columns past nc zero."""
    tp = t.as_pointer()
    nr, vw, nv = cfg.nr, cfg.vw, cfg.nv
    vty = ir.VectorType(t, vw)
    fn = _function(
        module, name, ir.VoidType(), [I64, I64, tp, I64, I64, tp], ["kc", "nc", "b", "b_rs", "b_cs", "bp"]
    )
    fn.args[2].add_attribute("noalias")
    fn.args[5].add_attribute("noalias")
    kc, nc, src, b_rs, b_cs, bp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(t, 0)
    unit = b.icmp_signed("==", b_cs, _c64(1))
    with _loop(b, 0, nc, nr, name="p") as j0:
        cols = b.sub(nc, j0)
        dst = _gep(b, bp, b.mul(j0, kc))

        def columns(k0):
            """Column by column from k0 on (reads run along k), columns past nc zero."""
            with _loop(b, 0, _c64(nr), name="j") as j:
                ok = b.icmp_signed("<", j, cols)
                jj = b.select(ok, j, _c64(0))
                col = _gep(b, src, b.mul(b.add(j0, jj), b_cs))
                d = _gep(b, dst, j)
                with _loop(b, k0, kc, name="kk") as k:
                    v = b.select(ok, _load(b, _gep(b, col, b.mul(k, b_rs)), size), zero)
                    _store(b, v, _gep(b, d, b.mul(k, _c64(nr))), size)

        fast = b.and_(unit, b.icmp_signed(">=", cols, _c64(nr)))
        with b.if_else(fast) as (then, otherwise):
            with then:
                col = _gep(b, src, j0)
                with _loop(b, 0, kc, name="k") as k:
                    row = _gep(b, col, b.mul(k, b_rs))
                    d = _gep(b, dst, b.mul(k, _c64(nr)))
                    for v in range(nv):
                        x = _load(b, _vptr(b, row, _c64(v * vw), vty), size)
                        _store(b, x, _vptr(b, d, _c64(v * vw), vty), vw * size)
            with otherwise:
                trans = b.and_(b.icmp_signed("==", b_rs, _c64(1)), b.icmp_signed(">=", cols, _c64(nr)))
                with b.if_else(trans) as (then2, otherwise2):
                    with then2:
                        # transposed B (unit stride along k): VW×VW transposes in registers
                        kv = b.mul(b.sdiv(kc, _c64(vw)), _c64(vw))
                        colp = [_gep(b, src, b.mul(b.add(j0, _c64(j)), b_cs)) for j in range(nr)]
                        with _loop(b, 0, kv, vw, name="kv") as k:
                            d = _gep(b, dst, b.mul(k, _c64(nr)))
                            for v in range(nv):
                                rows = [_load(b, _vptr(b, colp[v * vw + j], k, vty), size) for j in range(vw)]
                                for kk, vec in enumerate(_transpose(b, rows)):
                                    _store(b, vec, _vptr(b, d, _c64(kk * nr + v * vw), vty), vw * size)
                        columns(kv)
                    with otherwise2:
                        columns(_c64(0))
    b.ret_void()
    return fn


# --------------------------------------------------------------------------------------------------
# The macro-kernel


def define_gemm(module: ir.Module, dtype: str, cfg: GemmBlocking | None = None) -> ir.Function:
    """Define (once per module) `void tl_gemm_<f32|f64>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs,
    c_cs, workspace)`: C[m,n] += Σ_k A[m,k]·B[k,n], strides in elements, workspace of workspace_bytes()."""
    t, size, suffix = _TYPES[dtype]
    name = f"tl_gemm_{suffix}"
    if name in module.globals:
        return module.globals[name]
    cfg = cfg or gemm_blocking(dtype)
    tp = t.as_pointer()
    ukernel = _define_microkernel(module, f"{name}.ukernel", t, size, cfg)
    pack_a = _define_pack_a(module, f"{name}.pack_a", t, size, cfg)
    pack_b = _define_pack_b(module, f"{name}.pack_b", t, size, cfg)
    fn = _function(
        module,
        name,
        ir.VoidType(),
        [I64, I64, I64, tp, I64, I64, tp, I64, I64, tp, I64, I64, I8P],
        ["M", "N", "K", "A", "a_rs", "a_cs", "B", "b_rs", "b_cs", "C", "c_rs", "c_cs", "ws"],
        linkage="external",
    )
    fn.args[9].add_attribute("noalias")
    fn.args[12].add_attribute("noalias")
    M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, ws = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # A column-major C is computed as Cᵀ += Bᵀ·Aᵀ so that its unit stride runs along the vectors
    swap = b.and_(b.icmp_signed("!=", c_cs, _c64(1)), b.icmp_signed("==", c_rs, _c64(1)))

    def sel(x, y):
        return b.select(swap, y, x)

    M, N = sel(M, N), sel(N, M)
    A, B = sel(A, B), sel(B, A)
    a_rs, a_cs, b_rs, b_cs = sel(a_rs, b_cs), sel(a_cs, b_rs), sel(b_rs, a_cs), sel(b_cs, a_rs)
    c_rs, c_cs = sel(c_rs, c_cs), sel(c_cs, c_rs)

    a_off, b_off, _ = gemm_workspace_layout(cfg, size)
    ap = b.bitcast(b.gep(ws, [_c64(a_off)], inbounds=True), tp)
    bp = b.bitcast(b.gep(ws, [_c64(b_off)], inbounds=True), tp)
    with _loop(b, 0, N, cfg.nc, name="jc") as jc:
        nc = _min(b, _c64(cfg.nc), b.sub(N, jc))
        with _loop(b, 0, K, cfg.kc, name="pc") as pc:
            kc = _min(b, _c64(cfg.kc), b.sub(K, pc))
            bsrc = _gep(b, B, b.add(b.mul(pc, b_rs), b.mul(jc, b_cs)))
            b.call(pack_b, [kc, nc, bsrc, b_rs, b_cs, bp])
            with _loop(b, 0, M, cfg.mc, name="ic") as ic:
                mc = _min(b, _c64(cfg.mc), b.sub(M, ic))
                asrc = _gep(b, A, b.add(b.mul(ic, a_rs), b.mul(pc, a_cs)))
                b.call(pack_a, [mc, kc, asrc, a_rs, a_cs, ap])
                cblk = _gep(b, C, b.add(b.mul(ic, c_rs), b.mul(jc, c_cs)))
                with _loop(b, 0, nc, cfg.nr, name="jr") as jr:
                    n = _min(b, _c64(cfg.nr), b.sub(nc, jr))
                    bpanel = _gep(b, bp, b.mul(jr, kc))
                    ccol = _gep(b, cblk, b.mul(jr, c_cs))
                    with _loop(b, 0, mc, cfg.mr, name="ir") as i:
                        m = _min(b, _c64(cfg.mr), b.sub(mc, i))
                        astrip = _gep(b, ap, b.mul(i, kc))
                        ctile = _gep(b, ccol, b.mul(i, c_rs))
                        b.call(ukernel, [kc, astrip, bpanel, ctile, c_rs, c_cs, m, n])
    b.ret_void()
    return fn


# --------------------------------------------------------------------------------------------------
# Stand-alone compilation (tests, benchmarks)


def gemm_signature(dtype: str):
    ctype = ctypes.c_float if dtype == "float32" else ctypes.c_double
    ptr = ctypes.POINTER(ctype)
    i64 = ctypes.c_int64
    return ctypes.CFUNCTYPE(None, i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ctypes.c_void_p)


@dataclass
class CompiledGemm:
    """A JIT-compiled tl_gemm_<dtype>; keep it alive while `fn` is used."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef
    fn: ctypes._CFuncPtr
    address: int


def compile_gemm(dtype: str, cfg: GemmBlocking | None = None) -> CompiledGemm:
    """JIT-compile a module holding only tl_gemm_<dtype>."""
    from codegen.lowering.jit import _lock, new_target_machine, optimise

    module = ir.Module(name=f"gemm_{dtype}")
    fn = define_gemm(module, dtype, cfg)
    with _lock:
        ref = optimise(module)
        engine = llvm.create_mcjit_compiler(ref, new_target_machine())
        engine.finalize_object()
        address = engine.get_function_address(fn.name)
    return CompiledGemm(engine, ref, gemm_signature(dtype)(address), address)


def declare_gemm(module: ir.Module, dtype: str) -> ir.Function:
    """Declare tl_gemm_<dtype> in `module`; its body is the process-wide `shared_gemm(dtype)`."""
    t, _, suffix = _TYPES[dtype]
    name = f"tl_gemm_{suffix}"
    if name in module.globals:
        return module.globals[name]
    tp = t.as_pointer()
    ty = ir.FunctionType(ir.VoidType(), [I64, I64, I64, tp, I64, I64, tp, I64, I64, tp, I64, I64, I8P])
    return ir.Function(module, ty, name)


@functools.cache
def shared_gemm(dtype: str) -> CompiledGemm:
    """Compile tl_gemm_<dtype> once per process and publish its address to the JIT linker, so
    every kernel calls the same machine code instead of recompiling it (~0.4 s with O3)."""
    compiled = compile_gemm(dtype)
    llvm.add_symbol(f"tl_gemm_{_TYPES[dtype][2]}", compiled.address)
    return compiled
