"""gpu: a CudaKernel call's arguments → device buffers, launches of every phase, results (NumPy or device arrays).

One call, in order:
1. inputs checked as the CPU kernel checks them (runtime/arguments.py): count, dtype, rank,
   sizes bound from the shapes (device arrays contribute their shapes), keyword sizes, the
   call-time requirements and size preconditions (through the def's CPU Kernel, which shares
   them);
2. the mode: with any input already in CUDA memory (gpu/arrays.py), a *device call*: device
   inputs are used in place (copied on the device only when not C-contiguous), host inputs
   copied in, outputs allocated like the first device input (torch / cupy / DeviceArray) and
   returned on the device; otherwise a *host call*: NumPy in, NumPy out;
3. the kernel for these sizes and the device's architecture: plan, PTX, module (cached);
4. temporaries and the error record from the device's pool (a `+=` without `!` target zeroed),
   every phase launched in order on one stream (PyTorch's current stream in a device call with
   torch tensors, else the legacy default stream), a host call's results and then the error
   record read back, which waits for the stream: a call returns only when the GPU is done with
   every buffer. Few driver calls: an error record read back as zeros is reused without
   clearing, and on the default stream the last copy is the wait;
5. a failed run-time check (error[0] != 0) raises the same ArgumentError as on the CPU.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import numpy as np

from tensorlang.errors import ArgumentError, TensorLangWarning

from ..runtime import arguments as args_
from ..runtime import messages
from . import fastcall
from . import runtime as rt
from .arrays import DeviceView, allocate_like, device_view
from .params import pack_pointers


@dataclass
class _Shaped:  # what bind_sizes reads of an argument: its shape
    shape: tuple[int, ...]


@dataclass
class _Slot:
    """A tensor's device memory for this call; `fetch` copies it to a host array afterwards,
    `write_back` (a view) receives it when the caller's array could not be used in place."""

    ptr: int
    view: DeviceView | None = None
    fetch: np.ndarray | None = None
    write_back: object = None


