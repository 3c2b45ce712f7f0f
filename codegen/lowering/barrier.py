"""lowering: a team's shared block → its waits: `tl_team_barrier` (whole-call teams, between phases), and chunk claims and waits (loop teams).

`i32 tl_team_barrier(i8* team, i32* cancel)`: with a null `team` (the phase runs on one thread)
it returns 0 at once. Otherwise the calling thread notes the barrier generation, counts itself
in (TEAM_ARRIVED); the last of TEAM_SIZE threads to arrive resets the count and advances the
generation (a release), which lets the others go (an acquire: what every thread wrote before the
barrier is visible after it). Waiting threads spin with `pause` a little, then yield the core,
then sleep between looks: the machine may be shared and over-subscribed, so no thread waits
without giving its core away for long. A waiting thread returns ERROR_CANCELLED instead when the
call's cancel word or the team's TEAM_ABORT word is set (another thread left with an error, or
was cancelled): no thread is left waiting for one that will never come. Loop teams
(team.py) wait differently, for chunks of work counted done (`tl_team_claim`, `tl_team_wait`),
with the same back-off and the same way out.
"""

from __future__ import annotations

import llvmlite.ir as ir

from ..emit.gemm_kernel import back_off
from ..emit.gemm_pack import declare_intrinsic
from ..emit.gemm_team import (
    TEAM_ABORT,
    TEAM_ARRIVED,
    TEAM_CHUNK_CLAIMS,
    TEAM_CHUNK_DONE,
    TEAM_CHUNK_TICKET,
    TEAM_GENERATION,
    TEAM_SIZE,
)
from ..emit.values import I8, I32, I64
from .status import ERROR_CANCELLED

BARRIER = "tl_team_barrier"
# how a waiting thread looks: SPIN_LIMIT looks with a `pause` between them (a barrier of threads
# on cores of their own lasts well under a microsecond), then up to YIELD_LIMIT looks with a
# sched_yield() between them, then emit.gemm_kernel.SLEEP_US µs of sleep between looks
SPIN_LIMIT = 256
YIELD_LIMIT = 4096


def _c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _word(b: ir.IRBuilder, team: ir.Value, offset: int, ty: ir.Type) -> ir.Value:
    return b.bitcast(b.gep(team, [_c64(offset)], inbounds=True), ty.as_pointer())


def mark_aborted(b: ir.IRBuilder, team: ir.Value) -> None:
    """At the current position: if `team` is not null, set its TEAM_ABORT word (a release store),
    so that threads waiting at the team's barrier stop."""
    with b.if_then(b.icmp_unsigned("!=", team, ir.Constant(I8.as_pointer(), None))):
        b.store_atomic(ir.Constant(I32, 1), _word(b, team, TEAM_ABORT, I32), "release", 4)


def define_barrier(module: ir.Module) -> ir.Function:
    """`tl_team_barrier` in `module` (defined once; internal linkage)."""
    if BARRIER in module.globals:
        return module.globals[BARRIER]
    fn = ir.Function(module, ir.FunctionType(I32, [I8.as_pointer(), I32.as_pointer()]), name=BARRIER)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    team, cancel = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    spins = b.alloca(I64)
    ok = ir.Constant(I32, 0)
    with b.if_then(b.icmp_unsigned("==", team, ir.Constant(I8.as_pointer(), None))):
        b.ret(ok)
    size = b.load(_word(b, team, TEAM_SIZE, I64))
    generation = _word(b, team, TEAM_GENERATION, I64)
    arrived = _word(b, team, TEAM_ARRIVED, I64)
    abort = _word(b, team, TEAM_ABORT, I32)
    # the generation must be read before arriving: it cannot move until this thread has arrived
    mine = b.load_atomic(generation, "acquire", 8)
    before = b.atomic_rmw("add", arrived, _c64(1), "acq_rel")
    with b.if_then(b.icmp_signed(">=", b.add(before, _c64(1)), size)):
        # the last to arrive: the count is reset before the release that lets the others go, and
        # they touch it again only after seeing that release; so are the chunk counters (a loop
        # team's phase numbers its chunks from 0), which nobody uses while all wait here
        b.store_atomic(_c64(0), arrived, "monotonic", 8)
        b.store_atomic(_c64(0), _word(b, team, TEAM_CHUNK_TICKET, I64), "monotonic", 8)
        b.store_atomic(_c64(0), _word(b, team, TEAM_CHUNK_DONE, I64), "monotonic", 8)
        b.store_atomic(_c64(0), _word(b, team, TEAM_CHUNK_CLAIMS, I64), "monotonic", 8)
        b.atomic_rmw("add", generation, _c64(1), "acq_rel")
        b.ret(ok)
    b.store(_c64(0), spins)
    head = b.append_basic_block("wait.head")
    wait = b.append_basic_block("wait.spin")
    done = b.append_basic_block("wait.done")
    b.branch(head)
    b.position_at_end(head)
    seen = b.load_atomic(generation, "acquire", 8)
    b.cbranch(b.icmp_unsigned("!=", seen, mine), done, wait).set_weights([1, 1 << 10])
    b.position_at_end(done)
    b.ret(ok)
    b.position_at_end(wait)
    stopped = b.or_(
        b.load_atomic(cancel, "monotonic", 4),
        b.load_atomic(abort, "acquire", 4),
    )
    with b.if_then(b.icmp_unsigned("!=", stopped, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, ERROR_CANCELLED))
    _back_off(module, b, spins)
    b.branch(head)
    return fn


