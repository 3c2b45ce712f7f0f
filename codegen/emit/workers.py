"""emit: the native worker threads' protocol → LLVM IR (a worker's loop, posting a piece, running one, waiting for it).

A *slot* is a 64-byte-aligned block of SLOT_BYTES, one per native worker (and one for the calling
thread's own piece), laid out in i64 words at these byte offsets:

* SLOT_SEQ: the generation the caller posted (the worker watches it; a negative one: exit);
* SLOT_DONE: the generation the worker finished (the caller watches it), on its own cache line;
* SLOT_JOB: the piece — the kernel entry's address, its eight arguments (the lo, hi words are
  replaced per range), then the address of a list of [lo, hi) ranges, their count, the address
  of the i64 counter the pieces take ranges with (shared by the pieces of one loop's parts taken
  in turn, or the slot's own), and the i32 code the piece returned.

A piece takes ranges from its counter until none is left, the call's cancel word is set
(ERROR_CANCELLED), or a range returns an error (the counter is then pushed past the end, so the
other pieces take no more). A piece of a plain split (not a team's) then takes the ranges the
dispatch's other pieces have not taken yet (SLOT_PEERS, SLOT_NPEERS), with its own arguments: a
worker that starts late, its core busy, finds its share done instead of holding the call up.
A worker takes each generation by compare-and-swap on SLOT_CLAIM before it runs the piece; once
another piece of the dispatch has returned, the caller may revoke a generation not yet taken
(`tl_worker_revoke`) instead of waiting for a worker that has not got a core. Waits spin for a while (`readcyclecounter`), then sleep in the futex
system call: a worker that finished a piece spins SPIN_CYCLES for the next one (back-to-back
calls then cost no wake-up), then sleeps until posted to. No Python runs on these threads.
"""

from __future__ import annotations

import llvmlite.ir as ir

from .gemm_pack import c64, declare_intrinsic, define_function
from .values import I8, I32, I64

I8P = I8.as_pointer()
I32P = I32.as_pointer()
I64P = I64.as_pointer()

# the pool's header (before the slots), byte offsets: the running call's i32 cancel word, the
# counter of a shared list of ranges, the word a dispatch holds the workers with (1: taken), and
# the last generation posted to any slot
POOL_CANCEL = 0
SHARED_COUNTER_BYTE = 64
POOL_BUSY = 80
POOL_SEQ = 96

SLOT_SEQ = 0
SLOT_DONE = 64
# i64: the last generation whose fate is settled: `g` the worker took it, `-g` the caller revoked
# it (the caller's own piece took all its work first: no need to wait for a worker that has not
# started, its core taken by another thread); beside SLOT_DONE, which the caller reads too
SLOT_CLAIM = 72
SLOT_JOB = 128  # fn, then the entry's 8 arguments
SLOT_RANGES = SLOT_JOB + 9 * 8  # i64*: [lo, hi) pairs
SLOT_COUNT = SLOT_RANGES + 8  # i64: pairs in the list
SLOT_COUNTER = SLOT_COUNT + 8  # i64*: the next pair nobody has taken yet
SLOT_CODE = SLOT_COUNTER + 8  # i32: what the piece returned
SLOT_CPU = SLOT_CODE + 8  # i64: the core the caller runs on (a woken worker moves off it)
SLOT_SLEEPS = SLOT_CPU + 8  # i64: how often the worker slept (for tests and measurements)
SLOT_SHARED = SLOT_SLEEPS + 8  # i64: pieces the worker found itself on the caller's core for
SLOT_ERROR = 256  # i64[4]: the piece's error record (the entry's `error` argument points here)
SLOT_PEERS = 288  # i64: the address of the dispatch's first slot (stealing)
SLOT_NPEERS = 296  # i64: the dispatch's slots, whose untaken ranges this piece may run; 0: none
SLOT_OWN_COUNTER = 320  # i64: the counter of the slot's own list
SLOT_LIST = 384  # i64 pairs: the slot's own list of [lo, hi) ranges
SLOT_BYTES = 1024
SLOT_PAIRS = (SLOT_BYTES - SLOT_LIST) // 16
ARG_LO, ARG_HI = 4, 5  # the entry's arguments replaced by each range

