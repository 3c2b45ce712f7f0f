"""Native dispatch (runtime/dispatch_records.py, emit/dispatch.py): a repeated call of a split signature runs its GEMM teams and split phases through one native entry, with the Python path's results, errors and fallbacks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import codegen.runtime.parallel
import tensorlang as tl
from codegen.runtime import native_pool

pytestmark = pytest.mark.skipif(
    native_pool._supported() is None, reason="native workers: Linux x86-64/AArch64"
)

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
MLP = "def mlp(float(B,K) X, float(K,N) W, float(N) b) -> (O) {\n  O(i,j) +=! X(i,k) * W(k,j)\n  O(i,j) = fmax(O(i,j) + b(j), 0.0)\n}"
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
GATHER = "def g(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }"


@pytest.fixture
def everything_splits(monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes]


def _dispatched(kernel) -> list[int]:
    """The phases the kernel's last native signature dispatches to the workers (their record
    addresses); fails when no native dispatch ran, so that no test here passes vacuously."""
    fast = kernel._native
    assert fast is not None and fast.native is not None and fast.native.dispatch is not None
    return [a for a in fast.native.dispatch.addresses if a]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 1), (13, 7, 127), (127, 131, 61), (211, 211, 211)])
def test_repeated_gemm_team_calls_are_bitwise_one_threads(m, k, n, everything_splits):
    A, B = _inputs([(m, k), (k, n)])
    one = tl.compile(MM, options=tl.Options(threads=1))(A, B)
    two = tl.compile(MM, options=tl.Options(threads=2))
    for _ in range(4):
        np.testing.assert_array_equal(two(A, B), one)
    if m * n >= 127 * 61:  # smaller ones are no GEMM team (plain loops)
        assert len(_dispatched(two)) == 1
    C = np.full((m, n), np.nan, np.float32)
    assert two(A, B, out=C) is C and np.array_equal(C, one)


def test_a_gemm_team_then_its_epilogue(everything_splits):
    """relu(XW + b): the GEMM team and the split epilogue, one after the other, on every call."""
    X, W, b = _inputs([(97, 61), (61, 131), (131,)])
    want = tl.compile(MLP, options=tl.Options(threads=1))(X, W, b)
    k = tl.compile(MLP, options=tl.Options(threads=2))
    for _ in range(4):
        np.testing.assert_array_equal(k(X, W, b), want)
    assert _dispatched(k)


@pytest.mark.parametrize("n", [2, 1009, 4099])
def test_repeated_split_calls(n, everything_splits):
    a, c = _inputs([(n,), (n,)])
    k = tl.compile(ADD, options=tl.Options(threads=2))
    for _ in range(4):
        np.testing.assert_array_equal(k(a, c), a + c)
    assert _dispatched(k)


def test_a_split_with_shared_parts(monkeypatch, everything_splits):
    """From DYNAMIC_WORK the pieces take the calls from one shared list (the pool's counter)."""
    monkeypatch.setattr(codegen.runtime.parallel, "DYNAMIC_WORK", 0)
    a, c = _inputs([(3001,), (3001,)])
    k = tl.compile(ADD, options=tl.Options(threads=3))
    for _ in range(4):
        np.testing.assert_array_equal(k(a, c), a + c)
    assert _dispatched(k)


def test_an_error_in_a_dispatched_piece_reaches_the_caller(everything_splits):
    k = tl.compile(GATHER, options=tl.Options(threads=2))
    T = np.arange(10, dtype=np.float32)
    index = np.zeros(4001, dtype=np.int32)
    for _ in range(3):
        np.testing.assert_array_equal(k(T, index), T[index])
    assert _dispatched(k)
    for bad in (3999, 5):  # in the worker's half, then in the caller's
        index[bad] = 10
        with pytest.raises(tl.ArgumentError) as python_path:  # a new kernel's first call
            tl.compile(GATHER, options=tl.Options(threads=2))(T, index)
        with pytest.raises(tl.ArgumentError) as native:
            k(T, index)
        assert str(native.value) == str(python_path.value) and "I" in str(native.value)
        index[bad] = 9
        np.testing.assert_array_equal(k(T, index), T[index])  # nothing is left held


def test_workers_held_by_another_call_run_the_phase_here(everything_splits):
    """POOL_BUSY taken (another Python thread's call holds the workers): each phase runs whole
    on the calling thread, with the same bits."""
    A, B = _inputs([(67, 45), (45, 33)])
    one = tl.compile(MM, options=tl.Options(threads=1))(A, B)
    k = tl.compile(MM, options=tl.Options(threads=2))
    k(A, B)
    k(A, B)
    pool = native_pool._pool
    assert _dispatched(k) and pool.busy.acquire(blocking=False)
    try:
        seq = pool.seq
        np.testing.assert_array_equal(k(A, B), one)
        assert pool.seq == seq  # nothing was posted
    finally:
        pool.busy.release()
    np.testing.assert_array_equal(k(A, B), one)
    assert pool.seq > seq


def test_calls_of_one_signature_from_several_python_threads(everything_splits):
    """One call holds the signature's plan (its workspaces); the others take the Python path
    meanwhile, and both hold the workers in turn."""
    k = tl.compile(MM, options=tl.Options(threads=2))
    A, B = _inputs([(61, 37), (37, 53)])
    want = tl.compile(MM, options=tl.Options(threads=1))(A, B)
    k(A, B)
    k(A, B)
    failures = []

    def work():
        for _ in range(40):
            if not np.array_equal(k(A, B), want):
                failures.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and _dispatched(k)


def test_a_changed_thread_count_takes_the_python_path(monkeypatch, everything_splits):
    A, B = _inputs([(53, 29), (29, 47)])
    k = tl.compile(MM)  # the default thread count, read from the environment on each call
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "2")
    want = A @ B
    for _ in range(3):
        np.testing.assert_allclose(k(A, B), want, rtol=1e-4, atol=1e-4)
    native = k._native.native
    assert native.threads == 2
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "3")
    assert native.run((A, B), None) is None
    np.testing.assert_allclose(k(A, B), want, rtol=1e-4, atol=1e-4)


