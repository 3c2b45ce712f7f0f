"""emit: a phase's dispatch record → LLVM IR of `tl_worker_dispatch`, which runs one split phase or GEMM team on the native worker slots with no Python.

runtime/native_pool.run writes a dispatch into the slots from Python on every call (a few
microseconds of packing and four ctypes calls). A signature called again and again dispatches
the same pieces each time, so runtime/nativecall.py writes them once into a *record*, an i64
array, and the native checked call (emit/callentry.py) hands it to this function:

* R_HEADER: the pool's header (the call's cancel word, the shared counter, POOL_BUSY, POOL_SEQ);
  R_SLOTS: slot 0's address (slot p at R_SLOTS + p * SLOT_BYTES); R_PIECES: the pieces, one per
  slot, piece 0 the caller's;
* R_TEAM, R_TEAM_SIZE: a GEMM team's shared block (0: none) and its thread count;
* R_ENTRY, R_PARAMS, R_PHASE, R_WORKSPACE, R_NEVER: what running the whole phase on the calling
  thread takes (when another call holds the workers): the kernel entry, its parameters, the
  phase, piece 0's workspace, a cancel word nobody sets;
* from R_IMAGES, IMAGE_WORDS per piece: the slot's words from SLOT_JOB through SLOT_CPU (the
  buffers word is written per call: the pointer array lives on the checked call's stack), then
  from SLOT_PEERS through the slot's own counter (zero).

It takes the workers (POOL_BUSY, or runs the phase alone), clears the call's words and the team's
header, copies each piece into its slot, posts pieces 1.., runs piece 0, then revokes or waits
for each posted one (runtime/native_pool.run's protocol, emit/workers.py), and answers the first
failure's code with its error record copied to `error` (a cancelled piece's last), else 0.
"""

from __future__ import annotations

import llvmlite.ir as ir

from .gemm_pack import c64, declare_intrinsic, define_function, loop
from .gemm_team import TEAM_PANEL, TEAM_SIZE
from .values import I8, I32, I64
from .workers import (
    POOL_BUSY,
    POOL_SEQ,
    SHARED_COUNTER_BYTE,
    SLOT_BYTES,
    SLOT_CODE,
    SLOT_CPU,
    SLOT_ERROR,
    SLOT_JOB,
    SLOT_PEERS,
)

I8P = I8.as_pointer()
I64P = I64.as_pointer()

