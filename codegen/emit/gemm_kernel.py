"""emit: BLIS-style packed GEMM (C += A·B, any strides) → LLVM IR with an explicit-vector micro-kernel."""

from __future__ import annotations

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ..host import GemmBlocking, gemm_workspace_layout, variant_blocking
from .gemm_pack import (
    c64,
    declare_intrinsic,
    define_function,
    define_pack_a,
    define_pack_b,
    gep,
    imin,
    load,
    loop,
    splat,
    store,
    vptr,
)
from .gemm_team import TEAM_DONE, TEAM_PANEL, TEAM_SIZE, TEAM_SLEEPERS, TEAM_TICKET
from .values import I1, I8, I32, I64
from .workers import futex_number, sleep_until, wake_sleepers

I8P = I8.as_pointer()
I32P = I32.as_pointer()
# compute tasks per thread and stage of a GEMM team: a thread that finishes its last task waits
# for the others' at the stage's end (the next panel of B overwrites this one), up to a task's
# time, so smaller tasks waste less; each task packs its own block of A (no extra work). 16
# (was 8): sgemm 512 on 2 threads 692 → 604 µs here, and with a core shared with another busy
# thread 954/901 → 836/781 µs (a stage's last task is half as long)
TASKS_PER_THREAD = 16

_TYPES = {"float32": (ir.FloatType(), 4, "f32"), "float64": (ir.DoubleType(), 8, "f64")}


def gemm_symbol(dtype: str) -> str:
    """The name of the GEMM function for `dtype`: tl_gemm_f32 or tl_gemm_f64; for a variant of
    another cache blocking (host.gemm_variant, "float32@96x2048x256") tl_gemm_f32_96x2048x256."""
    base, _, blocks = dtype.partition("@")
    return f"tl_gemm_{_TYPES[base][2]}" + (f"_{blocks}" if blocks else "")


def cancellable_gemm_symbol(dtype: str) -> str:
    """The GEMM that kernels call: tl_gemm_<f32|f64>_cancellable, with a trailing `i32* cancel`."""
    return f"{gemm_symbol(dtype)}_cancellable"


def _gemm_params(t: ir.Type) -> list[ir.Type]:
    tp = t.as_pointer()
    return [I64, I64, I64, tp, I64, I64, tp, I64, I64, tp, I64, I64, I8P]


def _stop_if_cancelled(b: ir.IRBuilder, cancel) -> None:
    """Return (void) if `cancel` is not null and the word it points to is set (a relaxed atomic load)."""
    stop = b.append_basic_block("cancelled")
    check = b.append_basic_block("check.cancel")
    cont = b.append_basic_block("running")
    b.cbranch(b.icmp_unsigned("==", cancel, ir.Constant(I32P, None)), cont, check)
    b.position_at_end(check)
    flag = b.load_atomic(cancel, "monotonic", 4)
    b.cbranch(b.icmp_unsigned("!=", flag, ir.Constant(I32, 0)), stop, cont).set_weights([1, 1 << 20])
    b.position_at_end(stop)
    b.ret_void()
    b.position_at_end(cont)


# --------------------------------------------------------------------------------------------------
# The micro-kernel: C[0:mr, 0:nr] += Ap(kc×MR strip) · Bp(kc×NR panel), accumulators in registers


