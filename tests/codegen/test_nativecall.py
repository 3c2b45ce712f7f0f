"""The native checked call (codegen/runtime/nativecall.py, emit/callentry.py): a repeated small
call's checks and phases in one native entry, indistinguishable from the full path in results
and errors, for every argument it is handed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorlang as tl
from codegen.runtime import fastcall, nativecall

SCALE = "def f(float(M, N) A, float(N) b) -> (C) { C(i, j) = A(i, j) * b(j) }"
TWO = "def f(float(N) A, float(N) B) -> (C, D) { C(i) = A(i) + B(i)\n D(i) = A(i) * B(i) }"
GATHER = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"


def _outcome(fn):
    """(the result, as arrays) or (the exception's type and message)."""
    try:
        got = fn()
    except tl.TensorLangError as e:
        return ("error", type(e).__name__, str(e))
    return ("ok", [np.array(a) for a in (got if isinstance(got, tuple) else (got,))])


def _full_path(k, *args, **kw):
    """A call through the full path: no fast signature remembered."""
    k._fast.clear()
    k._native = None
    return k(*args, **kw)


def _no_python_fast_path(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("FastCall.run ran: the native path was expected")

    monkeypatch.setattr(fastcall.FastCall, "run", refuse)


def test_layout_holds_here():
    assert nativecall._layout_holds()


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (3, 7), (13, 31), (5, 0)])
def test_repeated_calls_run_natively_and_agree(shape, monkeypatch):
    k = tl.compile(SCALE)
    r = np.random.default_rng(1)
    a, b = r.standard_normal(shape).astype(np.float32), r.standard_normal(shape[1]).astype(np.float32)
    k(a, b)
    k(a, b)
    assert k._native is not None and k._native.native is not None
    _no_python_fast_path(monkeypatch)
    for seed in range(3):
        a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        c = k(a, b)
        np.testing.assert_array_equal(c, a * b)
        out = np.empty(shape, np.float32)
        assert k(a, b, out=out) is out and k(a, b, out={"C": out}) is out
        np.testing.assert_array_equal(out, a * b)
    assert k.compile_count == 1


def test_several_outputs_every_out_form(monkeypatch):
    k = tl.compile(TWO)
    a, b = np.arange(9, dtype=np.float32), np.full(9, 3, np.float32)
    k(a, b)
    k(a, b)
    _no_python_fast_path(monkeypatch)
    c, d = np.empty(9, np.float32), np.empty(9, np.float32)
    for out in (None, {"C": c, "D": d}, {"D": d}, (c, d), [None, d], (None, None)):
        got = k(a, b, out=out)
        np.testing.assert_array_equal(got[0], a + b)
        np.testing.assert_array_equal(got[1], a * b)
        given_ = out if isinstance(out, dict) else dict(zip("CD", out or (None, None)))
        for name, array in zip("CD", got):
            if given_.get(name) is not None:
                assert array is given_[name]
        assert not np.shares_memory(got[0], got[1])


def test_run_time_errors_from_the_native_path_are_located():
    k = tl.compile(GATHER)
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    k(table, np.array([3, 0], np.int32))
    k(table, np.array([1, 2], np.int32))
    assert k._native is not None
    with pytest.raises(
        tl.ArgumentError, match=r"index 4 out of range for dimension 0 of T in T\(I\(b\), d\)"
    ):
        k(table, np.array([1, 4], np.int32))
    np.testing.assert_array_equal(k(table, np.array([2, 2], np.int32)), table[[2, 2]])


def test_alternating_signatures():
    k = tl.compile(SCALE)
    for i in range(6):
        shape = (3, 5) if i % 2 else (4, 2)
        a = np.full(shape, i, np.float32)
        b = np.arange(shape[1], dtype=np.float32)
        np.testing.assert_array_equal(k(a, b), a * b)
    assert k.compile_count == 2


def test_eviction_forgets_the_native_call():
    k = tl.compile(SCALE, options=tl.Options(max_specializations=1))
    for shape in ((3, 4), (3, 4), (2, 2), (3, 4), (3, 4)):
        a, b = np.ones(shape, np.float32), np.arange(shape[1], dtype=np.float32)
        np.testing.assert_array_equal(k(a, b), a * b)
        assert k._native is None or k._native.spec in k._cache.values()


def test_most_recently_called_survives_eviction_with_fast_calls_between():
    # fast calls skip the cache lock while their sizes are already the newest; a full call of
    # other sizes must make the next fast call move its sizes to the end again
    k = tl.compile(SCALE, options=tl.Options(max_specializations=2))
    b = np.arange(3, dtype=np.float32)

    def call(rows):
        a = np.full((rows, 3), rows, np.float32)
        np.testing.assert_array_equal(k(a, b), a * b)

    for rows in (2, 2, 2, 5, 2, 2):  # 2 is the newest again, through fast calls only
        call(rows)
    call(7)  # evicts the least recently used: 5
    assert sorted(key[0] for key in k._cache) == [2, 7]
    count = k.compile_count
    call(2)
    assert k.compile_count == count


