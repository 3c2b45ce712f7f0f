"""runtime: phases of a compiled kernel → calls on a thread pool (parallel loops split by iterations).

The JIT-compiled entry runs one phase at a time, optionally restricted to iterations [lo, hi) of
the phase's parallel outer loop. A phase's pieces go to native worker threads
(runtime/native_pool.py) when no other call holds them, else to a Python thread pool (tens of
microseconds a dispatch). Phases with little work run serially.

Interrupts: no call outlives its memory. Every call that puts work on pool threads has a cancel
word that the generated code polls once per iteration of each phase's outermost loop (and the GEMM
body once per macro block); it returns ERROR_CANCELLED when the word is set. When the waiting
thread is interrupted (KeyboardInterrupt, or any exception a signal handler raises), it sets the
word, waits until no worker runs the call any more (a second interrupt does not cut that wait
short), gives the workspaces back, and only then re-raises. ctypes calls cannot be interrupted on
the calling thread, so a long serial call from the main thread runs on a pool thread too, while
the main thread waits in short, interruptible steps.

Loop teams (PhasePlan.loop_team): a phase whose outer loop is sequential with parallel loops
inside runs as one call per thread, the threads taking chunks of each step's parallel loops from
shared counters and waiting in the generated code until the step's chunks are done (one dispatch
per call, not per outer iteration). Whole-call teams (runtime/teams.py) run every phase of a call
in one dispatch, with a barrier between phases, which needs all their threads at once. Team
threads come from a pool of their own that one team call uses at a time (a barrier with a member
still queued behind another call's work would wait for it); a team call that finds that pool
busy (another Python thread's team) runs phase by phase, its loop-team phases on one thread. A
thread that leaves early (an error, the cancel word) raises the team's abort word, and the others
stop waiting too.

Fork: a forked child starts with no pool and fresh locks (`os.register_at_fork`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..emit.gemm_team import TEAM_LOOP_BYTES
from ..lowering.status import ERROR_CANCELLED
from ..planning.runs import PRIVATE_CHUNKS_PER_THREAD, TEAM_STEP_WORK, PhasePlan
from . import native_pool
from .native_pool import current_cpu as _current_cpu
from .native_pool import move_off as _move_off  # noqa: F401 — the tests use it from here
from .stalls import SmallTeams
from .teams import Teams, whole_call_table
from .watch import CallClock, Claims, Watch

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# statement instances below which a phase is not worth splitting across threads (a dispatch
# costs some 50 µs; a quarter million simple instances take about as long as a few dispatches)
MIN_PARALLEL_WORK = 1 << 18
# a GEMM team is worth threads from MIN_PARALLEL_WORK / GEMM_TEAM_DISCOUNT (a multiply-add counts
# 1/128, planning/plan.py: from 2^23 of them, ~200³): its dispatch and stage ends cost ~15-30 µs;
# 1 thread → 2 here, steady state: 160³ 57 → 56 µs, 192³ 71 → 61, 224³ 127 → 94, 256³ 154 → 105
GEMM_TEAM_DISCOUNT = 4
# statement instances of a whole call from which a serial call runs on a pool thread, so that the
# main thread stays interruptible: tens of milliseconds of work, because the hand-over and the
# waiting thread's wake-ups cost about 0.1 ms (measured: 10% of a 512³ sgemm when it was 2^22);
# a shorter call delivers the interrupt when it returns, which is soon enough
WATCHED_WORK = 1 << 26
# ... and only while the specialisation's last completed call on as many threads took this long
# or longer (or none has completed): instances say little of time (a vectorised stencil runs
# 2^27 of them in 5 ms), and a call this short delivers the interrupt soon enough when it
# returns. Watching a short call costs: jacobi-2d 1000² T=100 on 2 threads (2^27.6 instances,
# 3 ms) ran 6-28 % slower watched than on the calling thread (81 interleaved calls, 3 runs)
WATCH_AFTER_S = 0.05
# statement instances of one chunk of a chunked phase (PhasePlan.chunked): milliseconds of work,
# so that an interrupt is seen soon, against some microseconds per extra call
CHUNK_WORK = 1 << 22
# statement instances from which a split loop's threads take its iterations in DYNAMIC_PARTS
# parts per thread from a shared list instead of one fixed range each: a thread that starts
# late (its core busy, or woken onto the core of the thread that woke it) then takes fewer
# parts instead of holding the whole call up; each part is one more call (a few µs)
DYNAMIC_WORK = 1 << 22
DYNAMIC_PARTS = 2

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()
_serial_pool: ThreadPoolExecutor | None = None  # long serial calls of the main thread
_team_pool: ThreadPoolExecutor | None = None  # loop teams' threads, one team call at a time
_team_pool_size = 0
_team_busy = threading.Lock()  # held by the team call running on _team_pool
_NEVER = np.zeros(1, dtype=np.int32)  # the cancel word of calls that run on the calling thread alone
_NEVER_ADDRESS = _NEVER.ctypes.data


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tensorlang")
            _pool_size = threads
        return _pool


def _team_executor(threads: int) -> ThreadPoolExecutor:
    """Threads for loop teams (call with _team_busy held): none runs anything else."""
    global _team_pool, _team_pool_size
    with _pool_lock:
        if _team_pool is None or _team_pool_size < threads:
            if _team_pool is not None:
                _team_pool.shutdown(wait=False)
            _team_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tensorlang-team")
            _team_pool_size = threads
        return _team_pool


def _serial_executor() -> ThreadPoolExecutor:
    """Threads for long serial calls: started on demand, as many as calls run at once (bounded)."""
    global _serial_pool
    with _pool_lock:
        if _serial_pool is None:
            workers = max(32, 4 * (os.cpu_count() or 1))
            _serial_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tensorlang-serial")
        return _serial_pool


_fork_renewed: weakref.WeakSet = weakref.WeakSet()  # objects with locks a forked child renews


def renew_after_fork(obj) -> None:
    """Call `obj.after_fork()` in a forked child (it recreates the object's locks)."""
    _fork_renewed.add(obj)


def _after_fork_in_child() -> None:
    """The pools' threads do not exist in a forked child, and a lock another thread held at fork
    time stays held forever: start with no pools and fresh locks."""
    global _pool, _pool_size, _pool_lock, _serial_pool, _team_pool, _team_pool_size, _team_busy
    _pool, _pool_size, _serial_pool = None, 0, None
    _team_pool, _team_pool_size = None, 0
    _pool_lock, _team_busy = threading.Lock(), threading.Lock()
    for obj in list(_fork_renewed):
        obj.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
        renew_after_fork(self)

    def after_fork(self) -> None:
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


_teams = Teams()
renew_after_fork(_teams)
_small_teams = SmallTeams()  # small GEMM teams that stalled run on one thread for a while


def _whole(plan: PhasePlan) -> tuple[int, int]:
    """The [lo, hi) of a phase run as one piece: a chunked phase's loop range (piece_calls cuts
    it into chunks), else the whole phase."""
    return plan.loop_range[:2] if plan.chunked else (INT64_MIN, INT64_MAX)


def piece_calls(plan: PhasePlan, lo: int, hi: int) -> list[tuple[int, int]]:
    """The calls one piece [lo, hi) of a phase is run as: one, or for a chunked phase as many
    as keep each near CHUNK_WORK instances (its generated code does not poll the cancel word)."""
    if not plan.chunked or plan.loop_range is None:
        return [(lo, hi)]
    first, stop, step = plan.loop_range
    total = max(1, -(-(stop - first) // step))
    mine = -(-(hi - lo) // step)
    parts = -(-plan.work * mine // total // CHUNK_WORK)
    return chunks((lo, hi, step), parts)


def dynamic_calls(plan: PhasePlan, threads: int) -> list[tuple[int, int]] | None:
    """The calls a split phase's pieces take in turn from one shared list (from DYNAMIC_WORK: a
    thread that starts late takes fewer), or None: each piece makes its own range's calls."""
    pieces = chunks(plan.loop_range, threads)
    parts = chunks(plan.loop_range, threads * DYNAMIC_PARTS)
    if plan.work >= DYNAMIC_WORK and len(pieces) > 1 and len(parts) > len(pieces):
        return [r for lo, hi in parts for r in piece_calls(plan, lo, hi)]
    return None


def worth_threads(plan: PhasePlan) -> bool:
    """Whether the phase has enough work to split across threads (GEMM teams from less)."""
    gemm_team = plan.team and not plan.loop_team
    return plan.work >= (MIN_PARALLEL_WORK // GEMM_TEAM_DISCOUNT if gemm_team else MIN_PARALLEL_WORK)


def runs_inline(plans: tuple[PhasePlan, ...]) -> bool:
    """Whether run_phases runs every phase on the calling thread whatever the thread count (no
    phase worth threads, the whole below WATCHED_WORK): such calls may use run_inline."""
    return not any(map(worth_threads, plans)) and sum(p.work for p in plans) < WATCHED_WORK


def run_phases(
    entry,
    buffers_for,
    params,
    plans: tuple[PhasePlan, ...],
    threads: int,
    workspaces: Workspaces,
    clock: CallClock | None = None,
) -> tuple[int, np.ndarray]:
    """Run every phase in order; return (error code, error details) of the first failure.

    `buffers_for(workspace)` gives the address of the tensor pointer array a thread with that
    workspace uses (contracted temporaries point into the thread's own workspace).
    `entry(buffers, params, error, phase, lo, hi, workspace, cancel)` is the kernel's entry.

    An interrupt while worker threads run the call (KeyboardInterrupt) stops them through the
    cancel word and propagates only once none of them runs any more. Memory then: arrays the
    call allocated are dropped; a caller's `out=` array that the kernel writes in place may hold
    a partial result (some elements old, some new); nothing else is touched after the exception
    propagates. Which calls run watched like that: WATCHED_WORK and, with `clock` (the
    specialisation's), WATCH_AFTER_S; the clock then records this call's time.
    """
    leased = workspaces.lease(1)
    last = clock.seconds(threads) if clock is not None else None
    watched = (
        sum(p.work for p in plans) >= WATCHED_WORK
        and (last is None or last >= WATCH_AFTER_S)
        and threading.current_thread() is threading.main_thread()
    )
    start = time.perf_counter()
    try:
        code, error = _run_phases(entry, buffers_for, params, plans, threads, workspaces, leased, watched)
    finally:
        workspaces.give_back(leased)
    if code == 0 and clock is not None:
        clock.record(threads, time.perf_counter() - start)
    return code, error


_tables: dict = {}  # (plans, threads) → whole_call_table's answer


def _whole_call(plans: tuple[PhasePlan, ...], threads: int):
    """(shared block, _team_busy held) for a whole-call team (runtime/teams.py), or None."""
    table = whole_call_plan(plans, threads)
    if table is None or not _team_busy.acquire(blocking=False):
        return None
    block = _teams.take(threads, TEAM_LOOP_BYTES + table.nbytes)
    _teams.views[block[1]][TEAM_LOOP_BYTES : TEAM_LOOP_BYTES + table.nbytes] = table.view(np.uint8)
    return block, _team_busy


def whole_call_plan(plans: tuple[PhasePlan, ...], threads: int):
    """The whole-call team's table for these plans (teams.whole_call_table), made once, or None
    when the call runs phase by phase: beside a GEMM team, a team whose private copies need the
    room, or a split phase of DYNAMIC_WORK or more (a dispatch is little next to it, and its
    parts taken in turn let a thread that starts late take fewer)."""
    if threads < 2 or any((p.team and not p.barriers) or p.private_bytes for p in plans):
        return None
    key = (plans, threads)
    table = _tables.get(key, False)
    if table is False:  # the same plans give the same table: made once (a dozen µs)
        table = None
        if not any(p.loop_range is not None and not p.team and p.work >= DYNAMIC_WORK for p in plans):
            table = whole_call_table(
                plans,
                threads,
                worth_threads,
                lambda p: p.work // p.barriers >= TEAM_STEP_WORK,
                chunks,
                CHUNK_WORK,
            )
        if len(_tables) > 1024:
            _tables.clear()
        _tables[key] = table
    return table


def _run_phases(
    entry,
    buffers_for,
    params,
    plans: tuple[PhasePlan, ...],
    threads: int,
    workspaces: Workspaces,
    leased: list[tuple[np.ndarray, int]],
    watched: bool,
) -> tuple[int, np.ndarray]:
    """run_phases' work; `watched`: a long call from the main thread (the one signals reach),
    kept out of the kernel."""
    error = np.zeros(4, dtype=np.int64)
    error_ptr = error.ctypes.data
    watch: Watch | None = None
    whole_call = _whole_call(plans, threads)
    if whole_call is not None:  # one dispatch: phase len(plans) runs them all (lowering/whole.py)
        plans = (PhasePlan(len(plans), None, sum(p.work for p in plans), team=True, barriers=len(plans)),)
    for plan in plans:
        pieces = []
        team = None
        busy = None  # _team_busy, held while this phase's loop team runs
        claims = None  # the loop's parts, taken in turn by the pieces
        if whole_call is not None:
            team, busy = whole_call
            pieces = [(team[1], t) for t in range(threads)]
        elif threads > 1 and worth_threads(plan):
            if plan.loop_team:  # every thread calls the phase: lo = the shared block, hi = its index
                if plan.work // plan.barriers >= TEAM_STEP_WORK and _team_busy.acquire(blocking=False):
                    busy = _team_busy
                    # a team privatising reductions: its chunks' copies after the loop words
                    private = threads * PRIVATE_CHUNKS_PER_THREAD * plan.private_bytes
                    team = _teams.take(threads, TEAM_LOOP_BYTES + private)
                    pieces = [(team[1], t) for t in range(threads)]
            elif plan.team and not (plan.work < MIN_PARALLEL_WORK and _small_teams.resting()):
                team = _teams.take(threads)  # every thread calls the phase with the block as lo
                pieces = [(team[1], 0)] * threads
            elif plan.loop_range is not None:
                pieces = chunks(plan.loop_range, threads)
                shared_calls = dynamic_calls(plan, threads)
                if shared_calls is not None:
                    claims = Claims(shared_calls)
        if len(pieces) <= 1 and watched:
            # the one piece goes to a native worker too: a Python pool thread costs a wake-up and
            # the GIL per phase, a native worker a futex post, and it is still spinning when the
            # next phase comes (watched, jacobi-2d 1000² on 1 thread then cost 0.08-0.1 ms a
            # call over running on the caller at T = 1, 10 and 34; at T=100 within the noise)
            pieces = [_whole(plan)]
        if len(pieces) <= 1 and not watched:
            ws = leased[0][1]
            cancel = watch.address if watch is not None else _NEVER_ADDRESS
            code = entry(buffers_for(ws), params, error_ptr, plan.index, INT64_MIN, INT64_MAX, ws, cancel)
            if code:
                return code, error
            continue
        native = (
            native_pool.acquire(entry, len(pieces) - (not watched)) if len(pieces) > 1 or watched else None
        )
        if native is not None:  # microseconds per dispatch instead of tens
            if len(leased) < len(pieces):
                leased.extend(workspaces.lease(len(pieces) - len(leased)))
            try:
                jobs = [
                    (buffers_for(ws), ws, piece_calls(plan, lo, hi))
                    for (lo, hi), (_, ws) in zip(pieces, leased)
                ]
                shared = claims.parts if claims is not None else None
                start = time.perf_counter()
                # a caller that runs no piece (watched) sleeps: its core is free for a worker
                here = -1 if watched else _current_cpu()
                # a whole-call team's static shares and barriers need every thread: no revoking
                code, err = native_pool.run(
                    native, entry, params, plan.index, jobs, shared, not watched, here, team is None,
                    revocable=whole_call is None,
                )  # fmt: skip
                if plan.team and busy is None and plan.work < MIN_PARALLEL_WORK:  # a small GEMM team
                    _small_teams.timed(plan.work, time.perf_counter() - start)
            finally:
                native.busy.release()
                if team is not None:
                    _teams.give_back(team)
                if busy is not None:
                    busy.release()
            if code:
                return code, err
            continue
        if watch is None:
            watch = Watch()
        if len(pieces) <= 1:
            ws = leased[0][1]
            calls = [(error, *_whole(plan), ws)]
            pool = _serial_executor()
        else:
            if len(leased) < len(pieces):  # this call's workspaces: one per piece, kept until it ends
                leased.extend(workspaces.lease(len(pieces) - len(leased)))
            errors = [np.zeros(4, dtype=np.int64) for _ in pieces]
            calls = [(err, lo, hi, ws) for err, (lo, hi), (_, ws) in zip(errors, pieces, leased)]
            pool = _team_executor(threads) if busy is not None else _executor(threads)
        # a call short enough to deliver an interrupt when it returns (not `watched`) runs its
        # first piece on the calling thread: one thread fewer to wake, and that one is running
        inline = not watched and len(calls) > 1
        try:
            jobs = [
                (entry, (buffers_for(ws), params, err.ctypes.data, plan.index, lo, hi, ws, watch.address),
                 claims if claims is not None else piece_calls(plan, lo, hi))
                for err, lo, hi, ws in calls
            ]  # fmt: skip
            here = _current_cpu() if inline else -1
            futures = [watch.submit(pool, *job, here) for job in (jobs[1:] if inline else jobs)]
            first = [watch.run(*jobs[0])] if inline else []
            codes = first + watch.results(futures)
        except BaseException:
            watch.stop()
            raise
        finally:
            if team is not None:  # no piece is inside the kernel any more (nor will enter it)
                _teams.give_back(team)
            if busy is not None:
                busy.release()
        # a loop team's thread that left its barrier because another failed says ERROR_CANCELLED:
        # the failure itself is the answer
        failed = [(code, err) for code, (err, *_) in zip(codes, calls) if code]
        for code, err in sorted(failed, key=lambda f: f[0] == ERROR_CANCELLED):
            return code, err
    return 0, error