DISPATCH = "tl_worker_dispatch"
R_HEADER, R_SLOTS, R_PIECES, R_TEAM, R_TEAM_SIZE = 0, 1, 2, 3, 4
R_ENTRY, R_PARAMS, R_PHASE, R_WORKSPACE, R_NEVER = 5, 6, 7, 8, 9
R_IMAGES = 10
JOB_WORDS = (SLOT_CPU - SLOT_JOB) // 8 + 1  # SLOT_JOB through SLOT_CPU
PEER_WORDS = 5  # SLOT_PEERS through the own counter
IMAGE_WORDS = JOB_WORDS + PEER_WORDS
MAX_PIECES = 65  # the pool's slots: the caller's and 64 workers'
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def define_dispatch(module: ir.Module, run: ir.Function, post: ir.Function, wait: ir.Function,
                    revoke: ir.Function, cancelled: int) -> ir.Function:  # fmt: skip
    """`i32 tl_worker_dispatch(i64* record, i8* buffers, i8* error)` in `module`, beside the
    worker protocol's functions it calls."""
    fn = define_function(module, DISPATCH, I32, [I64P, I8P, I8P], ["record", "buffers", "error"], "external")
    record, buffers, error = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entry_ty = ir.FunctionType(I32, [I8P, I8P, I8P, I64, I64, I64, I8P, I8P])
    seqs = b.alloca(I64, c64(MAX_PIECES), name="seqs")

    def word(index):
        return b.load(b.gep(record, [index if isinstance(index, ir.Value) else c64(index)], inbounds=True))

    def at(base, offset, ty=I64):
        return b.bitcast(
            b.gep(base, [offset if isinstance(offset, ir.Value) else c64(offset)]), ty.as_pointer()
        )

    header = b.inttoptr(word(R_HEADER), I8P)
    slots = b.inttoptr(word(R_SLOTS), I8P)
    pieces = word(R_PIECES)
    busy = at(header, POOL_BUSY)
    taken = b.cmpxchg(busy, c64(0), c64(1), "acq_rel", "monotonic")
    alone = fn.append_basic_block("alone")
    shared = fn.append_basic_block("shared")
    b.cbranch(b.extract_value(taken, 1), shared, alone)

    b.position_at_end(alone)  # another call holds the workers: the whole phase here
    kernel = b.inttoptr(word(R_ENTRY), entry_ty.as_pointer())
    code = b.call(kernel, [buffers, b.inttoptr(word(R_PARAMS), I8P), error, word(R_PHASE), c64(INT64_MIN),
                           c64(INT64_MAX), b.inttoptr(word(R_WORKSPACE), I8P), b.inttoptr(word(R_NEVER), I8P)])  # fmt: skip
    b.ret(code)

    b.position_at_end(shared)
    b.store(ir.Constant(I32, 0), at(header, 0, I32))  # the call's cancel word
    b.store(c64(0), at(header, SHARED_COUNTER_BYTE))
    team = word(R_TEAM)
    with b.if_then(b.icmp_signed("!=", team, c64(0))):
        block = b.inttoptr(team, I8P)
        with loop(b, 0, c64(TEAM_PANEL // 8), name="clear") as i:
            b.store(c64(0), b.gep(b.bitcast(block, I64P), [i]))
        b.store(word(R_TEAM_SIZE), at(block, TEAM_SIZE))
    sched_getcpu = declare_intrinsic(module, "sched_getcpu", I32, [])
    cpu = b.sext(b.call(sched_getcpu, []), I64)
    with loop(b, 0, pieces, name="piece") as p:
        slot = b.gep(slots, [b.mul(p, c64(SLOT_BYTES))])
        image = b.add(c64(R_IMAGES), b.mul(p, c64(IMAGE_WORDS)))
        with loop(b, 0, c64(JOB_WORDS), name="job") as w:
            b.store(word(b.add(image, w)), b.gep(at(slot, SLOT_JOB), [w]))
        with loop(b, 0, c64(PEER_WORDS), name="peer") as w:
            b.store(word(b.add(b.add(image, c64(JOB_WORDS)), w)), b.gep(at(slot, SLOT_PEERS), [w]))
        b.store(b.ptrtoint(buffers, I64), at(slot, SLOT_JOB + 8))
        b.store(cpu, at(slot, SLOT_CPU))
    seq_word = at(header, POOL_SEQ)
    with loop(b, 1, pieces, name="post") as p:
        seq = b.add(b.atomic_rmw("add", seq_word, c64(1), "monotonic"), c64(1))
        b.store(seq, b.gep(seqs, [p]))
        b.call(post, [b.gep(slots, [b.mul(p, c64(SLOT_BYTES))]), seq])
    codes = b.alloca(I32, c64(MAX_PIECES), name="codes")
    b.store(b.call(run, [slots]), codes)
    with loop(b, 1, pieces, name="join") as p:
        slot = b.gep(slots, [b.mul(p, c64(SLOT_BYTES))])
        seq = b.load(b.gep(seqs, [p]))
        code_at = b.gep(codes, [p])
        with b.if_else(b.icmp_signed("!=", b.call(revoke, [slot, seq]), ir.Constant(I32, 0))) as (
            gone,
            posted,
        ):
            with gone:
                b.store(ir.Constant(I32, 0), code_at)
            with posted:
                head = fn.append_basic_block("join.wait")
                done = fn.append_basic_block("join.done")
                b.branch(head)
                b.position_at_end(head)
                ready = b.call(wait, [slot, seq, c64(50_000_000)])
                b.cbranch(b.icmp_signed("!=", ready, ir.Constant(I32, 0)), done, head)
                b.position_at_end(done)
                b.store(b.load(at(slot, SLOT_CODE, I32)), code_at)
    b.store_atomic(c64(0), busy, "release", 8)
    # the answer: the first failure, one cancelled because another failed last
    chosen = b.alloca(I64, name="chosen")
    b.store(c64(-1), chosen)
    with loop(b, 0, pieces, name="pick") as p:
        code = b.load(b.gep(codes, [p]))
        best = b.load(chosen)
        none_yet = b.icmp_signed("<", best, c64(0))
        best_cancelled = b.icmp_signed(
            "==", b.load(b.gep(codes, [b.select(none_yet, c64(0), best)])), ir.Constant(I32, cancelled)
        )
        better = b.or_(
            none_yet, b.and_(best_cancelled, b.icmp_signed("!=", code, ir.Constant(I32, cancelled)))
        )
        with b.if_then(b.and_(b.icmp_signed("!=", code, ir.Constant(I32, 0)), better)):
            b.store(p, chosen)
    best = b.load(chosen)
    ok = fn.append_basic_block("ok")
    failed = fn.append_basic_block("failed")
    b.cbranch(b.icmp_signed("<", best, c64(0)), ok, failed)
    b.position_at_end(ok)
    b.ret(ir.Constant(I32, 0))
    b.position_at_end(failed)
    slot = b.gep(slots, [b.mul(best, c64(SLOT_BYTES))])
    with loop(b, 0, c64(4), name="error") as w:
        b.store(b.load(b.gep(at(slot, SLOT_ERROR), [w])), b.gep(b.bitcast(error, I64P), [w]))
    b.ret(b.load(b.gep(codes, [best])))
    return fn
