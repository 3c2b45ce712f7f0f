"""Large temporaries kept between calls (runtime/scratch.py): the next call of the specialisation
reuses them (no fresh pages), results are those of fresh buffers, a temporary the program reads
before writing is zeroed again, and concurrent calls never share one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tensorlang as tl
from codegen.runtime import scratch
from codegen.runtime.scratch import Scratch

JACOBI = """def jacobi(float(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}"""
# T is read (accumulated into) before any write: without `!` it starts from zeros at every call
ACCUMULATED = """def acc(float(N, K) A) -> (O) {
  S(i) += A(i, k)
  O(i) = S(i) * 2.0
}"""


def _jacobi_numpy(A, steps):
    x = A.astype(np.float64)
    for _ in range(1, steps):
        y = x.copy()
        y[1:-1, 1:-1] = 0.2 * (x[1:-1, 1:-1] + x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:])
        x = y
    return x


@pytest.fixture
def keep_everything(monkeypatch):
    monkeypatch.setattr(scratch, "KEEP_BYTES", 1)


def _spec(kernel):
    (spec,) = kernel._cache.values()
    return spec


def test_a_set_is_taken_once_and_one_set_is_kept():
    pool = Scratch()
    assert pool.take() == {}
    first, second = {"B": np.zeros(3)}, {"B": np.zeros(3)}
    pool.give_back(first)
    pool.give_back(second)  # one idle set: the second is dropped
    assert pool.take() is first and pool.take() == {}
    pool._lock.acquire()  # held elsewhere (another thread; a forked child's dead one)
    try:
        pool.give_back(second)
        assert pool.take() == {}
    finally:
        pool._lock.release()
    assert pool.take() == {}


@pytest.mark.parametrize("threads,shape", [(1, (1, 1)), (1, (7, 5)), (2, (13, 31))])
def test_kept_temporary_is_reused_and_results_are_unchanged(keep_everything, threads, shape):
    A = np.random.default_rng(1).random(shape, dtype=np.float32)
    k = tl.compile(JACOBI, options=tl.Options(threads=threads))
    first = k(A, T=9)
    idle = _spec(k).scratch._idle
    assert idle is not None and set(idle) == {"B"}
    buffer = idle["B"]
    buffer.fill(np.nan)  # whatever the last call left there must not matter
    second = k(A, T=9)
    assert _spec(k).scratch._idle["B"] is buffer  # the same storage, given back again
    np.testing.assert_array_equal(second, first)
    np.testing.assert_allclose(first, _jacobi_numpy(A, 9), rtol=1e-5, atol=1e-6)


def test_small_temporaries_are_not_kept():
    A = np.random.default_rng(2).random((9, 7), dtype=np.float32)
    k = tl.compile(JACOBI)
    k(A, T=3)
    assert _spec(k).scratch._idle is None


def test_a_temporary_read_before_written_is_zeroed_again(keep_everything):
    A = np.random.default_rng(3).random((11, 6), dtype=np.float32)
    with pytest.warns(tl.TensorLangWarning, match="without initialization"):
        k = tl.compile(ACCUMULATED)
    want = 2.0 * A.astype(np.float64).sum(axis=1)
    for _ in range(3):  # kept S must start from zeros each time, not from the last sums
        np.testing.assert_allclose(k(A), want, rtol=1e-5)
    assert set(_spec(k).scratch._idle) == {"S"}


def test_a_kernel_with_a_kept_temporary_has_no_fast_path(keep_everything):
    A = np.random.default_rng(4).random((11, 6), dtype=np.float32)
    with pytest.warns(tl.TensorLangWarning, match="without initialization"):
        k = tl.compile(ACCUMULATED)
    k(A)
    k(A)
    assert not k._fast


def test_concurrent_calls_never_share_a_kept_buffer(keep_everything):
    """Python threads calling one kernel at once: each call takes the idle set or makes its own."""
    rng = np.random.default_rng(5)
    inputs = [rng.random((17, 23), dtype=np.float32) for _ in range(4)]
    wants = [_jacobi_numpy(A, 7) for A in inputs]
    k = tl.compile(JACOBI)
    k(inputs[0], T=7)
    failures = []

    def worker(n: int) -> None:
        for _ in range(25):
            got = k(inputs[n], T=7)
            if not np.allclose(got, wants[n], rtol=1e-5, atol=1e-6):
                failures.append(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
