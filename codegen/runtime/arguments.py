"""runtime: call arguments → checked contiguous arrays, bound sizes and output buffers."""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorlang.errors import ArgumentError

from ..interop import dlpack
from .messages import sizes_text

if TYPE_CHECKING:  # calls read the Interface (runtime/interface.py), which has ir's shape
    from tensorlang import ir

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def _describe(tensor: ir.Tensor) -> str:
    dims = ", ".join(str(d) for d in tensor.shape)
    return f"{tensor.dtype}({dims}) {tensor.name}" if tensor.shape else f"{tensor.dtype} {tensor.name}"


def as_input_array(value: object, tensor: ir.Tensor, program: ir.Program) -> np.ndarray:
    """A C-contiguous array of exactly the declared dtype and rank (copied if strided).

    Accepted: NumPy arrays; objects with `__dlpack__` in CPU memory (viewed without a copy) or
    with `__array__` (interop/dlpack.py); nested lists and tuples of Python numbers of the
    declared kind (`_from_list`); a Python number for a 0-d input (`_python_number`)."""
    expected = np.dtype(tensor.dtype.numpy_name)
    # NumPy scalars (np.float64 subclasses float) follow the array rule: their dtype must match
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic) and not tensor.shape:
        return _python_number(value, tensor, program, expected)
    if isinstance(value, np.generic):
        value = np.asarray(value)
    what = f"{program.name}: input {tensor.name}"
    hint = f"convert with .astype(np.{expected.name})"
    if isinstance(value, list | tuple):
        value = _from_list(value, tensor, program, expected)
    elif not isinstance(value, np.ndarray):
        if not dlpack.is_array_like(value):
            raise ArgumentError(
                f"{what} must be an array ({_describe(tensor)}): a NumPy array, an object with "
                f"__dlpack__ or __array__, or a nested list; got {type(value).__name__}"
            )
        hint = f"convert it to {expected.name} first"
        value = dlpack.to_array(value, what)
    if value.dtype != expected:
        raise ArgumentError(
            f"{program.name}: input {tensor.name} expected type {tensor.dtype} but found {value.dtype} "
            f"(tensorlang never casts silently; {hint})"
        )
    if value.ndim != tensor.rank:
        raise ArgumentError(
            f"{program.name}: input {tensor.name} expected a tensor with {tensor.rank} dimensions "
            f"but found {value.ndim} dimensions (shape {value.shape}); declared as {_describe(tensor)}"
        )
    return np.ascontiguousarray(value)


def _element_kind_ok(element: object, tensor: ir.Tensor, expected: np.dtype) -> bool:
    if isinstance(element, np.generic):  # NumPy scalars follow the array rule
        return element.dtype == expected
    if isinstance(element, bool):
        return tensor.dtype.is_bool
    if isinstance(element, int):
        return tensor.dtype.is_integer
    if isinstance(element, float):
        return tensor.dtype.is_float
    return False


def _from_list(value: list | tuple, tensor: ir.Tensor, program: ir.Program, expected: np.dtype) -> np.ndarray:
    """A nested list (or tuple) converted with the declared type, under the Python-number rule:
    every element of the declared kind (bool for bool, int for integer types, float for
    floating-point types; a NumPy scalar of exactly the declared dtype) and representable
    (integers in range; floats neither overflowing to inf nor underflowing a non-zero to 0).
    A ragged list is an error."""
    what = f"{program.name}: input {tensor.name}"
    try:
        cells = np.array(value, dtype=object)
    except ValueError as exc:  # ragged at a level NumPy cannot hold as objects
        raise ArgumentError(f"{what}: a nested list that is not rectangular ({exc})") from exc
    kind = "bool" if tensor.dtype.is_bool else "int" if tensor.dtype.is_integer else "float"
    for index, element in np.ndenumerate(cells):
        if _element_kind_ok(element, tensor, expected):
            continue
        if isinstance(element, list | tuple):
            raise ArgumentError(f"{what}: a nested list that is not rectangular (element {index} is a list)")
        shown = f"{type(element).__name__} {element!r}"
        raise ArgumentError(
            f"{what} is {_describe(tensor)}: a list must hold Python {kind}s (tensorlang never casts "
            f"silently), but element {index} is {shown}"
        )
    if tensor.dtype.is_integer and cells.size:
        info = np.iinfo(expected)
        for index, element in np.ndenumerate(cells):
            if not info.min <= int(element) <= info.max:
                raise ArgumentError(f"{what} ({tensor.dtype}) cannot hold {element} (element {index})")
    with np.errstate(over="ignore", under="ignore"):
        array = cells.astype(expected)
    if tensor.dtype.is_float and cells.size:
        source = cells.astype(np.float64)
        bad = (np.isfinite(source) & ~np.isfinite(array)) | ((source != 0) & (array == 0))
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ArgumentError(
                f"{what} ({tensor.dtype}) cannot represent {cells[index]!r} (element {index}): it would "
                f"become {array[index].item()!r}"
            )
    return array.reshape(cells.shape)


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
    """`out=` as {output name: array}; accepts a mapping or one entry per output (None = allocate).
    An entry is a NumPy array or an object viewed through DLPack or `__array__` (interop/dlpack.py):
    the kernel writes into the object's own memory."""
    if out is None:
        return {}
    names = [t.name for t in program.outputs]
    if not isinstance(out, Mapping | list | tuple) and dlpack.is_array_like(out):
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
    arrays = {}
    for name, arr in chosen.items():
        if not dlpack.is_array_like(arr):
            raise ArgumentError(
                f"{program.name}: out= for {name} must be an array written in place (a NumPy array, or "
                f"an object with __dlpack__ or __array__), got {type(arr).__name__}"
            )
        arrays[name] = dlpack.to_array(arr, f"{program.name}: out= for {name}", for_output=True)
    return arrays


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


