"""runtime: a FastCall and its input signature → NativeCall, the repeated small call checked and run by one native entry.

FastCall (fastcall.py) already skips binding, shape inference and the phase bookkeeping, but
still checks each array in Python and calls the kernel through ctypes once per phase: about
5 µs for an 8-element add. Here the checks and the phases run in `tl_checked_call`
(emit/callentry.py), compiled once per process (from the disk cache when it is there), against a
plan of the signature built once; Python only picks the output arrays and calls a builtin
function bound to the plan (`tl_checked_call_python`, METH_FASTCALL: ~0.04 µs, where a ctypes
call cost 0.35 µs).

The native code reads CPython tuples and NumPy arrays at fixed offsets. Before it is ever used,
`_layout_holds` reads those offsets on sample objects and compares what it finds with what
Python reports (data address, rank, shape, descriptor, flags, tuple items); where anything
differs (another NumPy, a debug build), there is no NativeCall and FastCall does the work.
Only FastCalls that run inline (every phase on the calling thread, no scratch memory) get one:
kernels small enough for the call's cost to matter. Their temporaries are allocated per call,
as FastCall allocates them.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import numpy as np

from ..emit.callentry import (
    ARRAY_DATA,
    ARRAY_DESCR,
    ARRAY_FLAGS,
    ARRAY_RANK,
    ARRAY_SHAPE,
    CHECKED_CALL,
    HEADER_WORDS,
    KIND_ARRAY,
    KIND_INLINE,
    KIND_NARROWED,
    MAX_BUFFERS,
    MAX_RANK,
    NUMBER_VALUE,
    OB_TYPE,
    PHASE_WORDS,
    PLAN_ARRAY_TYPE,
    PLAN_BUFFERS,
    PLAN_CANCEL,
    PLAN_DISPATCH,
    PLAN_ENTRY,
    PLAN_FROM_INT,
    PLAN_INPUTS,
    PLAN_OUTPUTS,
    PLAN_PARAMS,
    PLAN_PHASES,
    PLAN_RESTORE,
    PLAN_SAVE,
    PLAN_TUPLE_TYPE,
    PLAN_WORKSPACE,
    PYTHON_CALL,
    REC_DESCR,
    REC_FLAGS,
    REC_KIND,
    REC_NBYTES,
    REC_RANK,
    REC_SHAPE,
    REC_SLOT,
    REC_TYPE,
    RECORD_WORDS,
    TUPLE_ITEMS,
    TUPLE_SIZE,
)
from . import native_pool
from .dispatch_records import dispatch_records
from .fastcall import NUMPY_SCALAR, PYTHON_FLOAT, inline_error_record
from .parallel import _NEVER_ADDRESS

C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x1, 0x100, 0x400  # NumPy's NPY_ARRAY_* flag bits

METH_FASTCALL = 0x0080  # CPython's calling convention: f(self, PyObject *const *args, nargs)


class _MethodDef(ctypes.Structure):
    """CPython's PyMethodDef."""

    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


def _new_function():
    """PyCFunction_NewEx(def, self, module) → a new builtin function object (a prototype of our
    own: ctypes.pythonapi's function objects are shared with every other user of ctypes)."""
    prototype = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
    return prototype(("PyCFunction_NewEx", ctypes.pythonapi))


def _address(obj: object) -> int:
    """Where an object lives (a py_object's storage is the object's address)."""
    return ctypes.c_void_p.from_buffer(ctypes.py_object(obj)).value


def _word(address: int, offset: int) -> int:
    return ctypes.c_int64.from_address(address + offset).value


def _int32(address: int, offset: int) -> int:
    return ctypes.c_int32.from_address(address + offset).value


def _array_reads_as(array: np.ndarray) -> bool:
    at = _address(array)
    flags = array.flags
    expected = (
        (C_CONTIGUOUS, flags.c_contiguous),
        (ALIGNED, flags.aligned),
        (WRITEABLE, flags.writeable),
    )
    shape_at = _word(at, ARRAY_SHAPE)
    return (
        _word(at, OB_TYPE) == _address(np.ndarray)
        and _word(at, ARRAY_DATA) == array.__array_interface__["data"][0]
        and _int32(at, ARRAY_RANK) == array.ndim
        and all(_word(shape_at, 8 * d) == n for d, n in enumerate(array.shape))
        and _word(at, ARRAY_DESCR) == _address(array.dtype)
        and all(bool(_int32(at, ARRAY_FLAGS) & bit) == value for bit, value in expected)
    )


