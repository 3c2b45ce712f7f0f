"""gpu: a call argument → a DeviceView of CUDA memory (or None for host data); output arrays of the caller's kind.

Recognised as already on a GPU, and used in place (no copy when C-contiguous):
* PyTorch CUDA tensors (through `.detach().__cuda_array_interface__`; the device from `.device`);
* any object with `__cuda_array_interface__` (CuPy, Numba, JAX, ...; version 2 or 3; a producer
  `stream` is synchronised before the kernel reads the data; a `mask` is refused);
* any object with `__dlpack__` whose `__dlpack_device__()` is CUDA (2) or CUDA managed (13): the
  capsule's DLTensor is read with ctypes and kept alive for the call (never consumed).
Everything else is host data for runtime/arguments.py (NumPy, lists, numbers, CPU DLPack).

Outputs of a call with device inputs are made like its first device input: `torch.empty` on its
device for PyTorch, `cupy.empty` for CuPy, otherwise a `DeviceArray`, a minimal owner of device
memory that exposes `__cuda_array_interface__` (v3) and `.numpy()`.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from dataclasses import dataclass

import numpy as np

from tensorlang.errors import ArgumentError

CUDA, CUDA_MANAGED = 2, 13  # DLPack device types
_DL_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}  # DLDataTypeCode → NumPy kind (bfloat16, complex: no)


@dataclass(frozen=True)
class DeviceView:
    """CUDA memory as an array: `strides` in bytes (None when C-contiguous), `kind` the producer
    ("torch", "cupy", "cai", "dlpack", "tensorlang"), `owner` what keeps the memory alive."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: np.dtype
    device: int | None  # None: ask the driver (a generic __cuda_array_interface__)
    kind: str
    owner: object
    readonly: bool = False
    stream: int | None = None  # a producer stream to synchronise with first (CAI v3)

    @property
    def size(self) -> int:
        n = 1
        for extent in self.shape:
            n *= extent
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        return (
            self.strides is None
            or self.strides == _c_strides(self.shape, self.dtype.itemsize)
            or self.size <= 1
        )

    def span(self) -> tuple[int, int]:
        """[first, last + itemsize) byte offsets relative to ptr that the elements cover."""
        if self.strides is None or self.size == 0:
            return 0, self.nbytes
        lo = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return lo, hi + self.dtype.itemsize


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(1, extent)
    return tuple(reversed(strides))


def _is_torch(value: object) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "is_cuda")


def _is_cupy(value: object) -> bool:
    return type(value).__module__.split(".")[0] == "cupy"


def device_view(value: object, what: str) -> DeviceView | None:
    """The CUDA memory `value` lives in, or None when it is host data."""
    if isinstance(value, np.ndarray | list | tuple | int | float | bool | np.generic):
        return None
    if _is_torch(value):
        if not value.is_cuda:
            return None
        # the interface is read from a detached alias (torch refuses it on a tensor that requires
        # grad), but the owner is the caller's own tensor: `k(x, out=t) is t` must hold
        tensor = value.detach()
        view = from_cuda_array_interface(_interface(tensor, what), value, what, "torch")
        return _with(view, device=tensor.device.index or 0)
    if hasattr(type(value), "__cuda_array_interface__") or hasattr(value, "__cuda_array_interface__"):
        kind = "cupy" if _is_cupy(value) else "tensorlang" if isinstance(value, DeviceArray) else "cai"
        view = from_cuda_array_interface(_interface(value, what), value, what, kind)
        device = getattr(getattr(value, "device", None), "id", None) if kind == "cupy" else view.device
        return _with(view, device=device)
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            device_type, device_id = value.__dlpack_device__()
        except Exception as exc:  # noqa: BLE001 - a foreign object's failure, reported as the user's
            raise ArgumentError(f"{what}: {type(value).__name__}.__dlpack_device__() failed: {exc}") from exc
        if int(device_type) in (CUDA, CUDA_MANAGED):
            return from_dlpack(value, int(device_id), what)
    return None


def _with(view: DeviceView, **changes) -> DeviceView:
    from dataclasses import replace

    return replace(view, **changes)


def _interface(value: object, what: str) -> dict:
    try:
        cai = value.__cuda_array_interface__
    except Exception as exc:  # noqa: BLE001 - e.g. torch refuses tensors that require grad
        raise ArgumentError(
            f"{what}: cannot read {type(value).__name__}.__cuda_array_interface__: {exc}"
        ) from exc
    if not isinstance(cai, dict):
        raise ArgumentError(f"{what}: {type(value).__name__}.__cuda_array_interface__ is not a dict")
    return cai


