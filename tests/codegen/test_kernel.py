"""Kernel calls: argument checks that name the tensor, out=, caching, run-time checks, inspect."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensorlang as tl

MATMUL = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


@pytest.fixture(scope="module")
def matmul():
    return tl.compile(MATMUL)


def test_matmul_odd_sizes(matmul):
    for m, k, n in [(1, 1, 1), (7, 13, 5), (17, 3, 31), (0, 4, 3), (4, 0, 3)]:
        a, b = f32(m, k), f32(k, n)
        np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_same_shapes_do_not_recompile(matmul):
    a, b = f32(6, 5), f32(5, 4)
    matmul(a, b)
    before = matmul.compile_count
    for _ in range(3):
        matmul(a, b)
    assert matmul.compile_count == before
    matmul(f32(2, 5), b)
    assert matmul.compile_count == before + 1


def test_wrong_argument_count(matmul):
    with pytest.raises(tl.ArgumentError, match=r"expected 2 inputs \(A, B\) but found 1"):
        matmul(f32(2, 2))


def test_wrong_dtype_names_tensor(matmul):
    with pytest.raises(tl.ArgumentError, match="input B expected type float32 but found float64"):
        matmul(f32(2, 3), np.ones((3, 2)))


def test_wrong_rank_names_tensor(matmul):
    with pytest.raises(tl.ArgumentError, match="input A expected a tensor with 2 dimensions but found 1"):
        matmul(f32(3), f32(3, 2))


def test_inconsistent_sizes_name_both_tensors(matmul):
    with pytest.raises(tl.ArgumentError, match=r"K: A dimension 1 gives K = 3 but B dimension 0 has size 4"):
        matmul(f32(2, 3), f32(4, 2))


def test_constant_dimension_checked():
    k = tl.compile("def f(float(N, 4) A) -> (B) { B(i, j) = A(i, j) * 2 }")
    np.testing.assert_allclose(k(np.ones((3, 4), np.float32)), 2)
    with pytest.raises(tl.ArgumentError, match="constant size 4 but found size 5"):
        k(np.ones((3, 5), np.float32))


def test_not_an_array(matmul):
    with pytest.raises(tl.ArgumentError, match="input A must be an array"):
        matmul("A", f32(1, 1))
    # nested lists are converted under the Python-number rule (tests/codegen/test_array_inputs.py)
    with pytest.raises(tl.ArgumentError, match="must hold Python floats"):
        matmul([[1]], f32(1, 1))


def test_non_contiguous_inputs_are_read_correctly(matmul):
    big = f32(10, 12)
    a = big[::2, 1::3]  # strided view
    b = f32(12, 7)[::3].T.copy().T  # Fortran-ordered
    np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_out_buffer_is_used_and_returned(matmul):
    a, b = f32(3, 4), f32(4, 5)
    buf = np.full((3, 5), 7, np.float32)
    res = matmul(a, b, out={"C": buf})
    assert res is buf
    np.testing.assert_allclose(buf, a @ b, rtol=1e-5, atol=1e-6)
    seq = np.zeros((3, 5), np.float32)
    assert matmul(a, b, out=[seq]) is seq


def test_out_buffer_non_contiguous_is_written_back(matmul):
    a, b = f32(3, 4), f32(4, 5)
    backing = np.zeros((3, 10), np.float32)
    view = backing[:, ::2]
    matmul(a, b, out={"C": view})
    np.testing.assert_allclose(backing[:, ::2], a @ b, rtol=1e-5, atol=1e-6)
    assert not backing[:, 1::2].any()


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ({"C": np.zeros((3, 4), np.float32)}, "expected shape"),
        ({"C": np.zeros((3, 5), np.float64)}, "expected type float32"),
        ({"D": np.zeros((3, 5), np.float32)}, "not outputs"),
        ([None, None], "one entry per output"),
        ("C", "mapping"),
    ],
)
def test_bad_out_argument(matmul, out, message):
    with pytest.raises(tl.ArgumentError, match=message):
        matmul(f32(3, 4), f32(4, 5), out=out)


def test_output_aliasing_input_is_rejected():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    a = f32(8)
    with pytest.raises(tl.ArgumentError, match="shares memory with input A"):
        k(a, out={"B": a})


def test_accumulate_without_init_warns_and_uses_out():
    with pytest.warns(tl.TensorLangWarning, match="without initiali"):
        kernel = tl.compile("def f(float(N, K) A) -> (O) { O(n) += A(n, k) }")
    a = f32(4, 6)
    with pytest.warns(tl.TensorLangWarning, match="starts from zeros"):
        np.testing.assert_allclose(kernel(a), a.sum(axis=1), rtol=1e-5)
    start = np.arange(4, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(kernel(a, out={"O": start.copy()}), start + a.sum(axis=1), rtol=1e-5)


GATHER = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"


def test_gather_in_range():
    k = tl.compile(GATHER)
    t, idx = f32(5, 3), np.array([4, 0, 2, 2], np.int32)
    np.testing.assert_array_equal(k(t, idx), t[idx])


@pytest.mark.parametrize("bad", [5, -1, 2**31 - 1])
def test_gather_out_of_range_raises_and_protects_out(bad):
    k = tl.compile(GATHER)
    t = f32(5, 3)
    idx = np.array([0, bad, 1], np.int32)
    buf = np.full((3, 3), 9, np.float32)
    with pytest.raises(tl.ArgumentError, match=rf"index {bad} out of range for dimension 0 of T"):
        k(t, idx, out={"O": buf})


def test_integer_division_by_zero_is_an_error():
    k = tl.compile("def f(int32(N) A, int32(N) B) -> (C) { C(i) = A(i) / B(i) }")
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    np.testing.assert_array_equal(k(a, b), a // b)  # floor division, as in NumPy
    with pytest.raises(tl.ArgumentError, match="division by zero"):
        k(a, np.array([1, 0, 1, 1], np.int32))


def test_integer_modulo_is_floor_modulo():
    k = tl.compile("def f(int32(N) A, int32(N) B) -> (C) { C(i) = A(i) % B(i) }")
    a = np.array([7, -7, 7, -7, -2147483648], np.int32)
    b = np.array([3, 3, -3, -3, -1], np.int32)
    np.testing.assert_array_equal(k(a, b), np.mod(a, b))


def test_negative_output_extent_is_a_call_time_error():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = A(i + 3) where i in 0:N - 3 }")
    np.testing.assert_allclose(k(np.arange(5, dtype=np.float32)), [3, 4])
    assert k(np.arange(3, dtype=np.float32)).shape == (0,)
    with pytest.raises(tl.ArgumentError, match="negative size"):
        k(np.arange(2, dtype=np.float32))


@pytest.mark.parametrize("stage", ["ast", "ir", "scop", "deps", "schedule", "loops", "llvm", "asm"])
def test_inspect_every_stage(matmul, stage):
    text = matmul.inspect(stage)
    assert isinstance(text, str) and text.strip()


def test_inspect_specialised_loops_have_constant_bounds(matmul):
    text = matmul.inspect("loops", sizes={"M": 8, "K": 12, "N": 10})
    assert "c0 <= 7" in text or "c0 < 8" in text


def test_inspect_unknown_stage(matmul):
    with pytest.raises(tl.TensorLangError, match="stages are"):
        matmul.inspect("bogus")


def test_several_defs_need_a_name():
    src = "def a(float(N) X) -> (Y) { Y(i) = X(i) }\ndef b(float(N) X) -> (Y) { Y(i) = -X(i) }"
    with pytest.raises(tl.TensorLangError, match="a, b"):
        tl.compile(src)
    np.testing.assert_array_equal(tl.compile(src, "b")(np.ones(3, np.float32)), -1)


@pytest.mark.parametrize(
    ("dtype", "src_type"),
    [
        (np.int8, "int8"),
        (np.uint8, "uint8"),
        (np.int16, "int16"),
        (np.uint16, "uint16"),
        (np.int64, "int64"),
        (np.uint32, "uint32"),
        (np.uint64, "uint64"),
        (np.float64, "double"),
        (np.bool_, "bool"),
    ],
)
def test_element_types(dtype, src_type):
    k = tl.compile(f"def f({src_type}(N) A) -> (B) {{ B(i) = A(i) }}")
    a = (np.arange(7) % 2).astype(dtype)
    out = k(a)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, a)


def test_scalar_inputs_accept_python_numbers():
    k = tl.compile("def f(float s, float(N) A) -> (B) { B(i) = A(i) * s }")
    np.testing.assert_allclose(k(2.0, np.ones(3, np.float32)), 2)
    with pytest.raises(tl.ArgumentError, match="Python int"):
        k(2, np.ones(3, np.float32))


def test_contractions_take_the_gemm_path(matmul):
    text = matmul.inspect("loops", sizes={"M": 300, "K": 200, "N": 100})
    assert "gemm(m in 0:M, n in 0:N, k in 0:K)" in text
    small = matmul.inspect("loops", sizes={"M": 3, "K": 2, "N": 1})
    assert "gemm" not in small  # too little work to pay for packing
    a, b = f32(300, 200), f32(200, 100)
    np.testing.assert_allclose(matmul(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_conv2d_gemm_plan_uses_largest_dims():
    conv = tl.compile(
        "def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {"
        " O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }",
        options=tl.Options(direct_conv=False),  # the GEMM path (else a direct convolution)
    )
    text = conv.inspect("loops", sizes={"N": 1, "C": 32, "H": 20, "W": 30, "F": 16, "KH": 3, "KW": 3})
    assert "W + 1, f in 0:F, c in 0:C)" in text and "gemm(w in 0:" in text


def test_strided_gemm_operand_is_relaid_out_and_correct():
    """Conv weights Wt(f, c, kh, kw) have no unit stride along the GEMM's c and f: passed relaid out."""
    src = (
        "def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {"
        " O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }"
    )
    conv = tl.compile(src, options=tl.Options(direct_conv=False))  # the GEMM path
    x, w = f32(2, 32, 12, 30), f32(16, 32, 3, 2)
    got = conv(x, w)
    assert conv._cache and next(iter(conv._cache.values())).layouts == {"W1": (2, 3, 1, 0)}
    win = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 2), axis=(2, 3))
    np.testing.assert_allclose(got, np.einsum("nchwij,fcij->nfhw", win, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "src",
    [
        MATMUL,
        "def sm(float(N, D) I) -> (O) { m(n) max=! I(n, d)\n e(n, d) = exp(I(n, d) - m(n))\n"
        " s(n) +=! e(n, d)\n O(n, d) = e(n, d) / s(n) }",
        GATHER,
    ],
    ids=["matmul", "softmax", "gather"],
)
def test_generic_code_without_specialisation(src):
    """Options(specialize=False): one parametric kernel for every size, same results."""
    generic = tl.compile(src, options=tl.Options(specialize=False))
    special = tl.compile(src)
    rng_ = np.random.default_rng(9)
    for sizes in [(7, 5), (13, 3)]:
        if generic.name == "g":
            inputs = [f32(*sizes), rng_.integers(0, sizes[0], size=11).astype(np.int32)]
        elif generic.name == "matmul":
            inputs = [f32(*sizes), f32(sizes[1], 4)]
        else:
            inputs = [f32(*sizes)]
        np.testing.assert_allclose(generic(*inputs), special(*inputs), rtol=1e-5, atol=1e-6)
    assert generic.compile_count == 1  # one parametric kernel serves every size
