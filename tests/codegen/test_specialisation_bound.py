"""The specialisation cache is bounded (issue 9, item 6): Options.max_specializations sets how many
sets of sizes keep machine code; the least recently called is evicted and its code freed."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import tensorlang as tl

ROWS = "def r(float(N, D) I) -> (O) { O(n) +=! exp(I(n, d)) * 0.5 }"


def reference(x: np.ndarray) -> np.ndarray:
    return (np.exp(x.astype(np.float64)) * 0.5).sum(axis=1)


def call(k, n: int) -> np.ndarray:
    x = np.random.default_rng(n).uniform(-1, 1, (n, 7)).astype(np.float32)
    got = k(x)
    np.testing.assert_allclose(got, reference(x), rtol=1e-5)
    return got


def test_least_recently_used_specialisation_is_evicted_and_recompiled():
    k = tl.compile(ROWS, options=tl.Options(threads=1, max_specializations=3))
    for n in (3, 4, 5, 6, 7):
        call(k, n)
        assert len(k._cache) <= 3
        assert len(k._shape_cache) <= 3
    assert k.compile_count == 5
    call(k, 3)  # evicted: compiled again, still correct
    assert k.compile_count == 6
    call(k, 7)  # still cached
    assert k.compile_count == 6
    assert len(k._cache) == 3


def test_a_hit_refreshes_the_entry():
    k = tl.compile(ROWS, options=tl.Options(threads=1, max_specializations=2))
    call(k, 3)
    call(k, 4)
    call(k, 3)  # now 4 is the least recently used
    call(k, 5)  # evicts 4
    count = k.compile_count
    call(k, 3)
    assert k.compile_count == count
    call(k, 4)
    assert k.compile_count == count + 1


def test_evicted_machine_code_is_freed():
    k = tl.compile(ROWS, options=tl.Options(threads=1, max_specializations=1))
    call(k, 3)
    (spec,) = k._cache.values()
    engine = weakref.ref(spec.code.engine)
    del spec
    call(k, 4)  # evicts size 3
    gc.collect()
    assert engine() is None  # the execution engine (and with it the machine code) is gone


def test_eviction_waits_for_a_running_call():
    """A call holds its specialisation: evicting it meanwhile (another thread calls other sizes)
    does not free the code under the running call."""
    k = tl.compile(ROWS, options=tl.Options(threads=1, max_specializations=1))
    big = np.random.default_rng(0).uniform(-1, 1, (4000, 2001)).astype(np.float32)
    want = k(big)
    errors = []

    def others():
        try:
            for n in range(3, 9):
                call(k, n)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    for _ in range(3):
        t = threading.Thread(target=others)
        t.start()
        got = k(big)
        t.join()
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert not errors
    assert len(k._cache) <= 1


def test_bad_bound_is_rejected():
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(tl.TensorLangError, match="max_specializations"):
            tl.Options(max_specializations=bad)
