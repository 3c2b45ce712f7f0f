"""runtime: a specialisation's large temporaries → one set of buffers, each in a mapping of its own, kept for its next call."""

from __future__ import annotations

import mmap
import threading

import numpy as np

# A temporary of this many bytes or more is kept between calls, in an anonymous mapping of its
# own (page-aligned, huge pages asked for). Per call, glibc either maps an allocation afresh
# (above its mmap threshold: every call faults its pages in and the system zeroes them; heat-3d
# 256³ folds B to 2 planes of 64 MiB, 134 MB zeroed a call) or, once its threshold has risen
# past the size, hands out memory of its brk heap, where the same kernel ran 1.6-1.8x slower:
# heat-3d 120³ T=50 (B 2 planes of 7 MiB) 19.8-22.4 ms a call on one thread from the heap,
# 11.4-12.9 ms from a mapping of its own, in the same process; which one a call got depended on
# what the process had freed before (README, *Large temporaries are kept between calls*).
KEEP_BYTES = 4 << 20


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
    return mapped(shape, np.dtype(dtype))


def mapped(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array in a private anonymous mapping of its own (unmapped when the array and its
    views are gone), huge pages asked for where the system has them; np.zeros elsewhere."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):
        return np.zeros(shape, dtype=dtype)
    try:
        region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # no mapping to be had (address space, a limit): NumPy's answer, MemoryError
        return np.zeros(shape, dtype=dtype)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel built without transparent huge pages: plain pages
            pass
    return np.frombuffer(region, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