def test_a_forked_child_does_not_use_the_parents_workers(tmp_path):
    """The records point at the parent's pool; a child has none of its threads and makes a
    pool of its own."""
    script = (
        "import os, numpy as np, tensorlang as tl, codegen.runtime.parallel as p\n"
        "from codegen.runtime import native_pool\n"
        "p.MIN_PARALLEL_WORK = 0\n"
        f"k = tl.compile({MM!r}, options=tl.Options(threads=2))\n"
        "A = np.ones((33, 17), np.float32); B = np.ones((17, 29), np.float32)\n"
        "for _ in range(3): k(A, B)\n"
        "assert k._native.native.dispatch is not None\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = all(np.array_equal(k(A, B), A @ B) for _ in range(5))\n"
        "    ok = ok and native_pool._pool is not k._native.native.pool\n"
        "    os._exit(0 if ok else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0\n"
        "assert np.array_equal(k(A, B), A @ B)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TENSORLANG_CACHE_DIR=str(tmp_path)))  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_one_thread_signature_with_scratch_runs_natively_beside_a_pool(everything_splits):
    """A 1-thread GEMM (a workspace, so not inline) has records but no workers: it runs natively
    whether or not another kernel has started the pool (it used to compare against the pool and
    fall back to the Python path on every call once one existed)."""
    A, B = _inputs([(67, 45), (45, 33)])
    two = tl.compile(MM, options=tl.Options(threads=2))
    for _ in range(3):
        two(A, B)
    assert native_pool._pool is not None
    one = tl.compile(MM, options=tl.Options(threads=1))
    for _ in range(3):
        want = one(A, B)
    native = one._native.native
    assert native.dispatch is not None and native.pool is None
    code, _, got = native.run((A, B), None)
    assert code == 0 and np.array_equal(got, want)
