"""runtime: a call signature that passed every check before → FastCall, the few steps a repeated small call needs.

A cached call through Kernel.__call__ checks and binds its arguments, looks up shapes and
machine code, sets up storage and dispatches phases: about 15 µs, most of it Python. A small
kernel called in a loop repeats the same signature — the same input types, dtypes, contiguity
and shapes — so its first successful call leaves a FastCall keyed by the input shapes: the
specialisation, where each input and allocated array goes in the pointer array, and what to
allocate. A call matching it (NumPy arrays of exactly the declared dtypes, C-contiguous, these
shapes; `out=` arrays that can be written directly; no keyword sizes) then allocates the other
outputs, fills the pointer array and
runs the phases: inline (run_inline, below) when every phase runs on the calling thread anyway
and the kernel needs no scratch memory, else through parallel.run_phases with this one pointer
array for every thread. Only kernels with no relayout, shared storage or temporary kept in a
thread's workspace or between calls (scratch.py), and no output accumulated without
initialisation (that warns on every call) get one: the behaviour is the full path's.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..planning.runs import PhasePlan
from . import scratch
from .parallel import _NEVER_ADDRESS, INT64_MAX, INT64_MIN, run_phases, runs_inline
from .specialise import Specialisation, shared_bytes

_BYTE = ctypes.c_char


def address(array: np.ndarray) -> int:
    """The address of an array's data: through the buffer protocol (a third of `.ctypes.data`'s
    cost), or `.ctypes.data` for read-only or empty arrays."""
    try:
        return ctypes.addressof(_BYTE.from_buffer(array))
    except (TypeError, ValueError):
        return array.ctypes.data


@dataclass(frozen=True)
class FastCall:
    spec: Specialisation = field(repr=False)
    sizes: tuple[int, ...]  # the key of the kernel's specialisation cache
    buffer_count: int
    input_slots: tuple[int, ...]  # each input's index in the pointer array
    allocations: tuple[tuple[int, tuple[int, ...], np.dtype], ...]  # (slot, shape, dtype), outputs first
    outputs: tuple[str, ...]  # the outputs' names, in the def's order
    input_shapes: tuple[tuple[int, ...], ...] = ()  # the signature: each input's shape and dtype
    input_dtypes: tuple[np.dtype, ...] = ()
    # (slot, name, shape, dtype) of each temporary kept between calls (scratch.kept)
    kept: tuple[tuple[int, str, tuple[int, ...], np.dtype], ...] = ()
    # (bytes, slots) of each allocation that temporaries never live together share (spec.sharing)
    shared: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # (index, PYTHON_FLOAT or NUMPY_SCALAR) of each 0-d input given as a number, not an array
    scalars: tuple[tuple[int, str], ...] = ()
    # the kernel's Options.thread_count: a signature whose phases split dispatches natively for
    # the count it had when its NativeCall was made (nativecall.py), and asks again each call
    thread_count: Callable[[], int] | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def native(self):
        """The NativeCall that checks and runs this signature in one native call, or None (also
        for kept temporaries and shared storage, which it does not allocate)."""
        from .nativecall import native_call

        if not self.input_shapes or self.kept or self.shared:
            return None
        return native_call(self, self.input_shapes, self.input_dtypes)

    @functools.cached_property
    def output_names(self) -> frozenset[str]:
        return frozenset(self.outputs)

    def run(
        self, inputs: Sequence[np.ndarray], out: object, threads: Callable[[], int] = lambda: 1
    ) -> tuple[int, np.ndarray, object] | None:
        """Run the kernel into `out` (as `out=` takes it), allocating the other outputs:
        (status code, error details, the result as __call__ returns it). None, having run
        nothing, when `out` needs the full path: an array that is not a C-contiguous, writable
        NumPy array of the output's dtype and shape, or one whose memory may overlap an input's
        or another output's (the full path checks exactly, and reports). `threads` gives the
        thread count, asked only when a phase may split (it reads the environment: ~0.6 µs)."""
        given = self._out_arrays(out)
        if given is None:
            return None
        if self.scalars:
            inputs = list(inputs)
            for i, _ in self.scalars:
                inputs[i] = scalar_as_array(inputs[i], self.input_dtypes[i])
                if inputs[i] is None:
                    return None
        try:  # a pointer array of this signature not in use (a signal handler's call may nest)
            pointers, pointers_address = self._pointer_arrays.pop()
        except IndexError:
            pointers = (ctypes.c_void_p * self.buffer_count)()
            pointers_address = ctypes.addressof(pointers)
        where = address
        spans = []
        for slot, array in zip(self.input_slots, inputs):
            start = pointers[slot] = where(array)
            spans.append((start, start + array.nbytes))
        made = []
        for (slot, shape, dtype), array in zip(self.allocations, given):
            if array is None:
                array = np.empty(shape, dtype)
                start = where(array)
            else:  # a caller's array: memory bounds against every input and earlier output
                start = where(array)
                stop = start + array.nbytes
                for other_start, other_stop in spans:  # (a loop: cheaper than any() here)
                    if start < other_stop and other_start < stop:
                        self._pointer_arrays.append((pointers, pointers_address))
                        return None
                spans.append((start, stop))
            pointers[slot] = start
            made.append(array)
        spec = self.spec
        for nbytes, slots in self.shared:  # as specialise.shared_views: one allocation, per call
            array = np.empty(nbytes, np.uint8)
            made.append(array)  # (kept alive until the call returns)
            for slot in slots:
                pointers[slot] = where(array)
        if self.kept:  # as the full path: the idle set if no other call holds it, else new ones
            idle, keep = spec.scratch.take(), {}
            for slot, name, shape, dtype in self.kept:
                keep[name] = scratch.buffer(idle, name, shape, dtype, False)
                pointers[slot] = where(keep[name])
        if self.inline:
            code, error = run_inline(spec.code.entry, pointers_address, spec.params_address, spec.plans)
        else:  # every thread's pointer array is this one: no temporary lives in a workspace
            code, error = run_phases(
                spec.code.entry,
                lambda _: pointers_address,
                spec.params_address,
                spec.plans,
                threads(),
                spec.workspaces,
                spec.clock,
            )
        self._pointer_arrays.append((pointers, pointers_address))
        if self.kept:
            spec.scratch.give_back(keep)
        result = made[0] if len(self.outputs) == 1 else tuple(made[: len(self.outputs)])
        return code, error, result

    def _out_arrays(self, out: object) -> list | tuple | None:
        """One array or None per allocation (outputs, then temporaries), or None when `out`
        holds something the fast path does not take."""
        if out is None:
            return self.nothing_given
        if type(out) is dict:
            if not out.keys() <= self.output_names:
                return None
            arrays = [out.get(name) for name in self.outputs]
        elif type(out) is np.ndarray:
            arrays = [out]
        elif isinstance(out, list | tuple):
            arrays = list(out)
        else:
            return None
        if len(arrays) != len(self.outputs):
            return None
        for array, (_, shape, dtype) in zip(arrays, self.allocations):
            if array is None:
                continue
            if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape:
                return None
            flags = array.flags
            if not (flags.c_contiguous and flags.writeable):
                return None
        return arrays + self.temporaries_given

    @functools.cached_property
    def _pointer_arrays(self) -> list[tuple[ctypes.Array, int]]:
        """Pointer arrays (and their addresses) free for a call: one per call in flight, reused
        instead of built per call. Taken by pop and given back by append, both atomic."""
        return []

    @functools.cached_property
    def inline(self) -> bool:
        """Every phase on the calling thread, no scratch memory: run_inline's few steps."""
        return runs_inline(self.spec.plans) and not self.spec.workspaces.nbytes

    @functools.cached_property
    def nothing_given(self) -> tuple[None, ...]:
        return (None,) * len(self.allocations)

    @functools.cached_property
    def temporaries_given(self) -> list[None]:
        return [None] * (len(self.allocations) - len(self.outputs))


