"""export: KernelPlan + its module → the C entry points `<name>`, `<name>_error`, `<name>_output_shape` in LLVM IR.

The entry does in generated code what `Kernel.__call__` does around the phases: it checks the
sizes, computes the kernel parameters from them, allocates the temporaries and the workspace
(64-byte aligned, with posix_memalign), relays out GEMM operands, runs every phase serially
through `tl_kernel`, frees what it allocated and returns 0 or an error code.
"""

from __future__ import annotations

import llvmlite.ir as ll
import sympy

from polyhedral.sizes import isl_param_name
from tensorlang import ir

from ..emit import values as V
from ..emit.gemm_pack import loop
from ..lowering.abi import ERROR_CANCELLED, ERROR_DIVISION, ERROR_INDEX, KernelLayout
from ..planning.plan import Extent, KernelPlan, Param
from .sizes_ir import SizeIR, in_parameter_set

ERROR_SIZES = 4  # a size is negative, beyond int32, or breaks a requirement of the def
ERROR_NOT_EXPORTED = 5  # a specialised export called with sizes other than the exported ones
ERROR_MEMORY = 6  # malloc failed

ERROR_MESSAGES: dict[int, str] = {
    0: "no error",
    ERROR_INDEX: "an index read from a tensor (a gather) is out of range; the call was stopped",
    ERROR_DIVISION: "integer division by zero",
    ERROR_CANCELLED: "the call was cancelled",
    ERROR_SIZES: "invalid sizes: negative, larger than 2^31-1, breaking a requirement of the def, "
    "taking an access out of its tensor's bounds, or giving a tensor a negative extent or more than 2^63 bytes",
    ERROR_NOT_EXPORTED: "sizes other than the ones this kernel was exported (specialised) for",
    ERROR_MEMORY: "out of memory",
}
UNKNOWN_ERROR = "unknown error code"

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ALIGN = 64  # temporaries and the workspace: cache-line aligned, as the runtime's Workspaces
PTR = V.I8.as_pointer()


def c64(value: int) -> ll.Constant:
    return ll.Constant(V.I64, value)


def size_symbols(program: ir.Program) -> tuple[str, ...]:
    """The C entry's size arguments: every size symbol, in order of first appearance."""
    return tuple(s.name for s in program.sizes)


def tensor_pointer(t: ir.Tensor) -> ll.Type:
    return V.memory_type(t.dtype).as_pointer()


def isl_param_exprs(plan: KernelPlan) -> dict[str, sympy.Expr]:
    """Each isl parameter (by its isl name) as a size expression: a size, or a derived parameter."""
    by_isl = {isl_param_name(s.name): sympy.Symbol(s.name) for s in plan.program.sizes}
    by_isl.update(plan.scop.params.derived)
    return by_isl


def param_exprs(plan: KernelPlan, layout: KernelLayout) -> dict[Param, sympy.Expr]:
    """Each kernel parameter as a size expression: sizes, derived isl parameters, tensor extents."""
    by_isl = isl_param_exprs(plan)
    exprs: dict[Param, sympy.Expr] = {}
    for p in layout.params:
        exprs[p] = plan.program.tensor(p.tensor).shape[p.dim] if isinstance(p, Extent) else by_isl[p]
    return exprs


def _declare(module: ll.Module, name: str, ret: ll.Type, args: list[ll.Type]) -> ll.Function:
    if name in module.globals:
        return module.globals[name]
    return ll.Function(module, ll.FunctionType(ret, args), name)


def _string(module: ll.Module, name: str, text: str) -> ll.GlobalVariable:
    data = bytearray(text.encode() + b"\0")
    ty = ll.ArrayType(V.I8, len(data))
    g = ll.GlobalVariable(module, ty, name)
    g.global_constant = True
    g.linkage = "private"
    g.initializer = ll.Constant(ty, data)
    return g


