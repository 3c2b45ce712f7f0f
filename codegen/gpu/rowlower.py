"""gpu: a row-mapped phase (PhaseMapping.rows) → step functions, a ptx_kernel entry and its host emulation.

The row's work is a list of *operations*, the same list for the GPU and for the emulation:

* ("code", fn): a step function `tl_row<n>_<k>(tensors..., error, row iterators..., rowtid,
  slots, shared) -> i32`, run by every thread of the row (the function itself restricts work
  to the row's first thread, or to each warp's first lane, where it must). `slots` is the
  thread's private 8-byte cells (reduction accumulators and shuffle results), `shared` the
  block's shared array (partial results of the warps);
* ("exchange", src, dst, mask, wide): every thread's cell `dst` := cell `src` of the thread
  whose lane is its lane xor `mask` (a butterfly shuffle);
* ("barrier",): all the threads of the row wait for each other.

On the GPU the entry runs the list in order for its one thread: code steps are calls (inlined),
an exchange is `shfl.sync.bfly` (two for 8-byte values), a barrier is `barrier0` (a block per
row) or `bar.warp.sync` (a warp per row); the cells are an alloca that SROA turns into
registers, the shared array an addrspace(3) global. The emulation (`tl_emulate_phase<n>`) runs
each operation for every thread of a block before the next one — loop fission at every barrier
and exchange, as POCL does — with the cells in an array per thread and the exchanges through a
scratch array, so what it checks against NumPy is the same step structure the GPU runs.

A thread whose step fails a run-time check (a gather out of range) records the error as the
one-thread-per-point entry does (gpu/lower.py) and skips its later steps, but still takes part
in every exchange and barrier, so that the others do not wait forever.
"""

from __future__ import annotations

import llvmlite.ir as ll

from tensorlang import ir

from ..emit import values as V
from ..lowering.state import PolyLeafContext
from ..planning.astgen import leaves_under
from .mapping import PhaseMapping
from .rows import WARP, RowStep

CELL = 8  # bytes per private cell
_ROUNDS = (16, 8, 4, 2, 1)  # butterfly masks: every lane ends with the warp's total


def _const(n: int) -> ll.Constant:
    return ll.Constant(V.I64, n)


