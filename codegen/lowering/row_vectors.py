"""lowering: an innermost loop with a RowPlan → an explicit vector loop, store-aligned, whose neighbouring reads are lane shifts of aligned loads.

Jacobi's `0.2 * (B[j] + U[j] + D[j] + B[j-1] + B[j+1])` vectorised by LLVM loads five vectors per
16 points, the two shifted ones (and, with rows whose pitch is not a multiple of 64 bytes, others)
crossing two cache lines each: on an AVX-512 core that is what bounds the loop. Here each read
group (row_analysis.ReadGroup) is loaded once per block of lanes, at the addresses the aligned
store implies, and its shifted values are `shufflevector`s of consecutive loads (one `valignd`),
the previous block's load carried in a register. The row runs on one grid of blocks aligned to
the store's address: a block with a masked store before the first aligned one, unmasked blocks
(two per iteration, then one more where a whole block is left), blocks with masked stores to the
end (one masked block's code serves both ends). Loads are never masked: a row runs as vectors
only where every vector its blocks load lies inside its tensor's allocation (all but a tensor's
first and last rows; those, and rows shorter than two blocks, run the scalar loop), so nothing
is read out of bounds and nothing outside the row written. Every lane computes the scalar
expression in its order (no reassociation), and each block reads before it stores (row_analysis
proves that this keeps the loop's order).
"""

from __future__ import annotations

import functools

import islpy as isl
import llvmlite.binding as llvm
import llvmlite.ir as ll

from tensorlang import ir

from ..emit import values as V
from ..host import host_has_avx512
from .row_analysis import RowPlan, plan_row
from .state import LoweringState, PolyLeafContext


