"""runtime: call arguments → checked contiguous arrays, bound sizes and output buffers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorlang.errors import ArgumentError

if TYPE_CHECKING:  # calls read the Interface (runtime/interface.py), which has ir's shape
    from tensorlang import ir

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def _describe(tensor: ir.Tensor) -> str:
    dims = ", ".join(str(d) for d in tensor.shape)
    return f"{tensor.dtype}({dims}) {tensor.name}" if tensor.shape else f"{tensor.dtype} {tensor.name}"


def as_input_array(value: object, tensor: ir.Tensor, program: ir.Program) -> np.ndarray:
    """A C-contiguous array of exactly the declared dtype and rank (copied if strided)."""
    expected = np.dtype(tensor.dtype.numpy_name)
    # NumPy scalars (np.float64 subclasses float) follow the array rule: their dtype must match
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic) and not tensor.shape:
        return _python_number(value, tensor, program, expected)
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise ArgumentError(
            f"{program.name}: input {tensor.name} must be a NumPy array ({_describe(tensor)}), got {type(value).__name__}"
        )
    if value.dtype != expected:
        raise ArgumentError(
            f"{program.name}: input {tensor.name} expected type {tensor.dtype} but found {value.dtype} "
            f"(tensorlang never casts silently; convert with .astype(np.{expected.name}))"
        )
    if value.ndim != tensor.rank:
        raise ArgumentError(
            f"{program.name}: input {tensor.name} expected a tensor with {tensor.rank} dimensions "
            f"but found {value.ndim} dimensions (shape {value.shape}); declared as {_describe(tensor)}"
        )
    return np.ascontiguousarray(value)


def _python_number(
    value: bool | int | float, tensor: ir.Tensor, program: ir.Program, expected: np.dtype
) -> np.ndarray:
    """A Python number for a 0-d input: of the same kind, and representable in the declared type."""
    kind_ok = (
        (isinstance(value, bool) and tensor.dtype.is_bool)
        or (isinstance(value, int) and not isinstance(value, bool) and tensor.dtype.is_integer)
        or (isinstance(value, float) and tensor.dtype.is_float)
    )
    if not kind_ok:
        raise ArgumentError(
            f"{program.name}: input {tensor.name} is {_describe(tensor)}, got Python {type(value).__name__} {value!r}"
        )
    if tensor.dtype.is_integer:
        info = np.iinfo(expected)
        if not info.min <= value <= info.max:
            raise ArgumentError(f"{program.name}: input {tensor.name} ({tensor.dtype}) cannot hold {value}")
        return np.array(value, dtype=expected)
    if tensor.dtype.is_float:
        with np.errstate(over="ignore", under="ignore"):
            converted = np.array(value, dtype=expected)
        # rounding is expected; a finite number becoming inf, or a non-zero one becoming 0, is not
        overflow = np.isfinite(value) and not np.isfinite(converted)
        underflow = value != 0.0 and converted == 0
        if overflow or underflow:
            info = np.finfo(expected)
            raise ArgumentError(
                f"{program.name}: input {tensor.name} ({tensor.dtype}) cannot represent {value!r}: "
                f"it would become {converted.item()!r} (the range of {tensor.dtype} is "
                f"{float(info.smallest_subnormal):.3g} to {float(info.max):.6g} in magnitude)"
            )
        return converted
    return np.array(value, dtype=expected)


def bind_sizes(program: ir.Program, arrays: Sequence[np.ndarray], dims) -> dict[str, int]:
    """Size symbol → value from the input shapes, checking constants and repeated symbols;
    `dims` gives, per input and dimension, ("const", n) or ("size", name) (Interface.input_dims)."""
    sizes: dict[str, int] = {}
    origin: dict[str, tuple[str, int]] = {}
    for tensor, array, declared_dims in zip(program.inputs, arrays, dims):
        for d, ((kind, declared), actual) in enumerate(zip(declared_dims, array.shape)):
            if actual > _INT32_MAX:
                raise ArgumentError(
                    f"{program.name}: input {tensor.name} dimension {d} has size {actual}, beyond the int32 index range"
                )
            if kind == "const":
                if declared != actual:
                    raise ArgumentError(
                        f"{program.name}: input {tensor.name} dimension {d} is declared with constant size "
                        f"{declared} but found size {actual}"
                    )
                continue
            if declared in sizes and sizes[declared] != actual:
                first, first_dim = origin[declared]
                raise ArgumentError(
                    f"{program.name}: mismatched sizes for {declared}: {first} dimension {first_dim} gives "
                    f"{declared} = {sizes[declared]} but {tensor.name} dimension {d} has size {actual}"
                )
            if declared not in sizes:
                sizes[declared] = actual
                origin[declared] = (tensor.name, d)
    return sizes


@dataclass(frozen=True)
class OutputBuffer:
    """Where an output is computed (`work`) and where the caller wants it (`target`)."""

    work: np.ndarray
    target: np.ndarray | None  # the caller's array when it is not usable directly


def normalise_out(program: ir.Program, out: object) -> dict[str, np.ndarray]:
    """`out=` as {output name: array}; accepts a mapping or one entry per output (None = allocate)."""
    if out is None:
        return {}
    names = [t.name for t in program.outputs]
    if isinstance(out, np.ndarray):
        out = [out]
    if isinstance(out, Mapping):
        unknown = [k for k in out if k not in names]
        if unknown:
            raise ArgumentError(
                f"{program.name}: out= names {unknown} that are not outputs; outputs are {names}"
            )
        chosen = {k: v for k, v in out.items() if v is not None}
    elif isinstance(out, Sequence) and not isinstance(out, str | bytes):
        if len(out) != len(names):
            raise ArgumentError(
                f"{program.name}: out= needs one entry per output {names} (None to allocate), got {len(out)}"
            )
        chosen = {n: v for n, v in zip(names, out) if v is not None}
    else:
        raise ArgumentError(
            f"{program.name}: out= must be a mapping from output name to array, or a sequence"
        )
    for name, arr in chosen.items():
        if not isinstance(arr, np.ndarray):
            raise ArgumentError(
                f"{program.name}: out= for {name} must be a NumPy array, got {type(arr).__name__}"
            )
    return chosen


def check_out_buffer(
    program: ir.Program, tensor: ir.Tensor, arr: np.ndarray, shape: tuple[int, ...]
) -> OutputBuffer:
    expected = np.dtype(tensor.dtype.numpy_name)
    if arr.dtype != expected:
        raise ArgumentError(
            f"{program.name}: out= for {tensor.name} expected type {tensor.dtype} but found {arr.dtype}"
        )
    if arr.shape != shape:
        raise ArgumentError(
            f"{program.name}: out= for {tensor.name} expected shape {shape} but found {arr.shape}"
        )
    if not arr.flags.writeable:
        raise ArgumentError(f"{program.name}: out= for {tensor.name} is read-only")
    if arr.flags.c_contiguous:
        return OutputBuffer(arr, None)
    return OutputBuffer(np.ascontiguousarray(arr), arr)


def check_no_aliasing(
    program: ir.Program, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
) -> None:
    """Outputs may share memory neither with inputs nor with each other."""
    out_items = list(outputs.items())
    for i, (name, arr) in enumerate(out_items):
        for in_name, in_arr in inputs.items():
            if np.shares_memory(arr, in_arr):
                raise ArgumentError(
                    f"{program.name}: output {name} (out=) shares memory with input {in_name}; pass a separate array"
                )
        for other, other_arr in out_items[i + 1 :]:
            if np.shares_memory(arr, other_arr):
                raise ArgumentError(f"{program.name}: outputs {name} and {other} (out=) share memory")


def physical_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_allocation_sizes(
    program: ir.Program, shapes: Mapping[str, tuple[int, ...]], sizes_text: str
) -> None:
    """Refuse, before anything is compiled or allocated, tensors that cannot exist: an element
    count or byte size beyond 64 bits (any written tensor), or outputs larger than this machine's
    physical memory. Temporaries are not held to the memory limit: the fuser may contract them."""
    memory = physical_memory_bytes()
    output_bytes = 0
    for tensor in program.outputs + program.temporaries:
        shape = shapes[tensor.name]
        count = 1
        for extent in shape:
            count *= extent
        nbytes = count * np.dtype(tensor.dtype.numpy_name).itemsize
        described = f"{tensor.role} {tensor.name} would have shape {shape} ({sizes_text})"
        if count > _INT64_MAX or nbytes > _INT64_MAX:
            raise ArgumentError(
                f"{program.name}: {described}: {count} elements, more than a 64-bit size can count"
            )
        if tensor.role == "output":
            output_bytes += nbytes
            if memory is not None and nbytes > memory:
                raise ArgumentError(
                    f"{program.name}: {described}: {count} elements ({_bytes_text(nbytes)}), "
                    f"more than this machine's {_bytes_text(memory)} of memory"
                )
    if memory is not None and output_bytes > memory:
        raise ArgumentError(
            f"{program.name}: the outputs would need {_bytes_text(output_bytes)} together ({sizes_text}), "
            f"more than this machine's {_bytes_text(memory)} of memory"
        )


def _bytes_text(nbytes: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"
