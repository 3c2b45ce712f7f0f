"""Threads: results do not depend on the thread count; the count comes from Options or the environment."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SOFTMAX

import codegen.runtime.parallel
import tensorlang as tl
from codegen.runtime.parallel import chunks
from scheduler import default_threads

PROGRAMS = {
    "gemm": (
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
        [(301, 257), (257, 129)],
    ),
    "rows": ("def r(float(N, D) I) -> (O) { O(n) +=! exp(I(n, d)) * 0.5 }", [(517, 263)]),
    "bmm": (
        "def b(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }",
        [(5, 67, 33), (5, 33, 71)],
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_results_are_bitwise_identical_for_any_thread_count(name, monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    src, shapes = PROGRAMS[name]
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes]
    results = [tl.compile(src, options=tl.Options(threads=t))(*inputs) for t in (1, 2, 3, 7)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_chunks_cover_the_iterations_once():
    for first, stop, step, parts in [
        (0, 10, 1, 3),
        (0, 54, 32, 2),
        (5, 6, 1, 4),
        (0, 0, 1, 2),
        (-7, 100, 3, 5),
    ]:
        got = [i for lo, hi in chunks((first, stop, step), parts) for i in range(lo, hi, step)]
        assert got == list(range(first, stop, step))


def test_thread_count_from_environment(monkeypatch):
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "zero")
    with pytest.raises(tl.TensorLangError, match="TENSORLANG_NUM_THREADS"):
        default_threads()
    monkeypatch.delenv("TENSORLANG_NUM_THREADS")
    assert default_threads() >= 1


def test_bad_thread_option():
    with pytest.raises(tl.TensorLangError, match="threads"):
        tl.Options(threads=0)


def test_concurrent_calls_of_one_kernel_do_not_share_scratch_memory():
    """Two Python threads calling one kernel at once (ctypes releases the GIL): each call needs its
    own workspace, where softmax keeps its contracted row buffer `e`."""
    import threading

    k = tl.compile(SOFTMAX, options=tl.Options(threads=1))
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-4, 4, size=(64, 4099)).astype(np.float32) for _ in range(2)]
    wants = [k(x) for x in xs]
    failures = []

    def worker(x, want):
        for _ in range(40):
            got = k(x)
            if not np.array_equal(got, want):
                failures.append(float(np.abs(got - want).max()))
                return

    threads = [threading.Thread(target=worker, args=(x, w)) for x, w in zip(xs, wants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_small_gemm_stays_serial_and_larger_ones_split():
    """A GEMM team's dispatch and stage ends cost some 15-30 µs: 192³ gained little on 2 threads
    (71 → 61 µs), 224³ and 256³ gain (127 → 94, 154 → 105). GEMM teams split from about 2^23
    multiply-adds (parallel.GEMM_TEAM_DISCOUNT), other phases from MIN_PARALLEL_WORK."""
    from codegen.runtime.parallel import worth_threads

    k = tl.compile(
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
        options=tl.Options(threads=2),
    )

    def splits(n: int) -> bool:
        return any(map(worth_threads, k._specialisation({"M": n, "K": n, "N": n}).plans))

    assert not splits(128) and not splits(192)
    assert splits(224) and splits(256) and splits(384)


COLSUM = "def colsum(float(M, N) A) -> (s) { s(j) +=! A(i, j) * 2.0 }"


@pytest.mark.parametrize("src", [COLSUM], ids=["colsum"])
def test_a_band_parallel_only_along_its_stride_one_loop_splits_in_strips(src, monkeypatch):
    """s(j) += A(i, j) * 2 is parallel only along j, its stride-1 loop: on several threads a
    loop over strips of j goes outside, which threads split. (atax keeps its fusion over i on
    threads and privatises y: tests/codegen/test_private_reductions.py.)"""
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    sizes = {"M": 4000, "N": 4000}
    plan = tl.compile(src, options=tl.Options(threads=2)).inspect("plan", sizes=sizes)
    last = [line for line in plan.splitlines() if line.startswith("// phase")][-1]
    assert "threads split the outer loop" in last, plan
    rng = np.random.default_rng(4)
    reference = tl.compile(src, options=tl.Options(optimize=False))
    kernels = {t: tl.compile(src, options=tl.Options(threads=t)) for t in (1, 2, 3)}
    for m, n in [(1, 1), (7, 513), (37, 1100), (300, 2049)]:
        args = [rng.uniform(-1, 1, size=(m, n)).astype(np.float32)]
        got = {t: k(*args) for t, k in kernels.items()}
        np.testing.assert_array_equal(got[3], got[2])
        for t in (1, 2):
            np.testing.assert_allclose(got[t], reference(*args), rtol=1e-4, atol=1e-4 * m)


@pytest.mark.parametrize("name", sorted(PROGRAMS) + ["softmax", "elementwise"])
def test_dynamic_parts_give_bitwise_equal_results(name, monkeypatch):
    """Split loops whose threads take parts in turn (DYNAMIC_WORK): the same bits as one thread,
    also for softmax's contracted row buffer and pipelined rows, and a chunked elementwise loop."""
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(codegen.runtime.parallel, "DYNAMIC_WORK", 0)
    if name == "softmax":
        src, shapes = SOFTMAX, [(67, 129)]
    elif name == "elementwise":
        src, shapes = "def ew(float(N) a) -> (o) { o(i) = tanh(a(i)) * 0.5 }", [(1001,)]
        monkeypatch.setattr(codegen.runtime.parallel, "CHUNK_WORK", 50)
    else:
        src, shapes = PROGRAMS[name]
    rng = np.random.default_rng(6)
    inputs = [rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes]
    results = [tl.compile(src, options=tl.Options(threads=t))(*inputs) for t in (1, 2, 3)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_dynamic_parts_are_each_run_once_and_a_late_thread_takes_fewer():
    import threading
    import time

    from codegen.planning.runs import PhasePlan
    from codegen.runtime.parallel import DYNAMIC_PARTS, Workspaces, run_phases

    seen, lock = [], threading.Lock()
    main = threading.get_ident()

    def entry(buffers, params, error, phase, lo, hi, workspace, cancel):
        if threading.get_ident() != main and not any(t != main for _, _, t in seen):
            time.sleep(0.05)  # the pool thread starts late
        with lock:
            seen.append((lo, hi, threading.get_ident()))
        return 0

    plan = PhasePlan(0, (0, 100, 1), 1 << 23)  # split in parts; short: the caller takes part
    code, _ = run_phases(entry, lambda ws: 0, 0, (plan,), 2, Workspaces(0))
    assert code == 0
    covered = sorted(i for lo, hi, _ in seen for i in range(lo, hi))
    assert covered == list(range(100)) and len(seen) == 2 * DYNAMIC_PARTS
    late = [t for _, _, t in seen if t != main]
    assert len(late) < DYNAMIC_PARTS  # the late thread did fewer than its even share

    def failing(buffers, params, error, phase, lo, hi, workspace, cancel):
        with lock:
            seen.append((lo, hi, 0))
        return 7

    seen.clear()
    code, _ = run_phases(failing, lambda ws: 0, 0, (plan,), 2, Workspaces(0))
    assert code == 7 and len(seen) <= 2  # a failed part stops the others from taking more


def test_a_pool_thread_on_the_callers_core_moves_off_it_and_keeps_its_affinity():
    import os

    from codegen.runtime.parallel import _current_cpu, _move_off

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or _current_cpu() < 0:
        pytest.skip("needs two cores and sched_getcpu")
    allowed = os.sched_getaffinity(0)
    here = _current_cpu()
    _move_off(here)
    assert _current_cpu() != here
    assert os.sched_getaffinity(0) == allowed
    _move_off(-1)  # unknown core: nothing happens
    assert os.sched_getaffinity(0) == allowed


def test_a_long_call_is_watched_until_its_sizes_ran_short_once():
    """A call of WATCHED_WORK instances or more runs off the calling thread (which stays free
    for Ctrl-C) while its specialisation's clock has no completed call on as many threads, or
    the last took WATCH_AFTER_S or more; once one took less, the next runs on the calling
    thread. A failed call records nothing."""
    import threading

    from codegen.planning.runs import PhasePlan
    from codegen.runtime.parallel import WATCH_AFTER_S, WATCHED_WORK, Workspaces, run_phases
    from codegen.runtime.watch import CallClock

    threads_seen: list[bool] = []

    def entry(buffers, params, error, phase, lo, hi, workspace, cancel):
        threads_seen.append(threading.current_thread() is threading.main_thread())
        return code

    clock = CallClock()
    plan = PhasePlan(0, None, WATCHED_WORK)  # serial: one piece
    code = 5  # fails: the clock records nothing, the next call is watched again
    assert run_phases(entry, lambda ws: 0, 0, (plan,), 1, Workspaces(0), clock)[0] == 5
    code = 0
    assert run_phases(entry, lambda ws: 0, 0, (plan,), 1, Workspaces(0), clock)[0] == 0
    assert run_phases(entry, lambda ws: 0, 0, (plan,), 1, Workspaces(0), clock)[0] == 0
    assert threads_seen == [False, False, True]  # watched, watched (then short), on the caller
    assert clock.seconds(1) < WATCH_AFTER_S and clock.seconds(2) is None  # per thread count
    clock.record(1, WATCH_AFTER_S)  # a long call: watched again
    assert run_phases(entry, lambda ws: 0, 0, (plan,), 1, Workspaces(0), clock)[0] == 0
    assert threads_seen[-1] is False
    small = PhasePlan(0, None, WATCHED_WORK - 1)  # below the instances: never watched
    assert run_phases(entry, lambda ws: 0, 0, (small,), 1, Workspaces(0))[0] == 0
    assert threads_seen[-1] is True


@pytest.mark.parametrize("threads", [1, 2])
def test_a_watched_recurrence_matches_an_unwatched_one(monkeypatch, threads):
    """Every phase of a watched call on a native worker (serial ones too) gives the result the
    calling thread gives: jacobi-2d on an odd grid, each call watched, then each on the caller."""
    from codegen.runtime import native_pool, parallel

    src = """def jacobi(float(N, M) A) -> (O) {
      B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
      B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1) ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1)) : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
      O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
    }"""
    k = tl.compile(src, options=tl.Options(threads=threads))
    A = np.random.default_rng(3).random((37, 53), dtype=np.float32)
    dispatches = []
    real_run = native_pool.run

    def spy(*args, **kwargs):
        dispatches.append(args[6])  # inline: whether the caller runs a piece itself
        return real_run(*args, **kwargs)

    monkeypatch.setattr(native_pool, "run", spy)
    monkeypatch.setattr(parallel, "WATCHED_WORK", 1)
    monkeypatch.setattr(parallel, "WATCH_AFTER_S", 0.0)  # every call watched
    watched = [k(A, T=T) for T in (1, 2, 19)]
    if native_pool._supported() is not None:  # Linux x86-64/AArch64: native workers
        # every phase went to native workers, the caller running none (serial phases too)
        assert dispatches and not any(dispatches)
    dispatches.clear()
    monkeypatch.setattr(parallel, "WATCH_AFTER_S", 1e9)  # each size has run: on the caller now
    for T, want in zip((1, 2, 19), watched):
        np.testing.assert_array_equal(k(A, T=T), want)
    assert all(dispatches)  # split phases (2 threads) with the caller taking part; serial: none
    ref = tl.compile(src, options=tl.Options(optimize=False))
    np.testing.assert_allclose(watched[-1], ref(A, T=19), rtol=1e-5, atol=1e-6)
