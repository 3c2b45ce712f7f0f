"""gpu: KernelPlan + GridMapping → NVPTX LLVM IR module (one ptx_kernel entry per phase).

The phase bodies are emitted by the CPU lowering's own jobs (loops, statements, checks), in a
subclass that changes only what differs on the GPU:

* each phase is an internal, always-inlined function `tl_phase<n>(tensors..., error, lo0, hi0,
  ..., lo3, hi3) -> i32` (one pair per mapped loop, up to MAX_MAPPED); the mapped loops run [lo, hi) only, as the CPU's thread-split outer loop
  does (the same restricted-loop code, LoopLowering._open_loop);
* the entry `tl_<def>_phase<n>(tensors..., i64* error)` (calling convention ptx_kernel) computes
  the global thread id, decomposes it into one iteration of each mapped loop (the fastest loop
  last), checks it against the trip counts and calls the phase for that iteration;
* nothing of the CPU's machinery that the GPU lacks: the plan has no GEMM calls, contracted
  temporaries, pipelining or prefetching (planned with CodegenOptions(optimize=False)), the
  cancel word is never polled (no outermost loop: `loop_depth` starts at 1), and there is no
  workspace;
* math builtins: exp, log, tanh and the rest of codegen.emit.vecmath in their portable,
  branch-free form (no AVX-512 vscalef), everything else as the CPU emits it; the intrinsics
  and libm calls that NVPTX cannot select become libdevice calls (gpu/ptx.py).

Run-time errors (a gather index out of range, an integer division by zero) are recorded in
`error[0..3]` as on the CPU, [code, check id, dim, value]: each thread fails into a record of its
own, and the first to claim `error[0]` (compare-and-swap) copies its details (_run_thread).
"""

from __future__ import annotations

import dataclasses

import islpy as isl
import llvmlite.ir as ll

from tensorlang import ir

from ..emit import values as V
from ..emit.builtins import emit_builtin
from ..emit.vecmath import VECMATH_BUILTINS, emit_vecmath
from ..lowering.lower import Lowering
from ..planning.plan import KernelPlan, PhaseDecision, Split
from .mapping import MAX_MAPPED, GridMapping, PhaseMapping
from .rowlower import RowLowering
from .tilelower import TileLowering
from .tiles import TileMapping

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"

# builtins whose CPU form has no GPU counterpart (lgamma calls the re-entrant lgamma_r, which
# libdevice lacks): called in libdevice directly
_LIBDEVICE_DIRECT = {"lgamma": "lgamma"}

_SREG = "llvm.nvvm.read.ptx.sreg.{}.x"