def shapes_for_sizes(name: str, program, requirements, shape_fns, sizes: Mapping[str, int]) -> dict:
    """Each output's and temporary's shape for these sizes, after the call-time requirements
    (each an (evaluate, requirement) pair, 0 when it holds) and the allocation limits."""
    for evaluate, requirement in requirements:
        value = evaluate(sizes)
        if value != 0:
            where = f" (line {requirement.span.line})" if requirement.span is not None else ""
            raise ArgumentError(
                f"{name}: with {sizes_text(sizes)}, {requirement.message}{where}; here it is {value}"
            )
    shapes = {}
    for t in program.outputs + program.temporaries:
        shape = tuple(fn(sizes) for fn in shape_fns[t.name])
        for d, extent in enumerate(shape):
            if extent < 0:
                raise ArgumentError(
                    f"{name}: {t.role} {t.name} dimension {d} would have negative size {extent} "
                    f"({t.shape[d]} with {sizes_text(sizes)})"
                )
        shapes[t.name] = shape
    check_allocation_sizes(program, shapes, sizes_text(sizes))
    return shapes


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


def bind_keyword_sizes(
    program: ir.Program, bound: dict[str, int], given: Mapping[str, object]
) -> dict[str, int]:
    """The sizes the inputs bound, with those given by keyword: each must be a size of the
    def, a non-negative integer within int32, and agree with the inputs where they give it
    too; every size must end up with a value."""
    for name, value in given.items():
        if name not in program.sizes:
            valid = ", ".join(program.sizes) or "none"
            raise ArgumentError(f"{program.name}: {name}= is not a size of the def (its sizes: {valid})")
        try:
            number = operator.index(value)  # ints and NumPy integers; not floats or bools
        except TypeError:
            number = None
        if (
            number is None or isinstance(value, bool) or not 0 <= number < 2**31
        ):  # int32 index bounds, as input dimensions
            raise ArgumentError(f"{program.name}: size {name} must be an integer in [0, 2^31), got {value!r}")
        if name in bound and bound[name] != number:
            raise ArgumentError(
                f"{program.name}: {name}={number} but the input shapes give {name} = {bound[name]}"
            )
        bound[name] = number
    missing = [s for s in program.sizes if s not in bound]
    if missing:
        raise ArgumentError(
            f"{program.name}: no input's shape gives the size{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}: pass {'them' if len(missing) > 1 else 'it'} by keyword, "
            f"as in k(..., {missing[0]}=8)"
        )
    return bound


def sizes_of_shapes(program: ir.Program, input_shapes: Sequence[tuple[int, ...]], dims) -> dict[str, int]:
    """The sizes inputs of these shapes bind, checked as a call binds them (nothing allocated)."""
    if len(input_shapes) != len(program.inputs):
        raise ArgumentError(
            f"{program.name}: expected {len(program.inputs)} input shapes, got {len(input_shapes)}"
        )
    for t, shape in zip(program.inputs, input_shapes):
        if len(shape) != t.rank:
            raise ArgumentError(
                f"{program.name}: input {t.name} has {t.rank} dimensions, not shape {tuple(shape)}"
            )
    shaped = [np.broadcast_to(np.empty((), np.uint8), tuple(shape)) for shape in input_shapes]
    return bind_keyword_sizes(program, bind_sizes(program, shaped, dims), {})
