"""lowering: a LOOP_TEAM phase → its tl_phase<n> wrapper and tl_team<n>, the loop nest every thread of a team runs.

The runtime calls the phase on every thread of the team with lo = the address of the team's
shared block (emit/gemm_team.py), or once with lo = INT64_MIN to run it on one thread. Which
nodes are split, run by every thread or by one are decided in planning/teams.py. Here each unit
of work (a split loop, cut into up to CHUNKS_PER_THREAD chunks of contiguous iterations per
thread, or work one thread runs, one chunk) is numbered on from the units before it, the same on
every thread: threads take its chunks (each its own share first, then the others' that are
left; in a doacross loop over time tiles, a thread's share is the tiles of its columns, so that
a tile runs on the thread that wrote the rows it reads, doacross.py column_mask), count them
done, and wait until the unit's last chunk is done before the next unit (barrier.py:
tl_team_claim, tl_team_wait). A thread waits only for chunks another thread
holds, so one that starts late or loses its core to another process delays the step by its
chunk at most, and then catches up through the units already done without waiting. tl_team<n>
may leave early (a failed run-time check, a cancel): the wrapper then sets the team's abort
word, so that no other thread waits for it.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl
import llvmlite.ir as ll

from ..emit import values as V
from ..emit.gemm_team import TEAM_ABORT, TEAM_CHUNK_CLAIMS, TEAM_CHUNK_DONE, TEAM_CHUNK_TICKET, TEAM_SIZE
from ..planning.astgen import contains_loop, unwrap
from ..planning.teams import holds_team_split, is_team_split, split_bound
from .barrier import define_claim, define_wait, mark_aborted, own_chunks
from .doacross import Doacross
from .wavefront import WaveLowering

INT64_MIN = -(2**63)
# chunks each parallel loop is cut into, per thread: a thread that starts late or loses its core
# leaves its chunks to the others instead of holding up the step (each chunk: one atomic)
CHUNKS_PER_THREAD = 4


class TeamLowering(WaveLowering):
    """The phases a team of threads runs (Split.LOOP_TEAM)."""

    def emit_team_phase(self, n: int, node: isl.AstNode) -> None:
        """After begin_phase(n): make tl_phase<n> call tl_team<n> (and raise the team's abort
        word when it fails), then emit tl_team<n>'s loops and return."""
        wrapper, b = self.body, self.b
        private = self.decision.private if self.decision is not None else ()
        fn = ll.Function(self.module, wrapper.function_type, f"tl_team{n}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for arg in fn.args[: len(self.layout.tensors)]:
            arg.add_attribute("noalias")
        code = b.call(fn, wrapper.args)
        with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
            mark_aborted(b, self._team_block(b, wrapper.args[-4]))
        b.ret(code)

        self.body = fn
        self.b = b = ll.IRBuilder(fn.append_basic_block("entry"))
        self.error_ptr, self.lo, self.hi, self.workspace, self.cancel = fn.args[-5:]
        if self.param_values is None:
            self.params = dict(zip(self.layout.params, fn.args[len(self.layout.tensors) : -5]))
        self.pointers = dict(zip(self.layout.tensors, fn.args))
        alone = b.icmp_signed("==", self.lo, ll.Constant(V.I64, INT64_MIN))
        self.team_alone = alone
        self.team_block = self._team_block(b, self.lo)
        # alone, the counters are this thread's own
        mine = b.alloca(V.I64, 5)
        for n, v in enumerate((1, 0, 0, 0, 0)):
            b.store(ll.Constant(V.I64, v), b.gep(mine, [ll.Constant(V.I64, n)]))
        no_abort = b.alloca(V.I32)
        b.store(ll.Constant(V.I32, 0), no_abort)

        def word(offset: int, own: ll.Value, ty: ll.Type = V.I64) -> ll.Value:
            shared = b.bitcast(b.gep(self.team_block, [ll.Constant(V.I64, offset)]), ty.as_pointer())
            return b.select(alone, own, shared)

        self.team_size = b.load(word(TEAM_SIZE, mine))
        self.team_ticket = word(TEAM_CHUNK_TICKET, b.gep(mine, [ll.Constant(V.I64, 1)]))
        self.team_done = word(TEAM_CHUNK_DONE, b.gep(mine, [ll.Constant(V.I64, 2)]))
        self.team_abort = word(TEAM_ABORT, no_abort, V.I32)
        self.team_claims = word(TEAM_CHUNK_CLAIMS, b.gep(mine, [ll.Constant(V.I64, 4)]))
        self.team_base = b.gep(mine, [ll.Constant(V.I64, 3)])  # this thread's next chunk number
        self.team_index = b.select(alone, ll.Constant(V.I64, 0), self.hi)
        self.claim, self.wait = define_claim(self.module), define_wait(self.module)
        self.decision = None  # the loops below are not the runtime's split loop
        self.team_outermost = True  # a doacross loop only outermost (doacross.py)
        self.emit_team_root(node, private)
        self.b.ret(ll.Constant(V.I32, 0))

    def emit_team_root(self, node: isl.AstNode, private: tuple) -> None:
        """The phase's loop nest at team level (private copies: private_team.py)."""
        self.emit_team(node, {})

    @staticmethod
    def _team_block(b: ll.IRBuilder, lo: ll.Value) -> ll.Value:
        """The shared block whose address `lo` holds; null when the phase runs on one thread."""
        alone = b.icmp_signed("==", lo, ll.Constant(V.I64, INT64_MIN))
        null = ll.Constant(V.I8.as_pointer(), None)
        return b.select(alone, null, b.inttoptr(lo, V.I8.as_pointer()))

    def emit_team(self, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        """Emit `node` at team level: every thread runs it (planning/teams.py)."""
        node = unwrap(node)
        NT = isl.ast_node_type
        t = node.get_type()
        if t == NT.if_:  # its condition is the same on every thread: a barrier only where taken
            cond = self.ast_expr(node.if_get_cond(), env)
            with self.b.if_else(cond) as (then, otherwise):
                with then:
                    self.emit_team(node.if_get_then_node(), env)
                with otherwise:
                    if node.if_has_else_node():
                        self.emit_team(node.if_get_else_node(), env)
        elif not holds_team_split(node, self.ast):
            self._emit_solo([node], env)
        elif t == NT.block:
            children = node.block_get_children()
            solo: list[isl.AstNode] = []  # consecutive children without a split: one unit
            for i in range(children.n_ast_node()):
                child = children.get_at(i)
                if unwrap(child).get_type() == NT.if_ or holds_team_split(child, self.ast):
                    if solo:
                        self._emit_solo(solo, env)
                        solo = []
                    self.emit_team(child, env)
                else:
                    solo.append(child)
            if solo:
                self._emit_solo(solo, env)
        elif node.for_is_degenerate():
            name = node.for_get_iterator().get_id().get_name()
            self.emit_team(node.for_get_body(), {**env, name: self.ast_expr(node.for_get_init(), env)})
        elif is_team_split(node, self.ast):
            self._emit_split(node, env)
        elif (wave := self.wave_pieces(node)) is not None:
            self.emit_wave_loop(node, env, *wave)
        elif (lags := self.doacross_lags(node)) is not None:
            self.emit_doacross_loop(node, env, lags)
        else:
            self._emit_team_loop(node, env)

    def _emit_team_loop(self, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        """A sequential loop every thread runs, polling the cancel word once per iteration."""
        name = node.for_get_iterator().get_id().get_name()
        init = self.ast_expr(node.for_get_init(), env)
        self.loop_depth += 1
        self.team_outermost = False
        try:
            self.emit_chunk_loop(node, name, init, env, poll=True, restricted=False, body=self.emit_team)
        finally:
            self.loop_depth -= 1

    def split_geometry(self, node: isl.AstNode, env: dict[str, ll.Value]) -> tuple[ll.Value, ...]:
        """(first value, step, iterations, chunks) of the parallel loop `node` in `env`."""
        b = self.b
        init = self.ast_expr(node.for_get_init(), env)
        step = self.ast_expr(node.for_get_inc(), env)
        bound = self.ast_expr(split_bound(node), env)
        if node.for_get_cond().get_op_type() == isl.ast_expr_op_type.le:
            bound = b.add(bound, ll.Constant(V.I64, 1), flags=["nsw"])
        span = b.sub(bound, init)
        zero = ll.Constant(V.I64, 0)
        rounded = b.sdiv(b.add(span, b.sub(step, ll.Constant(V.I64, 1))), step)
        count = b.select(b.icmp_signed(">", span, zero), rounded, zero)
        most = b.mul(self.team_size, ll.Constant(V.I64, CHUNKS_PER_THREAD))
        return init, step, count, b.select(b.icmp_signed("<", count, most), count, most)

    def _emit_split(
        self, node: isl.AstNode, env: dict[str, ll.Value], doacross: Doacross | None = None
    ) -> None:
        """A parallel loop: chunks of contiguous iterations, taken in turn (in a doacross loop,
        each after the chunks it depends on, with no wait for the whole unit)."""
        b = self.b
        name = node.for_get_iterator().get_id().get_name()
        init, step, count, parts = self.split_geometry(node, env)

        def start(index: ll.Value) -> ll.Value:
            return b.add(init, b.mul(b.sdiv(b.mul(count, index), parts), step))

        def chunk(k: ll.Value) -> None:
            saved = self.lo, self.hi
            self.lo, self.hi = start(k), start(b.add(k, ll.Constant(V.I64, 1)))
            if doacross is not None:  # the chunks it reads from, in the units before
                self.wait_for_sources(doacross, self.lo, b.sub(self.hi, step))
            self.loop_depth += 1
            try:
                row = None if contains_loop(node.for_get_body()) else self.row_plan(node, name)
                if row is not None:  # an innermost loop of neighbours: row vectors (row_vectors.py)
                    self.emit_row_vector_for(node, name, init, env, row, restricted=True)
                    return
                self.emit_chunk_loop(node, name, init, env)
            finally:
                self.loop_depth -= 1
                self.lo, self.hi = saved

        own = None if doacross is None else self.own_columns(doacross, init, step, count, parts)
        self._emit_unit(parts, chunk, doacross, own)

    def emit_chunk_loop(
        self,
        node: isl.AstNode,
        name: str,
        init: ll.Value,
        env: dict[str, ll.Value],
        poll: bool = False,
        restricted: bool = True,
        body: Callable[[isl.AstNode, dict[str, ll.Value]], None] | None = None,
    ) -> None:
        """The for loop `node` over this chunk's iterations [self.lo, self.hi) (all of them if
        not `restricted`), its body emitted inside by `body` (emit_node by default)."""
        b = self.b
        _, iv, exit_, _ = self._open_loop(node, name, init, env, restricted=restricted, poll=poll)
        inner = {**env, name: iv}
        inc = self.ast_expr(node.for_get_inc(), inner)
        (body or self.emit_node)(node.for_get_body(), inner)
        iv.add_incoming(b.add(iv, inc, flags=["nsw"]), b.block)
        b.branch(iv.parent)
        b.position_at_end(exit_)

    def _emit_solo(self, nodes: list[isl.AstNode], env: dict[str, ll.Value]) -> None:
        """Work with no split loop: one chunk, which one thread takes."""

        def run(_: ll.Value) -> None:
            self.loop_depth += 1  # no cancel polls of an outermost loop: the team loop polls
            try:
                for node in nodes:
                    self.emit_node(node, env)
            finally:
                self.loop_depth -= 1

        self._emit_unit(ll.Constant(V.I64, 1), run)

    def _emit_unit(
        self,
        parts: ll.Value,
        chunk: Callable[[ll.Value], None],
        doacross: Doacross | None = None,
        own: ll.Value | None = None,
    ) -> None:
        """A unit of `parts` chunks, numbered on from the chunks of the units before it: take
        chunks until none is left (this thread's `own` first, a mask of chunks: by default its
        contiguous share), run each (`chunk(k)` emits chunk k), count it done, then wait
        until every chunk of the unit is done (what the next unit reads is written). In a
        doacross loop that runs on flags, each chunk is flagged done instead, and the next unit
        starts at once: its chunks wait for the ones they read from (doacross.py)."""
        b = self.b
        base = b.load(self.team_base)
        end = b.add(base, parts)
        head = b.append_basic_block("unit.claim")
        work = b.append_basic_block("unit.chunk")
        out = b.append_basic_block("unit.wait")
        if own is None:
            own = own_chunks(b, parts, self.team_index, self.team_size)
        b.branch(head)
        b.position_at_end(head)
        taken = b.call(self.claim, [self.team_ticket, self.team_claims, base, parts, own])
        b.cbranch(b.icmp_signed(">=", taken, ll.Constant(V.I64, 0)), work, out)
        b.position_at_end(work)
        self.unit_base = base
        chunk(b.sub(taken, base))
        if doacross is not None:
            self.flag_done(doacross, taken)
        b.atomic_rmw("add", self.team_done, ll.Constant(V.I64, 1), "release")
        b.branch(head)
        b.position_at_end(out)
        if doacross is None:
            self.wait_for_chunks(end)
        else:
            with b.if_then(b.not_(doacross.on_flags)):
                self.wait_for_chunks(end)
        b.store(end, self.team_base)

    def wait_for_chunks(self, end: ll.Value) -> None:
        """Wait until every chunk numbered below `end` is done (leave on a cancel or abort)."""
        b = self.b
        code = b.call(self.wait, [self.team_done, end, self.cancel, self.team_abort])
        with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
            b.ret(code)
