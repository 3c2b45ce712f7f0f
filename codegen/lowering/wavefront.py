"""lowering: a team's wavefront loop over parallel pieces of tiles (rows, and columns in each row) → doacross units whose tiles wait only for the tiles they read from.

A time-tiled stencil of three space dimensions (heat-3d) has, inside its sequential wavefront
loop c0, several parallel loops over tile rows c1 (pieces the AST builder separates), each with a
parallel loop over tile columns c2 inside (planning/wavefront.py). Splitting the rows alone gives
a wavefront a few chunks of very unequal work; splitting each piece's tiles (c1, c2), numbered
row by row, as one iteration space gives chunks of about equal work. Each piece of each
wavefront is one unit of the team (team.py): its chunks are claimed as any unit's, and when the
loop runs on flags (doacross.py), each chunk sets a flag when done, and each row segment of a
chunk first waits for the flags of the chunks of the `back` wavefronts before that hold tiles in
its window (WaveLags); the next unit starts at once. Flags are numbered over the pieces' chunks
only: each thread notes, per piece, where the piece's flags start, its tiles and its chunks in
each of the last wavefronts (a ring of back + 1). Work in the loop body that is no such piece
runs fenced: after every chunk before it is done, and before anything after it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import islpy as isl
import llvmlite.ir as ll

from ..emit import values as V
from ..planning.astgen import contains_loop, evaluate_ast_int, unwrap
from ..planning.teams import holds_team_split, is_team_split
from ..planning.wavefront import WaveLags
from .barrier import define_flags_wait
from .doacross import Doacross, DoacrossLowering

# chunks each piece of a wavefront is cut into, per thread (at most: one per tile)
WAVE_CHUNKS_PER_THREAD = 4


def _c64(v: int) -> ll.Constant:
    return ll.Constant(V.I64, v)


@dataclass(frozen=True)
class Piece:
    """A parallel loop over tile rows in the wavefront loop's body (`inner`: the parallel loop
    over the row's tiles, else each row is one tile), the `index`-th such."""

    rows: isl.AstNode
    inner: isl.AstNode | None
    index: int


@dataclass(frozen=True)
class Wave:
    """A wavefront loop being emitted: iterator `name` (now `iv`, from `first` by `inc`), its
    pieces, the ring of what each thread noted of the last `slots` wavefronts (per piece: first
    flag, tiles, chunks) and the flag state as in Doacross."""

    name: str
    iv: ll.Value
    first: ll.Value
    inc: int
    env: dict
    lags: WaveLags
    pieces: tuple[Piece, ...]
    ring: ll.Value  # i64*: [slot][piece][first flag, tiles, chunks]
    slots: int
    state: Doacross  # on_flags, flags, tag (first_chunk: set per unit)