def call(kernel, inputs: tuple, out: object, keyword_sizes: dict):
    interface = kernel.interface
    name = interface.name
    if len(inputs) != len(interface.inputs):
        names = ", ".join(t.name for t in interface.inputs)
        raise ArgumentError(
            f"{name}: expected {len(interface.inputs)} inputs ({names}) but found {len(inputs)}"
        )
    given: list[DeviceView | np.ndarray] = []
    for value, t in zip(inputs, interface.inputs):
        view = device_view(value, f"{name}: input {t.name}")
        given.append(
            args_.as_input_array(value, t, interface) if view is None else _checked(view, t, name, "input")
        )
    shaped = [_Shaped(g.shape) for g in given]
    sizes = args_.bind_keyword_sizes(
        interface, args_.bind_sizes(interface, shaped, interface.input_dims), keyword_sizes
    )
    shapes = kernel.shapes(sizes)
    requested = _requested_out(interface, out)
    _check_outputs(interface, requested, shapes, given)  # argument errors before any device work
    views = [g for g in given if isinstance(g, DeviceView)] + [
        r for r in requested.values() if isinstance(r, DeviceView)
    ]
    ordinal = _one_device(name, views)
    dev = rt.device(ordinal)
    kind = next((v.kind for v in given if isinstance(v, DeviceView)), None)  # None: a host call
    stream = _stream(kind, dev)
    spec = kernel.specialisation(sizes, dev.arch)
    module = rt.load_module(dev, spec.ptx, spec.digest)
    pooled: list[rt.Buffer] = []
    keep: list[object] = []  # host staging arrays alive until the copies are done
    error_buf: rt.Buffer | None = None
    error = np.zeros(4, np.int64)
    idle = False  # the stream has finished everything this call queued
    slots: dict[str, _Slot] = {}
    results: dict[str, object] = {}
    try:
        for v in views:  # producers' streams (CAI v3) first
            if v.stream is not None and v.stream != stream:
                dev.synchronize(v.stream)
        for t, g in zip(interface.inputs, given):
            slots[t.name] = _input_slot(dev, g, stream, pooled, keep)
        for t in interface.outputs:
            zero = t.name in interface.uninitialised
            if zero and t.name not in requested:
                warnings.warn(
                    f"{name}: output {t.name} is accumulated without initialisation (+= without !) and "
                    "no out= buffer was given; it starts from zeros",
                    TensorLangWarning,
                    stacklevel=3,  # the caller of CudaKernel.__call__
                )
            slots[t.name], results[t.name] = _output_slot(
                dev, t, shapes[t.name], requested.get(t.name), kind, zero, stream, pooled, keep
            )
        for t in interface.temporaries:
            shape = spec.storage[t.name]
            buf = _pooled(
                dev, int(np.prod(shape, dtype=np.int64)) * np.dtype(t.dtype.numpy_name).itemsize, pooled
            )
            if t.name in interface.uninitialised:
                dev.memset(buf.ptr, buf.nbytes, stream)
            slots[t.name] = _Slot(buf.ptr)
        error_buf = dev.error_record(stream)
        params = pack_pointers([slots[n].ptr for n in spec.tensors], error_buf.ptr)
        rt.launch_phases(dev, module, spec.launches, params, stream)
        for t in interface.outputs:  # a host call's results (garbage if a check failed: not read)
            slot = slots[t.name]
            if slot.fetch is not None:
                dev.to_host(slot.fetch.ctypes.data, slot.ptr, slot.fetch.nbytes, stream)
        # the error record last, and the wait for the stream with it: on the default stream one
        # driver call does both (each costs tens of microseconds on some hosts)
        dev.to_host_and_wait(error.ctypes.data, error_buf.ptr, rt.ERROR_RECORD_BYTES, stream)
        idle = True
        if error[0] != 0:
            raise messages.runtime_error(name, kernel.scop, int(error[0]), error)
        for t in interface.outputs:
            _write_back(slots[t.name], results, t.name)
    finally:
        # buffers go back to the pool only once the stream is done with them (copies from the
        # host, memsets and launches are asynchronous), also when the call failed half-way
        if not idle:
            try:
                dev.synchronize(stream)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pooled, error_buf = [], None  # the stream is in an unknown state: leak rather than reuse
        for buf in pooled:
            dev.release(buf)
        if error_buf is not None:
            dev.return_error_record(error_buf, zero=idle and not error.any())
    if out is None and not keyword_sizes and kind == "torch":  # the next such call can be quick
        fastcall.record(kernel, inputs, spec, module, shapes)
    values = tuple(results[t.name] for t in interface.outputs)
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------------------- argument checks


def _checked(view: DeviceView, t, name: str, role: str) -> DeviceView:
    expected = np.dtype(t.dtype.numpy_name)
    if view.dtype != expected:
        raise ArgumentError(
            f"{name}: {role} {t.name} expected type {t.dtype} but found {view.dtype} "
            f"(tensorlang never casts silently; convert it to {expected.name} first)"
        )
    if len(view.shape) != t.rank:
        raise ArgumentError(
            f"{name}: {role} {t.name} expected a tensor with {t.rank} dimensions but found "
            f"{len(view.shape)} dimensions (shape {view.shape})"
        )
    return view


def _requested_out(interface, out: object) -> dict[str, DeviceView | np.ndarray]:
    """out= as {output name: DeviceView or NumPy array} (NumPy through runtime/arguments.py)."""
    if out is None:
        return {}
    name = interface.name
    names = [t.name for t in interface.outputs]
    if device_view(out, f"{name}: out=") is not None:
        out = [out]
    if isinstance(out, dict):
        entries = dict(out)
    elif isinstance(out, list | tuple):
        if len(out) != len(names):
            raise ArgumentError(
                f"{name}: out= needs one entry per output {names} (None to allocate), got {len(out)}"
            )
        entries = dict(zip(names, out))
    else:
        entries = None
    device = {}
    if entries is not None:
        for key, value in list(entries.items()):
            view = device_view(value, f"{name}: out= for {key}") if key in names else None
            if view is not None:
                device[key] = view
                entries[key] = None
        if isinstance(out, list | tuple):
            entries = [entries[n] for n in names]
    host = args_.normalise_out(interface, entries if entries is not None else out)
    return {**host, **device}