# a worker spins (`pause`) this long (time-stamp counter cycles, ~50 µs at 3 GHz: the Python
# between back-to-back calls) for its next piece, then sleeps in the futex. It does not yield
# meanwhile: a thread that sleeps and is woken gets the core back at once (the scheduler's
# wake-up preemption), while one that keeps yielding waits out whoever shares its core — another
# process, or OpenBLAS's threads, which spin for ~0.1 s after each call: after a NumPy matmul on
# 2 threads, a yielding worker made 0.2 ms calls take 8-12 ms. A waiting caller pauses
# 2 * PAUSE_CYCLES, then sleeps.
SPIN_CYCLES = 150_000
PAUSE_CYCLES = 50_000
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
WAKE_ALL = 2**31 - 1

WORKER = "tl_worker_main"
POST = "tl_worker_post"
RUN = "tl_worker_run"
WAIT = "tl_worker_wait"
REVOKE = "tl_worker_revoke"
TAKE = "tl_pool_take"
GIVE = "tl_pool_give"


def _word(b: ir.IRBuilder, slot, offset: int, ty: ir.Type = I64):
    return b.bitcast(b.gep(slot, [c64(offset)], inbounds=True), ty.as_pointer())


def _futex(module: ir.Module, b: ir.IRBuilder, nr: int, word, op: int, value, timeout) -> None:
    _declare_syscall(module)
    syscall = module.globals["syscall"]
    b.call(
        syscall,
        [c64(nr), b.bitcast(word, I32P), ir.Constant(I32, op), b.trunc(value, I32), timeout, ir.Constant(I8P, None),
         ir.Constant(I32, 0)],
    )  # fmt: skip


def _declare_syscall(module: ir.Module) -> None:
    if "syscall" not in module.globals:
        ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), name="syscall")


def _pause(module: ir.Module, b: ir.IRBuilder, x86: bool) -> None:
    if x86:
        b.call(declare_intrinsic(module, "llvm.x86.sse2.pause", ir.VoidType(), []), [])


def _spin_until(module, b, word, target, budget: int, x86: bool, until_ge: bool, polite: bool = True):
    """Spin (at most `budget` cycles) until the acquire-loaded `word` reaches `target` (≥ when
    `until_ge`, else ≠): `pause` between looks for the first PAUSE_CYCLES, then (if `polite`)
    sched_yield(), so that a thread sharing this core (the caller, another process) runs
    meanwhile. Returns the last value seen."""
    clock = declare_intrinsic(module, "llvm.readcyclecounter", I64, [])
    start = b.call(clock, [])
    head = b.append_basic_block("spin.head")
    body = b.append_basic_block("spin.body")
    out = b.append_basic_block("spin.out")
    b.branch(head)
    b.position_at_end(head)
    seen = b.load_atomic(word, "acquire", 8)
    ready = b.icmp_signed(">=", seen, target) if until_ge else b.icmp_signed("!=", seen, target)
    b.cbranch(ready, out, body)
    b.position_at_end(body)
    elapsed = b.sub(b.call(clock, []), start)
    with b.if_else(b.icmp_unsigned("<", elapsed, c64(PAUSE_CYCLES if polite else budget))) as (busy, later):
        with busy:
            _pause(module, b, x86)
        with later:
            b.call(declare_intrinsic(module, "sched_yield", I32, []), [])
    b.cbranch(b.icmp_unsigned("<", elapsed, c64(budget)), head, out)
    b.position_at_end(out)
    return b.load_atomic(word, "acquire", 8)


