"""lowering: a phase's prefetch footprints → llvm.prefetch of the next outer iteration's rows."""

from __future__ import annotations

import islpy as isl
import llvmlite.ir as ll

from ..emit import values as V
from ..planning.astgen import Footprint
from ..planning.prefetching import PREFETCH_MAX_BYTES, PREFETCH_MIN_BYTES
from .state import LoweringState

#: llvm.prefetch locality: 2 = prefetcht1, into L2 (and L3).
PREFETCH_LOCALITY = 2
CACHE_LINE = 64


class PrefetchLowering(LoweringState):
    """Prefetches at the top of a phase's outer loop, for the footprints the plan chose."""

    def emit_prefetch(
        self,
        loop: isl.AstNode,
        iterator: str,
        next_iv: ll.Value,
        env: dict[str, ll.Value],
        footprints: tuple[Footprint, ...],
    ) -> None:
        """At the top of an iteration of a phase's outer loop: prefetch, one cache line at a
        time, what the next iteration reads, so that rows a body makes several passes over
        (softmax: max, exp and sum, divide) could arrive while this row computes. (Measured on
        softmax and layer norm here it did not pay: Options(prefetch) is off by default.) Only
        contiguous footprints (the box covers at least half of its address range) of
        PREFETCH_MIN_BYTES to PREFETCH_MAX_BYTES are fetched, and nothing past the loop's last
        iteration."""
        b = self.b
        nxt = {**env, iterator: next_iv}
        with b.if_then(self.ast_expr(loop.for_get_cond(), nxt)):
            for f in footprints:
                t = self.program.tensor(f.tensor)
                size = t.dtype.storage_bytes
                lo = [self.ast_expr(e, nxt) for e in f.lo]
                hi = [self.ast_expr(e, nxt) for e in f.hi]
                strides = self.element_strides(f.tensor)
                first = last = ll.Constant(V.I64, 0)
                count: ll.Value = ll.Constant(V.I64, 1)
                for lo_d, hi_d, stride in zip(lo, hi, strides):
                    first = b.add(first, b.mul(lo_d, stride))
                    last = b.add(last, b.mul(hi_d, stride))
                    count = b.mul(count, b.add(b.sub(hi_d, lo_d), ll.Constant(V.I64, 1)))
                span = b.add(b.sub(last, first), ll.Constant(V.I64, 1))
                worth = b.and_(
                    b.icmp_signed("<=", span, b.mul(count, ll.Constant(V.I64, 2))),
                    b.icmp_signed("<=", span, ll.Constant(V.I64, PREFETCH_MAX_BYTES // size)),
                )
                worth = b.and_(
                    worth, b.icmp_signed(">=", span, ll.Constant(V.I64, -(-PREFETCH_MIN_BYTES // size)))
                )
                with b.if_then(worth):
                    start = b.bitcast(b.gep(self.pointers[f.tensor], [first]), V.I8.as_pointer())
                    emit_prefetch_lines(b, start, b.mul(span, ll.Constant(V.I64, size)))


def emit_prefetch_lines(b: ll.IRBuilder, start: ll.Value, nbytes: ll.Value) -> None:
    """for (o = 0; o < nbytes; o += 64) prefetch(start + o) into L2."""
    fn = b.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ll.Function(
            b.module,
            ll.FunctionType(ll.VoidType(), [V.I8.as_pointer(), V.I32, V.I32, V.I32]),
            "llvm.prefetch.p0",
        )
    pre = b.block
    loop = b.append_basic_block("prefetch.loop")
    done = b.append_basic_block("prefetch.done")
    b.branch(loop)
    b.position_at_end(loop)
    offset = b.phi(V.I64, "prefetch.offset")
    offset.add_incoming(ll.Constant(V.I64, 0), pre)
    # rw = read, locality 2 (prefetcht1: into L2 and below), data cache
    args = [ll.Constant(V.I32, 0), ll.Constant(V.I32, PREFETCH_LOCALITY), ll.Constant(V.I32, 1)]
    b.call(fn, [b.gep(start, [offset]), *args])
    nxt = b.add(offset, ll.Constant(V.I64, CACHE_LINE))
    offset.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, nbytes), loop, done)
    b.position_at_end(done)
