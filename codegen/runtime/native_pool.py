"""runtime: pieces of a phase → native worker threads that spin for work, then sleep (a dispatch in microseconds, no Python on the workers).

The Python thread pool (parallel.py) costs tens of microseconds per dispatch: a queue, a woken
thread that must take the GIL, a future to wait on. Here each worker is a pthread running
`tl_worker_main` (emit/workers.py) on a slot of its own; the caller writes a piece's job into a
slot, posts it (an atomic store and a futex wake), runs its own piece through `tl_worker_run`
(ctypes releases the GIL), then waits in `tl_worker_wait` steps of POLL_NS, so that Python runs
signal handlers between them. A worker that finished spins about 50 µs for its next piece before
it sleeps, so back-to-back calls cost no wake-up.

One call uses the workers at a time (`acquire` is non-blocking: a second Python thread's call
meanwhile takes the Python pool). Linux x86-64 and AArch64 only (the futex system call); elsewhere
`acquire` answers None. Fork: the workers do not exist in a forked child, which starts a new pool
on first use. At interpreter exit the workers are told to leave, and the machine code they run is
never freed (a worker still spinning at exit must not run freed code).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import struct
import sys
import threading
import time

import numpy as np

from ..emit.workers import (
    GIVE,
    POOL_BUSY,
    POOL_SEQ,
    POST,
    REVOKE,
    RUN,
    SHARED_COUNTER_BYTE,
    SLOT_BYTES,
    SLOT_CODE,
    SLOT_CPU,
    SLOT_DONE,
    SLOT_ERROR,
    SLOT_JOB,
    SLOT_LIST,
    SLOT_NPEERS,
    SLOT_OWN_COUNTER,
    SLOT_PAIRS,
    SLOT_PEERS,
    SLOT_RANGES,
    SLOT_SEQ,
    TAKE,
    WAIT,
    WORKER,
)
from ..lowering.status import ERROR_CANCELLED

_I32 = struct.Struct("<i")
_JOB = struct.Struct("<14q")  # SLOT_JOB through SLOT_CPU
_PEERS = struct.Struct("<5q")  # SLOT_PEERS through SLOT_OWN_COUNTER
_HEAD = struct.Struct("<9q")  # the cancel word through SHARED_COUNTER (the words between: unused)
_PAIR = struct.Struct("<2q")
# run() writes each slot's words in two runs: SLOT_JOB through SLOT_CPU, SLOT_PEERS through the own counter
assert SLOT_RANGES == SLOT_JOB + 9 * 8 and SLOT_CPU == SLOT_JOB + 13 * 8
assert SLOT_NPEERS == SLOT_PEERS + 8 and SLOT_OWN_COUNTER == SLOT_PEERS + 4 * 8
POLL_NS = 50_000_000  # how long a waiting caller sleeps between looks for signal handlers
_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}

_W = 8  # bytes per word
_MAX_WORKERS = 64
# the pool's header, before the slots: the running call's cancel word (an i32) and the counter of
# a shared list of ranges (i64 word indices), and that list (a byte offset; COMMON_PAIRS pairs fit)
CANCEL_WORD = 0
SHARED_COUNTER = 8
COMMON_LIST = 128
HEADER_BYTES = 4096
COMMON_PAIRS = (HEADER_BYTES - COMMON_LIST) // 16
assert CANCEL_WORD == 0 and SHARED_COUNTER == 8 and COMMON_LIST >= 9 * _W  # run() clears words 0-8
assert SHARED_COUNTER * _W == SHARED_COUNTER_BYTE and 9 * _W <= POOL_BUSY < POOL_SEQ < COMMON_LIST


def _supported() -> int | None:
    """The futex system call number, or None where native workers are not used."""
    if not sys.platform.startswith("linux") or os.environ.get("TENSORLANG_NATIVE_POOL", "1") == "0":
        return None
    return _FUTEX.get(platform.machine().lower())


_libc_getcpu = None


def current_cpu() -> int:
    """The core the calling thread runs on (-1 when unknown)."""
    global _libc_getcpu
    if _libc_getcpu is None:
        try:
            _libc_getcpu = ctypes.CDLL(None).sched_getcpu
        except (OSError, AttributeError):
            _libc_getcpu = lambda: -1  # noqa: E731
    return _libc_getcpu()


def move_off(cpu: int) -> None:
    """If the calling thread runs on `cpu`, move it to another core it may use. A woken pool
    thread is often put on the core of the thread that woke it, which then runs its own piece
    there: both would share one core until the scheduler balances (tens of milliseconds)."""
    if cpu < 0 or current_cpu() != cpu or not hasattr(os, "sched_setaffinity"):
        return
    allowed = os.sched_getaffinity(0)
    if len(allowed) > 1 and cpu in allowed:
        os.sched_setaffinity(0, allowed - {cpu})  # migrates now
        os.sched_setaffinity(0, allowed)


class _Code:
    """The protocol's machine code (from the disk cache, else compiled and stored there: compiling
    takes ~0.1 s), loaded once per process and never freed."""

    def __init__(self, futex_nr: int):
        from ..emit.dispatch import DISPATCH, define_dispatch
        from ..emit.workers import define_workers
        from ..lowering.jit import cached_functions

        x86 = platform.machine().lower() in ("x86_64", "amd64")

        def define(module):
            define_workers(module, futex_nr, ERROR_CANCELLED, x86)
            functions = [module.globals[name] for name in (RUN, POST, WAIT, REVOKE)]
            define_dispatch(module, *functions, ERROR_CANCELLED)

        self.engine, self.ref, address = cached_functions(
            "workers",
            {"futex": futex_nr, "cancelled": ERROR_CANCELLED, "x86": x86},
            define,
            (WORKER, POST, RUN, WAIT, REVOKE, TAKE, GIVE, DISPATCH),
        )
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self.worker = address[WORKER]
        self.post = ctypes.CFUNCTYPE(None, vp, i64)(address[POST])
        self.run = ctypes.CFUNCTYPE(ctypes.c_int32, vp)(address[RUN])
        self.wait = ctypes.CFUNCTYPE(ctypes.c_int32, vp, i64, i64)(address[WAIT])
        self.revoke = ctypes.CFUNCTYPE(ctypes.c_int32, vp, i64)(address[REVOKE])
        self.take = ctypes.CFUNCTYPE(ctypes.c_int32, vp)(address[TAKE])
        self.give = ctypes.CFUNCTYPE(None, vp)(address[GIVE])
        self.dispatch = address[DISPATCH]  # called from the native checked call (nativecall.py)


_code: _Code | None = None
_code_failed = False


def _machine_code() -> _Code | None:
    global _code, _code_failed
    if _code is None and not _code_failed:
        nr = _supported()
        try:
            _code = _Code(nr) if nr is not None else None
        except Exception:  # noqa: BLE001 — no native workers: the Python pool does the work
            _code = None
        if _code is None:
            _code_failed = True
        else:  # never freed, not even when the interpreter tears its modules down
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(_code))
    return _code


class _Busy:
    """The pool's POOL_BUSY word as a lock (acquire, release): Python's dispatches and native
    ones (nativecall.py) take it alike, so one call holds the workers at a time."""

    def __init__(self, code, header: int):
        self._code, self._header = code, header

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._code.take(self._header):
            return True
        if not blocking:
            return False
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while not self._code.take(self._header):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        return True

    def release(self) -> None:
        self._code.give(self._header)


class Pool:
    """Native workers and their slots (slot 0 is the calling thread's own, slot i > 0 worker
    i's); slots never move, since a worker keeps the address of its own."""

    def __init__(self, code: _Code):
        self.code = code
        self._buf = np.zeros(HEADER_BYTES + (_MAX_WORKERS + 1) * SLOT_BYTES + 64, dtype=np.uint8)
        start = self._buf.ctypes.data
        self.header = (start + 63) // 64 * 64  # the call's cancel word, the shared counter
        self._base = self.header + HEADER_BYTES
        self.all_words = self._buf[self.header - start :].view(np.int64)  # header, then the slots
        # the same bytes for struct.pack_into (a few writes per piece and call: cheaper than
        # numpy's slice assignments), at byte offset address - self._origin
        self.mem = memoryview(self._buf)
        self._origin = start
        self.threads = 0  # workers started
        self.busy = _Busy(code, self.header)
        self._team_block: np.ndarray | None = None

    def team_block(self) -> int:
        """The address of a GEMM team's shared block that native dispatches (nativecall.py)
        use: one for the pool, since one dispatch holds it at a time (POOL_BUSY)."""
        from ..emit.gemm_team import gemm_team_bytes

        if self._team_block is None:
            self._team_block = np.zeros(gemm_team_bytes() + 64, dtype=np.uint8)
        return (self._team_block.ctypes.data + 63) // 64 * 64

    @property
    def seq(self) -> int:
        """The last generation posted (POOL_SEQ: native dispatches count on from it too)."""
        return int(self.all_words[POOL_SEQ // _W])

    @seq.setter
    def seq(self, value: int) -> None:
        self.all_words[POOL_SEQ // _W] = value

    def slot(self, i: int) -> int:
        return self._base + i * SLOT_BYTES

    def word_base(self, i: int) -> int:
        """The index in `all_words` of slot i's first word."""
        return (HEADER_BYTES + i * SLOT_BYTES) // _W

    def words(self, i: int) -> np.ndarray:
        return self.all_words[self.word_base(i) : self.word_base(i + 1)]

    def code_of(self, i: int) -> int:
        return _I32.unpack_from(self.mem, self.slot(i) + SLOT_CODE - self._origin)[0]

    def put(self, layout: struct.Struct, address: int, *values: int) -> None:
        """Write `values` as `layout` at `address` (inside the pool's memory)."""
        layout.pack_into(self.mem, address - self._origin, *values)

    def entry_address(self, entry) -> int:
        """The machine address of a kernel entry (a ctypes function), remembered on the entry
        object itself (ctypes function objects take attributes; the address lives as long as
        the entry's code)."""
        address = getattr(entry, "_tl_address", None)
        if address is None:
            address = entry._tl_address = ctypes.cast(entry, ctypes.c_void_p).value
        return address

    def ranges(self, i: int, ranges, keep: list, common: bool = False) -> tuple[int, int]:
        """(address, count) of the [lo, hi) pairs `ranges` written into slot i's list (or the
        header's, `common`), or into an array kept in `keep` when they do not fit."""
        count = len(ranges)
        room = COMMON_PAIRS if common else SLOT_PAIRS
        if count <= room:
            at = (self.header + COMMON_LIST) if common else self.slot(i) + SLOT_LIST
            if count == 1:
                self.put(_PAIR, at, *ranges[0])
            else:
                self.put(struct.Struct(f"<{2 * count}q"), at, *(v for pair in ranges for v in pair))
            return at, count
        pairs = np.asarray(ranges, dtype=np.int64).reshape(-1)
        keep.append(pairs)
        return pairs.ctypes.data, count

    def reserve(self, workers: int) -> bool:
        """At least `workers` threads (call with `busy` held); False if one could not start."""
        if workers > _MAX_WORKERS:
            return False
        if workers <= self.threads:
            return True
        libc = ctypes.CDLL(None)
        create, detach = libc.pthread_create, libc.pthread_detach
        create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        detach.argtypes = [ctypes.c_ulong]
        while self.threads < workers:
            i = self.threads + 1
            w = self.words(i)
            w[SLOT_SEQ // _W] = w[SLOT_DONE // _W] = self.seq
            tid = ctypes.c_ulong()
            if create(ctypes.byref(tid), None, self.code.worker, self.slot(i)) != 0:
                return False
            detach(tid.value)
            self.threads += 1
        return True

    def stop(self) -> None:
        """Tell every worker to leave (at interpreter exit)."""
        self.seq += 1
        for i in range(1, self.threads + 1):
            self.code.post(self.slot(i), -self.seq)
        self.threads = 0


_pool: Pool | None = None
_pool_lock = threading.Lock()


def acquire(entry, workers: int) -> Pool | None:
    """The native pool with at least `workers` threads, its `busy` lock held by the caller, or
    None (not supported here, another call uses it, threads could not start, or `entry` is no
    machine-code function: a Python stand-in of the tests)."""
    global _pool
    if not isinstance(entry, ctypes._CFuncPtr):
        return None
    with _pool_lock:
        if _pool is None:
            code = _machine_code()
            if code is None:
                return None
            _pool = Pool(code)
        pool = _pool
    if not pool.busy.acquire(blocking=False):
        return None
    if not pool.reserve(workers):
        pool.busy.release()
        return None
    return pool


def _after_fork_in_child() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # its threads did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _leave() -> None:
    pool = _pool
    if pool is not None and pool.busy.acquire(timeout=1.0):
        pool.stop()


def run(
    pool: Pool,
    entry,
    params: int,
    phase: int,
    pieces: list,
    shared,
    inline: bool,
    cpu: int,
    steal: bool,
    revocable: bool = False,
):
    """Run `pieces` — (buffers, workspace, ranges) each: the entry's tensor pointers and
    workspace for that piece and the [lo, hi) calls it makes — at once, the first on the calling
    thread when `inline`, the others on workers; with `shared` (a list of ranges) instead, every
    piece takes calls from that one list in turn. Returns (code, error record) of the first
    failure (one cancelled because another failed comes last), or (0, None). An interrupt sets
    the call's cancel word and returns only once no worker runs a piece (then re-raises).
    `cpu`: the caller's core (a worker woken onto it moves off). `steal`: a piece that finished
    its own ranges takes the others' untaken ones (not for teams, whose pieces must run at once,
    one per thread). `revocable`: once one piece has returned, the dispatch's work is all taken
    (pieces that take from one counter: a GEMM team's tasks, a loop team's chunks, split ranges
    with stealing), so a worker that has not started its piece yet — its core busy with another
    thread, OpenBLAS's spinning workers after a NumPy call — is not waited for: it never starts
    it. Per-call state lives in the pool's own memory (no array is made for a call whose lists
    fit the slots)."""
    address = pool.entry_address(entry)
    words = pool.all_words
    cancel = pool.header + CANCEL_WORD * _W
    pool.put(_HEAD, cancel, *([0] * 9))  # the i32 cancel word (and its padding), the shared counter
    keep = []
    offset = 0 if inline else 1
    shared_list = None
    if shared is not None:
        shared_list = pool.ranges(0, shared, keep, common=True)
    first = pool.slot(offset)
    peers = len(pieces) if steal and shared is None else 0
    for i, (buffers, ws, ranges) in enumerate(pieces):
        slot = i + offset
        at = pool.slot(slot)
        if shared_list is None:
            pairs, count = pool.ranges(slot, ranges, keep)
            counter = at + SLOT_OWN_COUNTER
        else:
            (pairs, count), counter = shared_list, pool.header + SHARED_COUNTER * _W
        # the job (SLOT_JOB: the entry and its 8 arguments) through SLOT_CPU, then SLOT_PEERS
        # through the own counter (zeroed; the two words between them are unused)
        pool.put(_JOB, at + SLOT_JOB, address, buffers, params, at + SLOT_ERROR, phase, 0, 0, ws, cancel,
                 pairs, count, counter, 0, cpu)  # fmt: skip
        pool.put(_PEERS, at + SLOT_PEERS, first, peers, 0, 0, 0)
    posted = []
    seq = pool.seq
    for slot in range(1, len(pieces) + offset):
        seq += 1
        pool.code.post(pool.slot(slot), seq)
        posted.append((slot, seq))
    pool.seq = seq
    try:
        codes = [pool.code.run(pool.slot(0))] if inline else []
        returned = inline  # a piece has returned: with `revocable`, all the work is taken
        for slot, seq in posted:
            if returned and revocable and pool.code.revoke(pool.slot(slot), seq):
                codes.append(0)
                continue
            while not pool.code.wait(pool.slot(slot), seq, POLL_NS):
                pass
            codes.append(int(pool.code_of(slot)))
            returned = True
    except BaseException:
        _cancel(pool, posted)
        raise
    failed = [(code, slot) for code, slot in zip(codes, range(offset, len(pieces) + offset)) if code]
    for code, slot in sorted(failed, key=lambda f: f[0] == ERROR_CANCELLED):
        base = pool.word_base(slot) + SLOT_ERROR // _W
        return code, words[base : base + 4].copy()
    return 0, None


def _cancel(pool: Pool, posted: list[tuple[int, int]]) -> None:
    """Set the cancel word and wait until no posted piece runs (interrupts swallowed): a
    piece its worker has not started is revoked instead."""
    pool.all_words.view(np.int32)[CANCEL_WORD * 2] = 1
    for slot, seq in posted:
        if pool.code.revoke(pool.slot(slot), seq):
            continue
        while True:
            try:
                if pool.code.wait(pool.slot(slot), seq, POLL_NS):
                    break
            except BaseException:  # noqa: BLE001 — a second interrupt: keep waiting
                continue
