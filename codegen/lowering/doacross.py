"""lowering: a team's sequential loop around one parallel loop (time tiles' wavefronts) → a doacross loop, each chunk waiting only for the chunks it reads from.

A loop team waits after each unit (one iteration of the sequential loop: a wavefront of time
tiles) until all of its chunks are done. Where the wavefronts hold few tiles each (fdtd-2d's
three time tiles on two threads) or tiles of unequal work, a thread idles at every wavefront. The
AST builder finds, for the parallel loop, how far back its iterations depend on the loop around
it (planning/astgen.py `LoopInfo.lags`: at most `back` iterations of the outer loop, and there
only inner values within [v - most, v - least] of the sink's v). So a chunk of wavefront w
covering values [v0, v1] needs only the chunks of wavefronts w - 1 .. w - back that hold values
in [v0 - most, v1 - least]: it waits for their flags (barrier.py `tl_team_flags`) and starts,
while other chunks of earlier wavefronts still run. Each chunk, once run, sets its flag, a word
of the team's block (TEAM_FLAGS) tagged with the call (TEAM_SERIAL) and the phase (the barrier
generation of a whole-call team), so that flags of an earlier call or phase never count.

A chunk waits only for chunks of earlier units, which have all been claimed (a thread leaves a
unit when no chunk of it is left to claim), so every wait ends: the earliest unfinished chunk
waits for nothing. The loop's chunks are counted first (each thread alike); when there are more
than TEAM_FLAG_SLOTS, the loop waits unit by unit as before. After the loop, every thread waits
for all of its chunks, as after any unit. A wavefront loop over several parallel pieces, or over
rows and columns of tiles, is wavefront.py's (with the flag state of `flag_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl
import llvmlite.ir as ll

from ..emit import values as V
from ..emit.gemm_team import TEAM_FLAG_SLOTS, TEAM_FLAGS, TEAM_GENERATION, TEAM_SERIAL
from ..planning.astgen import evaluate_ast_int, unwrap
from ..planning.teams import is_team_split
from .barrier import MASK_CHUNKS, define_flags_wait
from .state import LoweringState


def _c64(v: int) -> ll.Constant:
    return ll.Constant(V.I64, v)


@dataclass(frozen=True)
class Doacross:
    """A doacross loop being emitted: the outer loop's iterator `name` (now `iv`, from `first`
    by `inc`), its parallel loop `split`, the lags (back, least, most) and the flag state."""

    split: isl.AstNode | None
    name: str
    iv: ll.Value | None
    first: ll.Value | None
    inc: int
    env: dict
    lags: tuple[int, int, int]
    on_flags: ll.Value  # i1: this call runs on flags (else unit by unit)
    flags: ll.Value  # i64*: the flag words
    tag: ll.Value  # i64: what a done chunk's word holds in this call and phase
    first_chunk: ll.Value  # i64: the loop's first chunk number (flag 0)


class DoacrossLowering(LoweringState):
    """Doacross loops of a team phase (mixed into TeamLowering, whose unit and split helpers
    they use)."""

    def doacross_lags(self, node: isl.AstNode) -> tuple[int, int, int] | None:
        """The lags of `node`'s parallel loop when `node` is the phase's outermost team loop, a
        non-degenerate for loop with a constant positive step whose body is just that loop."""
        if not self.team_outermost or node.for_is_degenerate():
            return None
        body = unwrap(node.for_get_body())
        if body.get_type() != isl.ast_node_type.for_ or not is_team_split(body, self.ast):
            return None
        inc = evaluate_ast_int(node.for_get_inc(), {})
        info = self.ast.loops.get(body.get_annotation().get_name())
        if inc is None or inc <= 0 or info is None or info.lags is None:
            return None
        back, least, most = info.lags
        return (back, least, most) if back >= 1 else None

    def emit_doacross_loop(
        self, node: isl.AstNode, env: dict[str, ll.Value], lags: tuple[int, int, int]
    ) -> None:
        """The outer loop `node`: count its chunks, choose flags or unit-by-unit waits, run the
        iterations (each one unit of the parallel loop), then wait for every chunk."""
        name = node.for_get_iterator().get_id().get_name()
        split = unwrap(node.for_get_body())
        first = self.ast_expr(node.for_get_init(), env)
        inc = evaluate_ast_int(node.for_get_inc(), {})
        total = self._count_chunks(node, split, name, first, inc, env)
        state = self.flag_state(total)

        def body(iv: ll.Value) -> None:
            doacross = replace(state, split=split, name=name, iv=iv, first=first, inc=inc, env=env, lags=lags)
            self._emit_split(split, {**env, name: iv}, doacross)

        self.flag_loop(node, name, first, inc, env, state, body)

    def flag_loop(
        self, node: isl.AstNode, name: str, first: ll.Value, inc: int, env: dict, state: Doacross, body
    ) -> None:
        """The team's sequential loop `node` (iterator `name` from `first` by `inc`) with
        body(iv) emitted inside; after it, on flags, every thread waits for all its chunks."""
        b = self.b
        self.loop_depth += 1
        self.team_outermost = False
        try:
            _, iv, exit_, _ = self._open_loop(node, name, first, env, restricted=False, poll=True)
            body(iv)
            iv.add_incoming(b.add(iv, _c64(inc), flags=["nsw"]), b.block)
            b.branch(iv.parent)
            b.position_at_end(exit_)
        finally:
            self.loop_depth -= 1
        with b.if_then(state.on_flags):
            self.wait_for_chunks(b.load(self.team_base))

    def flag_state(self, total: ll.Value) -> Doacross:
        """The flag state of a loop of `total` chunks (its other fields unset): on flags when
        the phase runs on a team and the chunks fit TEAM_FLAG_SLOTS."""
        b = self.b
        null = ll.Constant(V.I8.as_pointer(), None)
        together = b.icmp_unsigned("!=", self.team_block, null)
        on_flags = b.and_(together, b.icmp_signed("<=", total, _c64(TEAM_FLAG_SLOTS)))
        # alone, nothing is read from the block: point at a word of this thread's own
        own = b.alloca(V.I64, 2)
        block = b.select(together, self.team_block, b.bitcast(own, V.I8.as_pointer()))

        def word(offset: int) -> ll.Value:
            at = b.select(together, _c64(offset), _c64(0))
            return b.bitcast(b.gep(block, [at]), V.I64.as_pointer())

        b.store(_c64(0), own)
        serial = b.load(word(TEAM_SERIAL))
        generation = b.load_atomic(word(TEAM_GENERATION), "acquire", 8)
        tag = b.add(b.add(b.mul(serial, _c64(1 << 16)), b.and_(generation, _c64(0xFFFF))), _c64(1))
        first_chunk = b.load(self.team_base)
        return Doacross(None, "", None, None, 0, {}, (0, 0, 0), on_flags, word(TEAM_FLAGS), tag, first_chunk)

    def _count_chunks(
        self, node: isl.AstNode, split: isl.AstNode, name: str, first: ll.Value, inc: int, env: dict
    ) -> ll.Value:
        """The chunks of all iterations of `node` (the same count on every thread)."""
        return self.count_over(
            node, name, first, inc, env, lambda w: self.split_geometry(split, {**env, name: w})[3]
        )

    def count_over(
        self, node: isl.AstNode, name: str, first: ll.Value, inc: int, env: dict, parts_of
    ) -> ll.Value:
        """The sum of parts_of(w) over the iterations w of `node`, from `first` by `inc`."""
        b = self.b
        before = b.block
        head = b.append_basic_block("doacross.count")
        body = b.append_basic_block("doacross.count.body")
        done = b.append_basic_block("doacross.counted")
        b.branch(head)
        b.position_at_end(head)
        w, total = b.phi(V.I64), b.phi(V.I64)
        w.add_incoming(first, before)
        total.add_incoming(_c64(0), before)
        b.cbranch(self.ast_expr(node.for_get_cond(), {**env, name: w}), body, done)
        b.position_at_end(body)
        parts = parts_of(w)
        w.add_incoming(b.add(w, _c64(inc)), b.block)
        total.add_incoming(b.add(total, parts), b.block)
        b.branch(head)
        b.position_at_end(done)
        return total

    def wait_for_sources(self, d: Doacross, lo: ll.Value, last: ll.Value) -> None:
        """Before a chunk of values [lo, last] of the current unit (numbered from
        self.unit_base): on flags, wait for the chunks of the `back` units before that hold
        values in [lo - most, last - least]."""
        b = self.b
        back, least, most = d.lags
        with b.if_then(d.on_flags):
            unit_base = self.unit_base
            for steps in range(1, -(-back // d.inc) + 1):
                w = b.sub(d.iv, _c64(steps * d.inc))
                init, step, count, parts = self.split_geometry(d.split, {**d.env, d.name: w})
                exists = b.icmp_signed(">=", w, d.first)
                count = b.select(exists, count, _c64(0))
                parts = b.select(exists, parts, _c64(0))
                unit_base = b.sub(unit_base, parts)  # units are numbered in order
                low = b.sub(b.sub(lo, _c64(most)), init)  # value offsets in that unit
                high = b.sub(b.sub(last, _c64(least)), init)
                one = _c64(1)
                j_lo = b.select(
                    b.icmp_signed("<=", low, _c64(0)), _c64(0), b.sdiv(b.add(low, b.sub(step, one)), step)
                )
                j_hi = b.select(b.icmp_signed("<", high, _c64(0)), _c64(-1), b.sdiv(high, step))
                j_hi = b.select(b.icmp_signed("<", j_hi, b.sub(count, one)), j_hi, b.sub(count, one))
                with b.if_then(b.icmp_signed("<=", j_lo, j_hi)):
                    # chunk k holds iterations [count * k / parts, count * (k + 1) / parts)
                    k_lo = b.sdiv(b.sub(b.mul(b.add(j_lo, one), parts), one), count)
                    k_hi = b.sdiv(b.sub(b.mul(b.add(j_hi, one), parts), one), count)
                    offset = b.sub(unit_base, d.first_chunk)
                    code = b.call(
                        define_flags_wait(self.module),
                        [
                            d.flags,
                            b.add(offset, k_lo),
                            b.add(offset, k_hi),
                            d.tag,
                            self.cancel,
                            self.team_abort,
                        ],
                    )
                    with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
                        b.ret(code)

    def own_columns(
        self, d: Doacross, init: ll.Value, step: ll.Value, count: ll.Value, parts: ll.Value
    ) -> ll.Value:
        """This thread's claim mask in the current unit of `d` (column_mask)."""
        return column_mask(self.b, init, step, count, parts, self.team_index, self.team_size)

    def flag_done(self, d: Doacross, chunk: ll.Value) -> None:
        """After chunk number `chunk` ran: on flags, set its flag (a release)."""
        b = self.b
        with b.if_then(d.on_flags):
            slot = b.gep(d.flags, [b.sub(chunk, d.first_chunk)])
            b.store_atomic(d.tag, slot, "release", 8)


