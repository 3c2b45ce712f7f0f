"""Call-time limits: impossible output sizes and unrepresentable Python numbers are ArgumentErrors."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from codegen.runtime import arguments

OUTER3 = "def outer(float(N) A, float(M) B, float(K) C) -> (O) { O(i, j, l) = A(i) * B(j) * C(l) }"
OUTER5 = "def outer5(float(N) A) -> (O) { O(i, j, l, m, n) = A(i) * A(j) * A(l) * A(m) * A(n) }"
SCALE = "def scale(float A, float(N) X) -> (B) { B(i) = A * X(i) }"
DSCALE = "def dscale(double A, double(N) X) -> (B) { B(i) = A * X(i) }"


def test_output_count_beyond_int64_is_an_argument_error():
    k = tl.compile(OUTER5)
    with pytest.raises(tl.ArgumentError) as info:
        k(np.ones(10_000, np.float32))  # 10^20 elements: NumPy said `ValueError: array is too big`
    message = str(info.value)
    assert "output O" in message and "(10000, 10000, 10000, 10000, 10000)" in message
    assert "N=10000" in message and "64-bit" in message
    assert k.compile_count == 0  # refused before anything was compiled


def test_output_beyond_memory_is_an_argument_error():
    k = tl.compile(OUTER3)
    a = np.ones(10_000, np.float32)
    memory = arguments.physical_memory_bytes()
    if memory is None or memory >= 4 * 10**12:
        pytest.skip("this machine reports no memory size, or more than 4 TB")
    with pytest.raises(tl.ArgumentError) as info:
        k(a, a, a)  # 10^12 float32 elements: NumPy said `MemoryError`
    message = str(info.value)
    assert "output O" in message and "(10000, 10000, 10000)" in message
    assert "1000000000000 elements" in message and "TiB" in message and "memory" in message
    assert k.compile_count == 0
    small = np.arange(3, dtype=np.float32)  # the kernel still works at sizes that fit
    np.testing.assert_allclose(k(small, small, small), np.einsum("i,j,k->ijk", small, small, small))


def test_outputs_together_beyond_memory(monkeypatch):
    src = "def two(float(N) A) -> (O, P) { O(i, j) = A(i) * A(j)\n P(i, j) = A(i) + A(j) }"
    k = tl.compile(src)
    monkeypatch.setattr(arguments, "physical_memory_bytes", lambda: 600)  # each fits, both do not
    with pytest.raises(tl.ArgumentError, match="outputs would need"):
        k(np.ones(10, np.float32))


def test_numpy_float64_scalar_is_not_cast_to_float32():
    k = tl.compile(SCALE)
    x = np.ones(3, np.float32)
    with pytest.raises(tl.ArgumentError, match="expected type float32 but found float64"):
        k(np.float64(0.5), x)  # np.float64 subclasses Python float: once silently cast
    np.testing.assert_array_equal(k(np.float32(0.5), x), 0.5 * x)
    np.testing.assert_array_equal(k(0.5, x), 0.5 * x)  # a Python float is fine


@pytest.mark.parametrize("value", [1e300, -1e39, float(np.finfo(np.float32).max) * 2, 1e-50])
def test_python_float_that_float32_cannot_hold(value):
    k = tl.compile(SCALE)
    with pytest.raises(tl.ArgumentError, match="cannot represent"):
        k(value, np.ones(3, np.float32))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), 0.0, -0.0, 3e38, 1e-45])
def test_python_float_that_float32_holds(value):
    k = tl.compile(SCALE)
    out = k(value, np.ones(2, np.float32))
    np.testing.assert_array_equal(out, np.float32(value) * np.ones(2, np.float32))


def test_python_float_nan_passes_through():
    k = tl.compile(SCALE)
    assert np.isnan(k(float("nan"), np.ones(2, np.float32))).all()


def test_double_scalar_keeps_full_range():
    k = tl.compile(DSCALE)
    out = k(1e300, np.ones(2, np.float64))
    np.testing.assert_array_equal(out, np.array([1e300, 1e300]))
    with pytest.raises(tl.ArgumentError, match="expected type float64 but found float32"):
        k(np.float32(1.0), np.ones(2, np.float64))
