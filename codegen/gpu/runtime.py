"""gpu: PTX text + device pointers → kernels run on a CUDA device through the driver API (cuda.bindings).

What this module owns, per process:
* the driver: `cuda.bindings.driver` (the `[cuda]` extra), imported on first use only, so that
  `import tensorlang` stays light; `cuInit` once per process;
* one `Device` per ordinal: its primary context (retained once, the context PyTorch and CuPy use
  too, so their pointers are valid here), made current on the calling thread at each use, its
  PTX architecture (sm_<major><minor>) and a pool of device buffers;
* the loaded modules, keyed by (PTX hash, device): a PTX text is JIT-compiled by the driver once
  per device and process (cuModuleLoadDataEx), its entries looked up once (cuModuleGetFunction);
* every driver result checked: a failure becomes a TensorLangError whose message has the error's
  name and description (cuGetErrorName / cuGetErrorString, or the CUresult enum's name when the
  driver itself is missing), never a raw CUresult or tuple.

Fork: the state belongs to the process that made it. A forked child starts afresh (os.register_at_fork)
and never uses its parent's contexts, modules or buffers; CUDA itself cannot be used in a child
forked after the parent initialised it, which the child's first call reports as such.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensorlang.errors import TensorLangError

from .params import KernelParams

_INSTALL = "pip install 'tensorlang[cuda]'"
_MAX_GRID_X = 2**31 - 1
_POOL_KEEP_BYTES = 4 << 30  # free device memory a Device keeps for reuse before giving it back


class CudaUnavailable(TensorLangError):
    """No usable CUDA driver or GPU in this process (the message says which and why)."""


# ---------------------------------------------------------------------------- the driver module


def driver():
    """`cuda.bindings.driver`, imported on first use; CudaUnavailable when it is not installed."""
    try:
        from cuda.bindings import driver as module
    except ImportError as exc:
        raise CudaUnavailable(f"cuda-bindings is not installed ({_INSTALL})") from exc
    return module


def error_text(drv, err) -> str:
    """`NAME (description)` of a CUresult. Without a loaded driver (cuGetErrorName itself fails),
    the name comes from the bindings' CUresult enum, and a bare number from neither."""
    code = int(err)
    name = description = None
    try:
        got, text = drv.cuGetErrorName(err)[:2]
        if int(got) == 0 and text:
            name = text.decode() if isinstance(text, bytes) else str(text)
        got, text = drv.cuGetErrorString(err)[:2]
        if int(got) == 0 and text:
            description = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - the driver library is missing or broken: fall back below
        pass
    if name is None:
        try:
            name = drv.CUresult(code).name
        except Exception:  # noqa: BLE001 - a code the bindings do not know
            name = f"CUresult {code}"
    return f"{name} ({description})" if description else name


def check(drv, result, what: str):
    """The values of a driver call's result tuple `(CUresult, values...)`, or a TensorLangError
    naming `what` and the decoded error. One value is returned bare, none as None."""
    if not isinstance(result, tuple) or not result:
        raise TensorLangError(f"CUDA driver: {what}: unexpected result {result!r}")
    err = result[0]
    if int(err) != 0:
        hint = _FORK_HINT if _STATE.inherited else ""
        raise TensorLangError(f"CUDA driver: {what} failed: {error_text(drv, err)}{hint}")
    values = result[1:]
    return None if not values else values[0] if len(values) == 1 else values


def call(drv, function: str, *args, what: str | None = None):
    """`drv.<function>(*args)` checked; an exception raised by the bindings becomes a
    TensorLangError too (a driver library that cannot be loaded raises instead of returning)."""
    try:
        result = getattr(drv, function)(*args)
    except TensorLangError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the bindings raise reaches the user as ours
        raise TensorLangError(f"CUDA driver: {what or function} failed: {type(exc).__name__}: {exc}") from exc
    return check(drv, result, what or function)


# ---------------------------------------------------------------------------- process state


