"""Issue 9 end to end through tensorlang.compile: a same-padding convolution whose guarded read
no longer clamps the filter taps, and the separately-reduced-product lint keeping TC's meaning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensorlang as tl

PADDED_CONV = """def c(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""


def padded_conv_reference(image: np.ndarray, weights: np.ndarray) -> np.ndarray:
    n, _, h, w = image.shape
    padded = np.pad(image.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, weights.shape[0], h, w))
    for kh in range(3):
        for kw in range(3):
            window = padded[:, :, kh : kh + h, kw : kw + w]
            out += np.einsum("nchw,fc->nfhw", window, weights[:, :, kh, kw].astype(np.float64))
    return out


@pytest.fixture(scope="module")
def padded_conv() -> tl.Kernel:
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)
        return tl.compile(PADDED_CONV)


def test_padded_conv_ranges_and_no_bounds_checks(padded_conv):
    assert "kh in 0:3, kw in 0:3" in padded_conv.inspect("ir")
    # every access is proved in bounds at compile time: no run-time or call-time check remains
    scop = padded_conv.inspect("scop")
    assert not [line for line in scop.splitlines() if line.startswith("check ")], scop


@pytest.mark.parametrize("h, w", [(5, 7), (1, 1), (1, 6), (3, 1), (13, 2), (2, 11)])
def test_padded_conv_matches_numpy_pad(padded_conv, h, w):
    rng = np.random.default_rng(h * 100 + w)
    image = rng.uniform(-1, 1, (2, 3, h, w)).astype(np.float32)
    weights = rng.uniform(-1, 1, (2, 3, 3, 3)).astype(np.float32)
    out = padded_conv(image, weights)
    assert out.shape == (2, 2, h, w)
    np.testing.assert_allclose(out, padded_conv_reference(image, weights), rtol=1e-5, atol=1e-5)


def test_padded_conv_with_narrowing_guard_warns_and_keeps_tcs_meaning():
    src = PADDED_CONV.replace("&& h + kh - 1 < H ", "")
    with pytest.warns(tl.TensorLangWarning, match="index kh narrowed to 0:2 by the guarded read I"):
        kernel = tl.compile(src)
    assert "kh in 0:2, kw in 0:3" in kernel.inspect("ir")
    rng = np.random.default_rng(3)
    image = rng.uniform(-1, 1, (2, 3, 5, 4)).astype(np.float32)
    weights = rng.uniform(-1, 1, (2, 3, 3, 3)).astype(np.float32)
    # h + kh - 1 < H still narrows kh (the bottom row of taps is dropped); the top row is summed
    expected = padded_conv_reference(image, weights * np.array([1, 1, 0], np.float32)[:, None])
    np.testing.assert_allclose(kernel(image, weights), expected, rtol=1e-5, atol=1e-5)


def test_mistyped_index_warns_and_computes_the_product_of_sums():
    src = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(kk, n)\n}"
    with pytest.warns(tl.TensorLangWarning, match=r"(?s)reduced over separate indices.*did you mean `k`"):
        kernel = tl.compile(src)
    rng = np.random.default_rng(9)
    a = rng.uniform(-1, 1, (4, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), np.outer(a.sum(1), b.sum(0)), rtol=1e-5, atol=1e-5)


def test_matmul_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)
        tl.compile("def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")


def test_causal_conv_keeps_every_tap_and_needs_no_checks():
    src = "def c(float(T) X, float(K) Wt) -> (O) { O(t) +=! (t - k >= 0) ? X(t - k) * Wt(k) : 0.0 where t in 0:T }"
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)
        kernel = tl.compile(src)
    assert not [line for line in kernel.inspect("scop").splitlines() if line.startswith("check ")]
    for t, k in [(7, 3), (2, 5), (1, 1)]:
        x = np.arange(1, t + 1, dtype=np.float32)
        w = np.arange(1, k + 1, dtype=np.float32) ** 2
        np.testing.assert_allclose(kernel(x, w), np.convolve(x, w)[:t], rtol=1e-6)