def _back_off(module: ir.Module, b: ir.IRBuilder, spins: ir.Value) -> None:
    """One step of a wait, with this module's limits (emit.gemm_kernel.back_off)."""
    back_off(module, b, spins, SPIN_LIMIT, YIELD_LIMIT)


def _stop_or_back_off(
    module: ir.Module, b: ir.IRBuilder, spins: ir.Value, cancel: ir.Value, abort: ir.Value
) -> None:
    """In a chunk wait: return ERROR_CANCELLED if the cancel or abort word is set, else back off."""
    stopped = b.or_(b.load_atomic(cancel, "monotonic", 4), b.load_atomic(abort, "acquire", 4))
    with b.if_then(b.icmp_unsigned("!=", stopped, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, ERROR_CANCELLED))
    _back_off(module, b, spins)


CLAIM = "tl_team_claim"
WAIT = "tl_team_wait"


# a unit of at most MASK_CHUNKS chunks is claimed through one word, (unit base << MASK_CHUNKS) |
# a bit per chunk taken, so that each thread can take its own chunks first (a larger unit: the
# ticket counter, in order)
MASK_CHUNKS = 24


def define_claim(module: ir.Module) -> ir.Function:
    """`i64 tl_team_claim(i64* ticket, i64* claims, i64 base, i64 parts, i64 own)`: take a chunk
    of the unit whose `parts` chunks are numbered from `base`, and return its number, or -1 when
    none is left. A thread takes the chunks of its own first, those whose bits are set in `own`
    (bit k: chunk base + k), in order, then the others' from the last: when every thread is on
    time, each runs the chunks the caller gave it (own_chunks: a contiguous share; in a
    doacross loop, the time tiles of its columns, doacross.column_mask), and a thread that is
    late leaves its chunks to the others. Units of more than MASK_CHUNKS chunks
    are taken in order from the `ticket` counter. Both are compare-and-swaps that never take a
    chunk of the next unit (numbered from base + parts): those wait until every thread has
    finished this one. The `claims` word holds the unit's base above its bits; a word of an
    earlier unit is read as no chunk taken."""
    if CLAIM in module.globals:
        return module.globals[CLAIM]
    i64p = I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [i64p, i64p, I64, I64, I64]), name=CLAIM)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    ticket, claims, base, parts, own = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    none = fn.append_basic_block("claim.none")
    by_ticket = fn.append_basic_block("claim.ticket")
    by_mask = fn.append_basic_block("claim.mask")
    b.cbranch(b.icmp_signed(">", parts, _c64(MASK_CHUNKS)), by_ticket, by_mask)

    b.position_at_end(by_mask)
    cttz = declare_intrinsic(module, "llvm.cttz.i64", I64, [I64, ir.IntType(1)])
    ctlz = declare_intrinsic(module, "llvm.ctlz.i64", I64, [I64, ir.IntType(1)])
    bits = _c64((1 << MASK_CHUNKS) - 1)
    full = b.sub(b.shl(_c64(1), parts), _c64(1))
    head = b.append_basic_block("claim.mask.head")
    b.branch(head)
    b.position_at_end(head)
    word = b.load_atomic(claims, "monotonic", 8)
    unit = b.lshr(word, _c64(MASK_CHUNKS))
    current = b.select(b.icmp_unsigned("==", unit, base), b.and_(word, bits), _c64(0))
    free = b.and_(b.xor(current, _c64(-1)), full)
    # an earlier unit's word reads as empty; a later unit's means this one is over
    over = b.or_(b.icmp_unsigned(">", unit, base), b.icmp_unsigned("==", free, _c64(0)))
    pick = b.append_basic_block("claim.mask.pick")
    b.cbranch(over, none, pick)
    b.position_at_end(pick)
    mine = b.and_(free, own)
    first_mine = b.call(cttz, [mine, ir.Constant(ir.IntType(1), 1)])
    last_other = b.sub(_c64(63), b.call(ctlz, [free, ir.Constant(ir.IntType(1), 1)]))
    k = b.select(b.icmp_unsigned("!=", mine, _c64(0)), first_mine, last_other)
    claimed = b.or_(b.or_(b.shl(base, _c64(MASK_CHUNKS)), current), b.shl(_c64(1), k))
    result = b.cmpxchg(claims, word, claimed, "acq_rel", "monotonic")
    won = b.append_basic_block("claim.mask.won")
    b.cbranch(b.extract_value(result, 1), won, head)
    b.position_at_end(won)
    b.ret(b.add(base, k))

    b.position_at_end(by_ticket)
    end = b.add(base, parts)
    first = b.load_atomic(ticket, "monotonic", 8)
    thead = fn.append_basic_block("claim.head")
    swap = fn.append_basic_block("claim.swap")
    taken = fn.append_basic_block("claim.taken")
    b.branch(thead)
    b.position_at_end(thead)
    seen = b.phi(I64)
    seen.add_incoming(first, by_ticket)
    # the counter may lag behind `base` where earlier units were claimed by their bits
    chunk = b.select(b.icmp_signed("<", seen, base), base, seen)
    b.cbranch(b.icmp_signed("<", chunk, end), swap, none)
    b.position_at_end(swap)
    result = b.cmpxchg(ticket, seen, b.add(chunk, _c64(1)), "acq_rel", "monotonic")
    seen.add_incoming(b.extract_value(result, 0), swap)
    b.cbranch(b.extract_value(result, 1), taken, thead)
    b.position_at_end(taken)
    b.ret(chunk)
    b.position_at_end(none)
    b.ret(_c64(-1))
    return fn


