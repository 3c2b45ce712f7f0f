"""runtime: the times of small GEMM teams' calls → whether the next one rests (runs on the calling thread alone).

A GEMM team (emit/gemm_kernel.py) never waits for a thread that has not started, but it must wait
for a task a thread has taken: a team thread that loses its core mid-task holds the call up until
the scheduler gives the core back, milliseconds when another busy thread shares that core (another
process's, or OpenBLAS's, which spin about 0.1 s after each NumPy call on several threads: sgemm
256 on 2 threads right after one took 4-15 ms a call for some 30 ms, against 0.15 ms on one
thread). For a small team (less work than parallel.MIN_PARALLEL_WORK: sgemm from about 208³ to
320³) the second thread gains tens of microseconds, so a call that took STALL_FACTOR times its
phase's fastest team call makes small teams run on one thread for REST_S; larger teams always
run on all threads (their gain is larger and a stall costs them relatively less). A phase's
first team call is only recorded (it starts the workers, faults its pages in); later ones are
judged against the fastest on record or, if less, the serial time by the cost model
(SECONDS_PER_WORK: a work unit is 128 packed-GEMM multiply-adds), since the first calls after a
NumPy matmul all stall.
"""

from __future__ import annotations

import time

STALL_FACTOR = 4  # a call this many times slower than the reference stalled
SECONDS_PER_WORK = 1.2e-9  # one thread, 128 multiply-adds (sgemm 256³ here: 150 µs for 2^17)
REST_S = 0.05  # how long small teams then run on the calling thread (long calls of other threads end)
_KEPT = 256  # phases (by work) whose fastest call is remembered


class SmallTeams:
    """The fastest call per phase work, and until when small teams rest. Thread-safe enough: a
    lost update of either only delays or shortens one rest."""

    def __init__(self):
        self._fastest: dict[int, float] = {}
        self._rest_until = 0.0

    def resting(self) -> bool:
        return time.perf_counter() < self._rest_until

    def timed(self, work: int, seconds: float) -> None:
        """Record a team call of this phase work that took `seconds`."""
        fastest = self._fastest.get(work)
        if fastest is None or seconds < fastest:
            if len(self._fastest) >= _KEPT:
                self._fastest.clear()
            self._fastest[work] = seconds
        if fastest is not None and seconds > STALL_FACTOR * min(fastest, work * SECONDS_PER_WORK):
            self._rest_until = time.perf_counter() + REST_S