def _define_microkernel(
    module: ir.Module, name: str, t: ir.Type, size: int, cfg: GemmBlocking
) -> ir.Function:
    tp = t.as_pointer()
    vty = ir.VectorType(t, cfg.vw)
    mr, nv, nr, vw = cfg.mr, cfg.nv, cfg.nr, cfg.vw
    fn = define_function(
        module,
        name,
        ir.VoidType(),
        [I64, tp, tp, tp, I64, I64, I64, I64, I1],
        ["kc", "ap", "bp", "c", "c_rs", "c_cs", "m", "n", "ow"],
    )
    for i in (1, 2, 3):
        fn.args[i].add_attribute("noalias")
    # ow: C = A·B instead of C += A·B (the first K block of a GEMM whose C starts at zero). The
    # tile is stored as acc + 0.0, which is bitwise what 0.0 + acc gave (-0.0 becomes +0.0).
    kc, ap, bp, c, c_rs, c_cs, m, n, ow = fn.args
    fma = declare_intrinsic(module, f"llvm.fma.v{cfg.vw}{'f32' if size == 4 else 'f64'}", vty, [vty] * 3)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    tmp = b.alloca(t, size=mr * nr, name="tile")
    tmp.align = 64
    zero = ir.Constant(vty, None)
    fzero = ir.Constant(t, 0)

    def update(old_vec_or_none, acc):
        return b.fadd(acc, zero) if old_vec_or_none is None else b.fadd(old_vec_or_none, acc)

    def step(accs, a_ptr, b_ptr, u):
        bs = [load(b, vptr(b, b_ptr, c64(u * nr + j * vw), vty), vw * size) for j in range(nv)]
        out = []
        for r in range(mr):
            a = splat(b, load(b, gep(b, a_ptr, c64(u * mr + r)), size), vty)
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
        k.add_incoming(c64(0), pre)
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
        k.add_incoming(b.add(k, c64(1), flags=["nsw"]), b.block)
        pa.add_incoming(gep(b, pa, c64(unroll * mr)), b.block)
        pb.add_incoming(gep(b, pb, c64(unroll * nr)), b.block)
        for r in range(mr):
            for j in range(nv):
                phis[r][j].add_incoming(new[r][j], b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis, pa, pb

    if cfg.prefetch_c:
        prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(), [I8P, I32, I32, I32])
        for r in range(mr):
            row = b.gep(c, [b.mul(c64(r), c_rs)])  # not inbounds: rows past m are only prefetched
            for j in range(0, nr * size, 64):
                p = b.gep(b.bitcast(row, I8P), [c64(j)])
                b.call(prefetch, [p, ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)])
    u = cfg.unroll
    accs = [[zero] * nv for _ in range(mr)]
    accs, pa, pb = k_loop("ku", b.sdiv(kc, c64(u)), u, accs, ap, bp)
    accs, pa, pb = k_loop("kr", b.srem(kc, c64(u)), 1, accs, pa, pb)

    def scalar_update():
        """Any C strides: spill the tile, then C[r, j] += tile[r, j] one element at a time."""
        for r in range(mr):
            for j in range(nv):
                store(b, accs[r][j], vptr(b, tmp, c64(r * nr + j * vw), vty), vw * size)
        with loop(b, 0, m, name="er") as r:
            row = gep(b, c, b.mul(r, c_rs))
            trow = gep(b, tmp, b.mul(r, c64(nr)))
            with loop(b, 0, n, name="ec") as j:
                p = gep(b, row, b.mul(j, c_cs))
                x = b.load(gep(b, trow, j))
                with b.if_else(ow) as (first, later):
                    with first:
                        b.store(b.fadd(x, fzero), p)
                    with later:
                        b.store(b.fadd(b.load(p), x), p)

    full = b.and_(
        b.and_(b.icmp_signed("==", m, c64(mr)), b.icmp_signed("==", n, c64(nr))),
        b.icmp_signed("==", c_cs, c64(1)),
    )
    with b.if_else(full) as (then, otherwise):
        with then:
            with b.if_else(ow) as (first, later):
                for overwrite, block in ((True, first), (False, later)):
                    with block:
                        for r in range(mr):
                            row = gep(b, c, b.mul(c64(r), c_rs))
                            for j in range(nv):
                                p = vptr(b, row, c64(j * vw), vty)
                                old = None if overwrite else load(b, p, size)
                                store(b, update(old, accs[r][j]), p, size)
        with otherwise:
            unit = b.icmp_signed("==", c_cs, c64(1))
            with b.if_else(unit) as (then2, otherwise2):
                with then2:
                    # partial tile of a row-major C: masked loads and stores (an all-false mask touches nothing)
                    vb = ir.VectorType(I1, vw)
                    vi = ir.VectorType(I64, vw)
                    mty = "f32" if size == 4 else "f64"
                    mload = declare_intrinsic(
                        module, f"llvm.masked.load.v{vw}{mty}.p0", vty, [vty.as_pointer(), I32, vb, vty]
                    )
                    mstore = declare_intrinsic(
                        module,
                        f"llvm.masked.store.v{vw}{mty}.p0",
                        ir.VoidType(),
                        [vty, vty.as_pointer(), I32, vb],
                    )
                    nvec = splat(b, n, vi)
                    align = ir.Constant(I32, size)
                    for r in range(mr):
                        ok = b.icmp_signed("<", c64(r), m)
                        row = gep(b, c, b.mul(b.select(ok, c64(r), c64(0)), c_rs))  # stays inside C
                        live = splat(b, ok, vb)
                        for j in range(nv):
                            lanes = ir.Constant(vi, [j * vw + e for e in range(vw)])
                            mask = b.and_(b.icmp_signed("<", lanes, nvec), live)
                            p = b.bitcast(b.gep(row, [c64(j * vw)]), vty.as_pointer())
                            # overwrite: an all-false load mask reads nothing (and gives zeros)
                            lmask = b.select(ow, ir.Constant(vb, [0] * vw), mask)
                            old = b.call(mload, [p, align, lmask, ir.Constant(vty, None)])
                            b.call(mstore, [b.fadd(old, accs[r][j]), p, align, mask])
                with otherwise2:
                    scalar_update()
    b.ret_void()
    return fn