def define_error(module: ll.Module, name: str) -> ll.Function:
    """`const char* <name>_error(int32_t code)`: a static message for every code."""
    fn = ll.Function(module, ll.FunctionType(PTR, [V.I32]), f"{name}_error")
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    unknown = _string(module, f"{name}.msg.unknown", UNKNOWN_ERROR)
    default = fn.append_basic_block("unknown")
    switch = b.switch(fn.args[0], default)
    for code, text in ERROR_MESSAGES.items():
        block = fn.append_basic_block(f"code{code}")
        switch.add_case(ll.Constant(V.I32, code), block)
        b.position_at_end(block)
        b.ret(b.bitcast(_string(module, f"{name}.msg{code}", text), PTR))
    b.position_at_end(default)
    b.ret(b.bitcast(unknown, PTR))
    return fn


def define_output_shape(module: ll.Module, program: ir.Program, name: str) -> ll.Function:
    """`void <name>_output_shape(int64_t sizes..., int64_t* dims)`: every output's extents,
    concatenated in return order."""
    sizes = size_symbols(program)
    ty = ll.FunctionType(ll.VoidType(), [V.I64] * len(sizes) + [V.I64.as_pointer()])
    fn = ll.Function(module, ty, f"{name}_output_shape")
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    emit = SizeIR(b, dict(zip(sizes, fn.args)))
    n = 0
    for t in program.outputs:
        for extent in t.shape:
            b.store(emit.integer(extent), b.gep(fn.args[-1], [c64(n)]))
            n += 1
    b.ret_void()
    return fn


