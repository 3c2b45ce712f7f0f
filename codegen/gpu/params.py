"""gpu: launch argument values → cuLaunchKernel's kernelParams (an array of pointers to each value).

The NVPTX lowering (gpu/lower.py) gives every entry the same signature,
`tl_<def>_phase<n>(T0* t0, ..., Tk* tk, i64* error)`: one pointer per tensor of the kernel
layout (codegen.lowering.abi.kernel_layout: inputs, outputs, temporaries) and the error record,
all `.param .u64` in PTX. cuLaunchKernel copies each parameter from the address at its position
of `kernelParams`, with the size the PTX declares: a value of the wrong width is read silently
wrong, so the packing is checked against the PTX text in the tests (`entry_params`).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

_CTYPES = {
    "u64": ctypes.c_uint64,
    "b64": ctypes.c_uint64,
    "s64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "b32": ctypes.c_uint32,
    "s32": ctypes.c_int32,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}


@dataclass(frozen=True)
class KernelParams:
    """The packed values and the pointer array; `address` is what cuLaunchKernel takes. Holding
    this object keeps both alive until the launch has copied them (the driver copies at launch)."""

    kinds: tuple[str, ...]
    values: object  # the ctypes objects holding the values
    pointers: ctypes.Array

    @property
    def address(self) -> int:
        return ctypes.addressof(self.pointers)


@functools.cache
def _array(ctype, n: int):  # ctypes array types, made once per length (making one is slow)
    return ctype * max(1, n)


def pack(args: Sequence[tuple[str, int | float]]) -> KernelParams:
    """(PTX type, value) per parameter, in the entry's order."""
    values = []
    for kind, value in args:
        if kind not in _CTYPES:
            raise ValueError(f"no packing for a .param .{kind}")
        values.append(_CTYPES[kind](value))
    pointers = _array(ctypes.c_void_p, len(values))(*[ctypes.addressof(v) for v in values])
    return KernelParams(tuple(k for k, _ in args), tuple(values), pointers)


def pack_pointers(pointers: Sequence[int], error: int) -> KernelParams:
    """The lowering's signature: one u64 device pointer per layout tensor, then the error record
    (all 8 bytes wide: one array of values, and the address of each)."""
    n = len(pointers) + 1
    values = _array(ctypes.c_uint64, n)(*pointers, error)
    base = ctypes.addressof(values)
    cells = _array(ctypes.c_void_p, n)(*range(base, base + 8 * n, 8))
    return KernelParams(("u64",) * n, values, cells)


_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)")


def entry_params(ptx: str) -> dict[str, tuple[str, ...]]:
    """Each `.entry`'s parameter types as the PTX declares them (`{"tl_mm_phase0": ("u64", ...)}`)."""
    return {m.group(1): tuple(_PARAM.findall(m.group(2))) for m in _ENTRY.finditer(ptx)}
