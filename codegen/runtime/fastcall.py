"""runtime: a call signature that passed every check before → FastCall, the few steps a repeated small call needs.

A cached call through Kernel.__call__ checks and binds its arguments, looks up shapes and
machine code, sets up storage and dispatches phases: about 15 µs, most of it Python. A small
kernel called in a loop repeats the same signature — the same input types, dtypes, contiguity
and shapes — so its first successful call leaves a FastCall keyed by the input shapes: the
specialisation, where each input and allocated array goes in the pointer array, and what to
allocate. A call matching it (NumPy arrays of exactly the declared dtypes, C-contiguous, these
shapes; no `out=`, no keyword sizes) then allocates its outputs, fills the pointer array and
runs the phases inline (parallel.run_inline). Only kernels whose every phase runs on the calling
thread anyway, with no scratch memory, relayout or shared storage, and no output accumulated
without initialisation (that warns on every call) get one: the behaviour is the full path's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .parallel import run_inline, runs_inline
from .specialise import Specialisation

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
    output_count: int

    def run(self, inputs: Sequence[np.ndarray]) -> tuple[int, np.ndarray, object]:
        """Run the kernel: (status code, error details, the result as __call__ returns it)."""
        addresses = [0] * self.buffer_count
        for slot, array in zip(self.input_slots, inputs):
            addresses[slot] = address(array)
        made = []
        for slot, shape, dtype in self.allocations:
            array = np.empty(shape, dtype)
            addresses[slot] = address(array)
            made.append(array)
        pointers = (ctypes.c_void_p * self.buffer_count)(*addresses)
        spec = self.spec
        code, error = run_inline(spec.code.entry, ctypes.addressof(pointers), spec.params_address, spec.plans)
        result = made[0] if self.output_count == 1 else tuple(made[: self.output_count])
        return code, error, result


def fast_call(
    spec: Specialisation,
    sizes: tuple[int, ...],
    inputs: Sequence[str],
    outputs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    temporaries: Sequence[tuple[str, tuple[int, ...], np.dtype]],
) -> FastCall | None:
    """The FastCall of a specialisation (inputs by name; outputs and temporaries with their
    shapes and dtypes), or None when it needs the full path."""
    if (
        spec.layouts
        or spec.sharing
        or spec.contracted
        or spec.workspaces.nbytes
        or not runs_inline(spec.plans)
    ):
        return None
    slot = {name: i for i, name in enumerate(spec.buffers)}
    allocations = tuple((slot[name], shape, dtype) for name, shape, dtype in (*outputs, *temporaries))
    return FastCall(spec, sizes, len(spec.buffers), tuple(slot[n] for n in inputs), allocations, len(outputs))