def fast_call(
    spec: Specialisation,
    sizes: tuple[int, ...],
    inputs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    outputs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    temporaries: Sequence[tuple[str, tuple[int, ...], np.dtype]],
) -> FastCall | None:
    """The FastCall of a specialisation (inputs, outputs and temporaries with their shapes and
    dtypes; temporaries of scratch.kept sizes are kept between calls, those spec.sharing
    assigns share an allocation), or None when it needs the full path."""
    if spec.layouts or spec.contracted:
        return None
    slot = {name: i for i, name in enumerate(spec.buffers)}
    # shared temporaries are never folded (planning: plan_buffer_sharing): storage shape = shape
    sizes_of = shared_bytes(spec.sharing, temporaries)
    shared = tuple(
        (n, tuple(slot[name] for name, _, _ in temporaries if spec.sharing.get(name) == index))
        for index, n in sorted(sizes_of.items())
    )
    temporaries = [t for t in temporaries if t[0] not in spec.sharing]
    per_call = [t for t in temporaries if not scratch.kept(t[1], t[2])]
    kept = tuple(
        (slot[name], name, shape, dtype) for name, shape, dtype in temporaries if scratch.kept(shape, dtype)
    )
    allocations = tuple((slot[name], shape, dtype) for name, shape, dtype in (*outputs, *per_call))
    return FastCall(
        spec,
        sizes,
        len(spec.buffers),
        tuple(slot[n] for n, _, _ in inputs),
        allocations,
        tuple(n for n, _, _ in outputs),
        tuple(shape for _, shape, _ in inputs),
        tuple(dtype for _, _, dtype in inputs),
        kept,
        shared,
    )