def _check_outputs(interface, requested: dict, shapes: dict, given: list) -> None:
    name = interface.name
    for key, value in requested.items():
        t = interface.tensor(key)
        if isinstance(value, np.ndarray):
            args_.check_out_buffer(interface, t, value, shapes[key])
            continue
        _checked(value, t, name, "out= for")
        if value.shape != shapes[key]:
            raise ArgumentError(
                f"{name}: out= for {key} expected shape {shapes[key]} but found {value.shape}"
            )
        if value.readonly:
            raise ArgumentError(f"{name}: out= for {key} is read-only")
        if not value.contiguous and value.kind not in ("torch", "cupy"):
            raise ArgumentError(
                f"{name}: out= for {key} is a strided CUDA array that is neither a PyTorch tensor nor a "
                "CuPy array: it cannot be written in place; pass a C-contiguous one"
            )
    host_inputs = {t.name: g for t, g in zip(interface.inputs, given) if isinstance(g, np.ndarray)}
    host_outs = {k: v for k, v in requested.items() if isinstance(v, np.ndarray)}
    args_.check_no_aliasing(interface, host_inputs, host_outs)
    ranges = [(f"input {t.name}", g) for t, g in zip(interface.inputs, given) if isinstance(g, DeviceView)]
    outs = [(k, v) for k, v in requested.items() if isinstance(v, DeviceView)]
    for i, (key, view) in enumerate(outs):
        for other, seen in ranges + [(f"output {k}", v) for k, v in outs[i + 1 :]]:
            if _overlap(view, seen):
                raise ArgumentError(
                    f"{name}: output {key} (out=) shares memory with {other}; pass a separate array"
                )


def _overlap(a: DeviceView, b: DeviceView) -> bool:
    if not a.nbytes or not b.nbytes:
        return False
    (a0, a1), (b0, b1) = a.span(), b.span()
    return a.ptr + a0 < b.ptr + b1 and b.ptr + b0 < a.ptr + a1


def _one_device(name: str, views: list[DeviceView]) -> int:
    ordinals = set()
    for v in views:
        ordinals.add(v.device if v.device is not None else _pointer_device(v))
    if len(ordinals) > 1:
        raise ArgumentError(
            f"{name}: the CUDA arrays live on different devices ({sorted(ordinals)}); move them to one"
        )
    if ordinals:
        return ordinals.pop()
    import os

    return int(os.environ.get("TENSORLANG_CUDA_DEVICE", "0") or 0)


def _pointer_device(view: DeviceView) -> int:
    if not view.ptr:
        return 0
    found = rt.device(0).pointer_device(view.ptr)
    return 0 if found is None else found


def _stream(kind: str | None, dev) -> int:
    """PyTorch's current stream on this device in a call with torch tensors (its allocator and
    its kernels use it), else the legacy default stream (0)."""
    if kind == "torch" and "torch" in sys.modules:
        return int(sys.modules["torch"].cuda.current_stream(dev.ordinal).cuda_stream)
    return 0


# ---------------------------------------------------------------------------- buffers


def _pooled(dev, nbytes: int, pooled: list) -> rt.Buffer:
    buf = dev.alloc(nbytes)
    pooled.append(buf)
    return buf