def _settle(b: ir.IRBuilder, claim, generation, value, name: str) -> tuple[ir.Block, ir.Block]:
    """Settle `generation`'s fate in the SLOT_CLAIM word `claim`: compare-and-swap `value` (the
    generation: taken; its negation: revoked) into it unless it already holds this generation or
    a later one, either sign. Returns the blocks reached when this thread's swap won, and when
    the word was settled otherwise (only a slot's worker and its caller write it, so a failed
    swap saw the other's)."""
    start = b.block
    first = b.load_atomic(claim, "acquire", 8)
    head = b.append_basic_block(f"{name}.head")
    swap = b.append_basic_block(f"{name}.swap")
    won = b.append_basic_block(f"{name}.won")
    lost = b.append_basic_block(f"{name}.settled")
    b.branch(head)
    b.position_at_end(head)
    seen = b.phi(I64, name=f"{name}.seen")
    seen.add_incoming(first, start)
    magnitude = b.select(b.icmp_signed("<", seen, c64(0)), b.neg(seen), seen)
    b.cbranch(b.icmp_signed(">=", magnitude, generation), lost, swap)
    b.position_at_end(swap)
    result = b.cmpxchg(claim, seen, value, "acq_rel", "acquire")
    seen.add_incoming(b.extract_value(result, 0), swap)
    b.cbranch(b.extract_value(result, 1), won, head)
    return won, lost