class WaveLowering(DoacrossLowering):
    """Wavefront loops of a team phase over pieces of tiles (mixed into TeamLowering)."""

    def wave_pieces(self, node: isl.AstNode) -> tuple[tuple[isl.AstNode | Piece, ...], WaveLags] | None:
        """The body of `node`, the phase's outermost team loop, as pieces and other work, when
        the AST builder found a window for its pieces (planning/wavefront.py) and there is more
        than one unit or a piece of rows of tiles; else None."""
        if not self.team_outermost or node.for_is_degenerate():
            return None
        inc = evaluate_ast_int(node.for_get_inc(), {})
        info = self.ast.loops.get(node.get_annotation().get_name())
        if inc is None or inc <= 0 or info is None or info.wave is None or info.wave.back < 1:
            return None
        lags = info.wave
        inner = dict(lags.inner)
        body = unwrap(node.for_get_body())
        if body.get_type() == isl.ast_node_type.block:
            children = body.block_get_children()
            nodes = [children.get_at(i) for i in range(children.n_ast_node())]
        else:
            nodes = [body]
        parts: list[isl.AstNode | Piece] = []
        pieces = 0
        for child in nodes:
            u = unwrap(child)
            if u.get_type() == isl.ast_node_type.if_ and holds_team_split(u, self.ast):
                return None
            key = u.get_annotation().get_name() if u.get_type() == isl.ast_node_type.for_ else None
            if key not in lags.pieces or not is_team_split(u, self.ast):
                parts.append(child)
                continue
            cols = unwrap(u.for_get_body())
            two = (
                key in inner
                and cols.get_type() == isl.ast_node_type.for_
                and cols.get_annotation().get_name() == inner[key]
                and is_team_split(cols, self.ast)
                and contains_loop(cols.for_get_body())
            )
            if not two and not contains_loop(u.for_get_body()):
                return None  # an innermost loop: row vectors (the doacross loop keeps them)
            parts.append(Piece(u, cols if two else None, pieces))
            pieces += 1
        if pieces == 0 or (len(parts) == 1 and parts[0].inner is None):
            return None
        return tuple(parts), lags

    def emit_wave_loop(
        self,
        node: isl.AstNode,
        env: dict[str, ll.Value],
        parts: tuple[isl.AstNode | Piece, ...],
        lags: WaveLags,
    ) -> None:
        """The wavefront loop `node`: count the pieces' chunks, choose flags or unit-by-unit
        waits, run each wavefront's pieces (and fenced work), then wait for every chunk."""
        b = self.b
        name = node.for_get_iterator().get_id().get_name()
        first = self.ast_expr(node.for_get_init(), env)
        inc = evaluate_ast_int(node.for_get_inc(), {})
        pieces = tuple(p for p in parts if isinstance(p, Piece))
        total = self._count_wave_chunks(node, pieces, name, first, inc, env)
        state = self.flag_state(total)
        slots = -(-lags.back // inc) + 1
        ring = b.alloca(V.I64, slots * len(pieces) * 3)
        next_flag = b.alloca(V.I64)
        b.store(_c64(0), next_flag)

        def body(iv: ll.Value) -> None:
            wave = Wave(name, iv, first, inc, env, lags, pieces, ring, slots, state)
            inner = {**env, name: iv}
            slot = b.srem(b.sdiv(b.sub(iv, first), _c64(inc)), _c64(slots))
            for part in parts:
                if isinstance(part, Piece):
                    self._emit_piece(wave, part, inner, slot, next_flag)
                else:  # fenced: after every chunk before it, and waited for (team.py)
                    with b.if_then(state.on_flags):
                        self.wait_for_chunks(b.load(self.team_base))
                    self.emit_team(part, inner)

        self.flag_loop(node, name, first, inc, env, state, body)

    def _ring(self, wave: Wave, slot: ll.Value, piece: int, field: int) -> ll.Value:
        at = self.b.add(self.b.mul(slot, _c64(len(wave.pieces) * 3)), _c64(piece * 3 + field))
        return self.b.gep(wave.ring, [at])

    def _loop(
        self,
        count: ll.Value,
        carried: list[ll.Value],
        body: Callable[[ll.Value, list[ll.Value]], list[ll.Value]],
    ) -> list[ll.Value]:
        """for j in [0, count): carried = body(j, carried); returns the carried values after."""
        b = self.b
        before = b.block
        head = b.append_basic_block("wave.loop")
        work = b.append_basic_block("wave.loop.body")
        done = b.append_basic_block("wave.loop.done")
        b.branch(head)
        b.position_at_end(head)
        j = b.phi(V.I64)
        j.add_incoming(_c64(0), before)
        phis = []
        for value in carried:
            phi = b.phi(value.type)
            phi.add_incoming(value, before)
            phis.append(phi)
        b.cbranch(b.icmp_signed("<", j, count), work, done)
        b.position_at_end(work)
        out = body(j, list(phis))
        j.add_incoming(b.add(j, _c64(1)), b.block)
        for phi, value in zip(phis, out):
            phi.add_incoming(value, b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis

    def _row(self, piece: Piece, env: dict, j: ll.Value) -> tuple[dict, ll.Value, ll.Value, ll.Value]:
        """Row j of `piece` in `env`: (env with its iterator, first column, column step, tiles)."""
        init, step, _, _ = self.split_geometry(piece.rows, env)
        name = piece.rows.for_get_iterator().get_id().get_name()
        env = {**env, name: self.b.add(init, self.b.mul(j, step))}
        if piece.inner is None:
            return env, _c64(0), _c64(1), _c64(1)
        return env, *self.split_geometry(piece.inner, env)[:3]

    def _tiles(self, piece: Piece, env: dict) -> tuple[ll.Value, ll.Value]:
        """(tiles, chunks) of `piece` in `env`."""
        rows = self.split_geometry(piece.rows, env)[2]
        if piece.inner is None:
            tiles = rows
        else:
            (tiles,) = self._loop(
                rows, [_c64(0)], lambda j, c: [self.b.add(c[0], self._row(piece, env, j)[3])]
            )
        most = self.b.mul(self.team_size, _c64(WAVE_CHUNKS_PER_THREAD))
        return tiles, self.b.select(self.b.icmp_signed("<", tiles, most), tiles, most)

    def _count_wave_chunks(
        self, node: isl.AstNode, pieces: tuple[Piece, ...], name: str, first: ll.Value, inc: int, env: dict
    ) -> ll.Value:
        """The pieces' chunks over all iterations of `node` (the same count on every thread)."""
        b = self.b

        def wavefront(w: ll.Value) -> ll.Value:
            inner = {**env, name: w}
            total = _c64(0)
            for piece in pieces:
                total = b.add(total, self._tiles(piece, inner)[1])
            return total

        return self.count_over(node, name, first, inc, env, wavefront)

    def _emit_piece(self, wave: Wave, piece: Piece, env: dict, slot: ll.Value, next_flag: ll.Value) -> None:
        """One piece of the current wavefront: note its flags, tiles and chunks in the ring, then
        run it as a unit of chunks of tiles numbered row by row."""
        b = self.b
        tiles, parts = self._tiles(piece, env)
        flag = b.load(next_flag)
        for field, value in enumerate((flag, tiles, parts)):
            b.store(value, self._ring(wave, slot, piece.index, field))
        b.store(b.add(flag, parts), next_flag)
        # flag of chunk number `taken` (team.py's numbering): flag + taken - the unit's base
        state = replace(wave.state, first_chunk=b.sub(b.load(self.team_base), flag))
        rows = self.split_geometry(piece.rows, env)[2]

        def chunk(k: ll.Value) -> None:
            f0 = b.sdiv(b.mul(tiles, k), parts)
            f1 = b.sdiv(b.mul(tiles, b.add(k, _c64(1))), parts)
            self.loop_depth += 2
            try:
                self._loop(
                    rows, [_c64(0)], lambda j, c: [self._emit_segment(wave, piece, env, j, c[0], f0, f1)]
                )
            finally:
                self.loop_depth -= 2

        self._emit_unit(parts, chunk, state)

    def _emit_segment(
        self, wave: Wave, piece: Piece, env: dict, j: ll.Value, before: ll.Value, f0: ll.Value, f1: ll.Value
    ) -> ll.Value:
        """Row j's tiles numbered within [f0, f1) (its first is tile number `before`): wait for
        their window, run them; returns the tiles up to the next row."""
        b = self.b
        row_env, init, step, count = self._row(piece, env, j)
        lo = b.sub(f0, before)
        lo = b.select(b.icmp_signed(">", lo, _c64(0)), lo, _c64(0))
        hi = b.sub(f1, before)
        hi = b.select(b.icmp_signed("<", hi, count), hi, count)
        with b.if_then(b.icmp_signed("<", lo, hi)):
            row = row_env[piece.rows.for_get_iterator().get_id().get_name()]
            if piece.inner is None:
                self.wait_for_window(wave, row, None)
                self.emit_node(piece.rows.for_get_body(), row_env)
            else:
                last = b.add(init, b.mul(b.sub(hi, _c64(1)), step))
                self.wait_for_window(wave, row, (b.add(init, b.mul(lo, step)), last))
                name = piece.inner.for_get_iterator().get_id().get_name()

                def tile(t: ll.Value, _: list[ll.Value]) -> list[ll.Value]:
                    col = b.add(init, b.mul(b.add(lo, t), step))
                    self.emit_node(piece.inner.for_get_body(), {**row_env, name: col})
                    return []

                self._loop(b.sub(hi, lo), [], tile)
        return b.add(before, count)

    def wait_for_window(self, wave: Wave, row: ll.Value, cols: tuple[ll.Value, ll.Value] | None) -> None:
        """On flags: wait for the chunks of the `back` wavefronts before that hold tiles in the
        window of tiles (row, cols[0] .. cols[1]) (cols None: the whole row)."""
        b = self.b
        with b.if_then(wave.state.on_flags):
            for steps in range(1, wave.slots):
                w = b.sub(wave.iv, _c64(steps * wave.inc))
                with b.if_then(b.icmp_signed(">=", w, wave.first)):
                    env = {**wave.env, wave.name: w}
                    slot = b.srem(b.sdiv(b.sub(w, wave.first), _c64(wave.inc)), _c64(wave.slots))
                    for piece in wave.pieces:
                        self._wait_in_piece(wave, piece, env, slot, row, cols)

    def _wait_in_piece(
        self, wave: Wave, piece: Piece, env: dict, slot: ll.Value, row: ll.Value, cols: tuple | None
    ) -> None:
        """The window's part in `piece` of the wavefront in `env` (its ring entry at `slot`)."""
        b = self.b
        lags = wave.lags
        flag, tiles, parts = (b.load(self._ring(wave, slot, piece.index, f)) for f in range(3))
        init, step, count, _ = self.split_geometry(piece.rows, env)
        one = _c64(1)
        low = b.sub(b.sub(row, _c64(lags.most_row)), init)  # row offsets in that wavefront
        high = b.sub(b.sub(row, _c64(lags.least_row)), init)
        j_lo = b.select(
            b.icmp_signed("<=", low, _c64(0)), _c64(0), b.sdiv(b.add(low, b.sub(step, one)), step)
        )
        j_hi = b.select(b.icmp_signed("<", high, _c64(0)), _c64(-1), b.sdiv(high, step))
        j_hi = b.select(b.icmp_signed("<", j_hi, b.sub(count, one)), j_hi, b.sub(count, one))

        def wait(f_lo: ll.Value, f_hi: ll.Value) -> None:
            # chunk k holds tiles [tiles * k / parts, tiles * (k + 1) / parts)
            k_lo = b.sdiv(b.sub(b.mul(b.add(f_lo, one), parts), one), tiles)
            k_hi = b.sdiv(b.sub(b.mul(b.add(f_hi, one), parts), one), tiles)
            code = b.call(
                define_flags_wait(self.module),
                [
                    wave.state.flags,
                    b.add(flag, k_lo),
                    b.add(flag, k_hi),
                    wave.state.tag,
                    self.cancel,
                    self.team_abort,
                ],
            )
            with b.if_then(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), likely=False):
                b.ret(code)

        if piece.inner is None:  # a tile per row: the rows' flags
            with b.if_then(b.icmp_signed("<=", j_lo, j_hi)):
                wait(j_lo, j_hi)
            return

        def each_row(j: ll.Value, carried: list[ll.Value]) -> list[ll.Value]:
            row_env, c_init, c_step, c_count = self._row(piece, env, j)
            with b.if_then(b.icmp_signed(">=", j, j_lo)):
                if cols is None:
                    lo, hi = _c64(0), b.sub(c_count, one)
                else:
                    c_low = b.sub(b.sub(cols[0], _c64(lags.most_col)), c_init)
                    c_high = b.sub(b.sub(cols[1], _c64(lags.least_col)), c_init)
                    lo = b.select(
                        b.icmp_signed("<=", c_low, _c64(0)),
                        _c64(0),
                        b.sdiv(b.add(c_low, b.sub(c_step, one)), c_step),
                    )
                    hi = b.select(b.icmp_signed("<", c_high, _c64(0)), _c64(-1), b.sdiv(c_high, c_step))
                    hi = b.select(b.icmp_signed("<", hi, b.sub(c_count, one)), hi, b.sub(c_count, one))
                with b.if_then(b.icmp_signed("<=", lo, hi)):
                    wait(b.add(carried[0], lo), b.add(carried[0], hi))
            return [b.add(carried[0], c_count)]

        self._loop(b.add(j_hi, one), [_c64(0)], each_row)
