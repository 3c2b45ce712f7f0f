"""Native worker threads (runtime/native_pool.py, emit/workers.py): split phases give the same results as one thread, errors and cancels come back, concurrent calls fall back to the Python pool."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import codegen.runtime.parallel
import tensorlang as tl
from codegen.emit.workers import SLOT_CLAIM, SLOT_SLEEPS
from codegen.runtime import native_pool

pytestmark = pytest.mark.skipif(
    native_pool._supported() is None, reason="native workers: Linux x86-64/AArch64"
)

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
BMM = "def b(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }"
CONV = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
GATHER = "def g(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }"


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes]


def _both(src, inputs, threads=(1, 2)):
    return [tl.compile(src, options=tl.Options(threads=t))(*inputs) for t in threads]


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (7, 13, 1), (1, 127, 7), (13, 7, 127), (127, 131, 61), (257, 7, 13)]
)
def test_gemm_on_native_workers_is_bitwise_one_threads(m, k, n, monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)  # split even tiny GEMMs
    A, B = _inputs([(m, k), (k, n)])
    one, two, seven = _both(MM, [A, B], threads=(1, 2, 7))
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(seven, one)
    np.testing.assert_allclose(one, A @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 7, 13, 5), (13, 1, 127, 7)])
def test_split_outer_loops_on_native_workers(shape, monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    b, m, k, n = shape
    X, Y = _inputs([(b, m, k), (b, k, n)])
    one, two = _both(BMM, [X, Y])
    np.testing.assert_array_equal(two, one)
    a, c = _inputs([(1009,), (1009,)])
    one, two = _both(ADD, [a, c])
    np.testing.assert_array_equal(two, a + c)


def test_direct_convolution_on_native_workers(monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    image, weights = _inputs([(2, 17, 13, 11), (19, 17, 3, 3)])
    one, two = _both(CONV, [image, weights])
    np.testing.assert_array_equal(two, one)


def test_workers_are_used_and_spin_between_calls(monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    A, B = _inputs([(64, 64), (64, 64)])
    k = tl.compile(MM, options=tl.Options(threads=2))
    k(A, B)
    pool = native_pool._pool
    assert pool is not None and pool.threads >= 1
    seq = pool.seq
    for _ in range(20):
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert pool.seq >= seq + 20  # every call posted to a worker
    assert all(int(pool.words(i)[SLOT_SLEEPS // 8]) >= 0 for i in range(1, pool.threads + 1))


def test_an_error_in_a_worker_piece_reaches_the_caller(monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    k = tl.compile(GATHER, options=tl.Options(threads=2))
    T = np.arange(10, dtype=np.float32)
    index = np.zeros(4001, dtype=np.int32)
    index[3999] = 10  # in the second thread's half
    with pytest.raises(tl.ArgumentError, match="I"):
        k(T, index)
    index[3999] = 9
    np.testing.assert_array_equal(k(T, index), T[index])  # the pool works after a failed call


def test_calls_from_several_python_threads_at_once(monkeypatch):
    """One call holds the native workers; the others meanwhile take the Python pool."""
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    k = tl.compile(MM, options=tl.Options(threads=2))
    problems = [_inputs([(37, 29), (29, 41)], seed=s) for s in range(6)]
    want = [k(A, B) for A, B in problems]
    failures = []

    def work(i):
        A, B = problems[i]
        for _ in range(30):
            if not np.array_equal(k(A, B), want[i]):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(problems))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_cancel_word_stops_pieces_before_they_start():
    """A piece whose call's cancel word is set returns ERROR_CANCELLED without running."""
    from codegen.lowering.status import ERROR_CANCELLED

    code = native_pool._machine_code()
    pool = native_pool.Pool(code)  # no worker threads: slot 0 only, run on this thread
    words = pool.all_words
    words[native_pool.CANCEL_WORD] = 1
    base = pool.word_base(0)
    from codegen.emit.workers import SLOT_COUNT, SLOT_COUNTER, SLOT_JOB, SLOT_OWN_COUNTER, SLOT_RANGES

    pairs = np.array([0, 1], dtype=np.int64)
    words[base + SLOT_JOB // 8 + 8] = pool.header + native_pool.CANCEL_WORD * 8  # the cancel argument
    words[base + SLOT_RANGES // 8] = pairs.ctypes.data
    words[base + SLOT_COUNT // 8] = 1
    words[base + SLOT_COUNTER // 8] = pool.slot(0) + SLOT_OWN_COUNTER
    words[base + SLOT_OWN_COUNTER // 8] = 0
    assert code.run(pool.slot(0)) == ERROR_CANCELLED  # the entry (address 0) is never called


def test_switched_off_by_the_environment():
    script = (
        "import numpy as np, tensorlang as tl, codegen.runtime.parallel as p\n"
        "from codegen.runtime import native_pool\n"
        "p.MIN_PARALLEL_WORK = 0\n"
        "k = tl.compile('def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }',"
        " options=tl.Options(threads=2))\n"
        "A = np.ones((33, 17), np.float32)\n"
        "assert np.array_equal(k(A, A.T.copy()), A @ A.T)\n"
        "assert native_pool._pool is None\n"
    )
    env = dict(os.environ, TENSORLANG_NATIVE_POOL="0")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("steal", [True, False])
def test_a_piece_whose_worker_never_starts_is_taken_by_the_caller(steal, run_phases_calls):
    """Stealing: the caller, done with its own range, runs the untaken range of a worker that
    never ran (its post dropped here); without stealing that range stays undone."""
    import types

    seen = run_phases_calls
    k = tl.compile(ADD, options=tl.Options(threads=2))
    a, c = _inputs([(1009,), (1009,)])
    out = np.full(1009, -7.0, dtype=np.float32)
    k(a, c, out={"C": out})
    (plan,) = seen["plans"]
    out[:] = -7.0
    code = native_pool._machine_code()
    lame = types.SimpleNamespace(run=code.run, post=lambda slot, seq: None, wait=lambda slot, seq, t: 1)
    pool = native_pool.Pool(lame)
    (_, ws), (_, ws2) = seen["workspaces"].lease(2)
    pieces = [(seen["buffers_for"](ws), ws, [(0, 500)]), (seen["buffers_for"](ws2), ws2, [(500, 1009)])]
    status, _ = native_pool.run(
        pool, seen["entry"], seen["params"], plan.index, pieces, None, True, -1, steal
    )
    assert status == 0
    np.testing.assert_array_equal(out[:500], (a + c)[:500])
    if steal:
        np.testing.assert_array_equal(out[500:], (a + c)[500:])
    else:
        assert (out[500:] == -7.0).all()


@pytest.mark.parametrize("watched", [False, True])
def test_workers_move_off_the_callers_core_only_when_it_runs_a_piece(watched, monkeypatch):
    """A caller that runs a piece itself keeps its core (woken workers move off it); a watched
    call's caller runs none and sleeps, so its core is left to the workers: moving them off it put
    both of a 2-core machine's workers on one core (a time-tiled stencil ran no faster on two
    threads than on one)."""
    parallel = codegen.runtime.parallel
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(parallel, "WATCHED_WORK", 0 if watched else 1 << 62)
    monkeypatch.setattr(parallel, "_current_cpu", lambda: 1)
    seen = []
    real = native_pool.run

    def spy(*args, **kwargs):
        seen.append((args[6], args[7]))  # inline, cpu
        return real(*args, **kwargs)

    monkeypatch.setattr(native_pool, "run", spy)
    a, c = _inputs([(4099,), (4099,)])
    np.testing.assert_array_equal(tl.compile(ADD, options=tl.Options(threads=2))(a, c), a + c)
    assert seen, "the split phase did not run on the native pool"
    assert all(inline is not watched for inline, _ in seen)
    assert all(cpu == (-1 if watched else 1) for _, cpu in seen)


def test_revoking_settles_each_generation_once():
    """SLOT_CLAIM: the caller revokes a generation the worker has not taken (the word becomes
    -seq); one the worker took (seq) stays taken, and the caller must wait for it."""
    code = native_pool._machine_code()
    pool = native_pool.Pool(code)  # slot 1 has no thread: nothing takes what is posted to it
    claim = pool.word_base(1) + SLOT_CLAIM // 8
    assert code.revoke(pool.slot(1), 5) == 1 and pool.all_words[claim] == -5
    assert code.revoke(pool.slot(1), 9) == 1 and pool.all_words[claim] == -9  # a later one
    pool.all_words[claim] = 12  # as the worker's compare-and-swap leaves it when it takes 12
    assert code.revoke(pool.slot(1), 12) == 0 and pool.all_words[claim] == 12


def _pool_without_workers(monkeypatch) -> native_pool.Pool:
    """The pool every dispatch gets: real machine code, but slot 1 has no thread, so a piece
    posted to it never starts (a worker whose core another thread holds, at the extreme)."""
    pool = native_pool.Pool(native_pool._machine_code())
    pool.threads = native_pool._MAX_WORKERS  # reserve() starts nothing

    def acquire(entry, workers):
        return pool if pool.busy.acquire(blocking=False) else None

    monkeypatch.setattr(native_pool, "acquire", acquire)
    return pool


def _finishes(fn, seconds=120.0):
    """fn() on a thread of its own: its result, or a failure if it is still waiting after
    `seconds` (a caller waiting for a piece nobody will ever run)."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the call waits for a piece whose worker never started"
    return result[0]


@pytest.mark.parametrize("kind", ["gemm team", "split", "loop team"])
def test_a_call_does_not_wait_for_a_worker_that_never_starts(kind, monkeypatch):
    """A worker piece not started by the time the caller's own piece returns is revoked: the
    caller's piece took every task, range or chunk, so the result is whole (a GEMM team, a split
    loop with stealing, a private-reduction loop team), and the call returns without the worker.
    Before, the caller waited until the worker got a core: after a NumPy matmul on 2 threads,
    OpenBLAS's spinning worker held it for ~0.1 s, and a 150 µs sgemm 256 took 370 µs."""
    parallel = codegen.runtime.parallel
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(parallel, "TEAM_STEP_WORK", 0)
    pool = _pool_without_workers(monkeypatch)
    dispatched = []
    real = native_pool.run
    monkeypatch.setattr(native_pool, "run", lambda *a, **kw: dispatched.append(kw) or real(*a, **kw))
    if kind == "gemm team":
        A, B = _inputs([(131, 67), (67, 97)])
        got = _finishes(lambda: tl.compile(MM, options=tl.Options(threads=2))(A, B))
        np.testing.assert_allclose(got, A @ B, rtol=1e-4, atol=1e-4)
    elif kind == "split":
        a, c = _inputs([(4099,), (4099,)])
        got = _finishes(lambda: tl.compile(ADD, options=tl.Options(threads=2))(a, c))
        np.testing.assert_array_equal(got, a + c)
    else:
        atax = "def atax(float(M,N) A, float(N) x) -> (y) {\n  t(i) +=! A(i,j) * x(j)\n  y(j) +=! A(i,j) * t(i)\n}"
        A, x = _inputs([(67, 31), (31,)])
        got = _finishes(lambda: tl.compile(atax, options=tl.Options(threads=2))(A, x))
        np.testing.assert_allclose(got, A.T @ (A @ x), rtol=1e-4, atol=1e-4)
    assert dispatched and all(kw["revocable"] for kw in dispatched)
    assert pool.all_words[pool.word_base(1) + SLOT_CLAIM // 8] == -pool.seq  # revoked