class EntryBuilder:
    """Emits `int32_t <name>(inputs..., outputs..., sizes...)` into the kernel's module."""

    def __init__(self, module: ll.Module, plan: KernelPlan, layout: KernelLayout, name: str):
        self.module, self.plan, self.layout = module, plan, layout
        self.program = plan.program
        self.sizes = size_symbols(self.program)
        args = [tensor_pointer(t) for t in self.program.inputs + self.program.outputs]
        ty = ll.FunctionType(V.I32, args + [V.I64] * len(self.sizes))
        self.fn = ll.Function(module, ty, name)
        self.b = ll.IRBuilder(self.fn.append_basic_block("entry"))
        ntensors = len(self.program.inputs) + len(self.program.outputs)
        self.tensor_args = dict(
            zip((t.name for t in self.program.inputs + self.program.outputs), self.fn.args)
        )
        self.size_args = dict(zip(self.sizes, self.fn.args[ntensors:]))
        self.owned: list[ll.Value] = []  # i8** slots of what the entry allocated (null until then)

    # -------------------------------------------------------------- checks

    def require(self, ok: ll.Value, code: int) -> None:
        """Continue where `ok` holds; otherwise return `code` (before any allocation)."""
        b = self.b
        bad = self.fn.append_basic_block("bad")
        cont = self.fn.append_basic_block("ok")
        b.cbranch(ok, cont, bad)
        b.position_at_end(bad)
        b.ret(ll.Constant(V.I32, code))
        b.position_at_end(cont)

    def check_sizes(self) -> SizeIR:
        b = self.b
        for s in self.sizes:  # as the runtime: sizes are non-negative and fit int32 indexing
            self.require(b.icmp_unsigned("<=", self.size_args[s], c64(INT32_MAX)), ERROR_SIZES)
        if self.plan.sizes is not None:  # constants of the code: other sizes are refused
            for s, value in self.plan.sizes:
                self.require(b.icmp_signed("==", self.size_args[s], c64(value)), ERROR_NOT_EXPORTED)
        emit = SizeIR(b, self.size_args)
        if self.plan.sizes is None:  # fixed sizes were checked when exporting
            for r in self.program.requirements:
                self.require(b.icmp_signed("==", emit.integer(r.expr), c64(0)), ERROR_SIZES)
            # affine accesses proved in bounds only for some sizes (Kernel._check_preconditions)
            violations = [c.violation for c in self.plan.scop.checks if c.violation is not None]
            if violations:
                exprs = isl_param_exprs(self.plan)
                values = {name: emit.integer(expr) for name, expr in exprs.items()}
                for violation in violations:
                    self.require(b.not_(in_parameter_set(b, violation, values)), ERROR_SIZES)
        return emit

    def tensor_bytes(self, emit: SizeIR, t: ir.Tensor) -> ll.Value:
        """The tensor's size in bytes, returning ERROR_SIZES for a negative extent or an overflow."""
        b = self.b
        total = c64(t.dtype.storage_bytes)
        for extent in t.shape:
            value = emit.integer(extent)
            self.require(b.icmp_signed(">=", value, c64(0)), ERROR_SIZES)
            product = b.smul_with_overflow(total, value)
            self.require(b.not_(b.extract_value(product, 1)), ERROR_SIZES)
            total = b.extract_value(product, 0)
        return total

    # -------------------------------------------------------------- memory

    def allocate(self, nbytes: ll.Value, cleanup: ll.Block, rc: ll.Value, zero: bool = False) -> ll.Value:
        """A 64-byte aligned block freed at `cleanup`; on failure store ERROR_MEMORY in `rc` and
        go there."""
        b = self.b
        slot = self.owned[len(self.allocated)]
        self.allocated.append(slot)
        posix_memalign = _declare(self.module, "posix_memalign", V.I32, [PTR.as_pointer(), V.I64, V.I64])
        size = b.select(b.icmp_signed("==", nbytes, c64(0)), c64(1), nbytes)  # never a 0-byte request
        status = b.call(posix_memalign, [slot, c64(ALIGN), size])
        failed = self.fn.append_basic_block("alloc.fail")
        done = self.fn.append_basic_block("alloc.ok")
        b.cbranch(b.icmp_signed("!=", status, ll.Constant(V.I32, 0)), failed, done)
        b.position_at_end(failed)
        b.store(ll.Constant(V.I32, ERROR_MEMORY), rc)
        b.branch(cleanup)
        b.position_at_end(done)
        pointer = b.load(slot)
        if zero:  # `+=` without `!`: the runtime starts such temporaries from zeros
            memset = self.module.declare_intrinsic("llvm.memset", [PTR, V.I64])
            b.call(memset, [pointer, ll.Constant(V.I8, 0), size, ll.Constant(V.I1, 0)])
        return pointer

    def relayout(self, name: str, order: tuple[int, ...], source: ll.Value, target: ll.Value) -> None:
        """target = source with its dimensions in `order` (row-major), as np.ascontiguousarray(
        a.transpose(order)) in the runtime; GEMM operands only, so the shape is constant."""
        b = self.b
        shape = [self.plan.param_values[Extent(name, d)] for d in range(len(order))]
        strides = [1] * len(shape)
        for d in reversed(range(len(shape) - 1)):
            strides[d] = strides[d + 1] * shape[d + 1]
        ty = V.memory_type(self.program.tensor(name).dtype).as_pointer()
        src, dst = b.bitcast(source, ty), b.bitcast(target, ty)

        def nest(level: int, src_offset: ll.Value, dst_offset: ll.Value) -> None:
            if level == len(order):
                b.store(b.load(b.gep(src, [src_offset])), b.gep(dst, [dst_offset]))
                return
            with loop(b, 0, c64(shape[order[level]]), name=f"relayout{level}") as i:
                inner = b.mul(dst_offset, c64(shape[order[level]]))
                nest(level + 1, b.add(src_offset, b.mul(i, c64(strides[order[level]]))), b.add(inner, i))

        nest(0, c64(0), c64(0))

    # -------------------------------------------------------------- the entry

    def build(self) -> ll.Function:
        b, plan, program, layout = self.b, self.plan, self.program, self.layout
        emit = self.check_sizes()
        generic = plan.sizes is None
        own = [t for t in program.temporaries if t.name not in plan.contracted and t.name not in plan.sharing]
        # byte counts first, so that a size error returns before anything is allocated
        nbytes = {t.name: self.tensor_bytes(emit, t) for t in own}
        for n, f in plan.folded.items():  # stored modulo: constant sizes (specialised plans only)
            nbytes[n] = c64(f.allocated_bytes)
        for t in program.outputs:  # negative or overflowing output extents are size errors too
            self.tensor_bytes(emit, t)
        params = b.alloca(V.I64, c64(max(1, len(layout.params))))
        if generic:  # a specialised kernel's parameters are constants of its code
            for n, expr in enumerate(param_exprs(plan, layout).values()):
                b.store(emit.integer(expr), b.gep(params, [c64(n)]))
        count = len(own) + len(set(plan.sharing.values())) + len(plan.layouts) + 1
        self.owned = [b.alloca(PTR) for _ in range(count)]
        self.allocated: list[ll.Value] = []
        for slot in self.owned:
            b.store(ll.Constant(PTR, None), slot)
        rc = b.alloca(V.I32)
        b.store(ll.Constant(V.I32, 0), rc)
        cleanup = self.fn.append_basic_block("cleanup")
        pointers: dict[str, ll.Value] = {n: b.bitcast(v, PTR) for n, v in self.tensor_args.items()}
        uninitialised = {st.tensor for st in program.statements if st.uninitialized}
        for t in own:
            pointers[t.name] = self.allocate(nbytes[t.name], cleanup, rc, zero=t.name in uninitialised)
        slots: dict[int, ll.Value] = {}
        for slot in sorted(set(plan.sharing.values())):  # constant sizes: specialised plans only
            names = [n for n, s in plan.sharing.items() if s == slot]
            largest = max(self._constant_bytes(n) for n in names)
            slots[slot] = self.allocate(c64(largest), cleanup, rc)
        for n, s in plan.sharing.items():
            pointers[n] = slots[s]
        for name, order in sorted(plan.layouts.items()):
            copy = self.allocate(c64(self._constant_bytes(name)), cleanup, rc)
            self.relayout(name, order, pointers[name], copy)
            pointers[name] = copy
        workspace = ll.Constant(PTR, None)
        if plan.workspace_bytes:
            workspace = self.allocate(c64(plan.workspace_bytes), cleanup, rc)
        for n, c in plan.contracted.items():  # one slice, in the (single) thread's workspace
            pointers[n] = b.gep(workspace, [c64(c.offset)])
        buffers = b.alloca(PTR, c64(max(1, len(layout.tensors))))
        for n, tensor in enumerate(layout.tensors):
            b.store(pointers[tensor], b.gep(buffers, [c64(n)]))
        self.run_phases(buffers, params, workspace, rc, cleanup)
        b.branch(cleanup)
        b.position_at_end(cleanup)
        free = _declare(self.module, "free", ll.VoidType(), [PTR])
        for slot in self.owned:
            b.call(free, [b.load(slot)])
        b.ret(b.load(rc))
        return self.fn

    def _constant_bytes(self, name: str) -> int:
        t = self.program.tensor(name)
        total = t.dtype.storage_bytes
        for d in range(t.rank):
            total *= self.plan.param_values[Extent(name, d)]
        return total

    def run_phases(self, buffers: ll.Value, params: ll.Value, workspace: ll.Value, rc, cleanup) -> None:
        """Every phase in order, each over its whole range (serially); stop at the first error."""
        b = self.b
        entry = self.module.globals["tl_kernel"]
        error = b.alloca(V.I64, c64(4))
        cancel = b.alloca(V.I32)  # never set: an exported call is not interrupted
        b.store(ll.Constant(V.I32, 0), cancel)
        for n in range(len(self.plan.phases)):
            code = b.call(
                entry, [buffers, params, error, c64(n), c64(INT64_MIN), c64(INT64_MAX), workspace, cancel]
            )
            failed = self.fn.append_basic_block(f"phase{n}.fail")
            done = self.fn.append_basic_block(f"phase{n}.ok")
            b.cbranch(b.icmp_signed("!=", code, ll.Constant(V.I32, 0)), failed, done)
            b.position_at_end(failed)
            b.store(code, rc)
            b.branch(cleanup)
            b.position_at_end(done)


def define_entry(module: ll.Module, plan: KernelPlan, layout: KernelLayout, name: str) -> ll.Function:
    return EntryBuilder(module, plan, layout, name).build()


def exported_symbols(name: str) -> tuple[str, str, str]:
    """The three functions an export defines; everything else in its object is internal."""
    return (name, f"{name}_error", f"{name}_output_shape")
