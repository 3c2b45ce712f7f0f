"""Large temporaries kept between calls (runtime/scratch.py): the next call of the specialisation
reuses them (no fresh pages), results are those of fresh buffers, a temporary the program reads
before writing is zeroed again, and concurrent calls never share one."""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import pytest
from conftest import JACOBI_2D_RECURRENCE, jacobi_2d_reference

import tensorlang as tl
from codegen.runtime import scratch
from codegen.runtime.scratch import Scratch

# S is read (accumulated into) before any write: without `!` it starts from zeros at every call
ACCUMULATED = """def acc(float(N, K) A) -> (O) {
  S(i) += A(i, k)
  O(i) = S(i) * 2.0
}"""


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
    k = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=threads))
    first = k(A, T=9)
    idle = _spec(k).scratch._idle
    assert idle is not None and set(idle) == {"B"}
    buffer = idle["B"]
    buffer.fill(np.nan)  # whatever the last call left there must not matter
    second = k(A, T=9)
    assert _spec(k).scratch._idle["B"] is buffer  # the same storage, given back again
    np.testing.assert_array_equal(second, first)
    np.testing.assert_allclose(first, jacobi_2d_reference(A, 9), rtol=1e-5, atol=1e-6)


def test_small_temporaries_are_not_kept():
    A = np.random.default_rng(2).random((9, 7), dtype=np.float32)
    k = tl.compile(JACOBI_2D_RECURRENCE)
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


def test_a_kernel_accumulating_without_initialisation_has_no_fast_path(keep_everything):
    A = np.random.default_rng(4).random((11, 6), dtype=np.float32)
    with pytest.warns(tl.TensorLangWarning, match="without initialization"):
        k = tl.compile(ACCUMULATED)
    k(A)
    k(A)
    assert not k._fast


def test_concurrent_calls_never_share_a_kept_buffer(keep_everything):
    """Python threads calling one kernel at once: each call takes the idle set or makes its own
    (on the fast path, fastcall.py, as on the full one)."""
    rng = np.random.default_rng(5)
    inputs = [rng.random((17, 23), dtype=np.float32) for _ in range(4)]
    wants = [jacobi_2d_reference(A, 7) for A in inputs]
    k = tl.compile(JACOBI_2D_RECURRENCE)
    k(inputs[0], T=7)
    assert [f.kept[0][1] for f in k._fast.values()] == ["B"]
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


def test_a_temporary_of_four_mib_is_kept_in_a_mapping_of_its_own():
    """jacobi-2d 1024 x 512: B folds to 2 planes of 2 MiB, 4 MiB in all (the default threshold).
    Kept temporaries live in their own page-aligned mapping, not in glibc's heap (where heat-3d
    ran 1.6-1.8x slower), and results do not depend on which call made them."""
    assert scratch.KEEP_BYTES == 4 << 20
    A = np.random.default_rng(6).random((1024, 512), dtype=np.float32)
    k = tl.compile(JACOBI_2D_RECURRENCE)
    first = k(A, T=3)
    buffer = _spec(k).scratch._idle["B"]
    assert buffer.nbytes == 4 << 20 and buffer.ctypes.data % mmap.PAGESIZE == 0
    owner = buffer
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert isinstance(owner.obj if isinstance(owner, memoryview) else owner, mmap.mmap)
    np.testing.assert_array_equal(k(A, T=3), first)
    np.testing.assert_allclose(first, jacobi_2d_reference(A, 3), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_mapped_memory_is_zeroed_writable_and_private_to_a_forked_child():
    a = scratch.mapped((5, 7), np.dtype(np.float64))
    assert a.flags.writeable and a.ctypes.data % mmap.PAGESIZE == 0 and not a.any()
    pid = os.fork()
    if pid == 0:  # the child writes its copy: the parent's must not change
        a.fill(7.0)
        os._exit(0 if a.sum() == 7.0 * 35 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not a.any()
    a[2, 3] = 1.5
    assert a.sum() == 1.5
    empty = scratch.mapped((0, 4), np.dtype(np.float32))
    assert empty.shape == (0, 4)


def test_mapped_falls_back_to_numpy_when_no_mapping_can_be_made(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(scratch.mmap, "mmap", refuse)
    a = scratch.mapped((3, 4), np.dtype(np.float32))
    assert a.shape == (3, 4) and a.dtype == np.float32 and not a.any()
