"""Kernel arguments beyond NumPy arrays: DLPack producers (zero-copy), __array__ objects, nested lists, out= objects."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SCALE = "def scale(int32(N) X, int32 s) -> (Y) { Y(i) = X(i) * s }"
FLAGS = "def neg(bool(N) X) -> (Y) { Y(i) = !X(i) }"


@pytest.fixture(scope="module")
def mm():
    return tl.compile(MM)


def rand(*shape, dtype=np.float32):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)


class DLPackOnly:
    """Exposes an array only through the DLPack protocol (as JAX or CuPy arrays do)."""

    def __init__(self, array, device=(1, 0)):
        self.array = array
        self.device = device

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


class ArrayOnly:
    """Exposes an array only through __array__; `copy` makes it hand out a fresh copy each time."""

    def __init__(self, array, copy=False):
        self.array = array
        self.copy = copy

    def __array__(self, dtype=None, copy=None):
        return self.array.copy() if self.copy else self.array


def address(array):
    return array.__array_interface__["data"][0]


# ---------------------------------------------------------------------- inputs


def test_numpy_arrays_through_dlpack_are_not_copied(mm, monkeypatch):
    a, b = rand(5, 3), rand(3, 4)
    seen = []
    import codegen.runtime.arguments as arguments

    original = arguments.as_input_array
    monkeypatch.setattr(
        arguments, "as_input_array", lambda v, t, p: seen.append(original(v, t, p)) or seen[-1]
    )
    got = mm(DLPackOnly(a), DLPackOnly(b))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5)
    assert address(seen[0]) == address(a) and address(seen[1]) == address(b)


def test_strided_dlpack_input_is_read_correctly(mm):
    big = rand(10, 12)
    a = big[::2, 1::3]
    b = rand(4, 7)
    np.testing.assert_allclose(mm(DLPackOnly(a), DLPackOnly(b)), a @ b, rtol=1e-5)


def test_dlpack_on_another_device_is_named(mm):
    with pytest.raises(
        tl.ArgumentError, match=r"input A is a DLPackOnly on CUDA \(DLPack device type 2, device 0\)"
    ):
        mm(DLPackOnly(rand(2, 2), device=(2, 0)), rand(2, 2))
    with pytest.raises(tl.ArgumentError, match="input B .* on ROCm"):
        mm(rand(2, 2), DLPackOnly(rand(2, 2), device=(10, 1)))


def test_read_only_inputs_are_fine(mm):
    a, b = rand(3, 3), rand(3, 3)
    a.flags.writeable = False
    np.testing.assert_allclose(mm(DLPackOnly(a), b), a @ b, rtol=1e-5)
    np.testing.assert_allclose(mm(a, b), a @ b, rtol=1e-5)


def test_array_objects_are_converted(mm):
    a, b = rand(4, 2), rand(2, 3)
    np.testing.assert_allclose(mm(ArrayOnly(a), ArrayOnly(b, copy=True)), a @ b, rtol=1e-5)


def test_foreign_dtype_is_never_cast(mm):
    with pytest.raises(
        tl.ArgumentError, match="expected type float32 but found float64.*convert it to float32"
    ):
        mm(DLPackOnly(rand(2, 2, dtype=np.float64)), rand(2, 2))
    with pytest.raises(tl.ArgumentError, match="expected type float32 but found int64"):
        mm(ArrayOnly(np.ones((2, 2), dtype=np.int64)), rand(2, 2))


def test_unsupported_objects_name_the_input(mm):
    with pytest.raises(tl.ArgumentError, match="mm: input B must be an array .* got dict"):
        mm(rand(2, 2), {"a": 1})

    class Broken:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("no")

    with pytest.raises(tl.ArgumentError, match="input A: converting the Broken with __array__ failed: no"):
        mm(Broken(), rand(2, 2))


# ---------------------------------------------------------------------- lists


def test_lists_of_the_declared_kind(mm):
    got = mm([[1.0, 2.0]], ((3.0,), (4.0,)))
    assert got.dtype == np.float32 and got.tolist() == [[11.0]]
    scale = tl.compile(SCALE)
    assert scale([1, -2, 3], 4).tolist() == [4, -8, 12]
    assert scale([], 4).shape == (0,)
    assert tl.compile(FLAGS)([True, False]).tolist() == [False, True]


def test_lists_follow_the_python_number_rule(mm):
    with pytest.raises(tl.ArgumentError, match=r"must hold Python floats .* element \(0, 1\) is int 2"):
        mm([[1.0, 2]], [[1.0], [1.0]])
    scale = tl.compile(SCALE)
    with pytest.raises(tl.ArgumentError, match="must hold Python ints .* float 1.0"):
        scale([1.0], 2)
    with pytest.raises(tl.ArgumentError, match="must hold Python ints .* bool True"):
        scale([True], 2)
    with pytest.raises(tl.ArgumentError, match=r"\(int32\) cannot hold 2147483648 \(element \(1,\)\)"):
        scale([1, 2**31], 2)
    with pytest.raises(tl.ArgumentError, match="cannot represent 1e\\+300 .* would become inf"):
        mm([[1e300]], [[1.0]])
    with pytest.raises(tl.ArgumentError, match="cannot represent 1e-300 .* would become 0.0"):
        mm([[1e-300]], [[1.0]])
    with pytest.raises(tl.ArgumentError, match="not rectangular"):
        mm([[1.0], [2.0, 3.0]], [[1.0]])
    # NumPy scalars in a list follow the array rule: exactly the declared dtype
    assert mm([[np.float32(2.0)]], [[3.0]]).tolist() == [[6.0]]
    with pytest.raises(tl.ArgumentError, match="element \\(0, 0\\) is float64"):
        mm([[np.float64(2.0)]], [[3.0]])


def test_list_rank_is_checked(mm):
    with pytest.raises(tl.ArgumentError, match="expected a tensor with 2 dimensions but found 1"):
        mm([1.0, 2.0], [[1.0]])


# ---------------------------------------------------------------------- out=


def test_out_through_dlpack_writes_in_place(mm):
    a, b = rand(3, 2), rand(2, 4)
    buf = np.zeros((3, 4), np.float32)
    got = mm(a, b, out=DLPackOnly(buf))
    np.testing.assert_allclose(buf, a @ b, rtol=1e-5)
    assert address(got) == address(buf)
    buf2 = np.zeros((3, 4), np.float32)
    mm(a, b, out={"C": ArrayOnly(buf2)})
    np.testing.assert_allclose(buf2, a @ b, rtol=1e-5)


def test_out_strided_object_is_written_back(mm):
    a, b = rand(3, 2), rand(2, 4)
    big = np.zeros((6, 4), np.float32)
    mm(a, b, out=[DLPackOnly(big[::2])])
    np.testing.assert_allclose(big[::2], a @ b, rtol=1e-5)
    assert not big[1::2].any()


def test_out_that_would_lose_results_is_refused(mm):
    a, b = rand(3, 2), rand(2, 4)
    with pytest.raises(tl.ArgumentError, match="out= for C: ArrayOnly.__array__ returns a copy"):
        mm(a, b, out=ArrayOnly(np.zeros((3, 4), np.float32), copy=True))
    with pytest.raises(tl.ArgumentError, match="out= for C must be an array written in place .* got list"):
        mm(a, b, out={"C": [[0.0] * 4] * 3})
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(tl.ArgumentError, match="out= for C is read-only"):
        mm(a, b, out=DLPackOnly(ro))
    with pytest.raises(tl.ArgumentError, match="out= for C is a DLPackOnly on CUDA"):
        mm(a, b, out=DLPackOnly(np.zeros((3, 4), np.float32), device=(2, 0)))


def test_out_aliasing_an_input_through_dlpack(mm):
    a = rand(3, 3)
    with pytest.raises(tl.ArgumentError, match="shares memory with input A"):
        mm(a, rand(3, 3), out=DLPackOnly(a))


# ---------------------------------------------------------------------- PyTorch, when installed


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    mm = tl.compile(MM)
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    got = mm(a, b)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, (a @ b).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mm(a.T.contiguous().T, b), (a @ b).numpy(), rtol=1e-5, atol=1e-6)
    out = torch.zeros(5, 4)
    result = mm(a, b, out=out)
    assert address(result) == out.data_ptr()
    torch.testing.assert_close(out, a @ b)
    strided = torch.zeros(5, 8)
    mm(a, b, out=strided[:, ::2])
    torch.testing.assert_close(strided[:, ::2], a @ b)
    assert not strided[:, 1::2].any()


def test_torch_errors():
    torch = pytest.importorskip("torch")
    mm = tl.compile(MM)
    with pytest.raises(tl.ArgumentError, match="input A is a Tensor that requires grad: pass .detach()"):
        mm(torch.randn(2, 2, requires_grad=True), torch.randn(2, 2))
    with pytest.raises(tl.ArgumentError, match="input B expected type float32 but found float64"):
        mm(torch.randn(2, 2), torch.randn(2, 2, dtype=torch.float64))
    with pytest.raises(tl.ArgumentError, match="input A: cannot view the Tensor \\(dtype torch.bfloat16\\)"):
        mm(torch.randn(2, 2, dtype=torch.bfloat16), torch.randn(2, 2))
    # a torch tensor used as a list element is not a Python float
    with pytest.raises(tl.ArgumentError, match="must hold Python floats"):
        mm([[torch.tensor(1.0)]], [[1.0]])
