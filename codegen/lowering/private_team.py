"""lowering: a LOOP_TEAM phase with private copies → its loop split into chunks that reduce into their own copies, then the combining pass.

The phase's sequential outer loop carries only reductions into the privatised tensors
(planning/private.py). Its iterations are cut into chunks that the team's threads take in turn
(team.py `_emit_unit`); chunk k first fills its copies with the reduction's identity, then runs
its iterations with the statements that reduce into a privatised tensor pointed at its copy (the
tensor's initialisation still writes the tensor). The copies live on the thread's stack while
the chunk runs (up to PRIVATE_STACK_BYTES), then are copied to slot k of the team's shared block,
after its loop words; larger ones are reduced into that slot directly. Once every chunk is done, the team combines: each thread takes a share of the
tensor's elements and folds into them the copies of chunk 0, 1, .. in that order, so the result
is the same whichever thread ran which chunk. Run on one thread (lo = INT64_MIN), the chunks
reduce into the tensors themselves, in order: the sequential loop, with nothing to combine.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl
import llvmlite.ir as ll

from ..emit import values as V
from ..emit.gemm_team import TEAM_LOOP_BYTES
from ..planning.astgen import contains_loop, unwrap
from ..planning.private import PrivateCopy, set_bytes
from ..planning.runs import PRIVATE_CHUNKS_PER_THREAD
from .team import CHUNKS_PER_THREAD, TeamLowering

# a chunk's copies up to this size live on its thread's stack while it runs (LLVM then knows they
# alias no tensor, and keeps a scalar accumulator in a register: a 10M-element sum on 2 threads
# took 23 ms with its copy in the shared block, against 0.9 ms on one thread), then are copied to
# the shared block; larger ones are reduced into there directly
PRIVATE_STACK_BYTES = 64 * 1024
# elements of a privatised tensor below which combining its copies is one chunk (one thread)
COMBINE_CHUNK_ELEMENTS = 4096


class PrivateTeamLowering(TeamLowering):
    """Loop teams that privatise reductions (PhaseDecision.private)."""

    def emit_team_root(self, node: isl.AstNode, private: tuple[PrivateCopy, ...]) -> None:
        if not private:
            super().emit_team_root(node, private)
            return
        loop = unwrap(node)
        b = self.b
        init, step, count, _ = self.split_geometry(loop, {})
        most = b.mul(self.team_size, ll.Constant(V.I64, PRIVATE_CHUNKS_PER_THREAD))
        parts = b.select(b.icmp_signed("<", count, most), count, most)
        alone = self.team_alone
        copies_at = b.gep(self.team_block, [ll.Constant(V.I64, TEAM_LOOP_BYTES)])
        size = set_bytes(private)
        stride = ll.Constant(V.I64, size)
        name = loop.for_get_iterator().get_id().get_name()

        def copy(c: PrivateCopy, k: ll.Value) -> ll.Value:
            at = b.gep(copies_at, [b.add(b.mul(k, stride), ll.Constant(V.I64, c.offset))])
            return b.bitcast(at, self.pointers[c.tensor].type)

        local = None  # a chunk's copies on the stack, where LLVM sees they alias no tensor
        if size <= PRIVATE_STACK_BYTES:
            with b.goto_entry_block():
                local = b.alloca(ll.ArrayType(V.I8, size))
                local.align = 64
            local = b.bitcast(local, V.I8.as_pointer())

        def chunk(k: ll.Value) -> None:
            for c in private:
                if local is None:
                    mine = copy(c, k)
                else:
                    mine = b.bitcast(
                        b.gep(local, [ll.Constant(V.I64, c.offset)]), self.pointers[c.tensor].type
                    )
                dtype = self.program.tensor(c.tensor).dtype
                with b.if_then(b.not_(alone)):
                    fill = V.identity(c.op, dtype)
                    self._each(ll.Constant(V.I64, 0), ll.Constant(V.I64, c.elements),
                               lambda e, p=mine, v=fill, t=dtype: V.store_element(b, v, b.gep(p, [e]), t))  # fmt: skip
                self.private_pointers[c.tensor] = b.select(alone, self.pointers[c.tensor], mine)
            saved = self.lo, self.hi
            self.lo = b.add(init, b.mul(b.sdiv(b.mul(count, k), parts), step))
            self.hi = b.add(init, b.mul(b.sdiv(b.mul(count, b.add(k, ll.Constant(V.I64, 1))), parts), step))
            self.loop_depth += 1
            try:
                if contains_loop(loop.for_get_body()):  # the outermost loop: it polls
                    self.emit_chunk_loop(loop, name, init, {}, poll=True)
                else:  # a poll per iteration would keep LLVM from vectorising it: one per block
                    self.emit_polled_innermost_for(loop, name, init, {}, restricted=True)
            finally:
                self.loop_depth -= 1
                self.lo, self.hi = saved
                self.private_pointers.clear()
            if local is not None:  # publish the copies for the combining pass
                with b.if_then(b.not_(alone)):
                    shared = b.gep(copies_at, [b.mul(k, stride)])
                    b.call(self._memcpy(), [shared, local, ll.Constant(V.I64, size), ll.Constant(V.I1, 0)])

        self._emit_unit(parts, chunk)
        with b.if_then(b.not_(alone)):  # one thread reduced into the tensors themselves
            for c in private:
                self._emit_combine(c, copy, parts)

    def _emit_combine(
        self, c: PrivateCopy, copy: Callable[[PrivateCopy, ll.Value], ll.Value], copies: ll.Value
    ) -> None:
        """One unit: shares of the tensor's elements, each folding in every chunk's copy in order."""
        b = self.b
        dtype = self.program.tensor(c.tensor).dtype
        wanted = -(-c.elements // COMBINE_CHUNK_ELEMENTS)
        most = b.mul(self.team_size, ll.Constant(V.I64, CHUNKS_PER_THREAD))
        parts = b.select(
            b.icmp_signed("<", ll.Constant(V.I64, wanted), most), ll.Constant(V.I64, wanted), most
        )
        total = ll.Constant(V.I64, c.elements)
        target = self.pointers[c.tensor]

        def share(j: ll.Value) -> None:
            first = b.sdiv(b.mul(total, j), parts)
            stop = b.sdiv(b.mul(total, b.add(j, ll.Constant(V.I64, 1))), parts)

            def fold(k: ll.Value) -> None:
                theirs = copy(c, k)

                def element(e: ll.Value) -> None:
                    at = b.gep(target, [e])
                    old = V.load_element(b, at, dtype)
                    new = V.load_element(b, b.gep(theirs, [e]), dtype)
                    V.store_element(b, V.combine(b, c.op, dtype, old, new, self.flags), at, dtype)

                self._each(first, stop, element)

            self._each(ll.Constant(V.I64, 0), copies, fold)

        self._emit_unit(parts, share)

    def _memcpy(self) -> ll.Function:
        return self.module.declare_intrinsic("llvm.memcpy", [V.I8.as_pointer(), V.I8.as_pointer(), V.I64])

    def _each(self, lo: ll.Value, hi: ll.Value, body: Callable[[ll.Value], None]) -> None:
        """for (i = lo; i < hi; i++) body(i), through WaveLowering._loop (no carried values)."""
        b = self.b

        def step(j: ll.Value, _: list[ll.Value]) -> list[ll.Value]:
            body(b.add(lo, j))
            return []

        self._loop(b.sub(hi, lo), [], step)