def from_cuda_array_interface(cai: dict, owner: object, what: str, kind: str = "cai") -> DeviceView:
    """A DeviceView of a `__cuda_array_interface__` dict (version 2 or 3)."""
    try:
        shape = tuple(int(n) for n in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        ptr, readonly = cai["data"]
        strides = cai.get("strides")
        strides = None if strides is None else tuple(int(s) for s in strides)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArgumentError(f"{what}: a malformed __cuda_array_interface__ ({exc})") from exc
    if cai.get("mask") is not None:
        raise ArgumentError(f"{what}: masked CUDA arrays (__cuda_array_interface__ 'mask') are not supported")
    if strides is not None and len(strides) != len(shape):
        raise ArgumentError(f"{what}: __cuda_array_interface__ strides {strides} do not match shape {shape}")
    stream = cai.get("stream")
    return DeviceView(int(ptr or 0), shape, strides, dtype, None, kind, owner, bool(readonly),
                      None if stream is None else int(stream))  # fmt: skip


# ---------------------------------------------------------------------------- DLPack on CUDA


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):  # the first member of DLManagedTensor (DLPack < 1.0 capsules)
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def from_dlpack(value: object, device_id: int, what: str) -> DeviceView:
    """A DeviceView of a DLPack producer on a CUDA device. The capsule is read, not consumed
    (its name stays "dltensor"): the producer's destructor frees it when the view is dropped."""
    try:
        try:
            capsule = value.__dlpack__(stream=1)  # we launch on the legacy default stream
        except TypeError:
            capsule = value.__dlpack__()
        address = _get_pointer(capsule, b"dltensor")
    except Exception as exc:  # noqa: BLE001 - BufferError, TypeError, ValueError by producer
        raise ArgumentError(f"{what}: cannot read the {type(value).__name__} through DLPack: {exc}") from exc
    t = _DLTensor.from_address(address)
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if code not in _DL_KINDS or lanes != 1:
        raise ArgumentError(f"{what}: DLPack type (code {code}, {bits} bits, {lanes} lanes) is not supported")
    dtype = np.dtype("bool") if code == 6 else np.dtype(f"{_DL_KINDS[code]}{bits // 8}")
    shape = tuple(int(t.shape[d]) for d in range(t.ndim))
    strides = None if not t.strides else tuple(int(t.strides[d]) * dtype.itemsize for d in range(t.ndim))
    ptr = (t.data or 0) + int(t.byte_offset)
    return DeviceView(ptr, shape, strides, dtype, device_id, "dlpack", (value, capsule))


# ---------------------------------------------------------------------------- outputs


class DeviceArray:
    """Device memory a call allocated for an output when its device inputs were neither PyTorch
    nor CuPy: `__cuda_array_interface__` (v3, C-contiguous, no stream to wait for: the call has
    synchronised), `shape`, `dtype`, `device`, and `.numpy()` (a host copy). The memory goes back
    to tensorlang's pool when the object is collected."""

    def __init__(self, device, buffer, shape: tuple[int, ...], dtype: np.dtype):
        self._device = device
        self._buffer = buffer
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device = device.ordinal
        self._finalizer = weakref.finalize(self, _give_back, device, buffer)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self._buffer.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def numpy(self) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        self._device.activate()
        self._device.to_host(host.ctypes.data, self._buffer.ptr, self.nbytes, 0)
        self._device.synchronize(0)
        return host

    def __repr__(self) -> str:
        return f"<tensorlang.DeviceArray {self.dtype}{list(self.shape)} on cuda:{self.device}>"


def _give_back(device, buffer) -> None:
    try:
        device.release(buffer)
    except Exception:  # noqa: BLE001, S110 - at interpreter exit the driver may already be gone
        pass


def allocate_like(kind: str, device, shape: tuple[int, ...], dtype: np.dtype, zero: bool):
    """(the object returned to the caller, its DeviceView) for an output of a device call."""
    if kind == "torch" and "torch" in sys.modules:
        torch = sys.modules["torch"]
        make = torch.zeros if zero else torch.empty
        tensor = make(shape, dtype=torch_dtype(torch, dtype), device=f"cuda:{device.ordinal}")
        return tensor, device_view(tensor, "output")
    if kind == "cupy" and "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device.ordinal):
            array = (cupy.zeros if zero else cupy.empty)(shape, dtype)
        return array, device_view(array, "output")
    buffer = device.alloc(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    array = DeviceArray(device, buffer, shape, dtype)
    if zero:
        device.memset(buffer.ptr, array.nbytes, 0)
    return array, device_view(array, "output")


def torch_dtype(torch, dtype: np.dtype):
    return torch.from_numpy(np.empty(0, dtype)).dtype