def own_chunks(b: ir.IRBuilder, parts: ir.Value, me: ir.Value, size: ir.Value) -> ir.Value:
    """The claim mask of thread `me` of `size` over a unit of `parts` chunks: its contiguous
    share, chunks [me * parts / size, (me + 1) * parts / size)."""
    own_lo = b.sdiv(b.mul(me, parts), size)
    own_hi = b.sdiv(b.mul(b.add(me, _c64(1)), parts), size)
    return b.sub(b.shl(_c64(1), own_hi), b.shl(_c64(1), own_lo))


def define_wait(module: ir.Module) -> ir.Function:
    """`i32 tl_team_wait(i64* done, i64 target, i32* cancel, i32* abort)`: wait until `done`
    reaches `target` (an acquire: the chunks' writes are visible after it); ERROR_CANCELLED when
    the cancel or abort word is set meanwhile. Waiting only for chunks that threads have taken,
    a thread that starts late or loses its core delays the others by its chunk at most, and
    catches up without waiting: the units the others finished need nothing from it."""
    if WAIT in module.globals:
        return module.globals[WAIT]
    i32p = I32.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I32, [I64.as_pointer(), I64, i32p, i32p]), name=WAIT)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    done, target, cancel, abort = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    spins = b.alloca(I64)
    b.store(_c64(0), spins)
    head = b.append_basic_block("wait.head")
    wait = b.append_basic_block("wait.spin")
    ready = b.append_basic_block("wait.ready")
    b.branch(head)
    b.position_at_end(head)
    seen = b.load_atomic(done, "acquire", 8)
    b.cbranch(b.icmp_signed(">=", seen, target), ready, wait).set_weights([1 << 10, 1])
    b.position_at_end(ready)
    b.ret(ir.Constant(I32, 0))
    b.position_at_end(wait)
    _stop_or_back_off(module, b, spins, cancel, abort)
    b.branch(head)
    return fn


FLAGS_WAIT = "tl_team_flags"


def define_flags_wait(module: ir.Module) -> ir.Function:
    """`i32 tl_team_flags(i64* flags, i64 first, i64 last, i64 tag, i32* cancel, i32* abort)`:
    wait until every word flags[first..last] holds `tag` (a chunk of a doacross loop counted
    done, doacross.py; acquires: the chunks' writes are visible after it); ERROR_CANCELLED
    when the cancel or abort word is set meanwhile. The same back-off as the other waits."""
    if FLAGS_WAIT in module.globals:
        return module.globals[FLAGS_WAIT]
    i32p, i64p = I32.as_pointer(), I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I32, [i64p, I64, I64, I64, i32p, i32p]), name=FLAGS_WAIT)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    flags, first, last, tag, cancel, abort = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    spins = b.alloca(I64)
    b.store(_c64(0), spins)
    head = fn.append_basic_block("flags.head")
    look = fn.append_basic_block("flags.look")
    wait = fn.append_basic_block("flags.wait")
    ready = fn.append_basic_block("flags.ready")
    b.branch(head)
    b.position_at_end(head)
    index = b.phi(I64)
    index.add_incoming(first, entry)
    b.cbranch(b.icmp_signed(">", index, last), ready, look)
    b.position_at_end(look)
    seen = b.load_atomic(b.gep(flags, [index], inbounds=True), "acquire", 8)
    index.add_incoming(b.add(index, _c64(1)), look)
    b.cbranch(b.icmp_unsigned("==", seen, tag), head, wait).set_weights([1 << 10, 1])
    b.position_at_end(ready)
    b.ret(ir.Constant(I32, 0))
    b.position_at_end(wait)
    _stop_or_back_off(module, b, spins, cancel, abort)
    index.add_incoming(index, b.block)  # look at the same word again
    b.branch(head)
    return fn
