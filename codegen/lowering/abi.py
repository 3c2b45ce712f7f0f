"""lowering: KernelLayout → the kernel's ABI: tl_phase<n> functions, the tl_kernel entry, the error record.

`tl_kernel(i8** buffers, i64* params, i64* error, i64 phase, i64 lo, i64 hi, i8* workspace,
i32* cancel) -> i32` unpacks its arguments and calls `tl_phase<phase>`, whose tensor pointers are
`noalias`. Parameters are the isl parameters followed by every tensor dimension; when the code is
specialised to concrete sizes they are compile-time constants instead. A non-zero return code
reports a run-time error whose details are in `error[0..3]`, or ERROR_CANCELLED: another thread set
the call's cancel word, which phases poll once per iteration of their outermost loops (the GEMM
body once per macro block; a split loop with nothing nested not at all: the runtime runs it in
chunks, PhaseDecision.chunked), so that an interrupted call stops within milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ll

from polyhedral import Scop
from tensorlang import ir

from ..emit import values as V
from ..planning.plan import Extent, Param
from .status import ERROR_CANCELLED, ERROR_DIVISION, ERROR_INDEX  # noqa: F401 (re-exported)

CANCEL = V.I32.as_pointer()  # the call's cancel word: non-zero asks the kernel to stop


@dataclass(frozen=True)
class KernelLayout:
    """How the host passes arguments: buffer order and parameter order."""

    tensors: tuple[str, ...]  # buffer pointer order
    params: tuple[Param, ...]  # isl parameters, then the extent of every tensor dimension


def kernel_layout(scop: Scop) -> KernelLayout:
    program = scop.program
    dims = tuple(Extent(t.name, d) for t in program.tensors for d in range(t.rank))
    return KernelLayout(tuple(t.name for t in program.tensors), scop.params.names + dims)


def declare_phase(
    module: ll.Module, program: ir.Program, layout: KernelLayout, specialised: bool, n: int
) -> ll.Function:
    """A function `tl_phase<n>(tensors..., [params...], error, lo, hi, workspace, cancel)` with
    noalias tensors; the parameters are left out when the code is `specialised` to constant sizes."""
    tensor_types = [V.memory_type(program.tensor(t).dtype).as_pointer() for t in layout.tensors]
    param_types = [] if specialised else [V.I64] * len(layout.params)
    ty = ll.FunctionType(
        V.I32, tensor_types + param_types + [V.I64.as_pointer(), V.I64, V.I64, V.I8.as_pointer()] + [CANCEL]
    )
    fn = ll.Function(module, ty, f"tl_phase{n}")
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    for arg in fn.args[: len(tensor_types)]:
        arg.add_attribute("noalias")
    return fn


def emit_entry(
    module: ll.Module,
    program: ir.Program,
    layout: KernelLayout,
    specialised: bool,
    phase_functions: list[ll.Function],
) -> None:
    """tl_kernel(i8** buffers, i64* params, i64* error, i64 phase, i64 lo, i64 hi, i8* workspace,
    i32* cancel) -> i32: unpacks its arguments and calls the phase's function (an unknown phase
    does nothing)."""
    ptr_ty = V.I8.as_pointer()
    ty = ll.FunctionType(
        V.I32,
        [ptr_ty.as_pointer(), V.I64.as_pointer(), V.I64.as_pointer(), V.I64, V.I64, V.I64, ptr_ty, CANCEL],
    )
    fn = ll.Function(module, ty, "tl_kernel")
    buffers, params, error, phase, lo, hi, workspace, cancel = fn.args
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    args = []
    for n in range(len(layout.tensors)):
        raw = b.load(b.gep(buffers, [ll.Constant(V.I64, n)]))
        args.append(b.bitcast(raw, V.memory_type(program.tensor(layout.tensors[n]).dtype).as_pointer()))
    if not specialised:
        for n in range(len(layout.params)):
            args.append(b.load(b.gep(params, [ll.Constant(V.I64, n)])))
    args += [error, lo, hi, workspace, cancel]
    default = fn.append_basic_block("no_such_phase")
    switch = b.switch(phase, default)
    for n, phase_fn in enumerate(phase_functions):
        block = fn.append_basic_block(f"phase{n}")
        switch.add_case(ll.Constant(V.I64, n), block)
        b.position_at_end(block)
        b.ret(b.call(phase_fn, args))
    b.position_at_end(default)
    b.ret(ll.Constant(V.I32, 0))


def poll_cancel(b: ll.IRBuilder, cancel: ll.Value) -> None:
    """At the current position: return ERROR_CANCELLED if the call's cancel word is set. One
    relaxed (monotonic) atomic load, a branch predicted not taken."""
    flag = b.load_atomic(cancel, "monotonic", 4)
    stop = b.append_basic_block("cancelled")
    cont = b.append_basic_block("running")
    branch = b.cbranch(b.icmp_unsigned("!=", flag, ll.Constant(V.I32, 0)), stop, cont)
    branch.set_weights([1, 1 << 20])
    b.position_at_end(stop)
    b.ret(ll.Constant(V.I32, ERROR_CANCELLED))
    b.position_at_end(cont)


# --------------------------------------------------------------------------------------------------
# Run-time checks: a failed one records error[0..3] and returns its code from the phase


def fail(b: ll.IRBuilder, error_ptr: ll.Value, code: int, detail: tuple[ll.Value, ...]) -> None:
    """At the current position: record the error and return `code`."""
    values = (ll.Constant(V.I64, code),) + detail
    for n, v in enumerate(values):
        b.store(v, b.gep(error_ptr, [ll.Constant(V.I64, n)]))
    b.ret(ll.Constant(V.I32, code))


def require(
    b: ll.IRBuilder, error_ptr: ll.Value, ok: ll.Value, code: int, detail: tuple[ll.Value, ...]
) -> None:
    """Continue where `ok` holds; otherwise fail with `code` and `detail`."""
    bad = b.append_basic_block("check.fail")
    cont = b.append_basic_block("check.ok")
    b.cbranch(ok, cont, bad)
    b.position_at_end(bad)
    fail(b, error_ptr, code, detail)
    b.position_at_end(cont)


def require_in_range(
    b: ll.IRBuilder, error_ptr: ll.Value, index: ll.Value, extent: ll.Value, check: int, dim: int
) -> None:
    """0 <= index < extent, or fail with ERROR_INDEX naming the bounds check and dimension."""
    # one unsigned comparison covers both index < 0 and index >= extent
    ok = b.icmp_unsigned("<", index, extent)
    require(b, error_ptr, ok, ERROR_INDEX, (ll.Constant(V.I64, check), ll.Constant(V.I64, dim), index))
