"""lowering: a kernel's phase functions → tl_phase<P>, one entry that runs every phase on each thread of a team, a barrier between phases.

With P phases, phase number P (which the runtime calls only on kernels without a GEMM team phase)
runs the whole call: every thread of a team calls it once, with lo = the team's shared block and
hi = the thread's index, instead of the runtime dispatching each phase from Python. The block's
table (emit/gemm_team.py, written by runtime/whole.py for each call) says per phase how: thread 0
alone, each thread its own [lo, hi) of the phase's outer loop (WHOLE_SPAN iterations at a time,
the cancel word polled between, for phases that do not poll it themselves), or as a loop team.
All threads meet at the team's barrier between phases; a thread that fails raises the team's
abort word (as a loop team's does), so that no other waits for it. Called with lo = INT64_MIN it
runs every phase on the calling thread.
"""

from __future__ import annotations

import llvmlite.ir as ll

from ..emit import values as V
from ..emit.gemm_team import TEAM_LOOP_BYTES, TEAM_SIZE, WHOLE_ALONE, WHOLE_SPLIT, WHOLE_TEAM
from .abi import declare_phase, poll_cancel
from .barrier import define_barrier, mark_aborted
from .state import LoweringState

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _c64(v: int) -> ll.Constant:
    return ll.Constant(V.I64, v)


class WholeCallLowering(LoweringState):
    """The whole-call entry (after every phase function exists)."""

    def emit_whole_call(self) -> None:
        phases = list(self.phase_functions)
        n = len(phases)
        wrapper = declare_phase(self.module, self.program, self.layout, self.param_values is not None, n)
        self.phase_functions.append(wrapper)
        fn = ll.Function(self.module, wrapper.function_type, f"tl_whole{n}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        b = ll.IRBuilder(wrapper.append_basic_block("entry"))
        code = b.call(fn, wrapper.args)
        lo = wrapper.args[-4]
        alone = b.icmp_signed("==", lo, _c64(INT64_MIN))
        block = b.select(alone, ll.Constant(V.I8.as_pointer(), None), b.inttoptr(lo, V.I8.as_pointer()))
        with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
            mark_aborted(b, block)
        b.ret(code)

        b = ll.IRBuilder(fn.append_basic_block("entry"))
        lead = list(fn.args[:-5])
        error, lo, hi, workspace, cancel = fn.args[-5:]

        def call(phase: ll.Function, first: ll.Value, last: ll.Value) -> None:
            """Call the phase; return its code if not 0."""
            code = b.call(phase, [*lead, error, first, last, workspace, cancel])
            with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
                b.ret(code)

        with b.if_then(b.icmp_signed("==", lo, _c64(INT64_MIN))):  # every phase on this thread
            for phase in phases:
                call(phase, _c64(INT64_MIN), _c64(INT64_MAX))
            b.ret(ll.Constant(V.I32, 0))
        block = b.inttoptr(lo, V.I8.as_pointer())
        size = b.load(b.bitcast(b.gep(block, [_c64(TEAM_SIZE)]), V.I64.as_pointer()))
        table = b.bitcast(b.gep(block, [_c64(TEAM_LOOP_BYTES)]), V.I64.as_pointer())
        record = b.add(b.mul(size, _c64(2)), _c64(2))
        barrier = define_barrier(self.module)
        for index, phase in enumerate(phases):
            base = b.mul(record, _c64(index))
            mode = b.load(b.gep(table, [base]))
            with b.if_then(b.icmp_signed("==", mode, _c64(WHOLE_ALONE))):
                with b.if_then(b.icmp_signed("==", hi, _c64(0))):
                    call(phase, _c64(INT64_MIN), _c64(INT64_MAX))
            with b.if_then(b.icmp_signed("==", mode, _c64(WHOLE_TEAM))):
                call(phase, lo, hi)
            with b.if_then(b.icmp_signed("==", mode, _c64(WHOLE_SPLIT))):
                span = b.load(b.gep(table, [b.add(base, _c64(1))]))
                mine = b.add(base, b.add(b.mul(hi, _c64(2)), _c64(2)))
                first = b.load(b.gep(table, [mine]))
                last = b.load(b.gep(table, [b.add(mine, _c64(1))]))
                pre = b.block
                head = fn.append_basic_block(f"whole{index}.head")
                body = fn.append_basic_block(f"whole{index}.body")
                done = fn.append_basic_block(f"whole{index}.done")
                b.branch(head)
                b.position_at_end(head)
                start = b.phi(V.I64)
                start.add_incoming(first, pre)
                b.cbranch(b.icmp_signed("<", start, last), body, done)
                b.position_at_end(body)
                poll_cancel(b, cancel)
                left = b.sub(last, start)
                stop = b.add(start, b.select(b.icmp_signed("<", left, span), left, span))
                call(phase, start, stop)
                start.add_incoming(stop, b.block)
                b.branch(head)
                b.position_at_end(done)
            if index + 1 < n:
                code = b.call(barrier, [block, cancel])
                with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
                    b.ret(code)
        b.ret(ll.Constant(V.I32, 0))