def define_workers(module: ir.Module, futex_nr: int, cancelled: int, x86: bool) -> None:
    """Define the four external functions of the protocol in `module`:

    * `i8* tl_worker_main(i8* slot)`: a worker thread's body (pthread_create's routine);
    * `void tl_worker_post(i8* slot, i64 seq)`: publish the slot's job as generation `seq`;
    * `i32 tl_worker_run(i8* slot)`: run the slot's piece on the calling thread, return its code;
    * `i32 tl_worker_wait(i8* slot, i64 seq, i64 timeout_ns)`: 1 once generation `seq` is done,
      0 if the timeout passed first (the caller looks again after running signal handlers);
    * `i32 tl_worker_revoke(i8* slot, i64 seq)`: 1 if the worker had not taken generation `seq`
      and now never will (SLOT_CLAIM), 0 if it took it (the caller then waits for it). Only for
      a piece that would find nothing left to do: another piece of its dispatch has returned;
    * `i32 tl_pool_take(i8* header)`, `void tl_pool_give(i8* header)`: hold the workers (1 if
      this call got them) and let them go (POOL_BUSY), for Python's dispatches and native ones.

    `futex_nr` is the host's futex system call number, `cancelled` the code a piece returns when
    the cancel word is set."""
    _declare_syscall(module)
    ts = ir.LiteralStructType([I64, I64])
    sched_getcpu = declare_intrinsic(module, "sched_getcpu", I32, [])

    # -- run: take ranges until none is left ---------------------------------------------------
    run = define_function(module, RUN, I32, [I8P], ["slot"], linkage="external")
    b = ir.IRBuilder(run.append_basic_block("entry"))
    (slot,) = run.args
    entry_ty = ir.FunctionType(I32, [I8P, I8P, I8P, I64, I64, I64, I8P, I32P])
    fn = b.inttoptr(b.load(_word(b, slot, SLOT_JOB)), entry_ty.as_pointer())
    args = [b.load(_word(b, slot, SLOT_JOB + 8 * (1 + i))) for i in range(8)]
    cancel = b.inttoptr(args[7], I32P)
    peers = b.load(_word(b, slot, SLOT_PEERS))
    npeers = b.load(_word(b, slot, SLOT_NPEERS))
    entry = b.block
    victim = b.append_basic_block("victim")
    head = b.append_basic_block("take")
    check = b.append_basic_block("check")
    call = b.append_basic_block("call")
    finished = b.append_basic_block("finished")
    stopped = b.append_basic_block("cancelled")
    failed = b.append_basic_block("failed")
    b.branch(victim)
    # the slot's own list first (v = -1), then, when stealing is allowed (SLOT_NPEERS > 0), the
    # lists of the dispatch's slots in turn: ranges their threads have not taken yet
    b.position_at_end(victim)
    v = b.phi(I64, name="v")
    v.add_incoming(c64(-1), entry)
    other = b.gep(b.inttoptr(peers, I8P), [b.mul(v, c64(SLOT_BYTES))])
    source = b.select(b.icmp_signed("<", v, c64(0)), slot, other)
    ranges = b.inttoptr(b.load(_word(b, source, SLOT_RANGES)), I64P)
    count = b.load(_word(b, source, SLOT_COUNT))
    counter = b.inttoptr(b.load(_word(b, source, SLOT_COUNTER)), I64P)
    b.branch(head)
    b.position_at_end(head)
    i = b.atomic_rmw("add", counter, c64(1), "monotonic")
    b.cbranch(b.icmp_signed(">=", i, count), finished, check)
    b.position_at_end(check)
    live = b.icmp_unsigned("!=", cancel, ir.Constant(I32P, None))
    look = b.append_basic_block("look")
    b.cbranch(live, look, call)
    b.position_at_end(look)
    flag = b.load_atomic(cancel, "monotonic", 4)
    b.cbranch(b.icmp_signed("!=", flag, ir.Constant(I32, 0)), stopped, call)
    b.position_at_end(call)
    lo = b.load(b.gep(ranges, [b.mul(i, c64(2))], inbounds=True))
    hi = b.load(b.gep(ranges, [b.add(b.mul(i, c64(2)), c64(1))], inbounds=True))
    values = [
        b.inttoptr(args[0], I8P), b.inttoptr(args[1], I8P), b.inttoptr(args[2], I8P), args[3], lo, hi,
        b.inttoptr(args[6], I8P), cancel,
    ]  # fmt: skip
    code = b.call(fn, values)
    b.cbranch(b.icmp_signed("!=", code, ir.Constant(I32, 0)), failed, head)
    b.position_at_end(failed)
    b.atomic_rmw("xchg", counter, count, "monotonic")  # the other pieces take no more ranges
    b.ret(code)
    b.position_at_end(stopped)
    b.ret(ir.Constant(I32, cancelled))
    b.position_at_end(finished)
    following = b.add(v, c64(1))
    v.add_incoming(following, finished)
    done = b.append_basic_block("done")
    b.cbranch(b.icmp_signed("<", following, npeers), victim, done)
    b.position_at_end(done)
    b.ret(ir.Constant(I32, 0))

    # -- post ------------------------------------------------------------------------------------
    post = define_function(module, POST, ir.VoidType(), [I8P, I64], ["slot", "seq"], linkage="external")
    b = ir.IRBuilder(post.append_basic_block("entry"))
    slot, seq = post.args
    word = _word(b, slot, SLOT_SEQ)
    b.store_atomic(seq, word, "seq_cst", 8)
    _futex(module, b, futex_nr, word, FUTEX_WAKE_PRIVATE, c64(1), ir.Constant(I8P, None))
    b.ret_void()

    # -- wait ------------------------------------------------------------------------------------
    wait = define_function(module, WAIT, I32, [I8P, I64, I64], ["slot", "seq", "timeout"], linkage="external")
    b = ir.IRBuilder(wait.append_basic_block("entry"))
    slot, seq, timeout = wait.args
    word = _word(b, slot, SLOT_DONE)
    # the caller pauses, then sleeps until the worker's wake: a yield on a machine shared with
    # other processes can hand them the core for a whole time slice
    seen = _spin_until(module, b, word, seq, PAUSE_CYCLES * 2, x86, until_ge=True, polite=False)
    ready = b.append_basic_block("ready")
    sleep = b.append_basic_block("sleep")
    b.cbranch(b.icmp_signed(">=", seen, seq), ready, sleep)
    b.position_at_end(sleep)
    spec = b.alloca(ts)
    b.store(b.sdiv(timeout, c64(1_000_000_000)), b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
    b.store(b.srem(timeout, c64(1_000_000_000)), b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
    _futex(module, b, futex_nr, word, FUTEX_WAIT_PRIVATE, seen, b.bitcast(spec, I8P))
    again = b.load_atomic(word, "acquire", 8)
    b.ret(b.zext(b.icmp_signed(">=", again, seq), I32))
    b.position_at_end(ready)
    b.ret(ir.Constant(I32, 1))

    # -- revoke ------------------------------------------------------------------------------------
    revoke = define_function(module, REVOKE, I32, [I8P, I64], ["slot", "seq"], linkage="external")
    b = ir.IRBuilder(revoke.append_basic_block("entry"))
    slot, seq = revoke.args
    revoked, taken = _settle(b, _word(b, slot, SLOT_CLAIM), seq, b.neg(seq), "revoke")
    b.position_at_end(revoked)
    b.ret(ir.Constant(I32, 1))
    b.position_at_end(taken)
    b.ret(ir.Constant(I32, 0))

    # -- holding the workers: POOL_BUSY ------------------------------------------------------------
    take = define_function(module, TAKE, I32, [I8P], ["header"], linkage="external")
    b = ir.IRBuilder(take.append_basic_block("entry"))
    busy = _word(b, take.args[0], POOL_BUSY)
    b.ret(b.zext(b.extract_value(b.cmpxchg(busy, c64(0), c64(1), "acq_rel", "monotonic"), 1), I32))
    give = define_function(module, GIVE, ir.VoidType(), [I8P], ["header"], linkage="external")
    b = ir.IRBuilder(give.append_basic_block("entry"))
    b.store_atomic(c64(0), _word(b, give.args[0], POOL_BUSY), "release", 8)
    b.ret_void()

    # -- a worker's loop -------------------------------------------------------------------------
    main = define_function(module, WORKER, I8P, [I8P], ["slot"], linkage="external")
    entry = main.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    (slot,) = main.args
    seq_word, done_word = _word(b, slot, SLOT_SEQ), _word(b, slot, SLOT_DONE)
    # the last generation done when the thread was made (the caller may post the next one
    # before the new thread first looks at SLOT_SEQ)
    first = b.load_atomic(done_word, "acquire", 8)
    head = b.append_basic_block("idle")
    b.branch(head)
    b.position_at_end(head)
    last = b.phi(I64, name="last")
    last.add_incoming(first, entry)
    seen = _spin_until(module, b, seq_word, last, SPIN_CYCLES, x86, until_ge=False, polite=False)
    posted = b.append_basic_block("posted")
    sleep = b.append_basic_block("sleep")
    b.cbranch(b.icmp_signed("!=", seen, last), posted, sleep)
    b.position_at_end(sleep)  # FUTEX_WAIT returns at once if the word moved meanwhile
    sleeps = _word(b, slot, SLOT_SLEEPS)
    b.store(b.add(b.load(sleeps), c64(1)), sleeps)
    _futex(module, b, futex_nr, seq_word, FUTEX_WAIT_PRIVATE, last, ir.Constant(I8P, None))
    recheck = b.load_atomic(seq_word, "acquire", 8)
    b.cbranch(b.icmp_signed("!=", recheck, last), posted, sleep)
    b.position_at_end(posted)
    now = b.load_atomic(seq_word, "acquire", 8)
    leave = b.append_basic_block("exit")
    work = b.append_basic_block("work")
    b.cbranch(b.icmp_signed("<", now, c64(0)), leave, work)
    b.position_at_end(work)
    # take the generation unless the caller revoked it (or a later one) meanwhile
    take, skip = _settle(b, _word(b, slot, SLOT_CLAIM), now, now, "claim")
    b.position_at_end(skip)  # nothing to run, nobody waits: look for the next generation
    last.add_incoming(now, skip)
    b.branch(head)
    b.position_at_end(take)
    # a worker woken from its sleep is often put on the core of the thread that woke it (and a
    # busy machine's balancing may move a spinning one there), which runs a piece too: move to
    # another core first (the caller wrote its core); SLOT_SHARED counts it
    caller = b.load(_word(b, slot, SLOT_CPU))
    with b.if_then(b.icmp_signed("==", b.sext(b.call(sched_getcpu, []), I64), caller)):
        shared = _word(b, slot, SLOT_SHARED)
        b.store(b.add(b.load(shared), c64(1)), shared)
        _move_off(module, b, caller)
    code = b.call(run, [slot])
    b.store(code, _word(b, slot, SLOT_CODE, I32))
    b.store_atomic(now, done_word, "seq_cst", 8)
    _futex(
        module, b, futex_nr, done_word, FUTEX_WAKE_PRIVATE, ir.Constant(I64, WAKE_ALL), ir.Constant(I8P, None)
    )
    last.add_incoming(now, b.block)
    b.branch(head)
    b.position_at_end(leave)
    b.store_atomic(now, done_word, "seq_cst", 8)
    _futex(
        module, b, futex_nr, done_word, FUTEX_WAKE_PRIVATE, ir.Constant(I64, WAKE_ALL), ir.Constant(I8P, None)
    )
    b.ret(ir.Constant(I8P, None))


CPUSET_BYTES = 128  # glibc's cpu_set_t (1024 cores)


def _move_off(module: ir.Module, b: ir.IRBuilder, cpu) -> None:
    """sched_setaffinity to the allowed cores less `cpu` (if any other is allowed), then back:
    the thread migrates at once and keeps its affinity."""
    get = declare_intrinsic(module, "sched_getaffinity", I32, [I32, I64, I8P])
    put = declare_intrinsic(module, "sched_setaffinity", I32, [I32, I64, I8P])
    mask_ty = ir.ArrayType(I64, CPUSET_BYTES // 8)
    allowed = b.alloca(mask_ty)
    other = b.alloca(mask_ty)
    a8, o8 = b.bitcast(allowed, I8P), b.bitcast(other, I8P)
    with b.if_then(
        b.icmp_signed("==", b.call(get, [ir.Constant(I32, 0), c64(CPUSET_BYTES), a8]), ir.Constant(I32, 0))
    ):
        with b.if_then(b.icmp_unsigned("<", cpu, c64(CPUSET_BYTES * 8))):
            rest = c64(0)
            for w in range(CPUSET_BYTES // 8):
                v = b.load(b.gep(allowed, [ir.Constant(I32, 0), ir.Constant(I32, w)]))
                b.store(v, b.gep(other, [ir.Constant(I32, 0), ir.Constant(I32, w)]))
            index = b.lshr(cpu, c64(6))
            bit = b.shl(c64(1), b.and_(cpu, c64(63)))
            p = b.gep(other, [ir.Constant(I32, 0), index])
            b.store(b.and_(b.load(p), b.xor(bit, c64(-1))), p)
            for w in range(CPUSET_BYTES // 8):
                rest = b.or_(rest, b.load(b.gep(other, [ir.Constant(I32, 0), ir.Constant(I32, w)])))
            with b.if_then(b.icmp_unsigned("!=", rest, c64(0))):
                b.call(put, [ir.Constant(I32, 0), c64(CPUSET_BYTES), o8])
                b.call(put, [ir.Constant(I32, 0), c64(CPUSET_BYTES), a8])


def futex_number() -> int | None:
    """The futex system call's number on the host LLVM generates code for, or None."""
    import llvmlite.binding as llvm

    arch = llvm.get_process_triple().split("-")[0]
    return {"x86_64": 202, "aarch64": 98}.get(arch) if "linux" in llvm.get_process_triple() else None


def sleep_until(module: ir.Module, b: ir.IRBuilder, word, target, sleepers, timeout_ns: int) -> None:
    """One sleep of a thread waiting for the i64 counter `word` to reach `target`: count itself
    in `sleepers` (an i64 the threads that advance `word` read, `wake_sleepers`), look once more,
    then FUTEX_WAIT at most `timeout_ns` (returns at once if the word moved meanwhile), and
    count itself out. The caller looks at the word again after it (and checks its cancel word)."""
    nr = futex_number()
    b.atomic_rmw("add", sleepers, c64(1), "seq_cst")
    seen = b.load_atomic(word, "seq_cst", 8)
    with b.if_then(b.icmp_signed("<", seen, target)):
        at_entry = ir.IRBuilder(b.function.entry_basic_block)  # not in the loop: the stack stays
        at_entry.position_at_start(b.function.entry_basic_block)
        spec = at_entry.alloca(ir.LiteralStructType([I64, I64]))
        b.store(c64(timeout_ns // 1_000_000_000), b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        b.store(c64(timeout_ns % 1_000_000_000), b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        _futex(module, b, nr, word, FUTEX_WAIT_PRIVATE, seen, b.bitcast(spec, I8P))
    b.atomic_rmw("sub", sleepers, c64(1), "seq_cst")


def wake_sleepers(module: ir.Module, b: ir.IRBuilder, word, sleepers) -> None:
    """After advancing `word` (a seq_cst update): wake the threads sleeping on it, if any."""
    with b.if_then(b.icmp_signed(">", b.load_atomic(sleepers, "seq_cst", 8), c64(0))):
        _futex(module, b, futex_number(), word, FUTEX_WAKE_PRIVATE, c64(WAKE_ALL), ir.Constant(I8P, None))