def column_mask(
    b: ll.IRBuilder,
    init: ll.Value,
    step: ll.Value,
    count: ll.Value,
    parts: ll.Value,
    me: ll.Value,
    size: ll.Value,
) -> ll.Value:
    """The claim mask (barrier.py tl_team_claim) of thread `me` of a team of `size` in a unit of
    `parts` chunks of a parallel loop's `count` values from `init` by `step`: the chunks whose
    first value v lies in a column v / step (rounded down) that is `me` modulo `size`.

    In a wavefront of time tiles (c0 = K + M, c1 = step * M), tile (K, M) then runs on the
    thread that ran (K - 1, M) in the wavefront before, which wrote the rows it reads: only the
    rows at the edge of a column, written by its neighbour (K, M - 1), cross to the other core.
    Dealt cyclically, a wavefront's tiles alternate between threads, and its shares stay about
    equal with a short last time tile. jacobi-2d 1000² T=100 on 2 threads, 161 rounds each
    against one thread in one process, p10 of the calls: 6.92 and 7.21 ms by columns, 7.05 and
    7.43 ms by contiguous shares (barrier.own_chunks, which keep blocks of rows K in steady
    state), 7.47 and 7.76 ms by rows (K modulo the size: every tile's rows come from the other
    core)."""
    zero, one = _c64(0), _c64(1)
    before = b.block
    head = b.append_basic_block("own.head")
    body = b.append_basic_block("own.body")
    done = b.append_basic_block("own.done")
    limit = b.select(b.icmp_signed("<", parts, _c64(MASK_CHUNKS)), parts, _c64(MASK_CHUNKS))
    b.branch(head)
    b.position_at_end(head)
    k, mask = b.phi(V.I64), b.phi(V.I64)
    k.add_incoming(zero, before)
    mask.add_incoming(zero, before)
    b.cbranch(b.icmp_signed("<", k, limit), body, done)
    b.position_at_end(body)
    value = b.add(init, b.mul(b.sdiv(b.mul(count, k), parts), step))
    # rounded down: a value below zero belongs to the column before
    below = b.icmp_signed("<", value, zero)
    column = b.sdiv(b.sub(value, b.select(below, b.sub(step, one), zero)), step)
    key = b.srem(column, size)
    key = b.select(b.icmp_signed("<", key, zero), b.add(key, size), key)
    mine = b.zext(b.icmp_signed("==", key, me), V.I64)
    k.add_incoming(b.add(k, one), body)
    mask.add_incoming(b.or_(mask, b.shl(mine, k)), body)
    b.branch(head)
    b.position_at_end(done)
    return mask