def _layout_holds() -> bool:
    """Whether tuples and arrays sit in memory as emit/callentry.py reads them."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    grid = np.arange(35, dtype=np.float32).reshape(5, 7)
    frozen = np.ones(3)
    frozen.setflags(write=False)
    samples = (grid, grid[:, ::2], grid[1:], frozen, np.empty((0, 4), np.int64), np.zeros((), np.float64))
    pair = (grid, frozen)
    return (
        all(_array_reads_as(a) for a in samples)
        and _word(_address(pair), TUPLE_SIZE) == 2
        and _word(_address(pair), TUPLE_ITEMS + 8) == _address(frozen)
        # arrays of a builtin dtype share its descriptor, which the plan records
        and _address(np.empty(2, np.float32).dtype) == _address(np.dtype(np.float32))
        and all(_holds(number, ctype) for number, ctype in _NUMBERS)
    )


# numbers and how their objects hold their values at NUMBER_VALUE
_NUMBERS = (
    (-2.5, ctypes.c_double),
    (np.float64(0.1), ctypes.c_double),
    (np.float32(-3.25), ctypes.c_float),
    (np.int32(-7), ctypes.c_int32),
    (np.int64(2**40 + 3), ctypes.c_int64),
    (np.uint8(200), ctypes.c_uint8),
    (np.bool_(True), ctypes.c_bool),
)


def _holds(number: object, ctype) -> bool:
    return ctype.from_address(_address(number) + NUMBER_VALUE).value == number


class _Code:
    """tl_checked_call's machine code (compiled once, kept in the disk cache) and the method
    definition of its Python entry, never freed: every bound entry points at both."""

    def __init__(self):
        from ..emit.callentry import define_checked_calls
        from ..lowering.jit import cached_functions

        parts = {
            "record_words": RECORD_WORDS,
            "header": HEADER_WORDS,
            "phase_words": PHASE_WORDS,
            "python_entry": METH_FASTCALL,
        }
        self.engine, self.ref, address = cached_functions(
            "checked-call", parts, define_checked_calls, (CHECKED_CALL, PYTHON_CALL)
        )
        self.method = _MethodDef(PYTHON_CALL.encode(), address[PYTHON_CALL], METH_FASTCALL, None)
        self.new_function = _new_function()
        self.from_int = ctypes.cast(ctypes.pythonapi.PyLong_FromLongLong, ctypes.c_void_p).value

    def bind(self, plan: np.ndarray):
        """The entry as a builtin function of (inputs, outputs, error record), its self the plan."""
        return self.new_function(ctypes.addressof(self.method), plan, None)


_code: _Code | None = None
_code_failed = False
_code_lock = threading.Lock()


def _checked_call() -> _Code | None:
    """The native entry's code, or None where it cannot be used."""
    global _code, _code_failed
    if _code is None and not _code_failed:
        with _code_lock:
            if _code is None and not _code_failed:
                try:
                    if _layout_holds():
                        _code = _Code()
                        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_code))  # outlives module teardown
                except Exception:  # noqa: BLE001 — no native entry: FastCall does the work
                    _code = None
                _code_failed = _code is None
    return _code