PYTHON_FLOAT, NUMPY_SCALAR = "float", "scalar"  # a 0-d input's key when it is not an array


def signature(inputs: Sequence[object], dtypes: Sequence[np.dtype]) -> tuple | None:
    """The key of a kernel's FastCalls: each input's shape when it is a C-contiguous NumPy array
    of its declared dtype; PYTHON_FLOAT for a Python float given to a floating-point input;
    NUMPY_SCALAR for a NumPy scalar of exactly the declared dtype (a 0-d input takes both; the
    full path decides that once, for the signature)."""
    if len(inputs) != len(dtypes):
        return None
    key = []
    for value, dtype in zip(inputs, dtypes):
        kind = type(value)
        if kind is np.ndarray:
            if value.dtype != dtype or not value.flags.c_contiguous:
                return None
            key.append(value.shape)
        elif kind is float and dtype.kind == "f":
            key.append(PYTHON_FLOAT)
        elif kind is dtype.type and kind is not np.ndarray:
            key.append(NUMPY_SCALAR)
        else:
            return None
    return tuple(key)


def keyed(key: tuple | None, keyword_sizes: dict[str, object]) -> tuple | None:
    """The key of a call with sizes given by keyword: its input signature `key` and the sizes,
    when each is a Python int (a NumPy integer, say, takes the full path, which checks it); the
    tag keeps it apart from a signature without keyword sizes."""
    if key is None or any(type(v) is not int for v in keyword_sizes.values()):
        return None
    return ("sizes", key, tuple(sorted(keyword_sizes.items())))


def scalar_as_array(value: object, dtype: np.dtype) -> np.ndarray | None:
    """A 0-d array holding a Python float or NumPy scalar, or None where the full path must
    judge it (a float the dtype cannot represent: it reports)."""
    if type(value) is not float:
        return np.asarray(value)
    with np.errstate(over="ignore", under="ignore"):
        array = np.array(value, dtype)
    # as arguments._python_number: a finite number becoming inf, or a non-zero one 0, is an error
    held = float(array)
    if (held in (np.inf, -np.inf) and value not in (np.inf, -np.inf)) or (held == 0.0 and value != 0.0):
        return None
    return array


def for_call(
    spec: Specialisation,
    interface,
    sizes,
    shapes,
    input_shapes,
    thread_count: Callable[[], int] | None = None,
) -> FastCall | None:
    """The FastCall of a call with these input shapes that just ran through the full path (None
    where it needs that path: see fast_call; also for `+=` without `!`, which warns or zeroes on
    every call)."""
    if interface.uninitialised:
        return None

    def described(tensors):
        return [
            (t.name, spec.storage_shape(t.name, shapes[t.name]), np.dtype(t.dtype.numpy_name))
            for t in tensors
        ]

    fast = fast_call(
        spec,
        tuple(sizes[s] for s in interface.sizes),
        [
            (t.name, () if isinstance(shape, str) else shape, np.dtype(t.dtype.numpy_name))
            for t, shape in zip(interface.inputs, input_shapes)
        ],
        described(interface.outputs),
        described(interface.temporaries),
    )
    if fast is None:
        return None
    scalars = tuple((i, shape) for i, shape in enumerate(input_shapes) if isinstance(shape, str))
    return dataclasses.replace(fast, scalars=scalars, thread_count=thread_count)


_inline_error = threading.local()


def inline_error_record() -> tuple[np.ndarray, int]:
    """This thread's error record and its address, reused (written only on an error, read before
    the thread calls again)."""
    record = getattr(_inline_error, "record", None)
    if record is None:
        error = np.zeros(4, dtype=np.int64)
        record = _inline_error.record = (error, error.ctypes.data)
    return record


def run_inline(entry, buffers: int, params: int, plans: tuple[PhasePlan, ...]) -> tuple[int, np.ndarray]:
    """run_phases for plans that `runs_inline` and a kernel without scratch memory, minus the
    bookkeeping: a cached call of a small kernel is a few microseconds."""
    error, error_ptr = inline_error_record()
    for plan in plans:
        code = entry(buffers, params, error_ptr, plan.index, INT64_MIN, INT64_MAX, 0, _NEVER_ADDRESS)
        if code:
            return code, error
    return 0, error