def counted_loop(b: ll.IRBuilder, fn: ll.Function, count: int, body) -> None:
    """At b: body(i) for i in 0..count-1 (none when count is 0)."""
    pre = b.block
    head = fn.append_basic_block("each")
    work = fn.append_basic_block("each.body")
    after = fn.append_basic_block("each.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(V.I64)
    i.add_incoming(_const(0), pre)
    b.cbranch(b.icmp_unsigned("<", i, _const(count)), work, after)
    b.position_at_end(work)
    body(i)
    i.add_incoming(b.add(i, _const(1)), b.block)
    b.branch(head)
    b.position_at_end(after)


class RowLowering:
    """Mixin of GpuLowering: phases whose rows are spread over a block or a warp."""

    redirect: dict | None = None  # statement → its accumulator cell, inside a strided loop
    row_local: dict | None = None  # temporary → RowLocal: kept in the row's shared memory
    row_step = -1  # the row step being emitted
    rowmem: ll.Value | None = None  # the step function's row region of shared memory

    # ------------------------------------------------------------------ the operations

    def emit_row_phase(self, grid: PhaseMapping) -> list[tuple]:
        rows = grid.rows
        ops: list[tuple] = []
        self.row_local = {v.tensor: v for v in rows.local}
        sync = ("barrier",)
        for k, step in enumerate(rows.steps):
            self.row_step = k
            if step.kind == "scalar":
                fn, env, rowtid, _, _ = self._step_function(grid, f"{k}")
                with self.b.if_then(self.b.icmp_unsigned("==", rowtid, _const(0))):
                    for node in step.nodes:
                        self.emit_node(node, env)
                self.b.ret(ll.Constant(V.I32, 0))
                ops += [("code", fn), sync]
                continue
            ops.append(("code", self._strided_loop(grid, step, k)))
            if not step.reductions:
                ops.append(sync)
                continue
            types = [self._reduction_type(s) for s in step.reductions]
            combine = self._combine_function(grid, step, k)
            butterfly = [
                op
                for m in _ROUNDS
                for op in [("exchange", 2 * r, 2 * r + 1, m, t.bits == 64) for r, t in enumerate(types)]
                + [("code", combine)]
            ]
            ops += butterfly
            if rows.warps > 1:
                ops += [
                    ("code", self._to_shared(grid, step, k)),
                    sync,
                    ("code", self._from_shared(grid, step, k)),
                ]
                ops += butterfly
            ops += [("code", self._store_totals(grid, step, k)), sync]
        if ops and ops[-1] == sync:
            ops.pop()  # nothing after the row's last step waits for it
        self.row_local = None
        return ops

    def _reduction_type(self, statement: str):
        return self.program.tensor(self.scop.statement(statement).statement.tensor).dtype

    def _step_function(self, grid: PhaseMapping, suffix: str):
        """Start `tl_row<n>_<suffix>`; returns (function, env of the row's iterators, rowtid,
        cells, shared), the builder at its entry."""
        tensor_types = [V.memory_type(self.program.tensor(t).dtype).as_pointer() for t in self.layout.tensors]
        i8p = V.I8.as_pointer()
        extra = [V.I64] * len(grid.loops) + [V.I64, V.I64, i8p, i8p, i8p]
        ty = ll.FunctionType(V.I32, tensor_types + [V.I64.as_pointer()] + extra)
        fn = ll.Function(self.module, ty, f"tl_row{grid.index}_{suffix}")
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        for arg in fn.args[: len(tensor_types)]:
            arg.add_attribute("noalias")
        n = len(tensor_types)
        self.body = fn
        self.error_ptr = fn.args[n]
        self.pointers = dict(zip(self.layout.tensors, fn.args))
        self.lo = self.hi = None
        self.decision = None
        self.loop_depth = 1
        self.b = ll.IRBuilder(fn.append_basic_block("entry"))
        iters = fn.args[n + 1 : n + 1 + len(grid.loops)]
        env = {loop.iterator: v for loop, v in zip(grid.loops, iters)}
        self.chunk, rowtid, cells, shared, self.rowmem = fn.args[n + 1 + len(grid.loops) :]
        return fn, env, rowtid, cells, shared

    def _cell(self, cells: ll.Value, n: int, dtype) -> ll.Value:
        return self.b.bitcast(self.b.gep(cells, [_const(CELL * n)]), V.memory_type(dtype).as_pointer())

    def _strided_loop(self, grid: PhaseMapping, step: RowStep, k: int) -> ll.Function:
        """Step k: the loop's iterations first + (rowtid + i T) inc, each thread's reductions
        accumulated in its cells (from the identity)."""
        fn, env, rowtid, cells, _ = self._step_function(grid, f"{k}")
        b = self.b
        node = step.nodes[0]
        self.redirect = {}
        for r, name in enumerate(step.reductions):
            st = self.scop.statement(name).statement
            dtype = self._reduction_type(name)
            cell = self._cell(cells, 2 * r, dtype)
            V.store_element(b, V.identity(st.op, dtype), cell, dtype)
            self.redirect[name] = cell
        init = self.ast_expr(node.for_get_init(), env)
        inc = self.ast_expr(node.for_get_inc(), env)
        start = b.add(init, b.mul(rowtid, inc))
        stride = b.mul(inc, _const(grid.rows.threads))
        _, body, exit_, iv = self._loop_head(step.iterator, start)
        b.cbranch(self.truth(self.ast_expr(node.for_get_cond(), {**env, step.iterator: iv})), body, exit_)
        b.position_at_end(body)
        self.emit_node(node.for_get_body(), {**env, step.iterator: iv})
        iv.add_incoming(b.add(iv, stride), b.block)
        b.branch(iv.parent)
        b.position_at_end(exit_)
        self.redirect = None
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def address(self, tensor: str, subscripts, read) -> ll.Value:
        local = self.row_local.get(tensor) if self.row_local else None
        if local is None or 0 <= self.row_step <= local.first_step:  # a copy: global until loaded
            return super().address(tensor, subscripts, read)
        return self._row_address(local, subscripts)

    def value(self, e):
        local = self.row_local.get(e.tensor) if self.row_local and isinstance(e, ir.Read) else None
        if local is None or local.first_step != self.row_step:
            return super().value(e)
        loaded = super().value(e)  # the copy's first step: from global memory, kept for the later ones
        V.store_element(self.b, loaded, self._row_address(local, e.indices), e.dtype)
        return loaded

    def _row_address(self, local, subscripts) -> ll.Value:
        # the other subscripts name the row (gpu/rows.py): the row's region holds its elements
        b = self.b
        dtype = self.program.tensor(local.tensor).dtype
        base = b.bitcast(b.gep(self.rowmem, [_const(local.offset)]), V.memory_type(dtype).as_pointer())
        return b.gep(base, [self.index_value(subscripts[local.dim])], inbounds=True)

    def emit_leaf(self, leaf, env) -> None:
        cell = self.redirect.get(leaf.statement) if self.redirect else None
        if cell is None:
            return super().emit_leaf(leaf, env)
        stmt = self.scop.statement(leaf.statement)
        st = stmt.statement
        indices = {var: self.ast_expr(expr, env) for var, expr in leaf.index_exprs}
        self.leaf_statement = PolyLeafContext(stmt.name, st, indices)
        dtype = self.program.tensor(st.tensor).dtype
        value = self.value(st.rhs)
        old = V.load_element(self.b, cell, dtype)
        flags = self.flags if self.flags else ("reassoc",)
        V.store_element(self.b, V.combine(self.b, st.op, dtype, old, value, flags), cell, dtype)

    def _combine_function(self, grid: PhaseMapping, step: RowStep, k: int) -> ll.Function:
        """acc := acc op (the value an exchange brought), for each reduction of step k."""
        fn, _, _, cells, _ = self._step_function(grid, f"{k}_combine")
        b = self.b
        for r, name in enumerate(step.reductions):
            st = self.scop.statement(name).statement
            dtype = self._reduction_type(name)
            acc, other = self._cell(cells, 2 * r, dtype), self._cell(cells, 2 * r + 1, dtype)
            x, y = V.load_element(b, acc, dtype), V.load_element(b, other, dtype)
            flags = self.flags if self.flags else ("reassoc",)
            V.store_element(b, V.combine(b, st.op, dtype, x, y, flags), acc, dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _to_shared(self, grid: PhaseMapping, step: RowStep, k: int) -> ll.Function:
        """Each warp's first lane puts its warp's total in shared[r][warp]."""
        fn, _, rowtid, cells, shared = self._step_function(grid, f"{k}_to_shared")
        b = self.b
        with b.if_then(b.icmp_unsigned("==", b.urem(rowtid, _const(WARP)), _const(0))):
            warp = b.udiv(rowtid, _const(WARP))
            for r in range(len(step.reductions)):
                word = b.load(b.bitcast(b.gep(cells, [_const(CELL * 2 * r)]), V.I64.as_pointer()))
                slot = b.add(_const(r * WARP), warp)
                b.store(word, b.gep(b.bitcast(shared, V.I64.as_pointer()), [slot]))
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _from_shared(self, grid: PhaseMapping, step: RowStep, k: int) -> ll.Function:
        """Every warp reloads the warps' totals, one per lane (the identity past the last warp),
        so that the next butterfly leaves the row's total in every thread."""
        fn, _, rowtid, cells, shared = self._step_function(grid, f"{k}_from_shared")
        b = self.b
        lane = b.urem(rowtid, _const(WARP))
        have = b.icmp_unsigned("<", lane, _const(grid.rows.warps))
        for r, name in enumerate(step.reductions):
            st = self.scop.statement(name).statement
            dtype = self._reduction_type(name)
            word = b.gep(b.bitcast(shared, V.I64.as_pointer()), [b.add(_const(r * WARP), lane)])
            value = V.load_element(b, b.bitcast(word, V.memory_type(dtype).as_pointer()), dtype)
            value = b.select(have, value, V.identity(st.op, dtype))
            V.store_element(b, value, self._cell(cells, 2 * r, dtype), dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _store_totals(self, grid: PhaseMapping, step: RowStep, k: int) -> ll.Function:
        """The row's first thread: element op= total, for each reduction (the element's
        subscripts do not depend on the loop's iterator: evaluated at its first value)."""
        fn, env, rowtid, cells, _ = self._step_function(grid, f"{k}_store")
        b = self.b
        node = step.nodes[0]
        at = {**env, step.iterator: self.ast_expr(node.for_get_init(), env)}
        leaves = {leaf.statement: leaf for leaf in leaves_under(node.for_get_body(), self.ast.leaves)}
        with b.if_then(b.icmp_unsigned("==", rowtid, _const(0))):
            for r, name in enumerate(step.reductions):
                stmt = self.scop.statement(name)
                st = stmt.statement
                dtype = self._reduction_type(name)
                indices = {var: self.ast_expr(expr, at) for var, expr in leaves[name].index_exprs}
                self.leaf_statement = PolyLeafContext(stmt.name, st, indices)
                ptr = self.address(st.tensor, st.lhs, None)
                total = V.load_element(b, self._cell(cells, 2 * r, dtype), dtype)
                old = V.load_element(b, ptr, dtype)
                flags = self.flags if self.flags else ("reassoc",)
                V.store_element(b, V.combine(b, st.op, dtype, old, total, flags), ptr, dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    # ------------------------------------------------------------------ running them

    def _row_cells(self, grid: PhaseMapping) -> int:
        return grid.rows.cells

    def _shared_words(self, grid: PhaseMapping) -> int:
        """The reduction area (a word per warp per reduction), then each row's region."""
        return self._reduction_words(grid) + grid.rows.per_block * grid.rows.row_bytes // CELL

    def _reduction_words(self, grid: PhaseMapping) -> int:
        return max(1, grid.rows.reductions) * WARP

    def _row_memory(self, b: ll.IRBuilder, grid: PhaseMapping, shared: ll.Value, tid: ll.Value) -> ll.Value:
        """The region of shared memory of thread `tid`'s row (rows of a block in warp order)."""
        rows = grid.rows
        offset = _const(CELL * self._reduction_words(grid))
        if rows.per_block > 1 and rows.row_bytes:
            offset = b.add(offset, b.mul(b.udiv(tid, _const(WARP)), _const(rows.row_bytes)))
        return b.gep(shared, [offset])

    def _row_of(self, b: ll.IRBuilder, grid: PhaseMapping, block: ll.Value, tid: ll.Value):
        """(row, thread of the row) of thread `tid` of block `block`."""
        rows = grid.rows
        if rows.per_block == 1:
            return block, tid
        row = b.add(b.mul(block, _const(rows.per_block)), b.udiv(tid, _const(WARP)))
        return row, b.urem(tid, _const(WARP))

    def _row_iterators(self, b: ll.IRBuilder, grid: PhaseMapping, row: ll.Value) -> list[ll.Value]:
        """The mapped loops' iterator values of `row` (the fastest varying loop the lowest digit)."""
        values: list[ll.Value] = [_const(0)] * len(grid.loops)
        rest = row
        for n in reversed(grid.order):
            loop = grid.loops[n]
            count = _const(max(1, loop.count))
            digit = b.urem(rest, count)
            rest = b.udiv(rest, count)
            values[n] = b.add(_const(loop.first), b.mul(digit, _const(loop.step)))
        return values

    def _run_code(self, b, fn, step_fn, args, failed_ptr, local, error, iters, rowtid, cells, shared) -> None:
        """`shared`: (the block's shared array, the row's region of it); `iters`: the row's
        iterators, then the chunk (of a loop of steps; 0 outside one)."""
        """At b: unless this thread failed before, run a step; record a failure (the first
        thread of the call to fail claims error[0..3], as gpu/lower.py's entry does)."""
        run = fn.append_basic_block("step")
        done = fn.append_basic_block("step.done")
        b.cbranch(b.icmp_unsigned("==", b.load(failed_ptr), ll.Constant(V.I32, 0)), run, done)
        b.position_at_end(run)
        code = b.call(step_fn, list(args) + [local] + list(iters) + [rowtid, cells, *shared])
        failed = fn.append_basic_block("step.failed")
        b.cbranch(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), failed, done)
        b.position_at_end(failed)
        b.store(code, failed_ptr)
        swap = b.cmpxchg(error, _const(0), b.zext(code, V.I64), "monotonic", "monotonic")
        claim = fn.append_basic_block("claim")
        b.cbranch(b.extract_value(swap, 1), claim, done)
        b.position_at_end(claim)
        for n in (1, 2, 3):
            word = b.load(b.gep(local, [_const(n)]))
            b.store_atomic(word, b.gep(error, [_const(n)]), "monotonic", 8)
        b.branch(done)
        b.position_at_end(done)

    def _intrinsic(self, name: str, ret: ll.Type, args: list[ll.Type]) -> ll.Function:
        return self.module.globals.get(name) or ll.Function(self.module, ll.FunctionType(ret, args), name)

    def emit_row_entry(self, grid: PhaseMapping, ops: list[tuple]) -> ll.Function:
        """`tl_<def>_phase<n>(tensors..., error)`: thread (ctaid, tid) runs the operations for its row."""
        n_tensors = len(self.layout.tensors)
        tensor_types = [V.memory_type(self.program.tensor(t).dtype).as_pointer() for t in self.layout.tensors]
        ty = ll.FunctionType(ll.VoidType(), tensor_types + [V.I64.as_pointer()])
        fn = ll.Function(self.module, ty, f"tl_{self.program.name}_phase{grid.index}")
        if self.new_cc:
            fn.calling_convention = "ptx_kernel"
        for arg in fn.args[:n_tensors]:
            arg.add_attribute("noalias")
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        tid, ctaid = (
            b.zext(b.call(self._intrinsic(f"llvm.nvvm.read.ptx.sreg.{r}.x", V.I32, []), []), V.I64)
            for r in ("tid", "ctaid")
        )
        local = b.alloca(V.I64, size=4, name="error.local")
        cells = b.alloca(V.I64, size=self._row_cells(grid), name="cells")
        for n in range(self._row_cells(grid)):
            b.store(_const(0), b.gep(cells, [_const(n)]))
        failed = b.alloca(V.I32, name="failed")
        b.store(ll.Constant(V.I32, 0), failed)
        words = self._shared_words(grid)
        array = ll.ArrayType(V.I64, words)
        shared_var = ll.GlobalVariable(self.module, array, f"tl_shared{grid.index}", addrspace=3)
        shared_var.linkage = "internal"
        shared_var.initializer = ll.Constant(array, ll.Undefined)
        shared_var.align = 16  # lets LLVM vectorise the staged tiles' shared loads
        shared = b.bitcast(b.addrspacecast(shared_var, array.as_pointer()), V.I8.as_pointer())
        cells8 = b.bitcast(cells, V.I8.as_pointer())
        row, rowtid = self._row_of(b, grid, ctaid, tid)
        shared = (shared, self._row_memory(b, grid, shared, tid))
        work = fn.append_basic_block("row")
        out = fn.append_basic_block("out")
        # uniform over a warp (a warp per row) or the block (a block per row): no barrier is left waiting
        b.cbranch(b.icmp_unsigned("<", row, _const(grid.rows.rows)), work, out)
        b.position_at_end(out)
        b.ret_void()
        b.position_at_end(work)
        iters = self._row_iterators(b, grid, row)
        args, error = list(fn.args[:n_tensors]), fn.args[n_tensors]
        warp_rows = grid.rows.per_block > 1
        self._gpu_ops(
            b, fn, ops, _const(0), (args, failed, local, error, iters, rowtid, cells8, shared), warp_rows
        )
        b.ret_void()
        return fn

    def _gpu_ops(self, b, fn, ops, chunk, state, warp_rows: bool) -> None:
        args, failed, local, error, iters, rowtid, cells8, shared = state
        cells = b.bitcast(cells8, V.I64.as_pointer())
        for op in ops:
            if op[0] == "code":
                self._run_code(
                    b, fn, op[1], args, failed, local, error, iters + [chunk], rowtid, cells8, shared
                )
            elif op[0] == "repeat":  # the same count for every thread of the block
                counted_loop(
                    b, fn, op[1], lambda i, body=op[2]: self._gpu_ops(b, fn, body, i, state, warp_rows)
                )
            elif op[0] == "barrier":
                if warp_rows:
                    sync = self._intrinsic("llvm.nvvm.bar.warp.sync", ll.VoidType(), [V.I32])
                    b.call(sync, [ll.Constant(V.I32, -1)])
                else:
                    b.call(self._intrinsic("llvm.nvvm.barrier0", ll.VoidType(), []), [])
            else:
                _, src, dst, mask, wide = op
                shfl = self._intrinsic("llvm.nvvm.shfl.sync.bfly.i32", V.I32, [V.I32] * 4)
                for half in range(2 if wide else 1):
                    word = b.gep(b.bitcast(cells, V.I32.as_pointer()), [_const(2 * src + half)])
                    value = b.call(
                        shfl,
                        [
                            ll.Constant(V.I32, -1),
                            b.load(word),
                            ll.Constant(V.I32, mask),
                            ll.Constant(V.I32, 31),
                        ],
                    )
                    b.store(value, b.gep(b.bitcast(cells, V.I32.as_pointer()), [_const(2 * dst + half)]))

    def emit_row_emulation(self, grid: PhaseMapping, ops: list[tuple]) -> None:
        """`tl_emulate_phase<n>(tensors..., error)`: for each block, each operation for every
        thread of the block in turn (barriers need nothing more: the previous operation has
        finished for every thread)."""
        n_tensors = len(self.layout.tensors)
        tensor_types = [V.memory_type(self.program.tensor(t).dtype).as_pointer() for t in self.layout.tensors]
        ty = ll.FunctionType(ll.VoidType(), tensor_types + [V.I64.as_pointer()])
        fn = ll.Function(self.module, ty, f"tl_emulate_phase{grid.index}")
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        threads, ncells = grid.rows.block, self._row_cells(grid)
        local = b.alloca(V.I64, size=4, name="error.local")
        cells = b.alloca(V.I64, size=threads * ncells, name="cells")
        failed = b.alloca(V.I32, size=threads, name="failed")
        xch = b.alloca(V.I64, size=threads, name="exchange")
        shared = b.bitcast(b.alloca(V.I64, size=self._shared_words(grid), name="shared"), V.I8.as_pointer())
        args, error = list(fn.args[:n_tensors]), fn.args[n_tensors]

        def each(count: int, body) -> None:
            counted_loop(b, fn, count, body)

        def cell(t: ll.Value, n: int) -> ll.Value:
            return b.gep(cells, [b.add(b.mul(t, _const(ncells)), _const(n))])

        def start(t: ll.Value) -> None:
            for n in range(ncells):
                b.store(_const(0), cell(t, n))
            b.store(ll.Constant(V.I32, 0), b.gep(failed, [t]))

        def run_block(block: ll.Value) -> None:
            each(threads, start)
            run_ops(block, ops, _const(0))

        def run_ops(block: ll.Value, ops: list[tuple], chunk: ll.Value) -> None:
            for op in ops:
                if op[0] == "code":
                    each(threads, lambda t, f=op[1]: run_code(block, t, f, chunk))
                elif op[0] == "repeat":
                    each(op[1], lambda i, body=op[2]: run_ops(block, body, i))
                elif op[0] == "exchange":
                    _, src, dst, mask, _wide = op
                    each(threads, lambda t, s=src: b.store(b.load(cell(t, s)), b.gep(xch, [t])))
                    each(
                        threads,
                        lambda t, d=dst, m=mask: b.store(
                            b.load(b.gep(xch, [b.xor(t, _const(m))])), cell(t, d)
                        ),
                    )

        def run_code(block: ll.Value, t: ll.Value, step_fn: ll.Function, chunk: ll.Value) -> None:
            row, rowtid = self._row_of(b, grid, block, t)
            live = fn.append_basic_block("live")
            skip = fn.append_basic_block("skip")
            b.cbranch(b.icmp_unsigned("<", row, _const(grid.rows.rows)), live, skip)
            b.position_at_end(live)
            iters = self._row_iterators(b, grid, row)
            mine = b.bitcast(cell(t, 0), V.I8.as_pointer())
            memory = (shared, self._row_memory(b, grid, shared, t))
            self._run_code(
                b, fn, step_fn, args, b.gep(failed, [t]), local, error, iters + [chunk], rowtid, mine, memory
            )
            b.branch(skip)
            b.position_at_end(skip)

        each(grid.rows.blocks, run_block)
        b.ret_void()