class NativeCall:
    """One signature's plan and the native entry that checks a call against it and runs it."""

    def __init__(
        self,
        fast,
        input_shapes: Sequence[tuple[int, ...]],
        input_dtypes: Sequence[np.dtype],
        code: _Code,
        dispatch=None,
    ):
        spec = fast.spec
        # a signature whose phases split: its records (dispatch_records.py), built for one
        # thread count and one pool (a forked child has another: FastCall's path then)
        self.dispatch = dispatch
        self.threads = dispatch.threads if dispatch is not None else None
        self.thread_count = fast.thread_count if dispatch is not None else None
        self.pool = dispatch.pool if dispatch is not None else None
        self.fast = fast  # holds the machine code the plan points into
        self.outputs = fast.outputs
        self.output_names = fast.output_names
        self.made = tuple((shape, dtype) for _, shape, dtype in fast.allocations)
        # one output and no temporary: the common case, with the fewest steps
        self.single = len(self.made) == 1
        self.no_temporaries = (None,) * (len(self.made) - len(self.outputs))

        numbers = dict(fast.scalars)
        tensors = [
            (slot, shape, np.dtype(dtype), C_CONTIGUOUS | ALIGNED, numbers.get(i))
            for i, (slot, shape, dtype) in enumerate(zip(fast.input_slots, input_shapes, input_dtypes))
        ] + [
            (slot, shape, dtype, C_CONTIGUOUS | ALIGNED | WRITEABLE, None)
            for slot, shape, dtype in fast.allocations
        ]
        plan = np.zeros(HEADER_WORDS + RECORD_WORDS * len(tensors) + PHASE_WORDS * len(spec.plans), np.int64)
        plan[PLAN_ENTRY] = ctypes.cast(spec.code.entry, ctypes.c_void_p).value
        plan[PLAN_PARAMS] = spec.params_address
        plan[PLAN_CANCEL] = _NEVER_ADDRESS
        plan[PLAN_PHASES] = len(spec.plans)
        plan[PLAN_BUFFERS] = fast.buffer_count
        plan[PLAN_INPUTS] = len(fast.input_slots)
        plan[PLAN_OUTPUTS] = len(fast.allocations)
        plan[PLAN_FROM_INT] = code.from_int
        plan[PLAN_TUPLE_TYPE] = _address(tuple)
        plan[PLAN_ARRAY_TYPE] = _address(np.ndarray)
        for i, (slot, shape, dtype, flags, number) in enumerate(tensors):
            record = plan[HEADER_WORDS + RECORD_WORDS * i :]
            record[REC_KIND] = number_kind(number, dtype)
            record[REC_TYPE] = _address(
                {PYTHON_FLOAT: float, NUMPY_SCALAR: dtype.type}.get(number, np.ndarray)
            )
            record[REC_DESCR] = _address(np.dtype(dtype))
            record[REC_RANK] = len(shape)
            record[REC_NBYTES] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            record[REC_SLOT] = slot
            record[REC_FLAGS] = flags
            record[REC_SHAPE : REC_SHAPE + len(shape)] = shape
        phases = plan[HEADER_WORDS + RECORD_WORDS * len(tensors) :].reshape(-1, PHASE_WORDS)
        phases[:, 0] = [p.index for p in spec.plans]
        if dispatch is not None:
            phases[:, 1] = dispatch.addresses
            plan[PLAN_WORKSPACE] = dispatch.workspace
            plan[PLAN_DISPATCH] = dispatch.pool.code.dispatch if dispatch.pool is not None else 0
            # the GIL is let go while the phases run (the arrays stay referenced by the caller)
            plan[PLAN_SAVE] = ctypes.cast(ctypes.pythonapi.PyEval_SaveThread, ctypes.c_void_p).value
            plan[PLAN_RESTORE] = ctypes.cast(ctypes.pythonapi.PyEval_RestoreThread, ctypes.c_void_p).value
        self.plan = plan
        self.call = code.bind(plan)  # holds the plan

    def run(self, inputs: tuple, out: object) -> tuple[int, np.ndarray, object] | None:
        """As FastCall.run: (code, error details, result), or None having run nothing when this
        call is not of this signature or `out` is not one of the simple forms (or, for a split
        signature, the thread count or the process's pool changed, or another call of it runs)."""
        if self.dispatch is not None and (
            (self.pool is not None and native_pool._pool is not self.pool)
            or self.thread_count() != self.threads
        ):
            return None
        if out is None:
            if self.single:
                shape, dtype = self.made[0]
                made = (np.empty(shape, dtype),)
            else:
                made = tuple([np.empty(shape, dtype) for shape, dtype in self.made])
        elif type(out) is dict:
            if self.single:
                if len(out) != 1 or (array := out.get(self.outputs[0])) is None:
                    return None
                made = (array,)
            else:
                if not out.keys() <= self.output_names:
                    return None
                made = self._with_temporaries([out.get(name) for name in self.outputs])
        elif type(out) is np.ndarray and len(self.outputs) == 1:
            made = (out,) if self.single else self._with_temporaries([out])
        elif type(out) in (tuple, list) and len(out) == len(self.outputs):
            made = self._with_temporaries(out)
        else:
            return None
        error = inline_error_record()[0]
        code = self.call(inputs, made, error)
        if code < 0:
            return None
        return code, error, made[0] if len(self.outputs) == 1 else made[: len(self.outputs)]

    def _with_temporaries(self, given: Sequence[np.ndarray | None]) -> tuple[np.ndarray, ...]:
        """The outputs given (None: allocate one), then the temporaries, all allocated."""
        return tuple(
            [
                np.empty(shape, dtype) if array is None else array
                for array, (shape, dtype) in zip([*given, *self.no_temporaries], self.made)
            ]
        )


def number_kind(number: str | None, dtype: np.dtype) -> int | None:
    """How the native entry reads an input given as `number` (fastcall's key; None: an array),
    or None where it cannot (a Python float for a half-precision input)."""
    if number is None:
        return KIND_ARRAY
    if number == NUMPY_SCALAR or dtype == np.float64:
        return KIND_INLINE
    return KIND_NARROWED if dtype == np.float32 else None


def native_call(fast, input_shapes, input_dtypes) -> NativeCall | None:
    """The NativeCall of a FastCall, or None where it takes FastCall's path."""
    if (
        any(number_kind(number, input_dtypes[i]) is None for i, number in fast.scalars)
        or fast.buffer_count > MAX_BUFFERS
        or any(len(s) > MAX_RANK for s in (*input_shapes, *(a[1] for a in fast.allocations)))
    ):
        return None
    dispatch = None
    if not fast.inline:
        if fast.thread_count is None:
            return None
        dispatch = dispatch_records(fast.spec, fast.thread_count())
        if dispatch is None:
            return None
    code = _checked_call()
    return NativeCall(fast, input_shapes, input_dtypes, code, dispatch) if code is not None else None