@dataclass
class _Process:
    pid: int
    inherited: bool = False  # forked from a process that had initialised CUDA
    initialised: bool = False
    failure: str | None = None  # why cuInit failed (remembered: it fails the same way again)
    lock: threading.Lock = field(default_factory=threading.Lock)
    devices: dict[int, Device] = field(default_factory=dict)
    modules: dict[tuple[str, int], Module] = field(default_factory=dict)


_STATE = _Process(os.getpid())
_FORK_HINT = (
    "; this process was forked after its parent initialised CUDA, which CUDA does not support: "
    "start workers with the 'spawn' or 'forkserver' method"
)


def _after_fork_in_child() -> None:
    global _STATE
    _STATE = _Process(os.getpid(), inherited=_STATE.initialised or _STATE.inherited)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _state() -> _Process:
    state = _STATE
    if state.pid != os.getpid():  # a fork the hook did not see (os.fork from C, say)
        _after_fork_in_child()
        state = _STATE
    return state


def _initialise(drv, state: _Process) -> None:
    """cuInit once per process (called with the state's lock held)."""
    if state.initialised:
        return
    if state.failure is not None:
        raise CudaUnavailable(state.failure)
    try:
        call(drv, "cuInit", 0, what="cuInit")
    except TensorLangError as exc:
        reason = f"no usable CUDA driver or GPU: {exc}"
        if state.inherited and _FORK_HINT not in reason:
            reason += _FORK_HINT
        state.failure = reason
        raise CudaUnavailable(reason) from exc
    state.initialised = True


def unavailable_reason() -> str | None:
    """Why no kernel can run on device 0 in this process, or None when one can."""
    try:
        device(0)
    except CudaUnavailable as exc:
        return str(exc)
    except TensorLangError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------- devices and memory


@dataclass(frozen=True)
class Buffer:
    """A device allocation of `nbytes` (rounded) at `ptr`, owned by a Device's pool."""

    ptr: int
    nbytes: int


