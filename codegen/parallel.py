"""codegen: phases of a compiled kernel → calls on a thread pool (parallel loops split by iterations).

The JIT-compiled entry runs one phase at a time, optionally restricted to iterations [lo, hi) of
the phase's parallel outer loop. ctypes releases the GIL for the call, so a plain Python thread
pool runs chunks on all cores. Phases with little work run serially: a dispatch costs tens of
microseconds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .planning.plan import PhasePlan

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# statement instances below which a phase is not worth splitting across threads (a dispatch
# costs some 50 µs; a quarter million simple instances take about as long as a few dispatches)
MIN_PARALLEL_WORK = 1 << 18

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tensorlang")
            _pool_size = threads
        return _pool


def chunks(loop_range: tuple[int, int, int], parts: int) -> list[tuple[int, int]]:
    """Split the iterations of a loop into at most `parts` contiguous [lo, hi) ranges."""
    first, stop, step = loop_range
    count = max(0, -(-(stop - first) // step))
    parts = max(1, min(parts, count))
    bounds = [first + (count * p // parts) * step for p in range(parts + 1)]
    return [(bounds[p], bounds[p + 1]) for p in range(parts) if bounds[p] < bounds[p + 1]]


class Workspaces:
    """Scratch buffers (packed GEMM operands, contracted temporaries), 64-byte aligned. A call
    leases one per thread it runs and gives them back at the end, so calls of one kernel from
    several Python threads at once never share scratch memory; idle buffers are kept for reuse."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._idle: list[tuple[np.ndarray, int]] = []  # (buffer, aligned address)
        self._lock = threading.Lock()

    def lease(self, count: int) -> list[tuple[np.ndarray, int]]:
        if self.nbytes == 0:
            return [(None, 0)] * count
        with self._lock:
            taken = [self._idle.pop() for _ in range(min(count, len(self._idle)))]
        while len(taken) < count:
            buf = np.empty(self.nbytes + 64, dtype=np.uint8)
            taken.append((buf, (buf.ctypes.data + 63) // 64 * 64))
        return taken

    def give_back(self, leased: list[tuple[np.ndarray, int]]) -> None:
        if self.nbytes == 0:
            return
        with self._lock:
            self._idle.extend(leased)


def run_phases(
    entry, buffers_for, params, plans: tuple[PhasePlan, ...], threads: int, workspaces: Workspaces
) -> tuple[int, np.ndarray]:
    """Run every phase in order; return (error code, error details) of the first failure.

    `buffers_for(workspace)` gives the address of the tensor pointer array a thread with that
    workspace uses (contracted temporaries point into the thread's own workspace).
    """
    leased = workspaces.lease(1)
    try:
        return _run_phases(entry, buffers_for, params, plans, threads, workspaces, leased)
    finally:
        workspaces.give_back(leased)


def _run_phases(
    entry,
    buffers_for,
    params,
    plans: tuple[PhasePlan, ...],
    threads: int,
    workspaces: Workspaces,
    leased: list[tuple[np.ndarray, int]],
) -> tuple[int, np.ndarray]:
    error = np.zeros(4, dtype=np.int64)
    error_ptr = error.ctypes.data
    for plan in plans:
        pieces = []
        if threads > 1 and plan.loop_range is not None and plan.work >= MIN_PARALLEL_WORK:
            pieces = chunks(plan.loop_range, threads)
        if len(pieces) <= 1:
            ws = leased[0][1]
            code = entry(buffers_for(ws), params, error_ptr, plan.index, INT64_MIN, INT64_MAX, ws)
            if code:
                return code, error
            continue
        errors = [np.zeros(4, dtype=np.int64) for _ in pieces]
        pool = _executor(threads)
        if len(leased) < len(pieces):  # this call's workspaces: one per piece, kept until it ends
            leased.extend(workspaces.lease(len(pieces) - len(leased)))
        futures = [
            pool.submit(entry, buffers_for(ws), params, err.ctypes.data, plan.index, lo, hi, ws)
            for err, (lo, hi), (_, ws) in zip(errors, pieces, leased)
        ]
        codes = [f.result() for f in futures]
        for code, err in zip(codes, errors):
            if code:
                return code, err
    return 0, error