# --------------------------------------------------------------------------------------------------
# The macro-kernel


def _pause(module: ir.Module, b: ir.IRBuilder) -> None:
    """A spin-wait hint (x86 `pause`; nothing on other hosts)."""
    if llvm.get_process_triple().startswith(("x86_64", "i686", "i386")):
        b.call(declare_intrinsic(module, "llvm.x86.sse2.pause", ir.VoidType(), []), [])


def define_gemm(module: ir.Module, dtype: str, cfg: GemmBlocking | None = None) -> ir.Function:
    """Define (once per module) `void tl_gemm_<f32|f64>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs,
    c_cs, workspace)`: C[m,n] += Σ_k A[m,k]·B[k,n], strides in elements, workspace of workspace_bytes(),
    and the one kernels call (cancellable_gemm_symbol), with three more arguments:

    * `i32* cancel`: returns early once the word is set, polled before each packed panel of B and
      each block of A (and while waiting for other threads);
    * `i64 ow`: nonzero computes C = A·B (the first K block stores instead of adding; with K = 0
      C is zeroed), which replaces a separate zeroing pass over C;
    * `i8* team`: null runs the whole GEMM on the calling thread. Otherwise every thread of a team
      calls it with the same arguments (each with its own workspace) and the same shared block
      (gemm_team_bytes(), counters zero): BLIS-style, the threads pack one KC×NC panel of B
      together (one NR-column micro-panel per task) into the shared block, then compute row
      blocks of C from it, each packing its own block of A. Tasks are numbered in that order and
      taken from a shared counter; a task waits only until every task of the previous stage is
      done (a single counter of finished tasks tells), so a thread waits only for tasks some
      running thread has taken: a thread that starts late, or never, delays nothing, and one
      thread alone finishes the call. Each element of C sums its K blocks in the same order as
      the serial code, so results are bitwise those of one thread.

    The stand-alone entry is for tests and benchmarks. `dtype` may name a variant
    (host.gemm_variant): its blocking, under its own symbols."""
    name = gemm_symbol(dtype)
    if name in module.globals:
        return module.globals[name]
    base, variant_cfg = variant_blocking(dtype)
    t, size, _ = _TYPES[base]
    cfg = cfg or variant_cfg
    tp = t.as_pointer()
    i64p = I64.as_pointer()
    ukernel = _define_microkernel(module, f"{name}.ukernel", t, size, cfg)
    pack_a = define_pack_a(module, f"{name}.pack_a", t, size, cfg)
    pack_b = define_pack_b(module, f"{name}.pack_b", t, size, cfg)
    names = ["M", "N", "K", "A", "a_rs", "a_cs", "B", "b_rs", "b_cs", "C", "c_rs", "c_cs", "ws"]
    fn = define_function(
        module,
        cancellable_gemm_symbol(dtype),
        ir.VoidType(),
        _gemm_params(t) + [I32P, I64, I8P],
        names + ["cancel", "ow", "team"],
        linkage="external",
    )
    fn.args[9].add_attribute("noalias")
    fn.args[12].add_attribute("noalias")
    M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, ws, cancel, ow, team = fn.args
    plain = define_function(module, name, ir.VoidType(), _gemm_params(t), names, linkage="external")
    pb = ir.IRBuilder(plain.append_basic_block("entry"))
    pb.call(fn, [*plain.args, ir.Constant(I32P, None), c64(0), ir.Constant(I8P, None)])
    pb.ret_void()
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    mine = b.alloca(I64, name="mine")  # cooperative: the task this thread holds
    base = b.alloca(I64, name="base")  # cooperative: the first task of the current stage
    spins = b.alloca(I64, name="spins")  # cooperative: how long this thread has waited
    # A column-major C is computed as Cᵀ += Bᵀ·Aᵀ so that its unit stride runs along the vectors
    swap = b.and_(b.icmp_signed("!=", c_cs, c64(1)), b.icmp_signed("==", c_rs, c64(1)))

    def sel(x, y):
        return b.select(swap, y, x)

    M, N = sel(M, N), sel(N, M)
    A, B = sel(A, B), sel(B, A)
    a_rs, a_cs, b_rs, b_cs = sel(a_rs, b_cs), sel(a_cs, b_rs), sel(b_rs, a_cs), sel(b_cs, a_rs)
    c_rs, c_cs = sel(c_rs, c_cs), sel(c_cs, c_rs)
    overwrite = b.icmp_signed("!=", ow, c64(0))

    a_off, b_off, _ = gemm_workspace_layout(cfg, size)
    ap = b.bitcast(b.gep(ws, [c64(a_off)], inbounds=True), tp)
    is_team = b.icmp_unsigned("!=", team, ir.Constant(I8P, None))

    def counter(offset):
        return b.bitcast(b.gep(team, [c64(offset)], inbounds=True), i64p)

    def block(ic, mc, pc, kc, jc, nc, bp):
        """Pack rows [ic, ic + mc) of A's K block pc into this thread's workspace, then update
        C[ic:ic+mc, jc:jc+nc] from the packed panel of B at `bp`."""
        asrc = gep(b, A, b.add(b.mul(ic, a_rs), b.mul(pc, a_cs)))
        b.call(pack_a, [mc, kc, asrc, a_rs, a_cs, ap])
        cblk = gep(b, C, b.add(b.mul(ic, c_rs), b.mul(jc, c_cs)))
        first = b.and_(overwrite, b.icmp_signed("==", pc, c64(0)))
        with loop(b, 0, nc, cfg.nr, name="jr") as jr:
            n = imin(b, c64(cfg.nr), b.sub(nc, jr))
            bpanel = gep(b, bp, b.mul(jr, kc))
            ccol = gep(b, cblk, b.mul(jr, c_cs))
            with loop(b, 0, mc, cfg.mr, name="ir") as i:
                m = imin(b, c64(cfg.mr), b.sub(mc, i))
                astrip = gep(b, ap, b.mul(i, kc))
                ctile = gep(b, ccol, b.mul(i, c_rs))
                b.call(ukernel, [kc, astrip, bpanel, ctile, c_rs, c_cs, m, n, first])

    with b.if_else(is_team) as (cooperative, alone):
        with alone:
            _zero_if_empty(b, overwrite, M, N, K, C, c_rs, c_cs, t)
            bp = b.bitcast(b.gep(ws, [c64(b_off)], inbounds=True), tp)
            with loop(b, 0, N, cfg.nc, name="jc") as jc:
                nc = imin(b, c64(cfg.nc), b.sub(N, jc))
                with loop(b, 0, K, cfg.kc, name="pc") as pc:
                    kc = imin(b, c64(cfg.kc), b.sub(K, pc))
                    _stop_if_cancelled(b, cancel)
                    bsrc = gep(b, B, b.add(b.mul(pc, b_rs), b.mul(jc, b_cs)))
                    b.call(pack_b, [kc, nc, bsrc, b_rs, b_cs, bp])
                    with loop(b, 0, M, cfg.mc, name="ic") as ic:
                        mc = imin(b, c64(cfg.mc), b.sub(M, ic))
                        _stop_if_cancelled(b, cancel)
                        block(ic, mc, pc, kc, jc, nc, bp)
        with cooperative:
            ticket, done = counter(TEAM_TICKET), counter(TEAM_DONE)
            sleepers = counter(TEAM_SLEEPERS) if futex_number() is not None else None
            threads = b.load(counter(TEAM_SIZE))
            bp = b.bitcast(b.gep(team, [c64(TEAM_PANEL)], inbounds=True), tp)
            # rows per compute task: about TASKS_PER_THREAD tasks per thread, MR-aligned, at most MC
            share = b.mul(threads, c64(TASKS_PER_THREAD))
            per = b.sdiv(b.add(M, b.sub(share, c64(1))), share)
            per = b.mul(b.sdiv(b.add(per, c64(cfg.mr - 1)), c64(cfg.mr)), c64(cfg.mr))
            rows = imin(b, c64(cfg.mc), b.select(b.icmp_signed("<", per, c64(cfg.mr)), c64(cfg.mr), per))
            tasks_m = b.sdiv(b.add(M, b.sub(rows, c64(1))), rows)
            b.store(b.atomic_rmw("add", ticket, c64(1), "monotonic"), mine)
            b.store(c64(0), base)
            with b.if_then(b.icmp_signed("==", b.load(mine), c64(0))):
                _zero_if_empty(b, overwrite, M, N, K, C, c_rs, c_cs, t)

            def stage(count, task):
                """Tasks [base, base + count): do the ones this thread takes, each once every task
                before the stage is done; then move base past the stage."""
                start = b.load(base)
                end = b.add(start, count)
                head = b.append_basic_block("stage.head")
                body = b.append_basic_block("stage.body")
                out = b.append_basic_block("stage.out")
                b.branch(head)
                b.position_at_end(head)
                b.cbranch(b.icmp_signed("<", b.load(mine), end), body, out)
                b.position_at_end(body)
                _stop_if_cancelled(b, cancel)
                _wait_until(module, b, done, start, cancel, spins, sleepers)
                task(b.sub(b.load(mine), start))
                b.atomic_rmw("add", done, c64(1), "seq_cst")
                if sleepers is not None:
                    wake_sleepers(module, b, done, sleepers)
                b.store(b.atomic_rmw("add", ticket, c64(1), "monotonic"), mine)
                b.branch(head)
                b.position_at_end(out)
                b.store(end, base)

            with loop(b, 0, N, cfg.nc, name="tjc") as jc:
                nc = imin(b, c64(cfg.nc), b.sub(N, jc))
                panels = b.sdiv(b.add(nc, c64(cfg.nr - 1)), c64(cfg.nr))
                with loop(b, 0, K, cfg.kc, name="tpc") as pc:
                    kc = imin(b, c64(cfg.kc), b.sub(K, pc))

                    def pack(j, jc=jc, nc=nc, pc=pc, kc=kc):
                        j0 = b.mul(j, c64(cfg.nr))
                        cols = imin(b, c64(cfg.nr), b.sub(nc, j0))
                        bsrc = gep(b, B, b.add(b.mul(pc, b_rs), b.mul(b.add(jc, j0), b_cs)))
                        b.call(pack_b, [kc, cols, bsrc, b_rs, b_cs, gep(b, bp, b.mul(j0, kc))])

                    def compute(i, jc=jc, nc=nc, pc=pc, kc=kc):
                        ic = b.mul(i, rows)
                        block(ic, imin(b, rows, b.sub(M, ic)), pc, kc, jc, nc, bp)

                    stage(panels, pack)
                    stage(tasks_m, compute)
    b.ret_void()
    return plain