class Device:
    """One GPU: its primary context, architecture and buffer pool (made by `device()`)."""

    def __init__(self, drv, ordinal: int):
        self.drv = drv
        self.ordinal = ordinal
        count = call(drv, "cuDeviceGetCount", what="cuDeviceGetCount")
        if not 0 <= ordinal < int(count):
            raise CudaUnavailable(f"no CUDA device {ordinal}: this machine has {int(count)}")
        self.handle = call(drv, "cuDeviceGet", ordinal, what=f"cuDeviceGet({ordinal})")
        self.context = call(drv, "cuDevicePrimaryCtxRetain", self.handle, what="cuDevicePrimaryCtxRetain")
        attr = drv.CUdevice_attribute
        major = call(
            drv, "cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle
        )
        minor = call(
            drv, "cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle
        )
        self.arch = f"sm_{int(major)}{int(minor)}"
        name = call(drv, "cuDeviceGetName", 256, self.handle, what="cuDeviceGetName")
        self.name = name.split(b"\0")[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        self._free: dict[int, list[int]] = {}  # rounded size → free allocations
        self._kept = 0
        self._pool_lock = threading.Lock()
        self._zeroed: list[Buffer] = []  # error records known to hold zeros (read back so)
        self._unread: int | None = None

    def __repr__(self) -> str:
        return f"<cuda device {self.ordinal}: {self.name}, {self.arch}>"

    def activate(self) -> None:
        """Make the primary context current on the calling thread (each call may come from
        another thread; the context stays current there, as PyTorch leaves it)."""
        call(self.drv, "cuCtxSetCurrent", self.context, what="cuCtxSetCurrent")

    def alloc(self, nbytes: int) -> Buffer:
        size = _rounded(nbytes)
        with self._pool_lock:
            free = self._free.get(size)
            if free:
                self._kept -= size
                return Buffer(free.pop(), size)
        try:
            ptr = call(self.drv, "cuMemAlloc", size, what=f"cuMemAlloc({size} bytes)")
        except TensorLangError:
            self.trim(0)  # give the pool's memory back and try once more
            ptr = call(self.drv, "cuMemAlloc", size, what=f"cuMemAlloc({size} bytes)")
        return Buffer(int(ptr), size)

    def release(self, buf: Buffer) -> None:
        """Back to the pool (the caller has synchronised the stream that used it)."""
        with self._pool_lock:
            self._free.setdefault(buf.nbytes, []).append(buf.ptr)
            self._kept += buf.nbytes
            over = self._kept > _POOL_KEEP_BYTES
        if over:
            self.trim(_POOL_KEEP_BYTES // 2)

    def trim(self, keep: int) -> None:
        """Free pooled allocations until at most `keep` bytes stay."""
        with self._pool_lock:
            victims = []
            for size in sorted(self._free, reverse=True):
                while self._free[size] and self._kept > keep:
                    victims.append(self._free[size].pop())
                    self._kept -= size
        for ptr in victims:
            call(self.drv, "cuMemFree", self.drv.CUdeviceptr(ptr), what="cuMemFree")

    def error_record(self, stream: int) -> Buffer:
        """A zeroed 32-byte error record: one that a call read back as zeros, else a new one
        cleared on `stream` (each driver call costs tens of microseconds on some hosts: a
        call should not spend one clearing a record that is known to be clear)."""
        with self._pool_lock:
            if self._zeroed:
                return self._zeroed.pop()
        buf = self.alloc(ERROR_RECORD_BYTES)
        self.memset(buf.ptr, ERROR_RECORD_BYTES, stream)
        return buf

    def unread_error_record(self) -> int:
        """The record passed to kernels that never read or write theirs (gpu/fastcall.py)."""
        if self._unread is None:
            with self._pool_lock:
                if self._unread is None:
                    self._unread = int(call(self.drv, "cuMemAlloc", ERROR_RECORD_BYTES, what="cuMemAlloc"))
        return self._unread

    def return_error_record(self, buf: Buffer, zero: bool) -> None:
        """After the call's stream is done with it; `zero`: the call read it back as zeros."""
        if not zero:
            self.release(buf)
            return
        with self._pool_lock:
            self._zeroed.append(buf)

    # ------------------------------------------------------------------ copies, launches, streams

    def memset(self, ptr: int, nbytes: int, stream: int) -> None:
        if nbytes:
            d = self.drv
            call(
                d,
                "cuMemsetD8Async",
                d.CUdeviceptr(ptr),
                0,
                nbytes,
                d.CUstream(stream),
                what="cuMemsetD8Async",
            )

    def to_device(self, ptr: int, host_address: int, nbytes: int, stream: int) -> None:
        if nbytes:
            d = self.drv
            call(d, "cuMemcpyHtoDAsync", d.CUdeviceptr(ptr), host_address, nbytes, d.CUstream(stream),
                 what="cuMemcpyHtoDAsync")  # fmt: skip

    def to_host(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        if nbytes:
            d = self.drv
            call(d, "cuMemcpyDtoHAsync", host_address, d.CUdeviceptr(ptr), nbytes, d.CUstream(stream),
                 what="cuMemcpyDtoHAsync")  # fmt: skip

    def to_host_and_wait(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        """Copy to the host once everything queued on `stream` is done, and return then: one
        synchronous copy on the legacy default stream (0), else a copy and a synchronise."""
        if stream == 0:
            d = self.drv
            call(d, "cuMemcpyDtoH", host_address, d.CUdeviceptr(ptr), nbytes, what="cuMemcpyDtoH")
            return
        self.to_host(host_address, ptr, nbytes, stream)
        self.synchronize(stream)

    def synchronize(self, stream: int) -> None:
        call(self.drv, "cuStreamSynchronize", self.drv.CUstream(stream), what="cuStreamSynchronize")

    def launch(self, function, grid: int, block: int, params: KernelParams, stream: int, what: str) -> None:
        """One 1-D launch of `grid` blocks of `block` threads (what the GridMapping plans)."""
        if not 1 <= grid <= _MAX_GRID_X or not 1 <= block <= 1024:
            raise TensorLangError(f"{what}: a grid of {grid} x {block} threads is beyond CUDA's limits")
        d = self.drv
        call(d, "cuLaunchKernel", function, grid, 1, 1, block, 1, 1, 0, d.CUstream(stream), params.address, 0,
             what=f"cuLaunchKernel({what})")  # fmt: skip

    def pointer_device(self, ptr: int) -> int | None:
        """The ordinal of the device holding `ptr` (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL), or None."""
        d = self.drv
        try:
            return int(
                call(
                    d,
                    "cuPointerGetAttribute",
                    d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    d.CUdeviceptr(ptr),
                )  # fmt: skip
            )
        except TensorLangError:
            return None


#: a call's error record: [code, check id, dim, value] as int64 (gpu/lower.py _run_thread)
ERROR_RECORD_BYTES = 32


def _rounded(nbytes: int) -> int:
    """Allocation sizes: at least 256 bytes, then powers of two up to 1 MiB and whole MiB beyond,
    so that the pool finds a buffer again for the next call of the same kernel."""
    n = max(256, int(nbytes))
    if n <= 1 << 20:
        return 1 << (n - 1).bit_length()
    return -(-n // (1 << 20)) << 20


def device(ordinal: int = 0) -> Device:
    """The Device of this ordinal (initialised once per process, thread-safe), made current."""
    drv = driver()
    state = _state()
    found = state.devices.get(ordinal)
    if found is None:
        with state.lock:
            _initialise(drv, state)
            found = state.devices.get(ordinal)
            if found is None:
                found = state.devices[ordinal] = Device(drv, ordinal)
    found.activate()
    return found


# ---------------------------------------------------------------------------- modules


@dataclass
class Module:
    """A PTX module loaded on one device; `function(name)` looks an entry up once."""

    device: Device
    handle: object
    functions: dict[str, object] = field(default_factory=dict)

    def function(self, name: str):
        found = self.functions.get(name)
        if found is None:
            found = self.functions[name] = call(
                self.device.drv, "cuModuleGetFunction", self.handle, name.encode(),
                what=f"cuModuleGetFunction({name})",
            )  # fmt: skip
        return found


def ptx_key(ptx: str) -> str:
    return hashlib.sha256(ptx.encode()).hexdigest()


def load_module(dev: Device, ptx: str, digest: str | None = None) -> Module:
    """The module of this PTX (whose ptx_key is `digest`, if known) on `dev`: JIT-compiled by the
    driver once per process and device. Modules stay loaded for the life of the process (one per
    kernel specialisation)."""
    state = _state()
    key = (digest or ptx_key(ptx), dev.ordinal)
    found = state.modules.get(key)
    if found is not None:
        return found
    with state.lock:
        found = state.modules.get(key)
        if found is None:
            image = ptx.encode() + b"\0"
            try:
                try:
                    handle = call(dev.drv, "cuModuleLoadDataEx", image, 0, [], [])
                except TensorLangError as exc:
                    if not isinstance(exc.__cause__, TypeError):
                        raise
                    # bindings that want the empty option lists in another form: the plain call
                    handle = call(dev.drv, "cuModuleLoadData", image)
            except TensorLangError as exc:
                raise TensorLangError(
                    f"{exc}; the driver could not JIT-compile tensorlang's PTX for {dev.arch} (a compiler "
                    "bug, or a driver older than the PTX version LLVM emitted: see inspect('ptx'))"
                ) from exc
            found = state.modules[key] = Module(dev, handle)
    return found


def launch_phases(
    dev: Device, module: Module, entries: Sequence[tuple[str, int, int]], params: KernelParams, stream: int
) -> None:
    """Launch each (entry, grid, block) in order on `stream` with the same parameters."""
    for name, grid, block in entries:
        dev.launch(module.function(name), grid, block, params, stream, name)
