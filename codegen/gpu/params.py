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
    values: tuple[ctypes._SimpleCData, ...]
    pointers: ctypes.Array

    @property
    def address(self) -> int:
        return ctypes.addressof(self.pointers)


def pack(args: Sequence[tuple[str, int | float]]) -> KernelParams:
    """(PTX type, value) per parameter, in the entry's order."""
    values = []
    for kind, value in args:
        if kind not in _CTYPES:
            raise ValueError(f"no packing for a .param .{kind}")
        values.append(_CTYPES[kind](value))
    pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return KernelParams(tuple(k for k, _ in args), tuple(values), pointers)


def pack_pointers(pointers: Sequence[int], error: int) -> KernelParams:
    """The lowering's signature: one u64 device pointer per layout tensor, then the error record."""
    return pack([("u64", int(p)) for p in pointers] + [("u64", int(error))])


_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)")


def entry_params(ptx: str) -> dict[str, tuple[str, ...]]:
    """Each `.entry`'s parameter types as the PTX declares them (`{"tl_mm_phase0": ("u64", ...)}`)."""
    return {m.group(1): tuple(_PARAM.findall(m.group(2))) for m in _ENTRY.finditer(ptx)}
