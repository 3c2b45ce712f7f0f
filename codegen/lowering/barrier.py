"""lowering: a team's shared block → `tl_team_barrier`, the sense-reversing barrier a loop team's threads meet at.

`i32 tl_team_barrier(i8* team, i32* cancel)`: with a null `team` (the phase runs on one thread)
it returns 0 at once. Otherwise the calling thread notes the barrier generation, counts itself
in (TEAM_ARRIVED); the last of TEAM_SIZE threads to arrive resets the count and advances the
generation (a release), which lets the others go (an acquire: what every thread wrote before the
barrier is visible after it). Waiting threads spin with `pause` a little, then yield the core,
then sleep between looks: the machine may be shared and over-subscribed, so no thread waits
without giving its core away for long. A waiting thread returns ERROR_CANCELLED instead when the
call's cancel word or the team's TEAM_ABORT word is set (another thread left with an error, or
was cancelled): no thread is left waiting for one that will never come.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ..emit.gemm_pack import declare_intrinsic
from ..emit.gemm_team import TEAM_ABORT, TEAM_ARRIVED, TEAM_GENERATION, TEAM_SIZE
from ..emit.values import I8, I32, I64
from .status import ERROR_CANCELLED

BARRIER = "tl_team_barrier"
# how a waiting thread looks: SPIN_LIMIT looks with a `pause` between them (a barrier of threads
# on cores of their own lasts well under a microsecond), then up to YIELD_LIMIT looks with a
# sched_yield() between them, then SLEEP_US µs of sleep between looks
SPIN_LIMIT = 256
YIELD_LIMIT = 4096
SLEEP_US = 50


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
        # they touch it again only after seeing that release
        b.store_atomic(_c64(0), arrived, "monotonic", 8)
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
    count = b.load(spins)
    b.store(b.add(count, _c64(1)), spins)
    with b.if_else(b.icmp_signed("<", count, _c64(SPIN_LIMIT))) as (busy, later):
        with busy:
            if llvm.get_process_triple().startswith(("x86_64", "i686", "i386")):
                b.call(declare_intrinsic(module, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        with later:
            with b.if_else(b.icmp_signed("<", count, _c64(YIELD_LIMIT))) as (polite, idle):
                with polite:
                    b.call(declare_intrinsic(module, "sched_yield", I32, []), [])
                with idle:
                    b.call(declare_intrinsic(module, "usleep", I32, [I32]), [ir.Constant(I32, SLEEP_US)])
    b.branch(head)
    return fn