def test_the_python_entry_refuses_arguments_it_does_not_take():
    k = tl.compile(SCALE)
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    k(a, b)
    k(a, b)
    entry = k._native.native.call
    out = np.zeros((2, 3), np.float32)
    error = fastcall.inline_error_record()[0]
    assert type(entry).__name__ == "builtin_function_or_method"
    # the wrong count, types that are not tuples and an error record that is not an array: -1,
    # having run nothing
    for args in ((), ((a, b),), ((a, b), (out,)), ([a, b], (out,), error), ((a, b), [out], error),
                 ((a, b), (out,), error.tolist()), ((a, b), (out,), error, error)):  # fmt: skip
        assert entry(*args) == -1
        assert not out.any()
    assert entry((a, b), (out,), error) == 0
    np.testing.assert_array_equal(out, a * b)
    assert entry((b, a), (out,), error) == -1  # another signature


def test_without_the_native_entry_the_python_fast_path_serves(monkeypatch):
    monkeypatch.setattr(nativecall, "_checked_call", lambda: None)
    k = tl.compile(SCALE)
    a, b = np.ones((3, 4), np.float32), np.arange(4, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(k(a, b), a * b)
    assert k._native is None and k._fast


def test_the_entry_loads_from_the_disk_cache(monkeypatch):
    nativecall._checked_call()  # compiled or loaded, and stored
    monkeypatch.setattr(nativecall, "_code", None)
    monkeypatch.setattr(nativecall, "_code_failed", False)
    assert nativecall._checked_call() is not None
    k = tl.compile(SCALE)
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(k(a, b), a * b)
    assert k._native is not None


def _argument(draw, kind: str, shape: tuple[int, ...], base: np.ndarray):
    """An array for an input or `out=`: well-formed or off in one way."""
    if kind == "plain":
        return np.ascontiguousarray(base, np.float32)
    if kind == "float64":
        return base.astype(np.float64)
    if kind == "strided":
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), np.float32) if shape else np.zeros(2, np.float32)
        view = wide[..., ::2] if shape else wide[:1]
        view[...] = base
        return view
    if kind == "offset":
        flat = np.zeros(base.size + 3, np.float32)
        view = flat[3:].reshape(shape)
        view[...] = base
        return view
    if kind == "read-only":
        array = np.array(base, np.float32)
        array.flags.writeable = False
        return array
    if kind == "fortran":
        return np.asfortranarray(base, np.float32)
    if kind == "shape":
        return np.zeros(tuple(n + 1 for n in shape), np.float32)
    if kind == "rank":
        return np.zeros(shape + (1,), np.float32)
    if kind == "subclass":
        return np.ma.masked_array(np.array(base, np.float32))
    if kind == "list":
        return np.array(base, np.float32).tolist()
    raise AssertionError(kind)


KINDS = [
    "plain",
    "plain",
    "float64",
    "strided",
    "offset",
    "read-only",
    "fortran",
    "shape",
    "rank",
    "subclass",
    "list",
]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 6),
    n=st.integers(1, 9),
    a_kind=st.sampled_from(KINDS),
    b_kind=st.sampled_from(KINDS),
    out_form=st.sampled_from(["none", "array", "dict", "tuple", "list", "extra-key", "alias-a", "alias-b"]),
    out_kind=st.sampled_from(KINDS),
    data=st.data(),
)
def test_native_calls_match_the_full_path(m, n, a_kind, b_kind, out_form, out_kind, data):
    k = _compiled()
    r = np.random.default_rng(m * 31 + n)
    a0, b0 = r.standard_normal((m, n)).astype(np.float32), r.standard_normal(n).astype(np.float32)
    k(a0, b0)
    k(a0, b0)  # the signature is now checked natively

    def arguments():  # fresh every time: an out= aliasing an input changes that input
        a = _argument(data.draw, a_kind, (m, n), a0)
        b = _argument(data.draw, b_kind, (n,), b0)
        if out_form == "none":
            return a, b, None
        if out_form == "alias-a":
            return a, b, a
        if out_form == "alias-b":
            return a, b, (b.reshape(1, -1) if isinstance(b, np.ndarray) and m == 1 else b)
        array = _argument(data.draw, out_kind, (m, n), np.zeros((m, n), np.float32))
        forms = {"array": array, "dict": {"C": array}, "tuple": (array,), "list": [array]}
        return a, b, forms.get(out_form, {"C": array, "Z": array})

    a, b, out = arguments()
    fast = _outcome(lambda: k(a, b, out=out))
    a, b, out = arguments()
    full = _outcome(lambda: _full_path(k, a, b, out=out))
    assert fast[0] == full[0], (fast, full)
    if fast[0] == "error":
        assert fast == full
    else:
        for x, y in zip(fast[1], full[1]):
            np.testing.assert_array_equal(x, y)


