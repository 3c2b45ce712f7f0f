"""Picklable kernels: a Kernel pickles as its source, name, options and filename (never machine
code, locks or caches), so it works in multiprocessing pools and process executors."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import pickle
import warnings

import numpy as np
import pytest

import tensorlang as tl

SRC = "def f(float(N, D) A) -> (B) { B(n, d) = tanh(A(n, d)) * 2.0 }"
TWO_DEFS = """def g(float(N) A) -> (B) { B(n) = A(n) + 1.0 }
def f(float(N, D) A) -> (B) { B(n, d) = tanh(A(n, d)) * 2.0 }"""
TIMEOUT = 120  # a hung worker fails the test instead of hanging the run

A = np.random.default_rng(0).standard_normal((64, 48), dtype=np.float32)
WANT = np.tanh(A) * 2


def _threaded_kernel() -> tl.Kernel:
    """A kernel that has run on 2 threads: its thread pool, locks and machine code exist."""
    kernel = tl.compile(TWO_DEFS, "f", options=tl.Options(threads=2), filename="model/f.tc")
    np.testing.assert_allclose(kernel(A), WANT, atol=1e-5)
    return kernel


def test_round_trip_of_a_called_threaded_kernel():
    kernel = _threaded_kernel()
    data = pickle.dumps(kernel)
    assert len(data) < len(TWO_DEFS) + 1500  # source, name, options: no machine code or caches
    again = pickle.loads(data)
    assert again is not kernel and again.name == "f" and again.filename == "model/f.tc"
    assert again.source == TWO_DEFS and again.options == kernel.options
    assert again.compile_count == 0  # recompiled from source, no machine code carried over
    np.testing.assert_allclose(again(A), WANT, atol=1e-5)
    np.testing.assert_allclose(again(A[:5]), WANT[:5], atol=1e-5)
    assert again.compile_count == 2
    np.testing.assert_allclose(pickle.loads(pickle.dumps(again))(A), WANT, atol=1e-5)


def test_unpickled_kernel_keeps_non_default_options():
    options = tl.Options(
        tile=(4, 8), fusion="none", threads=3, fast_math=True, specialize=False, max_specializations=2
    )
    kernel = tl.compile(SRC, options=options)
    again = pickle.loads(pickle.dumps(kernel))
    assert again.options == options and again.options.tile == (4, 8)
    assert again.inspect("plan") == kernel.inspect("plan")
    assert "symbolic" in again.inspect("plan") and "c0 += 4" in again.inspect("loops")
    np.testing.assert_allclose(again(A), WANT, atol=1e-5)


def test_options_pickle():
    options = tl.Options(tile=32, fusion="max", threads=2, prefetch=True)
    assert pickle.loads(pickle.dumps(options)) == options
    assert pickle.loads(pickle.dumps(tl.Options())) == tl.Options()


def test_unpickling_does_not_repeat_warnings():
    src = "def f(float(N) A) -> (B) { B(i) += A(i) }"
    with pytest.warns(tl.TensorLangWarning, match="Reduction without initialization"):
        kernel = tl.compile(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)
        again = pickle.loads(pickle.dumps(kernel))
    assert again.program.warnings


def test_a_kernel_without_source_says_why_it_cannot_pickle():
    kernel = tl.compile(SRC)
    kernel.source = None  # as for a Kernel built from a Program directly
    with pytest.raises(TypeError, match="not made by tl.compile"):
        pickle.dumps(kernel)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_pool(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    kernel = _threaded_kernel()  # the parent's thread pool is running when the children start
    with mp.get_context(method).Pool(2) as pool:
        results = pool.map_async(kernel, [A, A[:7]]).get(timeout=TIMEOUT)
    np.testing.assert_allclose(results[0], WANT, atol=1e-5)
    np.testing.assert_allclose(results[1], WANT[:7], atol=1e-5)


def test_process_pool_executor_spawn():
    kernel = _threaded_kernel()
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as executor:
        results = list(executor.map(kernel, [A[:10], A[10:30]], timeout=TIMEOUT))
    np.testing.assert_allclose(np.concatenate(results), WANT[:30], atol=1e-5)


def test_dask_processes():
    dask = pytest.importorskip("dask")
    kernel = _threaded_kernel()
    parts = [dask.delayed(kernel)(A[:10]), dask.delayed(kernel)(A[10:30])]
    results = dask.compute(*parts, scheduler="processes", num_workers=2)
    np.testing.assert_allclose(np.concatenate(results), WANT[:30], atol=1e-5)
