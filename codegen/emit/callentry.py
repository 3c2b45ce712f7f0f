"""emit: the checked-call protocol → LLVM IR (one native entry that checks a call's arrays against a signature's plan and runs its phases).

A cached call of a small kernel repeats a signature that passed every check before. Checking it
again in Python costs microseconds; here one function, compiled once per process, reads the
argument objects themselves (CPython tuples, NumPy arrays: their object layouts, which
runtime/nativecall.py verifies at load before it uses this code) and compares them with a *plan*,
an i64 array built per signature:

* PLAN_ENTRY, PLAN_PARAMS, PLAN_CANCEL: the kernel entry's address, its parameter array, the
  never-set cancel word; PLAN_PHASES, PLAN_BUFFERS, PLAN_INPUTS, PLAN_OUTPUTS: counts;
* from word HEADER_WORDS, one RECORD_WORDS record per input then per output: the object type's
  address, the dtype's descriptor address, the rank, the size in bytes, the pointer-array slot,
  the flags that must be set, the kind (an array, or a 0-d input given as a number), then the
  shape;
* then per phase its index and the address of its dispatch record (emit/dispatch.py), or 0 to
  run it on the calling thread.

Python calls it through `tl_checked_call_python`, a METH_FASTCALL function bound to the plan
array as a builtin (runtime/nativecall.py): 0.04 µs a call (an 8-element add), where a ctypes
call of the same entry cost 0.35 µs, a quarter of a small kernel's whole cached call then.

It answers -1, having run nothing, when an object differs from its record in any way (type,
descriptor, rank, shape, flags) or an output's memory meets an input's or an earlier output's:
the Python path then decides; also when another call of the same plan is running (PLAN_BUSY).
Otherwise it fills the pointer array with the data addresses and runs every phase, on the calling
thread or through its dispatch record on the native workers (the GIL let go meanwhile when the
plan says so), answering the first nonzero code, else 0.
"""

from __future__ import annotations

import llvmlite.ir as ir

from .gemm_pack import c64, declare_intrinsic, define_function, loop
from .values import F32, F64, I8, I32, I64

I8P = I8.as_pointer()
I64P = I64.as_pointer()

CHECKED_CALL = "tl_checked_call"
PYTHON_CALL = "tl_checked_call_python"

PLAN_ENTRY, PLAN_PARAMS, PLAN_CANCEL = 0, 1, 2
PLAN_PHASES, PLAN_BUFFERS, PLAN_INPUTS, PLAN_OUTPUTS = 3, 4, 5, 6
# a signature whose phases split (not inline): the workspace of phases run here, tl_worker_dispatch
# (emit/dispatch.py), PyEval_SaveThread and PyEval_RestoreThread (the GIL is let go while phases
# run: 0 keeps it), and the word one call of the plan holds it with (its workspaces are one set)
PLAN_WORKSPACE, PLAN_DISPATCH, PLAN_SAVE, PLAN_RESTORE, PLAN_BUSY = 7, 8, 9, 10, 11
# for tl_checked_call_python: PyLong_FromLongLong (its answer), and the addresses of the tuple
# and ndarray types (its arguments' types are checked: a builtin may be called with anything)
PLAN_FROM_INT, PLAN_TUPLE_TYPE, PLAN_ARRAY_TYPE = 12, 13, 14
HEADER_WORDS = 16
PHASE_WORDS = 2  # each phase: its index, and its dispatch record's address (0: run it here)
REC_TYPE, REC_DESCR, REC_RANK, REC_NBYTES, REC_SLOT, REC_FLAGS, REC_KIND, REC_SHAPE = 0, 1, 2, 3, 4, 5, 6, 7
MAX_RANK = 9
# what a record describes: an array; a number whose value the object holds at NUMBER_VALUE in the
# input's type (a NumPy scalar of that dtype, a Python float for a double); a Python float
# rounded to a float32 here
KIND_ARRAY, KIND_INLINE, KIND_NARROWED = 0, 1, 2
RECORD_WORDS = REC_SHAPE + MAX_RANK
MAX_BUFFERS = 64  # the pointer array lives on the stack