# How a thread waits for another's task: SPIN_LIMIT looks with a `pause` between them (a few
# microseconds: most waits at a stage's end are that short), then up to YIELD_LIMIT looks with a
# sched_yield() between them (the thread it waits for may share its core: under load, a waking
# thread is often put on the core of the one that woke it), then SLEEP_US µs of sleep between
# looks: an idle core lets the scheduler move the awaited thread there when another process
# shares that thread's core.
SPIN_LIMIT = 64
YIELD_LIMIT = 2048
SLEEP_US = 50
# a GEMM team's waits: `pause` between looks for FUTEX_SPIN_CYCLES time-stamp counter cycles
# (~100 µs, about a compute task: most waits at a stage's end are shorter, and a sleeping thread
# costs a wake-up of tens of µs on a VM), then sleep
FUTEX_SPIN_CYCLES = 300_000
FUTEX_TIMEOUT_NS = 1_000_000  # and look again (the cancel word too) at least every millisecond


def back_off(module: ir.Module, b: ir.IRBuilder, spins, spin_limit: int, yield_limit: int) -> None:
    """One step of a wait (`spins`: an i64 alloca counting them): `pause` for the first
    `spin_limit`, sched_yield() until `yield_limit`, then SLEEP_US µs of sleep. Shared by the GEMM
    team's waits and the loop teams' barrier (lowering/barrier.py)."""
    count = b.load(spins)
    b.store(b.add(count, c64(1)), spins)
    with b.if_else(b.icmp_signed("<", count, c64(spin_limit))) as (busy, later):
        with busy:
            _pause(module, b)
        with later:
            with b.if_else(b.icmp_signed("<", count, c64(yield_limit))) as (polite, idle):
                with polite:
                    b.call(declare_intrinsic(module, "sched_yield", I32, []), [])
                with idle:
                    b.call(declare_intrinsic(module, "usleep", I32, [I32]), [ir.Constant(I32, SLEEP_US)])


