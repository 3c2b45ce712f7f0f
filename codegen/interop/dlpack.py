"""interop: a call argument of another array library (DLPack, `__array__`) → a NumPy array on the same memory.

The rules (README, "Inputs"):
- a NumPy array is used as it is;
- an object with `__dlpack__` (PyTorch, JAX, CuPy, NumPy itself) is viewed with `np.from_dlpack`,
  without a copy, after `__dlpack_device__()` says it lives in CPU memory (DLPack device type 1);
  any other device is an ArgumentError that names the input and the device;
- otherwise an object with `__array__` is converted with `np.asarray` (which may copy);
- for `out=`, the array must be a view of the object's own memory: a DLPack view, or an
  `__array__` that returns the same memory twice (an object whose `__array__` makes a copy would
  silently lose the results, so it is refused).
Nested lists are not handled here: runtime/arguments.py converts them with the declared type.
"""

from __future__ import annotations

import numpy as np

from tensorlang.errors import ArgumentError

CPU = 1  # DLPack's kDLCPU
_DEVICES = {
    1: "CPU",
    2: "CUDA",
    3: "CUDA host (pinned)",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm host",
    12: "extension device",
    13: "CUDA managed",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
    17: "MAIA",
}


def is_array_like(value: object) -> bool:
    """Whether `value` is something `to_array` can view or convert (not a list)."""
    return isinstance(value, np.ndarray) or hasattr(value, "__dlpack__") or hasattr(value, "__array__")


def device_text(device: object) -> str:
    try:
        kind, index = device  # type: ignore[misc]
        kind = int(kind)
    except (TypeError, ValueError):
        return repr(device)
    return f"{_DEVICES.get(kind, 'an unknown device')} (DLPack device type {kind}, device {index})"


def to_array(value: object, what: str, *, for_output: bool = False) -> np.ndarray:
    """A NumPy array viewing (or, for `__array__` inputs, converted from) `value`.

    `what` names the argument in errors ("mm: input A", "mm: out= for C")."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        array = _from_dlpack(value, what)
        if not for_output or array.flags.writeable:
            return array
        # a read-only DLPack view: writable only if the object's __array__ gives the same memory
        if hasattr(value, "__array__"):
            other = _from_array(value, what)
            if other.flags.writeable and _same_memory(array, other):
                return other
        return array  # check_out_buffer reports it read-only
    if hasattr(value, "__array__"):
        array = _from_array(value, what)
        if for_output and array.size and not _same_memory(array, _from_array(value, what)):
            raise ArgumentError(
                f"{what}: {type(value).__name__}.__array__ returns a copy, so results written there "
                f"would be lost; pass a NumPy array or an object with __dlpack__"
            )
        return array
    raise ArgumentError(
        f"{what} must be an array (a NumPy array, or an object with __dlpack__ or __array__), "
        f"got {type(value).__name__}"
    )


def _from_dlpack(value: object, what: str) -> np.ndarray:
    device_of = getattr(value, "__dlpack_device__", None)
    if device_of is not None:
        try:
            device = device_of()
        except Exception as exc:  # noqa: BLE001 -- a foreign object's failure, reported as the user's
            raise ArgumentError(f"{what}: {type(value).__name__}.__dlpack_device__() failed: {exc}") from exc
        try:
            on_cpu = int(device[0]) == CPU
        except (TypeError, ValueError, IndexError):
            on_cpu = False
        if not on_cpu:
            raise ArgumentError(
                f"{what} is a {type(value).__name__} on {device_text(device)}; tensorlang kernels run "
                f"on the CPU: move it to CPU memory first (for PyTorch, .cpu())"
            )
    try:
        return np.from_dlpack(value)
    except Exception as exc:  # noqa: BLE001 -- BufferError, TypeError, RuntimeError by producer
        if getattr(value, "requires_grad", False):  # torch refuses to export these
            raise ArgumentError(
                f"{what} is a {type(value).__name__} that requires grad: pass .detach() (a kernel "
                f"call is not recorded by autograd; tensorlang.torch.op makes an op that is)"
            ) from exc
        dtype = getattr(value, "dtype", None)
        detail = f" (dtype {dtype})" if dtype is not None else ""
        raise ArgumentError(
            f"{what}: cannot view the {type(value).__name__}{detail} through DLPack: {exc}"
        ) from exc


def _from_array(value: object, what: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 -- whatever a foreign __array__ raises
        raise ArgumentError(
            f"{what}: converting the {type(value).__name__} with __array__ failed: {exc}"
        ) from exc
    if array.dtype == object:
        raise ArgumentError(
            f"{what}: the {type(value).__name__}'s __array__ gives Python objects, not numbers"
        )
    return array


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
    )