class GpuLowering(TileLowering, RowLowering, Lowering):
    """Emits the NVPTX module of a plan and its grid mapping. Single use: construct, `run()`."""

    def __init__(
        self,
        plan: KernelPlan,
        mapping: GridMapping,
        *,
        new_calling_convention: bool = True,
        emulate: bool = False,
    ):
        super().__init__(plan)
        self.mapping = mapping
        self.new_cc = new_calling_convention
        self.emulate = emulate  # host code running the grid's threads in turn (tests), no GPU entries
        if not emulate:
            self.module.triple = TRIPLE
            self.module.data_layout = DATA_LAYOUT
        self.entries: list[ll.Function] = []
        self.phase_map: PhaseMapping | None = None
        self.row_ops: dict[int, list[tuple]] = {}  # a row-mapped phase's operations (gpu/rowlower.py)

    def run(self) -> ll.Module:
        for decision, phase, grid in zip(self.plan.phases, self.ast.phases, self.mapping.phases):
            self.phase_map = grid
            self.begin_phase(decision.index)
            if grid.rows is not None:  # its own step functions; the phase function stays empty
                self.b.ret(ll.Constant(V.I32, 0))
                tiled = isinstance(grid.rows, TileMapping)
                ops = self.emit_tile_ops(grid) if tiled else self.emit_row_phase(grid)
                self.row_ops[grid.index] = ops
                if not self.emulate:
                    self.entries.append(self.emit_row_entry(grid, ops))
                continue
            # the mapped loops are restricted by emit_for below, nothing else is
            self.decision = dataclasses.replace(decision, split=Split.SERIAL, chunked=True)
            self.emit_node(phase.node, {})
            self.b.ret(ll.Constant(V.I32, 0))
            if not self.emulate:
                self.emit_kernel_entry(grid, self.body)
        if self.emulate:
            self.emit_emulation()
            return self.module
        if not self.new_cc:  # LLVM < 20 marks kernels with metadata instead
            nodes = [self.module.add_metadata([fn, "kernel", ll.Constant(V.I32, 1)]) for fn in self.entries]
            named = self.module.add_named_metadata("nvvm.annotations")
            for node in nodes:
                named.add(node)
        return self.module

    def begin_phase(self, n: int) -> None:
        tensor_types = [V.memory_type(self.program.tensor(t).dtype).as_pointer() for t in self.layout.tensors]
        ty = ll.FunctionType(V.I32, tensor_types + [V.I64.as_pointer()] + [V.I64] * (2 * MAX_MAPPED))
        fn = ll.Function(self.module, ty, f"tl_phase{n}")
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        for arg in fn.args[: len(tensor_types)]:
            arg.add_attribute("noalias")
        self.body = fn
        self.phase_functions.append(fn)
        self.error_ptr = fn.args[len(tensor_types)]
        self.bounds = list(fn.args[len(tensor_types) + 1 :])
        self.lo = self.hi = None  # set per mapped loop by emit_for
        self.workspace = self.cancel = None  # no workspace, no cancel word on the GPU
        self.loop_depth = 1  # never an "outermost loop": no cancel polls
        self.b = ll.IRBuilder(fn.append_basic_block("entry"))
        if self.param_values is None:
            raise ValueError("the cuda target needs a plan specialised to sizes")
        self.params = {p: ll.Constant(V.I64, int(self.param_values[p])) for p in self.layout.params}
        self.pointers = dict(zip(self.layout.tensors, fn.args))
        self.private_cells = {}  # tensor → its one element in this thread (gpu/private.py)
        for tensor in self.phase_map.private if self.phase_map is not None else ():
            ty = V.memory_type(self.program.tensor(tensor).dtype)
            cell = self.b.alloca(ty, name=f"{tensor}.private")
            self.b.store(ll.Constant(ty, None), cell)  # zero, as the runtime's memset would leave it
            self.private_cells[tensor] = cell

    def address(self, tensor: str, subscripts, read) -> ll.Value:
        cell = self.private_cells.get(tensor)
        return cell if cell is not None else super().address(tensor, subscripts, read)

    def emit_for(self, node: isl.AstNode, env: dict[str, ll.Value]) -> None:
        grid = self.phase_map
        key = node.get_annotation().get_name() if node.get_annotation() is not None else None
        mapped = [n for n, loop in enumerate(grid.loops) if loop.key == key] if grid is not None else []
        if not mapped:  # a sequential loop (the phase's SERIAL decision is consumed by the first)
            return super().emit_for(node, env)
        n = mapped[0]
        self.decision = PhaseDecision(grid.index, Split.OUTER_LOOP, (), None, chunked=True)
        self.lo, self.hi = self.bounds[2 * n], self.bounds[2 * n + 1]
        super().emit_for(node, env)

    def emit_kernel_entry(self, grid: PhaseMapping, phase_fn: ll.Function) -> None:
        """`tl_<def>_phase<n>(tensors..., error)`: one thread's iteration of the mapped loops."""
        tensor_types = [a.type for a in phase_fn.args[: len(self.layout.tensors)]]
        ty = ll.FunctionType(ll.VoidType(), tensor_types + [V.I64.as_pointer()])
        fn = ll.Function(self.module, ty, f"tl_{self.program.name}_phase{grid.index}")
        if self.new_cc:
            fn.calling_convention = "ptx_kernel"
        for arg in fn.args[: len(tensor_types)]:
            arg.add_attribute("noalias")
        self.entries.append(fn)
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        sreg = {}
        for reg in ("tid", "ctaid", "ntid"):
            name = _SREG.format(reg)
            f = self.module.globals.get(name) or ll.Function(self.module, ll.FunctionType(V.I32, []), name)
            sreg[reg] = b.zext(b.call(f, []), V.I64)
        gid = b.add(b.mul(sreg["ctaid"], sreg["ntid"]), sreg["tid"])
        self._run_thread(b, fn, grid, phase_fn, list(fn.args), gid)
        b.ret_void()

    def _run_thread(
        self,
        b: ll.IRBuilder,
        fn: ll.Function,
        grid: PhaseMapping,
        phase_fn: ll.Function,
        args: list,
        gid: ll.Value,
    ) -> None:
        """At b: thread `gid` checks it is within the grid's iterations and runs its one.

        The phase records a failed run-time check (a gather index out of range, an integer
        division by zero) in a thread-local record; the first thread of the call to fail claims
        the global `error[0]` with a compare-and-swap and alone copies its details to
        `error[1..3]`, so the runtime reads one thread's consistent record (as the CPU's
        [code, check, dim, value]) and the first failing phase's: the phases launched after it
        still run (the runtime reads the record once, after the last), harmlessly — their
        accesses are proved in bounds or checked like this one — and cannot overwrite it. No
        thread reads the word before its work: one hot address for every thread of every phase
        would cost more than the error path it would shorten."""
        error = args[-1]
        entry = ll.IRBuilder(fn.blocks[0])
        entry.position_at_start(fn.blocks[0])
        local = entry.alloca(V.I64, size=4, name="error.local")  # promoted to registers (inlined)
        b.position_at_end(b.block)  # b's insertion point moved with the instruction put before it
        run = fn.append_basic_block("run")
        done = fn.append_basic_block("done")
        total = grid.threads if grid.loops else 1
        b.cbranch(b.icmp_unsigned("<", gid, ll.Constant(V.I64, total)), run, done)
        b.position_at_end(run)
        bounds: list[ll.Value] = [ll.Constant(V.I64, 0)] * (2 * MAX_MAPPED)
        rest = gid
        for n in reversed(grid.order):  # the fastest varying loop is the lowest digit
            loop = grid.loops[n]
            count = ll.Constant(V.I64, max(1, loop.count))
            digit = b.urem(rest, count)
            rest = b.udiv(rest, count)
            lo = b.add(ll.Constant(V.I64, loop.first), b.mul(digit, ll.Constant(V.I64, loop.step)))
            bounds[2 * n], bounds[2 * n + 1] = lo, b.add(lo, ll.Constant(V.I64, 1))
        code = b.call(phase_fn, args[:-1] + [local] + bounds)
        failed = fn.append_basic_block("failed")
        b.cbranch(b.icmp_unsigned("!=", code, ll.Constant(V.I32, 0)), failed, done)
        b.position_at_end(failed)
        swap = b.cmpxchg(error, ll.Constant(V.I64, 0), b.zext(code, V.I64), "monotonic", "monotonic")
        claim = fn.append_basic_block("claim")
        b.cbranch(b.extract_value(swap, 1), claim, done)
        b.position_at_end(claim)
        for n in (1, 2, 3):
            word = b.load(b.gep(local, [ll.Constant(V.I64, n)]))
            b.store_atomic(word, b.gep(error, [ll.Constant(V.I64, n)]), "monotonic", 8)
        b.branch(done)
        b.position_at_end(done)

    def emit_emulation(self) -> None:
        """For testing the mapping on a CPU: `tl_emulate_phase<n>(tensors..., error)` runs every
        thread of phase n's grid (blocks x block, the idle ones too) one after the other."""
        for grid, phase_fn in zip(self.mapping.phases, self.phase_functions):
            if grid.rows is not None:
                self.emit_row_emulation(grid, self.row_ops[grid.index])
                continue
            tensor_types = [a.type for a in phase_fn.args[: len(self.layout.tensors)]]
            ty = ll.FunctionType(ll.VoidType(), tensor_types + [V.I64.as_pointer()])
            fn = ll.Function(self.module, ty, f"tl_emulate_phase{grid.index}")
            b = ll.IRBuilder(fn.append_basic_block("entry"))
            pre = b.block
            header = fn.append_basic_block("thread")
            b.branch(header)
            b.position_at_end(header)
            gid = b.phi(V.I64, "gid")
            gid.add_incoming(ll.Constant(V.I64, 0), pre)
            self._run_thread(b, fn, grid, phase_fn, list(fn.args), gid)
            nxt = b.add(gid, ll.Constant(V.I64, 1))
            gid.add_incoming(nxt, b.block)
            exit_ = fn.append_basic_block("exit")
            b.cbranch(b.icmp_unsigned("<", nxt, ll.Constant(V.I64, grid.blocks * grid.block)), header, exit_)
            b.position_at_end(exit_)
            b.ret_void()

    # ------------------------------------------------------------------ math on the GPU

    def value(self, e: ir.Expr) -> ll.Value:
        if isinstance(e, ir.Call):
            args = [self.value(a) for a in e.args]
            if e.function in VECMATH_BUILTINS:  # the portable form: no AVX-512 vscalef / ldexp
                if isinstance(args[0].type, ll.HalfType):  # computed in float, rounded once
                    wide = emit_vecmath(self.b, e.function, [self.b.fpext(args[0], V.F32)], scalef=False)
                    return self.b.fptrunc(wide, args[0].type)
                return emit_vecmath(self.b, e.function, args, scalef=False)
            if e.function in _LIBDEVICE_DIRECT and isinstance(args[0].type, ll.FloatType | ll.DoubleType):
                return self._libdevice_call(_LIBDEVICE_DIRECT[e.function], args)
            return emit_builtin(self.b, e.function, args)
        return super().value(e)

    def _libdevice_call(self, base: str, args: list[ll.Value]) -> ll.Value:
        """A call of libdevice's `__nv_<base>f` (float) or `__nv_<base>` (double)."""
        ty = args[0].type
        name = f"__nv_{base}{'f' if isinstance(ty, ll.FloatType) else ''}"
        fn = self.module.globals.get(name) or ll.Function(
            self.module, ll.FunctionType(ty, [ty] * len(args)), name
        )
        return self.b.call(fn, args)


def lower_to_nvptx(
    plan: KernelPlan, mapping: GridMapping, *, new_calling_convention: bool = True
) -> ll.Module:
    """The plan's NVPTX module: one ptx_kernel entry per phase, named tl_<def>_phase<n>."""
    return GpuLowering(plan, mapping, new_calling_convention=new_calling_convention).run()


def lower_for_emulation(plan: KernelPlan, mapping: GridMapping) -> ll.Module:
    """A host module with the same phase bodies and thread-to-iteration arithmetic, whose
    `tl_emulate_phase<n>(tensors..., error)` runs every thread of phase n's grid in turn: how
    the tests check the mapping against NumPy on a machine without a GPU."""
    return GpuLowering(plan, mapping, emulate=True).run()
