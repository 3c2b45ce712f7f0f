"""Direct convolution (polyhedral/convolution.py, codegen/emit/conv_kernel.py): which statements it
takes, and differential tests against NumPy, the GEMM path (Options(direct_conv=False)) and the
untransformed reference (Options(optimize=False)) on awkward sizes, layouts, strides and threads."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import tensorlang as tl

NCHW = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
NCHW64 = NCHW.replace("float(", "double(")
SWAPPED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! Wt(f,c,kh,kw) * I(n,c,h+kh,w+kw) }"
STRIDED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw) }"
DILATED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+2*kh,w+3*kw) * Wt(f,c,kh,kw) }"
NHWC = "def conv(float(N,H,W,C) I, float(KH,KW,C,F) Wt) -> (O) { O(n,h,w,f) +=! I(n,h+kh,w+kw,c) * Wt(kh,kw,c,f) }"
CONV1D = "def conv(float(C,X) I, float(F,C,K) Wt) -> (O) { O(f,x) +=! I(c,x+k) * Wt(f,c,k) }"
CONV3D = (
    "def conv(float(N,C,D,H,W) I, float(F,C,KD,KH,KW) Wt) -> (O) "
    "{ O(n,f,d,h,w) +=! I(n,c,d+kd,h+kh,w+kw) * Wt(f,c,kd,kh,kw) }"
)
CONV_BIAS_RELU = """def conv_bias_relu(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) Bias) -> (O) {
    T(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
    O(n, f, h, w) = fmax(T(n, f, h, w) + Bias(f), 0)
}"""

TOL = {np.float32: 2e-4, np.float64: 1e-11}


def conv_np(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW valid convolution (cross-correlation), stride 1, in float64."""
    win = sliding_window_view(x.astype(np.float64), w.shape[2:], axis=(2, 3))  # N, C, H', W', KH, KW
    return np.einsum("nchwij,fcij->nfhw", win, w.astype(np.float64))


def _sizes(kernel, args) -> dict[str, int]:
    sizes = {}
    inputs = [t for t in kernel.program.tensors if t.role == "input"]
    for t, a in zip(inputs, args):
        for d, e in enumerate(t.shape):
            if str(e) in kernel.interface.sizes:
                sizes[str(e)] = a.shape[d]
    return sizes


def _plan(kernel, args) -> str:
    return kernel.inspect("plan", _sizes(kernel, args))


def _args(rng, shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _close(got, want, dtype=np.float32):
    tol = TOL[dtype]
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


# N, C, H, W (input), F, KH, KW: odd and prime channels, output widths below a vector, 16k±1,
# one f-block and a partial one, 1×1 rows of taps (3×1), 5×5 windows, batches
NCHW_SHAPES = [
    (1, 3, 7, 9, 8, 3, 3),  # output 5×7: fewer positions than a vector
    (2, 5, 6, 19, 17, 3, 3),  # output width 17 = 16+1, 17 channels: a partial f-block
    (1, 7, 5, 17, 31, 3, 3),  # output width 15 = 16-1, prime channel counts
    (1, 4, 9, 36, 20, 5, 5),  # 5×5, output width 32
    (3, 2, 8, 21, 9, 3, 1),  # 3×1 filter
    (1, 1, 4, 50, 16, 1, 3),  # 1×3 filter, one input channel
]


@pytest.mark.parametrize("shape", NCHW_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("threads", [1, 2])
def test_nchw_matches_numpy_and_the_gemm_path(shape, threads):
    n, c, h, w, f, kh, kw = shape
    rng = np.random.default_rng(sum(shape))
    args = _args(rng, [(n, c, h, w), (f, c, kh, kw)])
    k = tl.compile(NCHW, options=tl.Options(threads=threads))
    assert "direct convolution" in _plan(k, args)
    want = conv_np(*args)
    _close(k(*args), want)
    _close(tl.compile(NCHW, options=tl.Options(threads=threads, direct_conv=False))(*args), want)


@pytest.mark.parametrize("shape", [(1, 3, 7, 12, 4, 3, 3), (2, 5, 6, 20, 9, 3, 3), (1, 6, 5, 13, 13, 5, 2)])
def test_float64(shape):
    n, c, h, w, f, kh, kw = shape
    args = _args(np.random.default_rng(7), [(n, c, h, w), (f, c, kh, kw)], np.float64)
    k = tl.compile(NCHW64, options=tl.Options(threads=1))
    assert "8-lane vectors" in _plan(k, args)
    _close(k(*args), conv_np(*args), np.float64)


@pytest.mark.parametrize(
    "src, shapes",
    [
        (SWAPPED, [(1, 4, 9, 20), (9, 4, 3, 3)]),
        (STRIDED, [(2, 5, 23, 37), (17, 5, 3, 3)]),
        (DILATED, [(1, 3, 20, 30), (20, 3, 3, 3)]),
        (NHWC, [(2, 12, 21, 5), (3, 3, 5, 24)]),
        (NHWC, [(1, 6, 9, 3), (2, 3, 3, 9)]),
        (CONV1D, [(6, 40), (33, 6, 5)]),
        (CONV3D, [(1, 3, 5, 6, 19), (10, 3, 2, 3, 3)]),
    ],
    ids=["swapped", "strided", "dilated", "nhwc", "nhwc-small", "conv1d", "conv3d"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_layouts_strides_dilation_match_the_reference(src, shapes, threads):
    args = _args(np.random.default_rng(3), shapes)
    k = tl.compile(src, options=tl.Options(threads=threads))
    assert "direct convolution" in _plan(k, args)
    want = tl.compile(src, options=tl.Options(optimize=False))(*args)
    _close(k(*args), want)
    _close(tl.compile(src, options=tl.Options(threads=threads, direct_conv=False))(*args), want)


def test_option_off_runs_the_gemm_path():
    args = _args(np.random.default_rng(0), [(1, 16, 10, 40), (16, 16, 3, 3)])
    k = tl.compile(NCHW, options=tl.Options(direct_conv=False))
    plan = _plan(k, args)
    assert "direct convolution" not in plan and "GEMM" in plan
    assert "direct_conv=False" in repr(tl.Options(direct_conv=False))
    assert "direct_conv" not in repr(tl.Options())
    _close(k(*args), conv_np(*args))


def test_not_taken_without_a_window_or_with_few_channels():
    rng = np.random.default_rng(0)
    one_by_one = _args(rng, [(1, 16, 10, 20), (16, 16, 1, 1)])  # a window of one: plain GEMM
    k = tl.compile(NCHW)
    assert "direct convolution" not in _plan(k, one_by_one)
    _close(k(*one_by_one), conv_np(*one_by_one))
    few = _args(rng, [(1, 16, 10, 20), (3, 16, 3, 3)])  # 3 output channels: under half a vector
    assert "direct convolution" not in _plan(k, few)
    _close(k(*few), conv_np(*few))


def test_filter_changed_between_calls_is_seen():
    """The filter is repacked on every call: a filter updated in place gives the new result."""
    rng = np.random.default_rng(5)
    x, w = _args(rng, [(1, 6, 9, 20), (18, 6, 3, 3)])
    k = tl.compile(NCHW, options=tl.Options(threads=2))
    _close(k(x, w), conv_np(x, w))
    w *= -2.0
    w[3] = 1.0
    _close(k(x, w), conv_np(x, w))


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_bias_relu_epilogue(threads):
    rng = np.random.default_rng(11)
    x, w, bias = _args(rng, [(2, 5, 11, 21), (19, 5, 3, 3), (19,)])
    k = tl.compile(CONV_BIAS_RELU, options=tl.Options(threads=threads))
    assert "direct convolution" in _plan(k, [x, w, bias])
    want = np.maximum(conv_np(x, w) + bias[None, :, None, None], 0)
    _close(k(x, w, bias), want)


def test_non_contiguous_arguments():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 6, 12, 44)).astype(np.float32)[:, :, ::2, ::2]
    w = np.asfortranarray(rng.standard_normal((16, 6, 3, 3)).astype(np.float32))
    _close(tl.compile(NCHW)(x, w), conv_np(x, w))


PADDED = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""
PADDED_5x5 = """def conv(float(N, C, H, W) I, float(F, C, 5, 5) Wt) -> (O) {
  O(n, f, h, w) +=! (0 <= h + kh - 2 && h + kh - 2 <= H - 1 && w + kw >= 2 && W > w + kw - 2)
                     ? I(n, c, h + kh - 2, w + kw - 2) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""
PADDED_WIDTH_ONLY = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! (w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H-KH+1, w in 0:W
}"""
PADDED_STRIDED = """def conv(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {
  O(n, f, h, w) +=! (2*h + kh - 1 >= 0 && 2*h + kh - 1 < H && 2*w + kw - 1 >= 0 && 2*w + kw - 1 < W)
                     ? I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(f, c, kh, kw) : 0.0
                     where h in 0:(H+1)/2, w in 0:(W+1)/2
}"""
PADDED_NHWC = """def conv(float(N, H, W, C) I, float(3, 3, C, F) Wt) -> (O) {
  O(n, h, w, f) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                     ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c, f) : 0.0 where h in 0:H, w in 0:W
}"""
MIXED_GUARD = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W && h + w + kw >= 2)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""


@pytest.mark.parametrize(
    "src, shapes",
    [
        (PADDED, [(1, 3, 7, 9), (8, 3, 3, 3)]),  # narrower than a vector: both edges in one block
        (PADDED, [(2, 5, 6, 40), (17, 5, 3, 3)]),  # interior blocks between the edges
        (PADDED, [(1, 4, 5, 33), (20, 4, 3, 3)]),  # 16k+1: a last block of one position
        (PADDED, [(1, 4, 6, 30), (9, 4, 1, 3)]),  # 1×3 window, padding along h with one tap
        (PADDED_5x5, [(1, 3, 6, 35), (16, 3, 5, 5)]),  # two columns of padding each side
        (PADDED_WIDTH_ONLY, [(2, 3, 8, 20), (11, 3, 3, 3)]),
        (PADDED_STRIDED, [(1, 4, 9, 37), (12, 4, 3, 3)]),
        (PADDED_NHWC, [(2, 5, 19, 6), (3, 3, 6, 10)]),
    ],
    ids=["small", "interior", "16k+1", "1x3", "5x5", "width-only", "strided", "nhwc"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_padding_guards_match_the_reference(src, shapes, threads):
    args = _args(np.random.default_rng(17), shapes)
    k = tl.compile(src, options=tl.Options(threads=threads))
    assert "padding guards" in _plan(k, args)
    want = tl.compile(src, options=tl.Options(optimize=False))(*args)
    _close(k(*args), want)


def test_padded_matches_numpy_pad():
    x, w = _args(np.random.default_rng(4), [(2, 6, 11, 23), (19, 6, 3, 3)])
    want = conv_np(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), w)
    _close(tl.compile(PADDED, options=tl.Options(threads=2))(x, w), want)


def test_guard_mixing_positions_and_rows_is_not_taken():
    args = _args(np.random.default_rng(8), [(1, 3, 6, 20), (16, 3, 3, 3)])
    k = tl.compile(MIXED_GUARD)
    assert "direct convolution" not in _plan(k, args)
    _close(k(*args), tl.compile(MIXED_GUARD, options=tl.Options(optimize=False))(*args))


GROUPED = "def conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt) -> (O) { O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * Wt(g,f,c,kh,kw) }"
GROUPED_LAST = "def conv(float(N,C,G,H,W) I, float(F,G,C,KH,KW) Wt) -> (O) { O(n,h,w,g,f) +=! I(n,c,g,h+kh,w+kw) * Wt(f,g,c,kh,kw) }"


@pytest.mark.parametrize(
    "src, shapes",
    [
        (GROUPED, [(2, 3, 5, 7, 20), (3, 9, 5, 3, 3)]),
        (GROUPED, [(1, 2, 4, 6, 40), (2, 17, 4, 3, 3)]),
        (GROUPED_LAST, [(1, 4, 3, 6, 21), (10, 3, 4, 3, 3)]),
    ],
    ids=["nchw", "two-blocks", "channels-last"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_groups_match_the_reference(src, shapes, threads):
    """Grouped convolution with the group as its own dimension: the filter is packed per group."""
    args = _args(np.random.default_rng(21), shapes)
    k = tl.compile(src, options=tl.Options(threads=threads))
    assert "groups g" in _plan(k, args)
    want = tl.compile(src, options=tl.Options(optimize=False))(*args)
    _close(k(*args), want)


OFFSET_ACCUMULATE = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) = 1.0 where n in 0:N, f in 0:F, h in 0:H, w in 0:W
  O(n,f,h,w) += I(n,c,h+kh-1,w+kw-3) * Wt(f,c,kh,kw) where h in 1:H-KH+1, w in 3:W-KW+2
}"""


@pytest.mark.parametrize("threads", [1, 2])
def test_ranges_not_starting_at_zero_add_to_the_output(threads):
    """`+=` onto values already there (no zeroing to fold), over ranges that start past 0."""
    args = _args(np.random.default_rng(9), [(2, 3, 9, 40), (17, 3, 3, 3)])
    k = tl.compile(OFFSET_ACCUMULATE, options=tl.Options(threads=threads))
    assert "direct convolution" in _plan(k, args)
    _close(k(*args), tl.compile(OFFSET_ACCUMULATE, options=tl.Options(optimize=False))(*args))


def test_zeroing_is_folded_into_the_kernel():
    """`+=!` on its own: the kernel stores its sums, no pass zeroes O first (any old values in
    O's buffer must not leak into the result)."""
    args = _args(np.random.default_rng(12), [(2, 4, 7, 22), (12, 4, 3, 3)])
    k = tl.compile(NCHW, options=tl.Options(threads=2))
    plan = _plan(k, args)
    assert "direct convolution" in plan and "no zeroing pass" in plan
    for _ in range(3):  # reused output buffers
        _close(k(*args), conv_np(*args))


WEIGHT_GRADIENT = (
    "def wg(float(N,C,H,W) I, float(N,F,OH,OW) dO) -> (dW) "
    "{ dW(f,c,kh,kw) +=! dO(n,f,h,w) * I(n,c,h+kh,w+kw) where kh in 0:H-OH+1, kw in 0:W-OW+1 }"
)


def test_weight_gradient_stays_a_gemm():
    """Convolution-shaped too (dO plays the filter), but its window (h, w) is wider than its
    output (kh, kw): the GEMM path suits it, not a kernel that packs dO."""
    args = _args(np.random.default_rng(13), [(1, 16, 20, 30), (1, 16, 18, 28)])
    k = tl.compile(WEIGHT_GRADIENT)
    plan = _plan(k, args)
    assert "direct convolution" not in plan and "GEMM" in plan
    _close(k(*args), tl.compile(WEIGHT_GRADIENT, options=tl.Options(optimize=False))(*args))