# object layouts (64-bit CPython, NumPy's PyArrayObject_fields): byte offsets
OB_TYPE = 8
TUPLE_SIZE, TUPLE_ITEMS = 16, 24
ARRAY_DATA, ARRAY_RANK, ARRAY_SHAPE, ARRAY_DESCR, ARRAY_FLAGS = 16, 24, 32, 56, 64
NUMBER_VALUE = 16  # a Python float's double, a NumPy scalar's value

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _at(b: ir.IRBuilder, obj, offset: int, ty: ir.Type = I64):
    """The `ty` field at a byte offset of an object."""
    return b.load(b.bitcast(b.gep(obj, [c64(offset)], inbounds=True), ty.as_pointer()))


def _fabs(module: ir.Module) -> ir.Function:
    return declare_intrinsic(module, "llvm.fabs.f64", F64, [F64])


def define_checked_call(module: ir.Module) -> ir.Function:
    """`i64 tl_checked_call(i64* plan, i8* inputs, i8* outputs, i64* error)`: inputs and outputs
    are tuples of arrays."""
    entry_ty = ir.FunctionType(I32, [I8P, I8P, I8P, I64, I64, I64, I8P, I8P])
    fn = define_function(
        module, CHECKED_CALL, I64, [I64P, I8P, I8P, I64P], ["plan", "inputs", "outputs", "error"], "external"
    )
    plan, inputs, outputs, error = fn.args
    b = ir.IRBuilder(fn.append_basic_block("start"))
    mismatch = fn.append_basic_block("mismatch")

    def word(index):
        return b.load(b.gep(plan, [index if isinstance(index, ir.Value) else c64(index)], inbounds=True))

    def require(condition, name: str) -> None:
        ok = fn.append_basic_block(name)
        b.cbranch(condition, ok, mismatch)
        b.position_at_end(ok)

    n_inputs, n_outputs = word(PLAN_INPUTS), word(PLAN_OUTPUTS)
    require(b.icmp_signed("==", _at(b, inputs, TUPLE_SIZE), n_inputs), "inputs.count")
    require(b.icmp_signed("==", _at(b, outputs, TUPLE_SIZE), n_outputs), "outputs.count")
    pointers = b.alloca(I64, c64(MAX_BUFFERS), name="pointers")
    spans = b.alloca(I64, c64(2 * MAX_BUFFERS), name="spans")  # [start, stop) of each array so far
    numbers = b.alloca(I64, c64(MAX_BUFFERS), name="numbers")  # Python floats rounded to float32
    with loop(b, 0, c64(MAX_BUFFERS), name="clear") as i:
        b.store(c64(0), b.gep(pointers, [i]))
    tensors = b.add(n_inputs, n_outputs)
    with loop(b, 0, tensors, name="t") as t:
        is_output = b.icmp_signed(">=", t, n_inputs)
        tuple_ = b.select(is_output, outputs, inputs)
        item = b.select(is_output, b.sub(t, n_inputs), t)
        item_at = b.bitcast(b.gep(tuple_, [c64(TUPLE_ITEMS)], inbounds=True), I8P.as_pointer())
        obj = b.load(b.gep(item_at, [item]))
        record = b.add(c64(HEADER_WORDS), b.mul(t, c64(RECORD_WORDS)))

        def field(i: int):
            return word(b.add(record, c64(i)))

        require(b.icmp_signed("==", _at(b, obj, OB_TYPE), field(REC_TYPE)), "type")
        kind = field(REC_KIND)
        array_case, number_case = fn.append_basic_block("array"), fn.append_basic_block("number")
        inline_case, narrowed_case = fn.append_basic_block("inline"), fn.append_basic_block("narrowed")
        checked = fn.append_basic_block("checked")
        b.cbranch(b.icmp_signed("==", kind, c64(KIND_ARRAY)), array_case, number_case)
        b.position_at_end(number_case)
        b.cbranch(b.icmp_signed("==", kind, c64(KIND_INLINE)), inline_case, narrowed_case)

        b.position_at_end(array_case)
        require(b.icmp_signed("==", _at(b, obj, ARRAY_DESCR), field(REC_DESCR)), "descr")
        rank = field(REC_RANK)
        require(b.icmp_signed("==", b.sext(_at(b, obj, ARRAY_RANK, I32), I64), rank), "rank")
        flags, wanted = b.sext(_at(b, obj, ARRAY_FLAGS, I32), I64), field(REC_FLAGS)
        require(b.icmp_signed("==", b.and_(flags, wanted), wanted), "flags")
        shape = b.bitcast(_at(b, obj, ARRAY_SHAPE, I8P), I64P)
        with loop(b, 0, rank, name="d") as d:
            extent = b.load(b.gep(shape, [d]))
            require(b.icmp_signed("==", extent, word(b.add(b.add(record, c64(REC_SHAPE)), d))), "extent")
        array_start, array_from = _at(b, obj, ARRAY_DATA), b.block
        b.branch(checked)

        b.position_at_end(inline_case)  # a NumPy scalar, or a Python float for a double: in place
        inline_start = b.add(b.ptrtoint(obj, I64), c64(NUMBER_VALUE))
        b.branch(checked)

        b.position_at_end(narrowed_case)  # a Python float for a float32: rounded, never to inf or 0
        wide = _at(b, obj, NUMBER_VALUE, F64)
        narrow = b.fptrunc(wide, F32)
        infinity = ir.Constant(F64, float("inf"))
        overflow = b.and_(
            b.fcmp_ordered("!=", b.call(_fabs(module), [wide]), infinity),
            b.fcmp_ordered("==", b.call(_fabs(module), [b.fpext(narrow, F64)]), infinity),
        )
        underflow = b.and_(b.fcmp_unordered("!=", wide, ir.Constant(F64, 0.0)),
                           b.fcmp_ordered("==", narrow, ir.Constant(F32, 0.0)))  # fmt: skip
        require(b.not_(b.or_(overflow, underflow)), "representable")
        slot = b.gep(numbers, [t])
        b.store(narrow, b.bitcast(slot, F32.as_pointer()))
        narrowed_start, narrowed_from = b.ptrtoint(slot, I64), b.block
        b.branch(checked)

        b.position_at_end(checked)
        start = b.phi(I64, name="start")
        start.add_incoming(array_start, array_from)
        start.add_incoming(inline_start, inline_case)
        start.add_incoming(narrowed_start, narrowed_from)
        stop = b.add(start, field(REC_NBYTES))
        # an output meets no input and no earlier output (inputs may share memory: only read)
        with loop(b, 0, b.select(is_output, t, c64(0)), name="u") as u:
            other_start = b.load(b.gep(spans, [b.mul(u, c64(2))]))
            other_stop = b.load(b.gep(spans, [b.add(b.mul(u, c64(2)), c64(1))]))
            meets = b.and_(b.icmp_unsigned("<", start, other_stop), b.icmp_unsigned("<", other_start, stop))
            require(b.not_(meets), "apart")
        b.store(start, b.gep(spans, [b.mul(t, c64(2))]))
        b.store(stop, b.gep(spans, [b.add(b.mul(t, c64(2)), c64(1))]))
        b.store(start, b.gep(pointers, [field(REC_SLOT)]))

    kernel = b.inttoptr(word(PLAN_ENTRY), entry_ty.as_pointer())
    params = b.inttoptr(word(PLAN_PARAMS), I8P)
    cancel = b.inttoptr(word(PLAN_CANCEL), I8P)
    workspace = b.inttoptr(word(PLAN_WORKSPACE), I8P)
    buffers = b.bitcast(pointers, I8P)
    busy = b.gep(plan, [c64(PLAN_BUSY)], inbounds=True)
    require(b.extract_value(b.cmpxchg(busy, c64(0), c64(1), "acquire", "monotonic"), 1), "plan.free")
    thread_state_ty = ir.FunctionType(I8P, [])
    save, restore = word(PLAN_SAVE), word(PLAN_RESTORE)
    lets_go = b.icmp_signed("!=", save, c64(0))
    state = b.alloca(I8P, name="thread_state")
    with b.if_then(lets_go):
        b.store(b.call(b.inttoptr(save, thread_state_ty.as_pointer()), []), state)
    dispatch_ty = ir.FunctionType(I32, [I64P, I8P, I8P])
    phases_at = b.add(c64(HEADER_WORDS), b.mul(tensors, c64(RECORD_WORDS)))
    outcome = b.alloca(I32, name="outcome")
    b.store(ir.Constant(I32, 0), outcome)
    finish = fn.append_basic_block("finish")
    with loop(b, 0, word(PLAN_PHASES), name="p") as p:
        at = b.add(phases_at, b.mul(p, c64(PHASE_WORDS)))
        phase, record = word(at), word(b.add(at, c64(1)))
        here = fn.append_basic_block("phase.here")
        away = fn.append_basic_block("phase.dispatched")
        ran = fn.append_basic_block("ran")
        b.cbranch(b.icmp_signed("==", record, c64(0)), here, away)
        b.position_at_end(here)
        code_here = b.call(
            kernel,
            [
                buffers,
                params,
                b.bitcast(error, I8P),
                phase,
                c64(INT64_MIN),
                c64(INT64_MAX),
                workspace,
                cancel,
            ],
        )
        here_end = b.block
        b.branch(ran)
        b.position_at_end(away)
        dispatch = b.inttoptr(word(PLAN_DISPATCH), dispatch_ty.as_pointer())
        code_away = b.call(dispatch, [b.inttoptr(record, I64P), buffers, b.bitcast(error, I8P)])
        away_end = b.block
        b.branch(ran)
        b.position_at_end(ran)
        code = b.phi(I32, name="code")
        code.add_incoming(code_here, here_end)
        code.add_incoming(code_away, away_end)
        b.store(code, outcome)
        go_on = fn.append_basic_block("phase.next")
        b.cbranch(b.icmp_signed("!=", code, ir.Constant(I32, 0)), finish, go_on)
        b.position_at_end(go_on)
    b.branch(finish)
    b.position_at_end(finish)
    with b.if_then(lets_go):
        b.call(b.inttoptr(restore, ir.FunctionType(ir.VoidType(), [I8P]).as_pointer()), [b.load(state)])
    b.store_atomic(c64(0), busy, "release", 8)
    b.ret(b.sext(b.load(outcome), I64))
    b.position_at_end(mismatch)
    b.ret(c64(-1))
    return fn


