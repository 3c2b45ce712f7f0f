"""emit: a ConvGeometry → the LLVM IR of a register-tiled direct convolution and of its filter packing.

At one point of the loops around it, the kernel computes O[f, x] += Σ_taps I[..] · W[f, taps] for
every output channel f and output position x. Output channels are vector lanes (16 float32 or 8
float64: the filter is packed once per call as [f-block][taps][u][lanes], zero-padded past the
last channel, so that a weight vector is one aligned load); a block of as many positions x as a
vector has lanes is held in registers, one accumulator vector per position. For each tap outside
the window, the U weight vectors of the unrolled window tap u are loaded once, and every input
element the block needs is broadcast once and multiplied into each accumulator (position j, tap
u) that reads it: with a 3-wide window, 18 broadcasts and 3 weight loads feed 48 FMAs. Nothing is
copied besides the filter (no im2col). The accumulators start from O, or from zero where O's
zeroing is folded into the kernel, and go back to it: along a
unit-stride f (NHWC) as vectors, along a unit-stride x (NCHW) through a lanes×lanes transpose in
registers, else element by element. Partial blocks (the last channels, the last positions) are
emitted as their own straight-line code with masked loads and stores, so nothing out of bounds
is read or written. Every size and stride is a constant: the code is specialised.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.ir as ir

from .gemm_pack import _transpose, c64, declare_intrinsic, define_function, gep, load, splat, store
from .values import F32, F64, I1, I32, I64


@dataclass(frozen=True)
class ConvGeometry:
    """The kernel's sizes and element strides (all constants of the specialised code)."""

    itemsize: int  # 4 or 8
    channels: int  # F, the output channels
    positions: int  # X, the output positions of the register-blocked variable
    window: int  # U, the unrolled window tap's trip count (1: none)
    taps: tuple[int, ...]  # trip counts of the looped taps, outermost first
    in_x: int  # input stride per position
    in_u: int  # input stride per window tap
    in_taps: tuple[int, ...]  # input stride per looped tap
    out_f: int  # output stride per channel
    out_x: int  # output stride per position
    wt_f: int  # filter stride per channel
    wt_u: int  # filter stride per window tap
    wt_taps: tuple[int, ...]  # filter stride per looped tap
    # padding guards, each `... >= 0`: along x, (cx, cu, c) for cx·position + cu·u + c (positions
    # and u counted from their first value); over the outer variables (kernel arguments) and the
    # looped taps (counted from their first value), (outer coefficients, tap coefficients, c)
    col_guards: tuple[tuple[int, int, int], ...] = ()
    row_guards: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = ()
    outer: int = 0  # outer-variable arguments the kernel takes (for row guards)
    groups: tuple[int, ...] = ()  # trip counts of the group variables (the filter packed per group)
    wt_groups: tuple[int, ...] = ()  # filter stride per group variable

    @property
    def lanes(self) -> int:
        return 64 // self.itemsize

    @property
    def f_blocks(self) -> int:
        return -(-self.channels // self.lanes)

    @property
    def group_elements(self) -> int:
        """Packed filter elements of one group."""
        return self.f_blocks * self.tap_count * self.window * self.lanes

    @property
    def tap_count(self) -> int:
        return math.prod(self.taps)

    @property
    def element(self) -> ir.Type:
        return F32 if self.itemsize == 4 else F64

    @property
    def suffix(self) -> str:
        return f"v{self.lanes}{'f32' if self.itemsize == 4 else 'f64'}"


def counted(b: ir.IRBuilder, count: int | ir.Value, carried: list, body: Callable, name: str) -> list:
    """`for i in range(count)` (count ≥ 1: a constant, or a run-time value) with values carried
    around the loop; `body(i, values)` emits one iteration and returns the values of the next."""
    if isinstance(count, int) and count == 1:
        return body(c64(0), carried)
    pre = b.block
    head = b.append_basic_block(f"{name}.loop")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    phis = [b.phi(v.type) for v in carried]
    i.add_incoming(c64(0), pre)
    for p, v in zip(phis, carried):
        p.add_incoming(v, pre)
    out = body(i, phis)
    nxt = b.add(i, c64(1), flags=["nsw"])
    end = b.block
    i.add_incoming(nxt, end)
    for p, v in zip(phis, out):
        p.add_incoming(v, end)
    bound = c64(count) if isinstance(count, int) else count
    b.cbranch(b.icmp_signed("<", nxt, bound), head, done)
    b.position_at_end(done)
    return out


def accumulate_if(b: ir.IRBuilder, inside: ir.Value, acc: list, accumulate: Callable) -> list:
    """`accumulate(acc)` where `inside` holds (a tap inside the padding guards), else `acc`
    unchanged: a branch around the tap's products and a phi per accumulator."""
    pre = b.block
    then = b.append_basic_block("tap")
    done = b.append_basic_block("tap.done")
    b.cbranch(inside, then, done)
    b.position_at_end(then)
    new = accumulate(list(acc))
    end = b.block
    b.branch(done)
    b.position_at_end(done)
    out = []
    for old, value in zip(acc, new):
        phi = b.phi(old.type)
        phi.add_incoming(old, pre)
        phi.add_incoming(value, end)
        out.append(phi)
    return out


def _nest(b: ir.IRBuilder, counts: tuple[int, ...], carried: list, body: Callable, ivs=()) -> list:
    """Loops over every point of `counts` (outermost first), `body(ivs, values)` innermost."""
    if not counts:
        return body(ivs, carried)
    return counted(
        b, counts[0], carried, lambda i, vals: _nest(b, counts[1:], vals, body, (*ivs, i)), f"t{len(ivs)}"
    )


def _offset(b: ir.IRBuilder, ivs, strides) -> ir.Value:
    total = c64(0)
    for i, s in zip(ivs, strides):
        total = b.add(total, b.mul(i, c64(s), flags=["nsw"]), flags=["nsw"])
    return total


class _Block:
    """The code of one register block: `fvalid` channels × `rx` positions at (fb, x0)."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder, g: ConvGeometry):
        self.b, self.g = b, g
        self.vty = ir.VectorType(g.element, g.lanes)
        self.vb = ir.VectorType(I1, g.lanes)
        self.fma = declare_intrinsic(module, f"llvm.fma.{g.suffix}", self.vty, [self.vty] * 3)
        self.mload = declare_intrinsic(
            module,
            f"llvm.masked.load.{g.suffix}.p0",
            self.vty,
            [self.vty.as_pointer(), I32, self.vb, self.vty],
        )
        self.mstore = declare_intrinsic(
            module,
            f"llvm.masked.store.{g.suffix}.p0",
            ir.VoidType(),
            [self.vty, self.vty.as_pointer(), I32, self.vb],
        )

    def _mask(self, n: int) -> ir.Constant:
        return ir.Constant(self.vb, [int(e < n) for e in range(self.g.lanes)])

    def _vload(self, ptr, n: int) -> ir.Value:
        """n ≤ lanes contiguous elements from ptr (zeros past n)."""
        b, g = self.b, self.g
        p = b.bitcast(ptr, self.vty.as_pointer())
        if n == g.lanes:
            return load(b, p, g.itemsize)
        return b.call(
            self.mload, [p, ir.Constant(I32, g.itemsize), self._mask(n), ir.Constant(self.vty, None)]
        )

    def _vstore(self, value, ptr, n: int) -> None:
        b, g = self.b, self.g
        p = b.bitcast(ptr, self.vty.as_pointer())
        if n == g.lanes:
            store(b, value, p, g.itemsize)
        else:
            b.call(self.mstore, [value, p, ir.Constant(I32, g.itemsize), self._mask(n)])

    def load_output(self, o, fvalid: int, rx: int) -> list:
        """The accumulators: acc[j] lane r = O[f0 + r, x0 + j] (zero past fvalid)."""
        b, g = self.b, self.g
        zero = ir.Constant(self.vty, None)
        if g.out_f == 1:
            return [self._vload(gep(b, o, c64(j * g.out_x)), fvalid) for j in range(rx)]
        if g.out_x == 1:
            rows = [
                self._vload(gep(b, o, c64(r * g.out_f)), rx) if r < fvalid else zero for r in range(g.lanes)
            ]
            return _transpose(b, rows)[:rx]
        accs = []
        for j in range(rx):
            acc = zero
            for r in range(fvalid):
                x = load(b, gep(b, o, c64(r * g.out_f + j * g.out_x)), g.itemsize)
                acc = b.insert_element(acc, x, ir.Constant(I32, r))
            accs.append(acc)
        return accs

    def store_output(self, accs: list, o, fvalid: int, rx: int) -> None:
        b, g = self.b, self.g
        if g.out_f == 1:
            for j, acc in enumerate(accs):
                self._vstore(acc, gep(b, o, c64(j * g.out_x)), fvalid)
            return
        if g.out_x == 1:
            cols = accs + [ir.Constant(self.vty, None)] * (g.lanes - rx)
            for r, row in enumerate(_transpose(b, cols)[:fvalid]):
                self._vstore(row, gep(b, o, c64(r * g.out_f)), rx)
            return
        for j, acc in enumerate(accs):
            for r in range(fvalid):
                x = b.extract_element(acc, ir.Constant(I32, r))
                store(b, x, gep(b, o, c64(r * g.out_f + j * g.out_x)), g.itemsize)

    def reduce(self, blocks: list[list], i0, wp0, per_block: int, pairs: frozenset, outer: list) -> list:
        """Every tap into the accumulators of consecutive f-blocks (`blocks[k][j]`: block k,
        position j): i0 is the input at (x0, first taps), wp0 the first block's packed filter (the
        next ones `per_block` elements apart), `pairs` the (position, window tap) products inside
        the padding guards, `outer` the outer variables' values (row guards skip the taps outside
        them). Each input element is broadcast once for all the blocks."""
        b, g = self.b, self.g
        nblocks, rx = len(blocks), len(blocks[0])
        accs = [a for block in blocks for a in block]
        # input offsets of (position j, window tap u); equal ones share one broadcast
        readers: dict[int, list[tuple[int, int]]] = {}
        for j, u in sorted(pairs):
            readers.setdefault(j * g.in_x + u * g.in_u, []).append((j, u))

        def step(ivs, vals):
            wp, *acc = vals
            nxt = gep(b, wp, c64(g.window * g.lanes))
            if not g.row_guards:
                return [nxt, *accumulate(ivs, wp, acc)]
            inside = ir.Constant(I1, 1)
            for oc, tc, c in g.row_guards:
                value = b.add(_offset(b, outer, oc), b.add(_offset(b, ivs, tc), c64(c)))
                inside = b.and_(inside, b.icmp_signed(">=", value, c64(0)))
            return [nxt, *accumulate_if(b, inside, acc, lambda acc: accumulate(ivs, wp, acc))]

        def accumulate(ivs, wp, acc):
            i = b.gep(i0, [_offset(b, ivs, g.in_taps)])  # not inbounds: i0 may lie in the padding
            weights = [
                [
                    load(
                        b,
                        b.bitcast(gep(b, wp, c64(k * per_block + u * g.lanes)), self.vty.as_pointer()),
                        g.itemsize,
                    )
                    for u in range(g.window)
                ]
                for k in range(nblocks)
            ]
            for off in sorted(readers):
                x = splat(b, load(b, b.gep(i, [c64(off)]), g.itemsize), self.vty)
                for k in range(nblocks):
                    for j, u in readers[off]:
                        acc[k * rx + j] = b.call(self.fma, [weights[k][u], x, acc[k * rx + j]])
            return acc

        flat = _nest(b, g.taps, [wp0, *accs], step)[1:]
        return [flat[k * rx : (k + 1) * rx] for k in range(nblocks)]


def _pairs(g: ConvGeometry, x0: int, rx: int) -> frozenset:
    """The (position, window tap) products of the block at x0 that the padding guards keep."""
    return frozenset(
        (j, u)
        for j in range(rx)
        for u in range(g.window)
        if all(cx * (x0 + j) + cu * u + c >= 0 for cx, cu, c in g.col_guards)
    )


def define_conv(module: ir.Module, name: str, g: ConvGeometry, overwrite: bool = False) -> ir.Function:
    """`conv(i, wp, o)`: O[f, x] += Σ I·W over every f, x and tap, with i, o at the first f, x
    and taps of the current outer point and wp the packed filter (conv_pack.define_pack). `overwrite`:
    O = Σ I·W (O's zeroing folded into the call: its old values are not read)."""
    tp = g.element.as_pointer()
    names = ["i", "wp", "o", *(f"outer{k}" for k in range(g.outer))]
    fn = define_function(module, name, ir.VoidType(), [tp, tp, tp] + [I64] * g.outer, names)
    for a in fn.args[:3]:
        a.add_attribute("noalias")
    i, wp, o, *outer = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    blk = _Block(module, b, g)
    lanes = g.lanes
    per_block = g.tap_count * g.window * lanes  # packed elements of one f-block

    def block(fbs: list, x0, rx: int, pairs: frozenset) -> None:
        """Consecutive f-blocks `fbs` ((first block, valid lanes) each) × rx positions at x0."""
        outs = [gep(b, o, b.add(b.mul(fb, c64(lanes * g.out_f)), b.mul(x0, c64(g.out_x)))) for fb, _ in fbs]
        accs = [
            [ir.Constant(blk.vty, None)] * rx if overwrite else blk.load_output(o0, fvalid, rx)
            for o0, (_, fvalid) in zip(outs, fbs)
        ]
        i0 = b.gep(i, [b.mul(x0, c64(g.in_x))])  # may lie in the padding: not inbounds
        accs = blk.reduce(accs, i0, gep(b, wp, b.mul(fbs[0][0], c64(per_block))), per_block, pairs, outer)
        for acc, o0, (_, fvalid) in zip(accs, outs, fbs):
            blk.store_output(acc, o0, fvalid, rx)

    def positions(body) -> None:
        """body(x0, rx, pairs) for each block of `lanes` positions; a run of full blocks that the
        guards leave whole is a loop, the others (the padding's edges, the last partial block)
        are code of their own."""
        blocks = [(x0, min(lanes, g.positions - x0)) for x0 in range(0, g.positions, lanes)]
        whole = _pairs(g, 0, lanes) if g.col_guards else None
        n = 0
        while n < len(blocks):
            x0, rx = blocks[n]
            pairs = _pairs(g, x0, rx)
            run = 1
            if rx == lanes and len(pairs) == rx * g.window:
                while (
                    n + run < len(blocks)
                    and blocks[n + run][1] == lanes
                    and (whole is None or len(_pairs(g, blocks[n + run][0], lanes)) == lanes * g.window)
                ):
                    run += 1
            if run > 1:
                counted(
                    b,
                    run,
                    [],
                    lambda xb, _, first=n, pairs=pairs: (
                        body(b.mul(b.add(xb, c64(first)), c64(lanes)), lanes, pairs) or []
                    ),
                    "xb",
                )
            else:
                body(c64(x0), rx, pairs)
            n += run

    # f-blocks per register block: one when a block holds `lanes` positions; with fewer positions
    # (a 7-wide output) several, so that enough independent accumulators hide the FMA latency
    # (accumulators and weight vectors within the 32 vector registers)
    width = min(g.positions, lanes)
    together = max(1, min(g.f_blocks, 31 // (width + g.window))) if g.positions < lanes else 1

    def channels(body) -> None:
        """body(fbs) for each group of `together` consecutive blocks of `lanes` output channels
        ((block, valid lanes) each); the leftover full blocks and the partial one go last."""
        full_f, rest_f = divmod(g.channels, lanes)
        groups, left = divmod(full_f, together)
        if groups:

            def group(n, _):
                first = b.mul(n, c64(together))
                return body([(b.add(first, c64(k)), lanes) for k in range(together)]) or []

            counted(b, groups, [], group, "fb")
        last = [(c64(groups * together + k), lanes) for k in range(left)]
        if rest_f:
            last.append((c64(full_f), rest_f))
        if last:
            body(last)

    # channel blocks outside: one block's packed filter is reused by every position block (the
    # other order measured the same on the 64×64×3×3 case)
    channels(lambda fbs: positions(lambda x0, rx, pairs: block(fbs, x0, rx, pairs)))
    b.ret_void()
    return fn
