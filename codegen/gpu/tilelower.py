"""gpu: a tiled contraction phase (PhaseMapping.rows a TileMapping) → its step functions and operations.

The operations (run by gpu/rowlower.py on the GPU and in the emulation): fetch chunk 0 into
registers, stage it in shared memory, barrier, ("repeat", chunks, [fetch the next chunk into
registers, compute this one, barrier, stage the next, barrier]), then store. Thread t of the block owns rows ty·RM .. and
columns tx·RN .. of the tile (tx = t mod TN/RN): its RM x RN accumulators are its private
cells. The staged slices live in the block's shared memory: A's TK x TM (transposed, so that
a thread reads its RM values of one k side by side), then B's TK x TN.
"""

from __future__ import annotations

import llvmlite.ir as ll

from tensorlang import ir

from ..emit import values as V
from ..lowering.state import PolyLeafContext
from .mapping import PhaseMapping
from .tiles import TileMapping


def _const(n: int) -> ll.Constant:
    return ll.Constant(V.I64, n)


class TileLowering:
    """Mixin of GpuLowering (with RowLowering): the steps of a tiled contraction."""

    def emit_tile_ops(self, grid: PhaseMapping) -> list[tuple]:
        tiles: TileMapping = grid.rows
        first, ahead = self._tile_fetch(grid, tiles, 0), self._tile_fetch(grid, tiles, 1)
        stage, compute = self._tile_stage(grid, tiles), self._tile_compute(grid, tiles)
        store = self._tile_store(grid, tiles)
        sync = ("barrier",)
        chunk = [("code", ahead), ("code", compute), sync, ("code", stage), sync]
        return [("code", first), ("code", stage), sync, ("repeat", tiles.chunks, chunk), ("code", store)]

    def _tile_parts(self, tiles: TileMapping):
        """(statement, its dtype, the read of A, the read of B) of the contraction."""
        stmt = self.scop.statement(tiles.contraction.statement)
        st = stmt.statement
        rhs = st.rhs
        assert isinstance(rhs, ir.Binary) and isinstance(rhs.lhs, ir.Read) and isinstance(rhs.rhs, ir.Read)
        return stmt, rhs.dtype, rhs.lhs, rhs.rhs

    def _tile_origin(self, tiles: TileMapping, tile: ll.Value) -> tuple[ll.Value, ll.Value]:
        """The first m and n of tile `tile` (tiles numbered with n fastest)."""
        b = self.b
        tm, tn = b.udiv(tile, _const(tiles.tiles_n)), b.urem(tile, _const(tiles.tiles_n))
        return b.mul(tm, _const(tiles.tm)), b.mul(tn, _const(tiles.tn))

    def _unflatten(self, tiles: TileMapping, role: int, flat: ll.Value | None) -> dict[str, ll.Value]:
        """The variables of a role (0 m, 1 n, 2 k) at a flattened index (the last variable
        fastest); each at its first value when `flat` is None (a role the operand lacks)."""
        b = self.b
        out = {}
        rest = flat
        for var, lo, hi in reversed(tiles.roles[role]):
            if rest is None:
                out[var] = _const(lo)
                continue
            extent = _const(max(1, hi - lo))
            out[var] = b.add(_const(lo), b.urem(rest, extent))
            rest = b.udiv(rest, extent)
        return out

    def _element(self, stmt, read: ir.Read, indices: dict[str, ll.Value], ok: ll.Value, dtype) -> ll.Value:
        """read's element at `indices` where `ok`, else zero: the index is clamped into range first,
        so the load is always in bounds (no branch)."""
        self.leaf_statement = PolyLeafContext(stmt.name, stmt.statement, indices)
        value = V.load_element(self.b, self.address(read.tensor, read.indices, read), dtype)
        return self.b.select(ok, value, V.const(dtype, 0))

    def _clamped(self, value: ll.Value, lo: int, hi: int) -> tuple[ll.Value, ll.Value]:
        """(value clamped into [lo, hi), whether it was in range); hi > lo."""
        b = self.b
        ok = b.icmp_signed("<", value, _const(hi))
        return b.select(ok, value, _const(hi - 1)), ok

    def _shared_slices(self, tiles: TileMapping, dtype) -> tuple[ll.Value, ll.Value]:
        ty = V.memory_type(dtype).as_pointer()
        a = self.b.bitcast(self.rowmem, ty)
        return a, self.b.gep(a, [_const(tiles.tm * tiles.tk)])

    def _staged(self, tiles: TileMapping, tid: ll.Value) -> list[tuple[int, ll.Value, ll.Value]]:
        """Thread `tid`'s elements of a chunk: (0, r, kk) of A's slice or (1, kk, col) of B's,
        consecutive threads on consecutive k or on consecutive m (n), whichever the operand's
        stride-1 subscript follows (TileMapping.k_fastest)."""
        b = self.b
        out = []
        for q in range(tiles.tm * tiles.tk // tiles.threads):
            i = b.add(tid, _const(q * tiles.threads))
            if tiles.k_fastest[0]:
                out.append((0, b.udiv(i, _const(tiles.tk)), b.urem(i, _const(tiles.tk))))
            else:
                out.append((0, b.urem(i, _const(tiles.tm)), b.udiv(i, _const(tiles.tm))))
        for q in range(tiles.tk * tiles.tn // tiles.threads):
            i = b.add(tid, _const(q * tiles.threads))
            if tiles.k_fastest[1]:
                out.append((1, b.urem(i, _const(tiles.tk)), b.udiv(i, _const(tiles.tk))))
            else:
                out.append((1, b.udiv(i, _const(tiles.tn)), b.urem(i, _const(tiles.tn))))
        return out

    def _tile_fetch(self, grid: PhaseMapping, tiles: TileMapping, ahead: int) -> ll.Function:
        """The thread's elements of chunk `chunk + ahead` from global memory into its staging
        cells (after the accumulators); zero outside A and B (past the last chunk too). Fetching
        the next chunk before computing this one lets the loads' latency overlap the products."""
        fn, env, tid, cells, _ = self._step_function(grid, f"fetch{ahead}")
        b = self.b
        stmt, dtype, read_a, read_b = self._tile_parts(tiles)
        (tile,) = env.values()
        m0, n0 = self._tile_origin(tiles, tile)
        chunk = b.add(self.chunk, _const(ahead))
        k0 = b.add(_const(tiles.ranges[2][0]), b.mul(chunk, _const(tiles.tk)))
        (_, m_hi), (_, n_hi), (_, k_hi) = tiles.ranges
        for n, (which, x, y) in enumerate(self._staged(tiles, tid)):
            if which == 0:
                m, m_ok = self._clamped(b.add(m0, x), 0, m_hi)
                k, k_ok = self._clamped(b.add(k0, y), 0, k_hi)
                at = {
                    **self._unflatten(tiles, 0, m),
                    **self._unflatten(tiles, 1, None),
                    **self._unflatten(tiles, 2, k),
                }
                value = self._element(stmt, read_a, at, b.and_(m_ok, k_ok), dtype)
            else:
                col, n_ok = self._clamped(b.add(n0, y), 0, n_hi)
                k, k_ok = self._clamped(b.add(k0, x), 0, k_hi)
                at = {
                    **self._unflatten(tiles, 0, None),
                    **self._unflatten(tiles, 1, col),
                    **self._unflatten(tiles, 2, k),
                }
                value = self._element(stmt, read_b, at, b.and_(n_ok, k_ok), dtype)
            V.store_element(b, value, self._cell(cells, tiles.rm * tiles.rn + n, dtype), dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _tile_stage(self, grid: PhaseMapping, tiles: TileMapping) -> ll.Function:
        """The staging cells into the shared slices: A transposed (kk, r), B as (kk, col)."""
        fn, _, tid, cells, _ = self._step_function(grid, "stage")
        b = self.b
        _, dtype, _, _ = self._tile_parts(tiles)
        a_s, b_s = self._shared_slices(tiles, dtype)
        for n, (which, x, y) in enumerate(self._staged(tiles, tid)):
            value = V.load_element(b, self._cell(cells, tiles.rm * tiles.rn + n, dtype), dtype)
            if which == 0:
                at = b.gep(a_s, [b.add(b.mul(y, _const(tiles.tm)), x)])
            else:
                at = b.gep(b_s, [b.add(b.mul(x, _const(tiles.tn)), y)])
            V.store_element(b, value, at, dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _thread_origin(self, tiles: TileMapping, tid: ll.Value) -> tuple[ll.Value, ll.Value]:
        """The first row and column of thread `tid`'s register tile, within the tile."""
        b = self.b
        across = tiles.tn // tiles.rn
        ty, tx = b.udiv(tid, _const(across)), b.urem(tid, _const(across))
        return b.mul(ty, _const(tiles.rm)), b.mul(tx, _const(tiles.rn))

    def _tile_compute(self, grid: PhaseMapping, tiles: TileMapping) -> ll.Function:
        """acc[i][j] += A_s[kk][row + i] · B_s[kk][col + j] for the chunk's kk (unrolled)."""
        fn, _, tid, cells, _ = self._step_function(grid, "compute")
        b = self.b
        _, dtype, _, _ = self._tile_parts(tiles)
        a_s, b_s = self._shared_slices(tiles, dtype)
        row, col = self._thread_origin(tiles, tid)
        slots = [self._cell(cells, n, dtype) for n in range(tiles.cells)]
        acc = [V.load_element(b, p, dtype) for p in slots]
        flags = self.flags if self.flags else ("reassoc", "contract")
        for kk in range(tiles.tk):
            a_row = b.gep(a_s, [b.add(_const(kk * tiles.tm), row)])
            b_row = b.gep(b_s, [b.add(_const(kk * tiles.tn), col)])
            xs, ys = self._shared_run(a_row, tiles.rm, dtype), self._shared_run(b_row, tiles.rn, dtype)
            for i in range(tiles.rm):
                for j in range(tiles.rn):
                    n = i * tiles.rn + j
                    acc[n] = b.fadd(acc[n], b.fmul(xs[i], ys[j], flags=flags), flags=flags)
        for value, p in zip(acc, slots):
            V.store_element(b, value, p, dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn

    def _shared_run(self, ptr: ll.Value, count: int, dtype) -> list[ll.Value]:
        """`count` consecutive elements from `ptr` (16-byte aligned: the shared array is, and a
        thread's run starts at a multiple of RM or RN elements), in 16-byte vector loads on the
        GPU; the emulation's arrays promise no alignment, so it loads the same vectors unaligned."""
        b = self.b
        width = max(1, 16 // (dtype.bits // 8))
        if count % width:
            return [V.load_element(b, b.gep(ptr, [_const(i)]), dtype) for i in range(count)]
        vector = ll.VectorType(V.memory_type(dtype), width)
        out = []
        for start in range(0, count, width):
            vp = b.bitcast(b.gep(ptr, [_const(start)]), vector.as_pointer())
            v = b.load(vp, align=dtype.bits // 8 if self.emulate else 16)
            out += [b.extract_element(v, ll.Constant(V.I32, i)) for i in range(width)]
        return out

    def _tile_store(self, grid: PhaseMapping, tiles: TileMapping) -> ll.Function:
        """C[m][n] += acc for the thread's elements inside C."""
        fn, env, tid, cells, _ = self._step_function(grid, "store")
        b = self.b
        stmt, dtype, _, _ = self._tile_parts(tiles)
        st = stmt.statement
        (tile,) = env.values()
        m0, n0 = self._tile_origin(tiles, tile)
        row, col = self._thread_origin(tiles, tid)
        (_, m_hi), (_, n_hi), _ = tiles.ranges
        flags = self.flags if self.flags else ("reassoc",)
        for i in range(tiles.rm):
            m = b.add(b.add(m0, row), _const(i))
            for j in range(tiles.rn):
                n = b.add(b.add(n0, col), _const(j))
                inside = b.and_(b.icmp_signed("<", m, _const(m_hi)), b.icmp_signed("<", n, _const(n_hi)))
                with b.if_then(inside):
                    at = {
                        **self._unflatten(tiles, 0, m),
                        **self._unflatten(tiles, 1, n),
                        **self._unflatten(tiles, 2, None),
                    }
                    self.leaf_statement = PolyLeafContext(stmt.name, st, at)
                    ptr = self.address(st.tensor, st.lhs, None)
                    total = V.load_element(b, self._cell(cells, i * tiles.rn + j, dtype), dtype)
                    old = V.load_element(b, ptr, dtype)
                    V.store_element(b, V.combine(b, "+", dtype, old, total, flags), ptr, dtype)
        b.ret(ll.Constant(V.I32, 0))
        return fn