def define_python_call(module: ir.Module, checked: ir.Function) -> ir.Function:
    """`PyObject* tl_checked_call_python(PyObject* plan, PyObject* const* args, i64 nargs)`, a
    METH_FASTCALL function whose self is the plan (an int64 ndarray) and whose arguments are the
    inputs tuple, the outputs tuple and the error record (an int64 ndarray): tl_checked_call's
    answer as a Python int, -1 for arguments of any other count or type."""
    fn = define_function(
        module, PYTHON_CALL, I8P, [I8P, I8P.as_pointer(), I64], ["plan_array", "args", "nargs"], "external"
    )
    plan_array, args, nargs = fn.args
    b = ir.IRBuilder(fn.append_basic_block("start"))
    plan = b.bitcast(_at(b, plan_array, ARRAY_DATA, I8P), I64P)

    def word(index: int):
        return b.load(b.gep(plan, [c64(index)], inbounds=True))

    call, answer = fn.append_basic_block("call"), fn.append_basic_block("answer")
    start = b.block  # the count first: args holds nargs pointers, no more
    b.cbranch(b.icmp_signed("==", nargs, c64(3)), call, answer)
    b.position_at_end(call)
    arguments = [b.load(b.gep(args, [c64(i)])) for i in range(3)]
    typed = b.and_(
        b.and_(
            b.icmp_signed("==", _at(b, arguments[0], OB_TYPE), word(PLAN_TUPLE_TYPE)),
            b.icmp_signed("==", _at(b, arguments[1], OB_TYPE), word(PLAN_TUPLE_TYPE)),
        ),
        b.icmp_signed("==", _at(b, arguments[2], OB_TYPE), word(PLAN_ARRAY_TYPE)),
    )
    run = fn.append_basic_block("run")
    b.cbranch(typed, run, answer)
    b.position_at_end(run)
    error = b.bitcast(_at(b, arguments[2], ARRAY_DATA, I8P), I64P)
    code = b.call(checked, [plan, arguments[0], arguments[1], error])
    checked_end = b.block
    b.branch(answer)
    b.position_at_end(answer)
    outcome = b.phi(I64, name="outcome")
    outcome.add_incoming(c64(-1), start)
    outcome.add_incoming(c64(-1), call)
    outcome.add_incoming(code, checked_end)
    from_int = b.inttoptr(word(PLAN_FROM_INT), ir.FunctionType(I8P, [I64]).as_pointer())
    b.ret(b.call(from_int, [outcome]))
    return fn


def define_checked_calls(module: ir.Module) -> None:
    """tl_checked_call and its Python entry."""
    define_python_call(module, define_checked_call(module))
