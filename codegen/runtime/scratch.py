"""runtime: a specialisation's large temporaries → one set of buffers kept for its next call, instead of fresh pages at every call."""

from __future__ import annotations

import threading

import numpy as np

# A temporary of this many bytes or more is kept between calls. glibc maps an allocation this
# large afresh each time (32 MiB is the ceiling of its mmap threshold) and returns it to the
# system when it is freed: every call then faults its pages in again and the system zeroes them
# (NumPy asks for huge pages: 2 MiB zeroed per fault). heat-3d 256³ folds B to 2 planes of 64 MiB:
# 134 MB zeroed per call. Smaller temporaries come back from glibc's heap without faults.
KEEP_BYTES = 32 << 20


class Scratch:
    """The idle buffers of one specialisation's kept temporaries: at most one set, taken by a
    call and given back when it ends (a call running meanwhile, from another Python thread,
    allocates its own). Never blocks: a lock held elsewhere (another thread, or a thread that
    no longer exists in a forked child) reads as no idle set and drops a set given back."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: dict[str, np.ndarray] | None = None

    def take(self) -> dict[str, np.ndarray]:
        if not self._lock.acquire(blocking=False):
            return {}
        try:
            idle, self._idle = self._idle, None
        finally:
            self._lock.release()
        return idle or {}

    def give_back(self, buffers: dict[str, np.ndarray]) -> None:
        if not buffers or not self._lock.acquire(blocking=False):
            return
        try:
            if self._idle is None:
                self._idle = buffers
        finally:
            self._lock.release()


def kept(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether a temporary of this storage shape and dtype is kept between calls."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize >= KEEP_BYTES


def buffer(
    idle: dict[str, np.ndarray], name: str, shape: tuple[int, ...], dtype: np.dtype, zeroed: bool
) -> np.ndarray:
    """The storage of temporary `name`: the idle buffer of that shape and dtype (zeroed again
    when the program reads it before writing it), else a new one."""
    old = idle.get(name)
    if old is not None and old.shape == shape and old.dtype == dtype:
        if zeroed:
            old.fill(0)
        return old
    return (np.zeros if zeroed else np.empty)(shape, dtype=dtype)
