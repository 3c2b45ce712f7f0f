"""runtime: one call's pieces on pool threads → a cancel word they poll, the parts they claim, and how long the call took (parallel.run_phases' watching)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from ..lowering.status import ERROR_CANCELLED
from .native_pool import move_off as _move_off

POLL_S = 0.05  # how often a waiting thread wakes up to let Python run signal handlers


class Claims:
    """The [lo, hi) parts of one phase's loop that its pieces take in turn: iterating gives the
    parts nobody has taken yet, one at a time (thread-safe)."""

    def __init__(self, parts: list[tuple[int, int]]):
        self.parts = self._parts = parts
        self._next = 0
        self._lock = threading.Lock()

    def __iter__(self):
        while True:
            with self._lock:
                if self._next >= len(self._parts):
                    return
                part = self._parts[self._next]
                self._next += 1
            yield part

    def stop(self) -> None:
        """A piece failed: the others take no more parts."""
        with self._lock:
            self._next = len(self._parts)


class Watch:
    """One call's work on pool threads and the cancel word its generated code polls.

    A piece enters the kernel only while the word is clear, and is counted while inside, so that
    `stop()` knows when no thread touches the call's memory any more — also for pieces that were
    submitted but had not started, or whose future the interrupted thread never got hold of."""

    def __init__(self):
        self.word = np.zeros(1, dtype=np.int32)
        self.address = self.word.ctypes.data
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0

    def submit(self, executor: ThreadPoolExecutor, entry, args: tuple, ranges, away: int = -1) -> Future:
        """Run the piece on a pool thread, first moved off core `away` (the caller's) if on it."""
        return executor.submit(self._pooled, entry, args, ranges, away)

    def _pooled(self, entry, args: tuple, ranges, away: int) -> int:
        _move_off(away)
        return self.run(entry, args, ranges)

    def run(self, entry, args: tuple, ranges) -> int:
        """Run the piece: one call per [lo, hi) of `ranges` (a list, or Claims shared with the
        phase's other pieces; the args' own lo and hi replaced), checking the cancel word before
        each."""
        with self._cond:
            if self.word[0]:
                return ERROR_CANCELLED
            self._inside += 1
        try:
            buffers, params, error, phase, _, _, workspace, cancel = args
            for lo, hi in ranges:
                if self.word[0]:
                    return ERROR_CANCELLED
                code = entry(buffers, params, error, phase, lo, hi, workspace, cancel)
                if code:
                    if isinstance(ranges, Claims):
                        ranges.stop()
                    return code
            return 0
        finally:
            with self._cond:
                self._inside -= 1
                if self._inside == 0:
                    self._cond.notify_all()

    def results(self, futures: list[Future]) -> list[int]:
        """The pieces' return codes, waiting in short steps that signal handlers can interrupt."""
        codes = []
        for f in futures:
            while True:
                try:
                    codes.append(f.result(timeout=POLL_S))
                    break
                except FutureTimeout:
                    continue
        return codes

    def stop(self) -> None:
        """Set the cancel word and wait until no piece is inside the kernel. Further interrupts
        (Ctrl-C pressed again) are swallowed: returning earlier would free memory still in use."""
        while True:
            try:
                self.word[0] = 1
                with self._cond:
                    while self._inside:
                        self._cond.wait(POLL_S)
                return
            except BaseException:  # noqa: BLE001 — a second interrupt: keep waiting
                continue


class CallClock:
    """How long a specialisation's last completed call took, per thread count (parallel.py
    watches a call whose last took long, WATCH_AFTER_S)."""

    def __init__(self):
        self._seconds: dict[int, float] = {}

    def seconds(self, threads: int) -> float | None:
        return self._seconds.get(threads)

    def record(self, threads: int, seconds: float) -> None:
        self._seconds[threads] = seconds