def _input_slot(dev, g, stream: int, pooled: list, keep: list) -> _Slot:
    if isinstance(g, np.ndarray):  # host data (C-contiguous after as_input_array)
        buf = _pooled(dev, g.nbytes, pooled)
        keep.append(g)
        dev.to_device(buf.ptr, g.ctypes.data, g.nbytes, stream)
        return _Slot(buf.ptr)
    if g.contiguous:
        return _Slot(g.ptr, g)
    # a strided device array: gathered through the host (correct, not fast; PyTorch and CuPy
    # callers get the same by passing .contiguous() / cupy.ascontiguousarray first)
    lo, hi = g.span()
    raw = np.empty(hi - lo, np.uint8)
    dev.to_host(raw.ctypes.data, g.ptr + lo, hi - lo, stream)
    dev.synchronize(stream)
    host = np.ascontiguousarray(
        np.lib.stride_tricks.as_strided(
            raw[-lo:].view(g.dtype) if lo else raw.view(g.dtype), g.shape, g.strides
        )
        if g.size
        else np.empty(g.shape, g.dtype)
    )
    buf = _pooled(dev, host.nbytes, pooled)
    keep.append(host)
    dev.to_device(buf.ptr, host.ctypes.data, host.nbytes, stream)
    return _Slot(buf.ptr)


def _output_slot(dev, t, shape, requested, kind, zero: bool, stream: int, pooled: list, keep: list):
    dtype = np.dtype(t.dtype.numpy_name)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if isinstance(requested, DeviceView):
        if requested.contiguous:
            return _Slot(requested.ptr, requested), requested.owner
        buf = _pooled(dev, nbytes, pooled)  # computed contiguous, then copied into the caller's array
        _stage_in(dev, buf, requested, stream, keep)
        return _Slot(buf.ptr, requested, np.empty(shape, dtype), write_back=requested), requested.owner
    if isinstance(requested, np.ndarray) or kind is None:  # a host result
        host = requested if isinstance(requested, np.ndarray) else np.empty(shape, dtype)
        buf = _pooled(dev, nbytes, pooled)
        if isinstance(requested, np.ndarray) and zero:  # `+=` onto the caller's values
            staged = np.ascontiguousarray(requested)
            keep.append(staged)
            dev.to_device(buf.ptr, staged.ctypes.data, nbytes, stream)
        elif zero:
            dev.memset(buf.ptr, nbytes, stream)
        fetch = host if host.flags.c_contiguous else np.empty(shape, dtype)
        return _Slot(buf.ptr, None, fetch, write_back=None if fetch is host else host), host
    owner, view = allocate_like(kind, dev, shape, dtype, zero)
    return _Slot(view.ptr, view), owner


def _stage_in(dev, buf, view: DeviceView, stream: int, keep: list) -> None:
    """A strided out= array's current values into a contiguous buffer (a `+=` reads them)."""
    lo, hi = view.span()
    raw = np.empty(hi - lo, np.uint8)
    dev.to_host(raw.ctypes.data, view.ptr + lo, hi - lo, stream)
    dev.synchronize(stream)
    host = np.ascontiguousarray(
        np.lib.stride_tricks.as_strided(
            raw[-lo:].view(view.dtype) if lo else raw.view(view.dtype), view.shape, view.strides
        )
    )
    keep.append(host)
    dev.to_device(buf.ptr, host.ctypes.data, host.nbytes, stream)


def _write_back(slot: _Slot, results: dict, name: str) -> None:
    """Results the caller's array could not receive in place: a strided NumPy out=, or a strided
    device out= (through PyTorch's or CuPy's own copy, else element by element via the host)."""
    target = slot.write_back
    if target is None:
        return
    if isinstance(target, np.ndarray):
        target[...] = slot.fetch
        return
    owner = target.owner
    if target.kind == "torch":
        torch = sys.modules["torch"]
        owner.detach().copy_(torch.from_numpy(slot.fetch))  # in place, outside autograd
    elif target.kind == "cupy":
        owner[...] = sys.modules["cupy"].asarray(slot.fetch)
    else:  # refused before the launch (_check_outputs)
        raise AssertionError(f"out= for {name}: no way to write a strided {target.kind} array")
