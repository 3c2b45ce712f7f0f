"""emit: a GenericConv (the structure of a direct convolution) → LLVM IR whose sizes and strides are run-time arguments.

The generic kernel (`Options(specialize=False)`) runs the same register-tiled direct
convolution as the specialised one (codegen/emit/conv_kernel.py): output channels are vector
lanes, a block of positions is held in registers, the window tap u is unrolled and every input
element a block needs is broadcast once for all the accumulators that read it. What the
specialised code knows as constants comes in as arguments here: the channel and position
counts, the looped taps' trip counts and every stride. Only the structure is compiled in: the
window width U (one function per width the caller picks at run time; other widths loop over u
as a tap), the subscript coefficients of x and u (so which products share an input element is
decided here, as in the specialised code) and which output dimension has unit stride.

Blocks: channel blocks of `lanes` with a run-time mask on the last; position blocks of `lanes`
in a loop, then the rest of the row as one block as wide as the next power of two (16, 8, .., 1:
one piece of code each, one of which runs), whose positions past the end are computed and never
stored, over as many channel blocks at once as keep enough accumulators in flight. Padding
guards along x split each row at run time into its interior, where every product lies inside
them (guard-free blocks), and its two edges, whose blocks read a zero element in place of each
input element outside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .conv_generic_pack import dot, floor_div, imax, imin, nest, positive, strided_sum, when
from .conv_kernel import accumulate_if
from .gemm_pack import _transpose, c64, declare_intrinsic, define_function, gep, load, loop, splat, store
from .values import F32, F64, I1, I32, I64


@dataclass(frozen=True)
class GenericConv:
    """What a generic direct-convolution kernel compiles in; its sizes and strides are arguments."""

    itemsize: int  # 4 or 8
    window: int  # U, the unrolled window tap's width (1: none, or looped as the last tap)
    taps: int  # looped taps (trip counts and input strides are arguments)
    in_cx: int  # coefficient of x in its input subscript (the input moves in_cx·S per position)
    in_cu: int  # coefficient of the window tap there (0: none)
    out_f_unit: bool  # the output's stride along f is 1 (NHWC): accumulators stored as vectors
    out_x_unit: bool  # the output's stride along x is 1 (NCHW): stored through a transpose
    # padding guards along x, (cx, cu): cx·position + cu·u + c ≥ 0 (c an argument)
    col_guards: tuple[tuple[int, int], ...] = ()
    # guards per tap, (outer coefficients, tap coefficients): Σ + c ≥ 0 (c an argument)
    row_guards: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    outer: int = 0  # outer-variable arguments (for the row guards)
    looped_u: bool = False  # the last looped tap is the window tap (col guards read its value)

    @property
    def lanes(self) -> int:
        return 64 // self.itemsize

    @property
    def element(self) -> ir.Type:
        return F32 if self.itemsize == 4 else F64

    @property
    def suffix(self) -> str:
        return f"v{self.lanes}{'f32' if self.itemsize == 4 else 'f64'}"

    def argument_names(self) -> list[str]:
        """The i64 arguments after (i, wp, o), in order."""
        names = ["F", "X", "S", "out_f", "out_x"]
        names += [f"T{k}" for k in range(self.taps)] + [f"in_t{k}" for k in range(self.taps)]
        names += [f"outer{k}" for k in range(self.outer)]
        names += [f"row_c{k}" for k in range(len(self.row_guards))]
        return names + [f"col_c{k}" for k in range(len(self.col_guards))]


class _Kernel:
    """The function being emitted: its arguments and the code of one block."""

    def __init__(self, module: ir.Module, fn: ir.Function, g: GenericConv, overwrite: bool):
        self.g, self.overwrite = g, overwrite
        self.vty = ir.VectorType(g.element, g.lanes)
        self.vb = ir.VectorType(I1, g.lanes)
        self.fma = declare_intrinsic(module, f"llvm.fma.{g.suffix}", self.vty, [self.vty] * 3)
        vp = self.vty.as_pointer()
        self.mload = declare_intrinsic(
            module, f"llvm.masked.load.{g.suffix}.p0", self.vty, [vp, I32, self.vb, self.vty]
        )
        self.mstore = declare_intrinsic(
            module, f"llvm.masked.store.{g.suffix}.p0", ir.VoidType(), [self.vty, vp, I32, self.vb]
        )
        self.pty = ir.VectorType(g.element.as_pointer(), g.lanes)
        pointers = f"v{g.lanes}p0"
        self.gather = declare_intrinsic(
            module, f"llvm.masked.gather.{g.suffix}.{pointers}", self.vty, [self.pty, I32, self.vb, self.vty]
        )
        self.scatter = declare_intrinsic(
            module,
            f"llvm.masked.scatter.{g.suffix}.{pointers}",
            ir.VoidType(),
            [self.vty, self.pty, I32, self.vb],
        )
        zero_name = f"tl_conv_zero_{g.suffix}"
        zero = module.globals.get(zero_name)
        if zero is None:  # the element read in place of one outside the padding guard
            zero = ir.GlobalVariable(module, g.element, zero_name)
            zero.global_constant = True
            zero.linkage = "internal"
            zero.initializer = ir.Constant(g.element, 0.0)
            zero.align = g.itemsize
        self.zero = zero
        self.i, self.wp, self.o = fn.args[:3]
        args = dict(zip(g.argument_names(), fn.args[3:]))
        self.args = args
        self.counts = [args[f"T{k}"] for k in range(g.taps)]
        self.in_taps = [args[f"in_t{k}"] for k in range(g.taps)]
        self.outer = [args[f"outer{k}"] for k in range(g.outer)]
        self.row_c = [args[f"row_c{k}"] for k in range(len(g.row_guards))]
        self.col_c = [args[f"col_c{k}"] for k in range(len(g.col_guards))]

    # ------------------------------------------------------------------ output

    def _vload(self, b, ptr, mask) -> ir.Value:
        p = b.bitcast(ptr, self.vty.as_pointer())
        if mask is None:
            return load(b, p, self.g.itemsize)
        return b.call(self.mload, [p, ir.Constant(I32, self.g.itemsize), mask, ir.Constant(self.vty, None)])

    def _vstore(self, b, value, ptr, mask) -> None:
        p = b.bitcast(ptr, self.vty.as_pointer())
        if mask is None:
            store(b, value, p, self.g.itemsize)
        else:
            b.call(self.mstore, [value, p, ir.Constant(I32, self.g.itemsize), mask])

    def _lane_mask(self, b, n) -> ir.Value:
        """Lanes below the run-time count n."""
        iota = ir.Constant(ir.VectorType(I64, self.g.lanes), list(range(self.g.lanes)))
        nv = splat(b, n, ir.VectorType(I64, self.g.lanes))
        return b.icmp_signed("<", iota, nv)

    def _channels(self, b, o0, j: int, fvalid, n) -> tuple[ir.Value, ir.Value]:
        """The addresses of O[f0 + lane, x0 + j] and the mask of those that exist (a narrow
        block's gather and scatter: no transpose for a few positions)."""
        g = self.g
        vi = ir.VectorType(I64, g.lanes)
        iota = ir.Constant(vi, list(range(g.lanes)))
        base = b.ptrtoint(b.gep(o0, [b.mul(c64(j), self.args["out_x"])]), I64)
        step = b.mul(self.args["out_f"], c64(g.itemsize))
        addresses = b.add(splat(b, base, vi), b.mul(iota, splat(b, step, vi)))
        mask = self._column_mask(b, j, self._lane_mask(b, fvalid), n)
        return b.inttoptr(addresses, self.pty), mask

    def _pos_ok(self, b, j: int, n) -> ir.Value:
        """Position j of the block exists (n: the valid positions at run time, None: all)."""
        return ir.Constant(I1, 1) if n is None else b.icmp_signed("<", c64(j), n)

    def _row_mask(self, b, r: int, fvalid, rx: int, n) -> ir.Value:
        """Row r (channel) of an NCHW block: the block's valid positions if r < fvalid, else none."""
        lanes = self.g.lanes
        xs = ir.Constant(self.vb, [int(e < rx) for e in range(lanes)]) if n is None else self._lane_mask(b, n)
        return b.select(b.icmp_signed("<", c64(r), fvalid), xs, ir.Constant(self.vb, None))

    def _column_mask(self, b, j: int, fmask, n) -> ir.Value:
        """Position j of an NHWC block: the valid channels if the position exists, else none."""
        return fmask if n is None else b.select(self._pos_ok(b, j, n), fmask, ir.Constant(self.vb, None))

    def load_output(self, b, o0, fvalid, rx: int, n) -> list:
        """The accumulators: acc[j] lane r = O[f0 + r, x0 + j] (zero past fvalid and n)."""
        g = self.g
        out_f, out_x = self.args["out_f"], self.args["out_x"]
        zero = ir.Constant(self.vty, None)
        if self.overwrite:
            return [zero] * rx
        if g.out_f_unit:
            fmask = self._lane_mask(b, fvalid)
            return [
                self._vload(b, b.gep(o0, [b.mul(c64(j), out_x)]), self._column_mask(b, j, fmask, n))
                for j in range(rx)
            ]
        if g.out_x_unit and rx <= g.lanes // 4:
            accs = []
            for j in range(rx):
                addresses, mask = self._channels(b, o0, j, fvalid, n)
                accs.append(b.call(self.gather, [addresses, ir.Constant(I32, g.itemsize), mask, zero]))
            return accs
        if g.out_x_unit:
            rows = [
                self._vload(b, b.gep(o0, [b.mul(c64(r), out_f)]), self._row_mask(b, r, fvalid, rx, n))
                for r in range(g.lanes)
            ]
            return _transpose(b, rows)[:rx]
        accs = []
        for j in range(rx):
            acc = zero
            for r in range(g.lanes):
                inside = b.and_(b.icmp_signed("<", c64(r), fvalid), self._pos_ok(b, j, n))
                # outside: read O's first element (in bounds: F, X ≥ 1), not this block's
                at = b.select(inside, b.gep(o0, [b.add(b.mul(c64(r), out_f), b.mul(c64(j), out_x))]), self.o)
                x = b.select(inside, load(b, at, g.itemsize), ir.Constant(g.element, 0.0))
                acc = b.insert_element(acc, x, ir.Constant(I32, r))
            accs.append(acc)
        return accs

    def store_output(self, b, accs: list, o0, fvalid, rx: int, n) -> None:
        g = self.g
        out_f, out_x = self.args["out_f"], self.args["out_x"]
        if g.out_f_unit:
            fmask = self._lane_mask(b, fvalid)
            for j, acc in enumerate(accs):
                self._vstore(b, acc, b.gep(o0, [b.mul(c64(j), out_x)]), self._column_mask(b, j, fmask, n))
            return
        if g.out_x_unit and rx <= g.lanes // 4:
            for j, acc in enumerate(accs):
                addresses, mask = self._channels(b, o0, j, fvalid, n)
                b.call(self.scatter, [acc, addresses, ir.Constant(I32, g.itemsize), mask])
            return
        if g.out_x_unit:
            cols = accs + [ir.Constant(self.vty, None)] * (g.lanes - rx)
            for r, row in enumerate(_transpose(b, cols)):
                self._vstore(b, row, b.gep(o0, [b.mul(c64(r), out_f)]), self._row_mask(b, r, fvalid, rx, n))
            return
        for j, acc in enumerate(accs):
            for r in range(g.lanes):
                x = b.extract_element(acc, ir.Constant(I32, r))
                at = b.add(b.mul(c64(r), out_f), b.mul(c64(j), out_x))
                inside = b.and_(b.icmp_signed("<", c64(r), fvalid), self._pos_ok(b, j, n))
                when(b, inside, lambda x=x, at=at: store(b, x, gep(b, o0, at), g.itemsize), "st")

    # ------------------------------------------------------------------ one block

    def block(self, b, fbs: list, x0, rx: int, guarded: bool, per_block, n=None) -> None:
        """Consecutive channel blocks `fbs` ((block, valid channels at run time) each) × rx
        positions at x0, of which the first n exist (n None: all); `guarded`: read zero for the
        products outside the guards along x. Each input element is broadcast once for all the
        blocks. The products of positions past n are computed and never stored: an element only
        they read is read at the block's first element instead (in bounds)."""
        g = self.g
        lanes, args = g.lanes, self.args
        outs = [
            b.gep(self.o, [b.add(b.mul(b.mul(fb, c64(lanes)), args["out_f"]), b.mul(x0, args["out_x"]))])
            for fb, _ in fbs
        ]
        blocks = [self.load_output(b, o0, fvalid, rx, n) for o0, (_, fvalid) in zip(outs, fbs)]
        accs = [a for block in blocks for a in block]
        stride = args["S"]
        i0 = b.gep(self.i, [b.mul(b.mul(x0, c64(g.in_cx)), stride)])  # may lie in the padding
        wp0 = gep(b, self.wp, b.mul(fbs[0][0], per_block))
        # block k's filter, from the first block's (a block past the last channel block reads
        # the last one's: its sums are never stored)
        last = b.sub(self.fblocks, c64(1))
        deltas = [b.mul(b.sub(imin(b, fb, last), fbs[0][0]), per_block) for fb, _ in fbs]
        # products (position j, window tap u) grouped by the input element they read (and, when
        # guarded, by their guards' values, so that a group is inside or outside as one)
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for j in range(rx):
            for u in range(g.window):
                key = (j * g.in_cx + u * g.in_cu,)
                if guarded:
                    key += tuple(cx * j + cu * u for cx, cu in g.col_guards)
                groups.setdefault(key, []).append((j, u))
        keys = sorted(groups)
        offsets = [b.mul(c64(k[0]), stride) for k in keys]
        exists = [self._pos_ok(b, min(j for j, _ in groups[k]), n) for k in keys]  # read by a position < n
        if n is not None:
            offsets = [b.select(ok, off, c64(0)) for ok, off in zip(exists, offsets)]

        def valid(key, u_value) -> ir.Value:
            ok = ir.Constant(I1, 1)
            for (cx, cu), value, c in zip(g.col_guards, key[1:], self.col_c):
                total = b.add(b.add(b.mul(x0, c64(cx)), c64(value)), c)
                if g.looped_u and cu:
                    total = b.add(total, b.mul(u_value, c64(cu)))
                ok = b.and_(ok, b.icmp_signed(">=", total, c64(0)))
            return ok

        fixed = (
            [b.and_(valid(k, None), ok) for k, ok in zip(keys, exists)]
            if guarded and not g.looped_u
            else None
        )
        vp = self.vty.as_pointer()

        def accumulate(ivs, wp, acc):
            i = b.gep(i0, [strided_sum(b, ivs, self.in_taps)])  # not inbounds: i0 may lie in the padding
            weights = [
                [
                    load(
                        b,
                        b.bitcast(gep(b, wp, b.add(c64(u * lanes), deltas[k])), vp),
                        g.itemsize,
                    )
                    for u in range(g.window)
                ]
                for k in range(len(fbs))
            ]
            for m, key in enumerate(keys):
                ptr = b.gep(i, [offsets[m]])
                if guarded:
                    ok = fixed[m] if fixed is not None else b.and_(valid(key, ivs[-1]), exists[m])
                    ptr = b.select(ok, ptr, self.zero)
                x = splat(b, load(b, ptr, g.itemsize), self.vty)
                for k in range(len(fbs)):
                    for j, u in groups[key]:
                        acc[k * rx + j] = b.call(self.fma, [weights[k][u], x, acc[k * rx + j]])
            return acc

        def step(ivs, vals):
            wp, *acc = vals
            nxt = gep(b, wp, c64(g.window * lanes))
            if not g.row_guards:
                return [nxt, *accumulate(ivs, wp, acc)]
            inside = ir.Constant(I1, 1)
            for (oc, tc), c in zip(g.row_guards, self.row_c):
                value = b.add(dot(b, self.outer, oc), b.add(dot(b, ivs, tc), c))
                inside = b.and_(inside, b.icmp_signed(">=", value, c64(0)))
            return [nxt, *accumulate_if(b, inside, acc, lambda acc: accumulate(ivs, wp, acc))]

        if not self.overwrite:  # the kernel runs only with every tap count positive
            accs = nest(b, self.counts, [wp0, *accs], step)[1:]
        else:  # O = Σ I·W: zero where there are no taps
            accs = accumulate_if(
                b, self.taps_ok, accs, lambda zeros: nest(b, self.counts, [wp0, *zeros], step)[1:]
            )
        for k, (o0, (_, fvalid)) in enumerate(zip(outs, fbs)):
            self.store_output(b, accs[k * rx : (k + 1) * rx], o0, fvalid, rx, n)

    def interior(self, b, nx) -> tuple[ir.Value, ir.Value]:
        """[xa, xe): the positions whose every product lies inside the guards along x (each
        guard cx·x + cu·u + c ≥ 0 bounds x from below or above, for its lowest cu·u)."""
        g = self.g
        xa, xe = c64(0), nx
        for (cx, cu), c in zip(g.col_guards, self.col_c):
            low = c  # c + min over u of cu·u
            if cu < 0:  # the last window tap is the lowest
                tap = b.sub(self.counts[-1], c64(1)) if g.looped_u else c64(g.window - 1)
                low = b.add(low, b.mul(tap, c64(cu)))
            if cx > 0:  # x ≥ ⌈-low / cx⌉
                xa = imax(b, xa, floor_div(b, b.add(b.sub(c64(0), low), c64(cx - 1)), cx))
            elif cx < 0:  # x ≤ ⌊low / -cx⌋
                xe = imin(b, xe, b.add(floor_div(b, low, -cx), c64(1)))
            else:  # no position, or every one
                xa = b.select(b.icmp_signed("<", low, c64(0)), nx, xa)
        xa = imin(b, xa, nx)
        return xa, imax(b, xe, xa)


def define_generic_conv(module: ir.Module, name: str, g: GenericConv, overwrite: bool = False) -> ir.Function:
    """`conv(i, wp, o, F, X, S, out_f, out_x, T.., in_t.., outer.., row_c.., col_c..)`: O[f, x] +=
    Σ I·W over every f < F, x < X and tap (T each), with i and o at the first f, x and taps of the
    current point, wp the packed filter (`define_generic_pack`) and S the element stride of x's
    input dimension. `overwrite`: O = Σ I·W (zero without taps). Nothing else happens when a
    count is not positive."""
    tp = g.element.as_pointer()
    names = g.argument_names()
    fn = define_function(
        module, name, ir.VoidType(), [tp, tp, tp] + [I64] * len(names), ["i", "wp", "o", *names]
    )
    for a in fn.args[:3]:
        a.add_attribute("noalias")
    k = _Kernel(module, fn, g, overwrite)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes = g.lanes
    nf, nx = k.args["F"], k.args["X"]
    work = b.append_basic_block("work")
    done = b.append_basic_block("done")
    # storing O (its zeroing folded in) with no taps still stores zeros
    b.cbranch(positive(b, [nf, nx, *(() if overwrite else k.counts)]), work, done)
    b.position_at_end(work)
    k.taps_ok = positive(b, k.counts)
    taps = c64(1)
    for count in k.counts:
        taps = b.mul(taps, count)
    per_block = b.mul(taps, c64(g.window * lanes))  # packed elements of one channel block

    def channel(fb):
        """(block, its valid channels)."""
        left = b.sub(nf, b.mul(fb, c64(lanes)))
        return fb, b.select(b.icmp_signed("<", left, c64(lanes)), left, c64(lanes))

    fblocks = b.sdiv(b.add(nf, c64(lanes - 1)), c64(lanes))
    k.fblocks = fblocks

    def row(start, count, guarded: bool) -> None:
        """Every channel × the positions [start, start + count)."""
        full = b.sdiv(count, c64(lanes))
        # blocks of `lanes` positions, channel blocks outside: one block's packed filter is
        # reused by every position block
        with loop(b, 0, fblocks, name="fb") as fb:
            with loop(b, 0, full, name="xb") as xb:
                k.block(b, [channel(fb)], b.add(start, b.mul(xb, c64(lanes))), lanes, guarded, per_block)
        # the rest (0 < rest < lanes positions): blocks as wide as the next power of two (at
        # most lanes/2: a rest above lanes/2 is two blocks of lanes/2), of which `rest` positions
        # exist, so that the filter streams once or twice more, not once per bit of rest; each
        # over several channel blocks at once, so that enough independent accumulators hide the
        # FMA latency (accumulators and weight vectors within the 32 vector registers)
        x0 = b.add(start, b.mul(full, c64(lanes)))
        rest = b.sub(count, b.mul(full, c64(lanes)))
        after = b.append_basic_block("rest.done")

        def tail(width: int) -> None:
            # channel blocks past the last one (in the last run) compute but store nothing
            together = max(1, min(16 // width, 31 // (width + g.window)))  # ≤ 16 accumulators
            runs = b.sdiv(b.add(fblocks, c64(together - 1)), c64(together))
            pieces = b.sdiv(b.add(rest, c64(width - 1)), c64(width))  # 2 only for width lanes/2
            with loop(b, 0, pieces, name=f"fp{width}") as piece:
                xp = b.add(x0, b.mul(piece, c64(width)))
                left = b.sub(rest, b.mul(piece, c64(width)))
                with loop(b, 0, runs, name=f"fr{width}") as run:
                    first = b.mul(run, c64(together))
                    fbs = [channel(b.add(first, c64(n))) for n in range(together)]
                    k.block(b, fbs, xp, width, guarded, per_block, imin(b, left, c64(width)))

        width = lanes // 2
        while width:
            lower = width // 2  # rest in (lower, width], or above for the widest: this width
            wide = b.append_basic_block(f"rest{width}")
            narrow = b.append_basic_block(f"rest.le{lower}")
            b.cbranch(b.icmp_signed(">", rest, c64(lower)), wide, narrow)
            b.position_at_end(wide)
            tail(width)
            b.branch(after)
            b.position_at_end(narrow)
            width = lower
        b.branch(after)
        b.position_at_end(after)

    if not g.col_guards:
        row(c64(0), nx, False)
    else:  # the interior without guards, then the two edges [0, xa) and [xe, X) with them
        xa, xe = k.interior(b, nx)
        row(xa, b.sub(xe, xa), False)
        with loop(b, 0, c64(2), name="edge") as edge:
            first = b.icmp_signed("==", edge, c64(0))
            row(b.select(first, c64(0), xe), b.select(first, xa, b.sub(nx, xe)), True)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn
