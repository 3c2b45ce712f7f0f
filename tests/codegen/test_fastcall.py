"""The fast path of repeated small calls (codegen/runtime/fastcall.py): taken only for a signature
that passed every check before, and indistinguishable from the full path in results and errors."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import tensorlang as tl
from tensorlang.errors import TensorLangWarning

ADD = "def f(float(N) A, float(N) B) -> (C, D) { C(i) = A(i) + B(i)\n D(i) = A(i) * B(i) }"
GATHER = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"
TEMP = "def t(float(N) A) -> (O) {\n  T(i) = A(i) * 2\n  O(i) = T(N - 1 - i) + 1\n}"


def _pair(n, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("n", [0, 1, 7, 31, 4099])
def test_repeated_calls_take_the_fast_path_and_agree(n):
    k = tl.compile(ADD)
    a, b = _pair(n)
    first = k(a, b)
    assert len(k._fast) == 1
    for seed in range(3):
        a, b = _pair(n, seed)
        c, d = k(a, b)
        np.testing.assert_array_equal(c, a + b)
        np.testing.assert_array_equal(d, a * b)
        assert c is not first[0] and not np.shares_memory(c, d)  # fresh outputs every call
    assert k.compile_count == 1


def test_read_only_inputs():
    k = tl.compile(ADD)
    a, b = _pair(9)
    a.flags.writeable = False
    for _ in range(3):
        np.testing.assert_array_equal(k(a, b)[0], a + b)
    assert k._fast


def test_temporaries_in_shared_storage_take_the_fast_path():
    k = tl.compile(TEMP)
    a = np.arange(9, dtype=np.float32)
    results = [k(a) for _ in range(3)]
    for r in results:
        np.testing.assert_array_equal(r, a[::-1] * 2 + 1)
    (fast,) = k._fast.values()
    assert fast.shared and fast.native is None  # one allocation a call, as the full path makes
    assert not np.shares_memory(results[1], results[2])


def _full_path_taken(*_):
    raise AssertionError("the full path ran")


RECURRENCE = """def acc(float(N) A) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = B(t-1, i) + 1 where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}"""


def test_sizes_given_by_keyword_take_the_fast_path_with_their_values_in_the_key():
    k = tl.compile(RECURRENCE)
    a = np.arange(7, dtype=np.float32)
    for steps in (5, 5, 2, 5):
        np.testing.assert_array_equal(k(a, T=steps), a + steps - 1)
    assert sorted(key[2] for key in k._fast) == [(("T", 2),), (("T", 5),)]
    assert all(key[0] == "sizes" for key in k._fast)
    k._specialisation = _full_path_taken
    np.testing.assert_array_equal(k(a, T=2), a + 1)
    del k._specialisation
    # the full path's checks still apply: a value of another type is never looked up
    np.testing.assert_array_equal(k(a, T=np.int64(5)), a + 4)
    for bad in (5.0, True, -1):
        with pytest.raises(tl.ArgumentError, match="size T must be an integer"):
            k(a, T=bad)
    with pytest.raises(tl.ArgumentError, match="N=6 but the input shapes give N = 7"):
        k(a, T=5, N=6)
    assert len(k._fast) == 2


def test_kept_temporaries_take_the_fast_path_and_are_reused():
    k = tl.compile(RECURRENCE)
    n = (4 << 20) // 4 + 1  # B folded to two planes of n floats: kept between calls (scratch.py)
    a = np.random.default_rng(0).integers(-1000, 1000, n).astype(np.float32)  # sums exact
    np.testing.assert_array_equal(k(a, T=4), a + 3)
    np.testing.assert_array_equal(k(a, T=4), a + 3)
    (fast,) = k._fast.values()
    assert [name for _, name, _, _ in fast.kept] == ["B"]
    held = fast.spec.scratch._idle["B"]
    k._specialisation = _full_path_taken
    for steps in (4, 4):
        np.testing.assert_array_equal(k(a, T=steps), a + steps - 1)
    assert fast.spec.scratch._idle["B"] is held  # the same mapping, call after call


@pytest.mark.parametrize("variant", ["list", "strided"])
def test_other_signatures_use_the_full_path(variant):
    k = tl.compile(ADD)
    a, b = _pair(5)
    if variant == "list":
        c, _ = k([float(x) for x in a], b)
    else:
        strided = np.zeros(10, np.float32)[::2]
        strided[:] = a
        c, _ = k(strided, b)
    np.testing.assert_array_equal(c, a + b)
    assert not k._fast


def test_checks_still_apply_on_a_fast_signature():
    k = tl.compile(ADD)
    a, b = _pair(6)
    k(a, b)
    with pytest.raises(tl.ArgumentError, match="expected type float32"):
        k(a.astype(np.float64), b)
    with pytest.raises(tl.ArgumentError, match="mismatched sizes for N"):
        k(a, b[:5])
    strided = np.zeros(12, np.float32)[::2]
    strided[:] = a
    np.testing.assert_array_equal(k(strided, b)[0], a + b)  # copied, by the full path


def test_run_time_errors_from_the_fast_path_are_located():
    k = tl.compile(GATHER)
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    k(table, np.array([3, 0], np.int32))
    assert k._fast
    with pytest.raises(
        tl.ArgumentError, match=r"index 4 out of range for dimension 0 of T in T\(I\(b\), d\)"
    ):
        k(table, np.array([1, 4], np.int32))


def test_uninitialised_outputs_warn_on_every_call():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorLangWarning)
        k = tl.compile("def f(float(N, K) A) -> (O) { O(n) += A(n, k) }")
    a = np.ones((3, 4), np.float32)
    for _ in range(2):
        with pytest.warns(TensorLangWarning, match="accumulated without initialisation"):
            np.testing.assert_array_equal(k(a), np.full(3, 4, np.float32))
    assert not k._fast


def test_evicted_specialisations_leave_the_fast_path():
    k = tl.compile(ADD, options=tl.Options(max_specializations=1))
    for n in (3, 4, 3, 5):
        a, b = _pair(n)
        np.testing.assert_array_equal(k(a, b)[0], a + b)
        assert len(k._fast) <= 1 and all(f.spec in k._cache.values() for f in k._fast.values())


def test_large_work_keeps_the_threaded_path():
    k = tl.compile(ADD, options=tl.Options(threads=2))
    a, b = _pair(1 << 20)
    np.testing.assert_array_equal(k(a, b)[0], a + b)
    # split over threads and watched for Ctrl-C: the fast call dispatches through run_phases
    assert all(not f.inline for f in k._fast.values())
    np.testing.assert_array_equal(k(a, b)[0], a + b)


def test_concurrent_fast_calls():
    k = tl.compile(ADD)
    a, b = _pair(257)
    k(a, b)
    failures = []

    def worker(seed):
        x, y = _pair(257, seed)
        for _ in range(200):
            c, d = k(x, y)
            if not (np.array_equal(c, x + y) and np.array_equal(d, x * y)):
                failures.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_out_arrays_on_the_fast_path():
    k = tl.compile(ADD)
    a, b = _pair(11)
    k(a, b)
    c, d = np.empty_like(a), np.empty_like(a)
    for out in ({"C": c, "D": d}, (c, d), [c, None], {"D": d}):
        got = k(a, b, out=out)
        given = dict(zip(("C", "D"), out)) if not isinstance(out, dict) else out
        for name, array, want in zip(("C", "D"), got, (a + b, a * b)):
            np.testing.assert_array_equal(array, want)
            if given.get(name) is not None:
                assert array is given[name]  # written in place and returned
    assert len(k._fast) == 1


@pytest.mark.parametrize("bad", ["alias", "dtype", "strided", "shape", "read-only", "unknown-name"])
def test_out_arrays_the_fast_path_cannot_take(bad):
    k = tl.compile(ADD)
    a, b = _pair(6)
    k(a, b)
    if bad == "alias":
        with pytest.raises(tl.ArgumentError, match="shares memory with input A"):
            k(a, b, out=(a, None))
    elif bad == "dtype":
        with pytest.raises(tl.ArgumentError, match="expected type float32"):
            k(a, b, out=(np.empty(6, np.float64), None))
    elif bad == "strided":
        target = np.zeros(12, np.float32)[::2]
        c, _ = k(a, b, out=(target, None))
        assert c is target
        np.testing.assert_array_equal(target, a + b)  # computed, then copied in
    elif bad == "shape":
        with pytest.raises(tl.ArgumentError, match="expected shape"):
            k(a, b, out=(np.empty(5, np.float32), None))
    elif bad == "read-only":
        target = np.empty(6, np.float32)
        target.flags.writeable = False
        with pytest.raises(tl.ArgumentError, match="read-only"):
            k(a, b, out=(target, None))
    else:
        with pytest.raises(tl.ArgumentError, match="not outputs"):
            k(a, b, out={"Q": np.empty(6, np.float32)})


def test_data_addresses_match_numpy():
    """The fast path reads an array's data pointer through the buffer protocol (or .ctypes for
    read-only and empty arrays): it must agree with NumPy's own for views and offsets."""
    from codegen.runtime import fastcall

    base = np.arange(64, dtype=np.float32)
    frozen = np.arange(5.0)
    frozen.flags.writeable = False
    arrays = [
        base,
        base[3:],
        base[::2],
        base.reshape(8, 8)[2:, 1:],
        frozen,
        np.zeros(0, np.int8),
        np.empty((0, 3)),
    ]
    for array in arrays:
        assert fastcall.address(array) == array.ctypes.data


def test_views_at_an_offset_are_read_at_their_own_address():
    k = tl.compile("def add(float(N) a, float(N) b) -> (c) { c(i) = a(i) + b(i) }")
    base = np.arange(64, dtype=np.float32)
    for start in (0, 1, 7, 13):  # the same shapes, so every call after the first takes the fast path
        x, y = base[start : start + 8], base[start + 20 : start + 28]
        np.testing.assert_array_equal(k(x, y), x + y)
        out = np.empty(8, np.float32)
        k(x, y, out={"c": out})
        np.testing.assert_array_equal(out, x + y)