_kernel = []


def _compiled():
    if not _kernel:
        _kernel.append(tl.compile(SCALE))
    return _kernel[0]


NORMALISE = "def t(float(N, M) A) -> (O, P) {\n  T(i) max=! A(i, j)\n  O(i, j) = A(i, j) - T(N - 1 - i)\n  P(i) = T(i)\n}"


def test_temporaries_are_allocated_per_call(monkeypatch):
    k = tl.compile(NORMALISE, options=tl.Options(optimize=False))  # T gets storage of its own
    a = np.random.default_rng(3).standard_normal((7, 5)).astype(np.float32)
    k(a)
    k(a)
    assert k._native is not None and len(k._native.allocations) == 3
    _no_python_fast_path(monkeypatch)
    for seed in range(3):
        a = np.random.default_rng(seed).standard_normal((7, 5)).astype(np.float32)
        t = a.max(axis=1)
        want = (a - t[::-1, None], t)
        o, p = np.empty((7, 5), np.float32), np.empty(7, np.float32)
        for out in (None, {"P": p}, (o, None), [None, p], {"O": o, "P": p}):
            got = k(a, out=out)
            assert len(got) == 2
            for x, y in zip(got, want):
                np.testing.assert_array_equal(x, y)
    monkeypatch.undo()  # one array for two outputs: the Python checks report it
    with pytest.raises(tl.ArgumentError):
        k(a, out=o)


AXPY = "def axpy(float a, float(N) x, float(N) y) -> (z) { z(i) = a * x(i) + y(i) }"
SCALE64 = "def s(double a, double(N) x) -> (z) { z(i) = a * x(i) }"


@pytest.mark.parametrize(
    "source, warm_with, numbers",
    [
        (AXPY, 2.5, (1.5, -0.0, float("inf"), 1e-45, 3.4e38)),
        (AXPY, np.float32(2.5), (np.float32(-7.25), np.float32(1e-45))),
        (SCALE64, 0.3, (0.1, 1e-320, 1e300)),
        (SCALE64, np.float64(0.3), (np.float64(-2.0),)),
    ],
    ids=["float32-python", "float32-numpy", "float64-python", "float64-numpy"],
)
def test_numbers_for_0d_inputs_take_the_native_path(source, warm_with, numbers, monkeypatch):
    k = tl.compile(source)
    dtype = np.float32 if source == AXPY else np.float64
    x, y = np.linspace(-1, 1, 9).astype(dtype), np.ones(9, dtype)
    args = (x, y) if source == AXPY else (x,)
    k(warm_with, *args)
    k(warm_with, *args)
    assert k._native is not None and k._native.scalars
    _no_python_fast_path(monkeypatch)
    for a in numbers:
        with np.errstate(invalid="ignore"):  # inf * 0
            want = dtype(a) * x + (y if source == AXPY else 0)
        np.testing.assert_array_equal(k(a, *args), want)
    if source == AXPY and type(warm_with) is float:
        assert np.isnan(k(float("nan"), *args)).all()


NUMBERS = [
    0.0, -0.0, 1.0, 0.1, 1e-40, 1e-45, 1e-46, 1e-50, 3.4e38, 3.5e38, 1e300,
    float("inf"), float("-inf"), 2, True, np.float32(1.25), np.float64(1.25), np.int32(3),
    np.array(1.5, np.float32), np.array([1.5], np.float32), "1.5", None,
]  # fmt: skip


@pytest.mark.parametrize("number", NUMBERS, ids=repr)
@pytest.mark.parametrize("warm_with", [2.0, np.float32(2.0)], ids=["float", "float32"])
def test_numbers_match_the_full_path(number, warm_with):
    k = tl.compile(AXPY)
    x, y = np.arange(5, dtype=np.float32), np.full(5, 0.5, np.float32)
    k(warm_with, x, y)
    k(warm_with, x, y)
    fast = _outcome(lambda: k(number, x, y))
    full = _outcome(lambda: _full_path(k, number, x, y))
    assert fast[0] == full[0], (fast, full)
    if fast[0] == "error":
        assert fast == full
    else:
        np.testing.assert_array_equal(fast[1][0], full[1][0])


def test_forked_child_runs_the_native_call():
    import multiprocessing

    k = _compiled()
    a, b = np.ones((3, 4), np.float32), np.arange(4, dtype=np.float32)
    k(a, b)
    k(a, b)
    assert k._native is not None
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        got = pool.apply(_call_in_child, (a * 2, b))
    np.testing.assert_array_equal(got, a * 2 * b)


def _call_in_child(a, b):
    k = _compiled()
    assert k._native is not None  # inherited: the parent's machine code and plan
    return k(a, b)