def _wait_until(module: ir.Module, b: ir.IRBuilder, done, target, cancel, spins, sleepers) -> None:
    """Wait until the finished-task counter reaches `target` (an acquire load, so that what those
    tasks wrote is visible); return from the function if the call is cancelled meanwhile. `spins`
    is an i64 alloca. Where the futex system call exists (`sleepers` not None): `pause` between
    looks for FUTEX_SPIN_CYCLES, then sleep until a finished task wakes this thread (at most
    FUTEX_TIMEOUT_NS a time). A sleeping thread gives its core away without giving up its turn:
    sched_yield() on a machine shared with other processes (other scheduling groups) handed the
    core to them for a whole time slice. Elsewhere: back_off's spin, yield, sleep."""
    if sleepers is None:
        b.store(c64(0), spins)
    else:
        b.store(b.call(declare_intrinsic(module, "llvm.readcyclecounter", I64, []), []), spins)
    head = b.append_basic_block("wait.head")
    spin = b.append_basic_block("wait.spin")
    ready = b.append_basic_block("wait.ready")
    b.branch(head)
    b.position_at_end(head)
    seen = b.load_atomic(done, "acquire", 8)
    b.cbranch(b.icmp_signed(">=", seen, target), ready, spin).set_weights([1 << 10, 1])
    b.position_at_end(spin)
    if sleepers is None:
        back_off(module, b, spins, SPIN_LIMIT, YIELD_LIMIT)
    else:  # `spins` holds the time-stamp counter when the wait began
        clock = declare_intrinsic(module, "llvm.readcyclecounter", I64, [])
        elapsed = b.sub(b.call(clock, []), b.load(spins))
        with b.if_else(b.icmp_unsigned("<", elapsed, c64(FUTEX_SPIN_CYCLES))) as (busy, later):
            with busy:
                _pause(module, b)
            with later:
                sleep_until(module, b, done, target, sleepers, FUTEX_TIMEOUT_NS)
    _stop_if_cancelled(b, cancel)
    b.branch(head)
    b.position_at_end(ready)


def _zero_if_empty(b: ir.IRBuilder, overwrite, M, N, K, C, c_rs, c_cs, t: ir.Type) -> None:
    """C = A·B with K = 0 is C = 0: no K block stores it, so zero it here."""
    with b.if_then(b.and_(overwrite, b.icmp_signed("<=", K, c64(0)))):
        with loop(b, 0, M, name="zr") as r:
            row = gep(b, C, b.mul(r, c_rs))
            with loop(b, 0, N, name="zc") as j:
                b.store(ir.Constant(t, 0), gep(b, row, b.mul(j, c_cs)))


def declare_gemm(module: ir.Module, dtype: str) -> ir.Function:
    """Declare tl_gemm_<dtype>_cancellable in `module`; its body is the process-wide
    `lowering.gemm_jit.shared_gemm(dtype)` (`dtype` may name a variant, host.gemm_variant)."""
    t = _TYPES[dtype.partition("@")[0]][0]
    name = cancellable_gemm_symbol(dtype)
    if name in module.globals:
        return module.globals[name]
    ty = ir.FunctionType(ir.VoidType(), _gemm_params(t) + [I32P, I64, I8P])
    return ir.Function(module, ty, name)