def vector_lanes(bits: int | None, element_bytes: int) -> int:
    """Lanes of the vectors rows run in: the plan's vector width, else 512 bits on AVX-512."""
    if bits is None:
        bits = 512 if host_has_avx512() else 256
    return max(2, bits // 8 // element_bytes)


#: blocks per iteration of the unmasked loop
STEADY_UNROLL = 2


class RowVectorLowering(LoweringState):
    """Innermost loops that row_analysis accepts, as explicit vector loops."""

    def row_plan(self, node: isl.AstNode, name: str) -> RowPlan | None:
        """The RowPlan of an innermost loop `node` whose body is one statement instance, or
        None (vectorisation off, a CUDA module, a GEMM/convolution call, checked subscripts...)."""
        body = node.for_get_body()
        if body.get_type() != isl.ast_node_type.user or not self.plan.vectorize:
            return None
        if not self.pads_rows():  # a CUDA module (or its emulation): CPU code only
            return None
        leaf = self.ast.leaves[body.get_annotation().get_name()]
        stmt = self.scop.statement(leaf.statement)
        if stmt.kind == "init" or stmt.name in self.plans or stmt.name in self.plan.convolutions:
            return None
        if stmt.statement.tensor in self.private_pointers:  # it writes a private copy (private_team.py)
            return None
        if any(key[0] == stmt.name for key in self.checks_of) or any(
            key[0] == stmt.name for key in self.read_overrides
        ):
            return None
        st = stmt.statement
        dtype = self.program.tensor(st.tensor).dtype
        lanes = vector_lanes(self.plan.vector_width, dtype.storage_bytes)
        folds = {t: (f.dim, f.modulus) for t, f in self.plan.folded.items()}
        return plan_row(
            node, name, leaf.index_exprs, st, dtype, lanes, dict(self.layouts), folds, set(self.contracted)
        )

    def emit_row_vector_for(
        self,
        node: isl.AstNode,
        name: str,
        init: ll.Value,
        env: dict[str, ll.Value],
        row: RowPlan,
        restricted: bool = False,
    ) -> None:
        """The loop as vectors when it runs at least two blocks, else as it is. `restricted`:
        this thread runs the iterations in [lo, hi) only (a contiguous part of the row)."""
        b = self.b
        end = self.ast_expr(row.end, env)
        if row.end_inclusive:
            end = b.add(end, ll.Constant(V.I64, 1), flags=["nsw"])
        if restricted:
            init = b.select(b.icmp_signed(">", self.lo, init), self.lo, init)
            end = b.select(b.icmp_signed("<", self.hi, end), self.hi, end)
        leaf = self.ast.leaves[node.for_get_body().get_annotation().get_name()]
        st = self.scop.statement(leaf.statement).statement
        dtype = self.program.tensor(st.tensor).dtype
        lanes = vector_lanes(self.plan.vector_width, dtype.storage_bytes)
        n = b.sub(end, init, flags=["nsw"])
        check = b.append_basic_block("row.check")
        vector = b.append_basic_block("row.vector")
        scalar = b.append_basic_block("row.scalar")
        done = b.append_basic_block("row.done")
        b.cbranch(b.icmp_signed(">=", n, ll.Constant(V.I64, 2 * lanes)), check, scalar)
        b.position_at_end(check)  # the row runs: the addresses of its first iteration are real
        rows = _RowEmitter(self, leaf, st, dtype, lanes, row, env, name, init, n)
        head = rows.head_block()
        # a tensor's first or last row, where a block's vector may leave the allocation: scalar
        b.cbranch(rows.inside_allocations(head), vector, scalar)
        b.position_at_end(vector)
        rows.emit(head)
        b.branch(done)
        b.position_at_end(scalar)
        self.emit_plain_for(node, name, init, env, end)
        b.branch(done)
        b.position_at_end(done)


class _RowEmitter:
    """One row's vector code: the three parts on one grid of store-aligned blocks."""

    def __init__(
        self, low: RowVectorLowering, leaf, st: ir.Statement, dtype, lanes, row: RowPlan, env, name, js, n
    ):
        self.low, self.b, self.st, self.row, self.lanes = low, low.b, st, row, lanes
        self.js, self.n = js, n
        self.elem = V.register_type(dtype)
        self.vty = ll.VectorType(self.elem, lanes)
        self.esize = dtype.storage_bytes
        self.valign = lanes * self.esize == 64 and _inline_asm_ready()
        b = self.b
        # addresses at the first iteration (in bounds: it runs), moved by plain GEPs from there
        indices = {var: low.ast_expr(expr, {**env, name: js}) for var, expr in leaf.index_exprs}
        low.leaf_statement = PolyLeafContext(low.scop.statement(leaf.statement).name, st, indices)
        self.wptr = low.address(st.tensor, st.lhs, None)
        self.gptr = []
        for g in row.groups:
            rep = low.address(g.tensor, g.rep.indices, g.rep)
            self.gptr.append(b.gep(rep, [ll.Constant(V.I64, -g.rep_offset)]))
        self.invariant: dict[ir.Read, ll.Value] = {}
        mty = ll.VectorType(V.I1, lanes)
        suffix = f"v{lanes}{'f32' if self.esize == 4 else 'f64'}"
        self.mstore = _declare(
            low.module,
            f"llvm.masked.store.{suffix}.p0",
            ll.VoidType(),
            [self.vty, self.vty.as_pointer(), V.I32, mty],
        )
        self.dtype = dtype

    # ------------------------------------------------------------------ pieces

    def c(self, v: int) -> ll.Constant:
        return ll.Constant(V.I64, v)

    def splat(self, x: ll.Value) -> ll.Value:
        b = self.b
        one = b.insert_element(ll.Constant(self.vty, ll.Undefined), x, ll.Constant(V.I32, 0))
        return b.shuffle_vector(
            one,
            ll.Constant(self.vty, ll.Undefined),
            ll.Constant(ll.VectorType(V.I32, self.lanes), [0] * self.lanes),
        )

    def vptr(self, base: ll.Value, offset: ll.Value) -> ll.Value:
        return self.b.bitcast(self.b.gep(base, [offset]), self.vty.as_pointer())

    def lane_mask(self, first: ll.Value, count: ll.Value) -> ll.Value:
        """Lanes l with 0 <= first + l < count, as a bit mask (scalar arithmetic: cheaper than
        comparing vectors of lane numbers) bitcast to <lanes x i1>."""
        b, lanes = self.b, self.lanes

        def clamp(x: ll.Value) -> ll.Value:
            x = b.select(b.icmp_signed("<", x, self.c(0)), self.c(0), x)
            return b.select(b.icmp_signed(">", x, self.c(lanes)), self.c(lanes), x)

        lo = clamp(b.sub(self.c(0), first))
        hi = clamp(b.sub(count, first))
        below_hi = b.sub(b.shl(self.c(1), hi), self.c(1))
        below_lo = b.sub(b.shl(self.c(1), lo), self.c(1))
        bits = b.trunc(b.and_(below_hi, b.not_(below_lo)), ll.IntType(lanes))
        return b.bitcast(bits, ll.VectorType(V.I1, lanes))

    def load_group(self, g: int, d: ll.Value, m: int) -> ll.Value:
        """Vector m (in blocks from the group's offset 0) of group g at block start js + d."""
        off = self.b.add(d, self.c(m * self.lanes))
        return self.b.load(self.vptr(self.gptr[g], off), align=self.esize)

    def shifted(self, vectors: dict[int, ll.Value], offset: int) -> ll.Value:
        q, r = divmod(offset, self.lanes)
        if r == 0:
            return vectors[q]
        b = self.b
        lo, hi = vectors[q], vectors[q + 1]
        if self.valign:
            # LLVM selects vpermt2ps (an index register, and a copy of the operand it
            # overwrites) for this shuffle of floats; valignd is one cheap instruction and
            # measured 0.50 against 0.67 ns per jacobi vector on Zen 5 (README)
            op = "valignd" if self.esize == 4 else "valignq"
            asm = ll.InlineAsm(
                ll.FunctionType(self.vty, [self.vty, self.vty]), f"{op} $${r}, $1, $2, $0", "=v,v,v"
            )
            return b.call(asm, [lo, hi])
        idx = ll.Constant(ll.VectorType(V.I32, self.lanes), list(range(r, r + self.lanes)))
        return b.shuffle_vector(lo, hi, idx)

    def compute(self, loaded: list[dict[int, ll.Value]]) -> ll.Value:
        values = {r: self.shifted(loaded[g], o) for r, g, o in self.row.slots}
        values.update(self.invariant)
        return self.value(self.st.rhs, values)

    def value(self, e: ir.Expr, reads: dict[ir.Read, ll.Value]) -> ll.Value:
        b, flags = self.b, self.low.flags
        match e:
            case ir.Const(value=v):
                return ll.Constant(self.vty, [ll.Constant(self.elem, float(v))] * self.lanes)
            case ir.Read():
                return reads[e]
            case ir.Unary(op="-", operand=o):
                return b.fneg(self.value(o, reads))
            case ir.Binary(op=op, lhs=x, rhs=y):
                fn = {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}[op]
                return fn(self.value(x, reads), self.value(y, reads), flags=flags)
        raise NotImplementedError(f"row vector expression {e!r}")  # row_analysis.vectorisable

    def block(self, d: ll.Value) -> None:
        """One block at js + d whose store is masked to the row, every vector loaded afresh."""
        loaded = []
        for g, group in enumerate(self.row.groups):
            qlo, qhi = group.vector_range(self.lanes)
            loaded.append({m: self.load_group(g, d, m) for m in range(qlo, qhi + 1)})
        self.store(d, self.compute(loaded), True)

    def store(self, d: ll.Value, value: ll.Value, masked: bool) -> None:
        b = self.b
        ptr = self.vptr(self.wptr, d)
        if masked:
            b.call(self.mstore, [value, ptr, ll.Constant(V.I32, self.esize), self.lane_mask(d, self.n)])
        else:
            b.store(value, ptr, align=self.esize)

    def steady_loop(self, start: ll.Value, need_hi: int, unroll: int) -> ll.Value:
        """Unmasked blocks from `start`, `unroll` per iteration, while the last one's
        block + need_hi <= n, each group's lower vectors carried from the block before; the d
        it leaves with. (Unrolled, the loop's counting and moves are shared by several blocks:
        with one block per iteration they made as many instructions as the arithmetic.)"""
        b, lanes = self.b, self.lanes
        reach = need_hi + (unroll - 1) * lanes  # the last block of an iteration must fit
        pre = b.block
        init = b.append_basic_block("row.steady.init")
        header = b.append_basic_block("row.steady")
        done = b.append_basic_block("row.steady.done")
        fits = b.icmp_signed("<=", b.add(start, self.c(reach)), self.n)
        b.cbranch(fits, init, done)
        b.position_at_end(init)
        ranges = [g.vector_range(lanes) for g in self.row.groups]
        first = [
            [self.load_group(g, start, m) for m in range(qlo, qhi)] for g, (qlo, qhi) in enumerate(ranges)
        ]
        b.branch(header)
        b.position_at_end(header)
        d = b.phi(V.I64)
        d.add_incoming(start, init)
        carried = []
        for vals in first:
            phis = []
            for v in vals:
                phi = b.phi(self.vty)
                phi.add_incoming(v, init)
                phis.append(phi)
            carried.append(phis)
        current = [dict(zip(range(qlo, qhi), carried[g])) for g, (qlo, qhi) in enumerate(ranges)]
        for u in range(unroll):
            at = b.add(d, self.c(u * lanes), flags=["nsw"]) if u else d
            for g, (_, qhi) in enumerate(ranges):
                current[g][qhi] = self.load_group(g, at, qhi)
            self.store(at, self.compute(current), False)
            current = [
                {m - 1: v for m, v in vecs.items() if m > qlo} for vecs, (qlo, _) in zip(current, ranges)
            ]
        nxt = b.add(d, self.c(unroll * lanes), flags=["nsw"])
        latch = b.block
        d.add_incoming(nxt, latch)
        for g, (qlo, qhi) in enumerate(ranges):
            for m, phi in zip(range(qlo, qhi), carried[g]):
                phi.add_incoming(current[g][m], latch)
        b.cbranch(b.icmp_signed("<=", b.add(nxt, self.c(reach)), self.n), header, done)
        b.position_at_end(done)
        out = b.phi(V.I64)
        out.add_incoming(start, pre)
        out.add_incoming(nxt, latch)
        return out

    # ------------------------------------------------------------------ the row

    def inside_allocations(self, head: ll.Value) -> ll.Value:
        """Whether every vector the row's blocks load, from the block at `head` to the one
        holding iteration n - 1, lies inside its tensor's allocation (all but a tensor's first
        and last rows): then only the stores at the row's ends need masks."""
        b, lanes = self.b, self.lanes
        ok = ll.Constant(V.I1, 1)
        for g, group in enumerate(self.row.groups):
            qlo, qhi = group.vector_range(lanes)
            base = b.ptrtoint(self.low.pointers[group.tensor], V.I64)
            first = b.ashr(b.sub(b.ptrtoint(self.gptr[g], V.I64), base), self.c(self.esize.bit_length() - 1))
            lowest = b.add(first, b.add(head, self.c(lanes * qlo)))
            highest = b.add(first, b.add(self.n, self.c(lanes * qhi + lanes - 2)))  # blocks start below n
            inside = b.and_(
                b.icmp_signed(">=", lowest, self.c(0)),
                b.icmp_signed("<", highest, self.numel(group.tensor)),
            )
            ok = b.and_(ok, inside)
        return ok

    def numel(self, tensor: str) -> ll.Value:
        """Elements allocated for `tensor`: its outermost stored dimension's stride × extent."""
        low = self.low
        order = low.layouts.get(tensor, tuple(range(low.program.tensor(tensor).rank)))
        outer = order[0]
        fold = low.plan.folded.get(tensor)
        extent = (
            ll.Constant(V.I64, fold.modulus)
            if fold is not None and fold.dim == outer
            else low.extent(tensor, outer)
        )
        return self.b.mul(low.element_strides(tensor)[outer], extent)

    def head_block(self) -> ll.Value:
        """The first block's start (from js): the store's address aligned to a whole vector,
        one block before the first aligned one when that is past js."""
        b, lanes = self.b, self.lanes
        addr = b.ptrtoint(self.wptr, V.I64)
        mis = b.and_(b.lshr(addr, self.c(self.esize.bit_length() - 1)), self.c(lanes - 1))
        self.aligned = b.and_(b.sub(self.c(lanes), mis), self.c(lanes - 1))
        return b.select(
            b.icmp_signed(">", self.aligned, self.c(0)), b.sub(self.aligned, self.c(lanes)), self.aligned
        )

    def emit(self, head: ll.Value) -> None:
        """Masked stores before the first aligned block, unmasked blocks while whole, masked
        stores after; every load unmasked (inside_allocations holds)."""
        b, lanes = self.b, self.lanes
        self.invariant = {
            r: self.splat(V.load_element(b, self.low.address(r.tensor, r.indices, r), self.dtype))
            for r in self.row.invariant
        }
        # one masked block's code serves both ends: phase 0 runs the block before the first
        # aligned one (if any), phase 1 the blocks after the unmasked loop
        entry = b.block
        header = b.append_basic_block("row.masked")
        body = b.append_basic_block("row.masked.body")
        after = b.append_basic_block("row.masked.done")
        exit_ = b.append_basic_block("row.exit")
        b.branch(header)
        b.position_at_end(header)
        d = b.phi(V.I64)
        tail = b.phi(V.I1)
        d.add_incoming(head, entry)
        tail.add_incoming(ll.Constant(V.I1, 0), entry)
        limit = b.select(tail, self.n, _smin(b, self.aligned, self.n))
        b.cbranch(b.icmp_signed("<", d, limit), body, after)
        b.position_at_end(body)
        self.block(d)
        d.add_incoming(b.add(d, self.c(lanes)), b.block)
        tail.add_incoming(tail, b.block)
        b.branch(header)
        b.position_at_end(after)
        steady = b.append_basic_block("row.unmasked")
        b.cbranch(tail, exit_, steady)
        b.position_at_end(steady)
        out = self.steady_loop(d, lanes, STEADY_UNROLL)
        if STEADY_UNROLL > 1:
            # the whole block the unrolled loop leaves (a 998-point row of jacobi-2d: 60 blocks
            # in pairs, then this one, then one masked block instead of two): 1.4-2.1 % faster
            # calls, 1000^2 T=100 on 1 and 2 threads (README, *Row vectors*)
            out = self.steady_loop(out, lanes, 1)
        d.add_incoming(out, b.block)
        tail.add_incoming(ll.Constant(V.I1, 1), b.block)
        b.branch(header)
        b.position_at_end(exit_)


@functools.cache
def _inline_asm_ready() -> bool:
    """True on an AVX-512 host, once LLVM can assemble inline asm (its asm parser registered)."""
    if not host_has_avx512():
        return False
    llvm.initialize_native_asmparser()
    return True


def _smin(b: ll.IRBuilder, x: ll.Value, y: ll.Value) -> ll.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _declare(module: ll.Module, name: str, ret: ll.Type, args: list[ll.Type]) -> ll.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ll.Function(module, ll.FunctionType(ret, args), name)
