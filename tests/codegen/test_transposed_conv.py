"""Transposed convolutions on the direct-convolution kernel: a window that steps backwards along
its taps (`dO(n, f, h - kh, w - kw)`, the input gradient `tl.grad` writes for a convolution, or a
user's own transposed convolution) is planned like any other window (negative input strides),
and agrees with the untransformed program on odd, prime and tiny sizes."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl

CONV = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
DILATED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+2*kh,w+2*kw) * Wt(f,c,kh,kw) }"
# a transposed convolution as a user writes it: every input pixel scattered through the window
TRANSPOSED = """def tconv(float(N, F, H, W) X, float(F, C, KH, KW) Wt) -> (Y) {
  Y(n, c, h, w) +=! (h - kh >= 0 && h - kh < H && w - kw >= 0 && w - kw < W)
      ? X(n, f, h - kh, w - kw) * Wt(f, c, kh, kw) : 0.0
      where h in 0:H + KH - 1, w in 0:W + KW - 1, kh in 0:KH, kw in 0:KW
}"""

SHAPES = [  # (N, C, H, W, F, KH, KW): channels past one vector, odd and prime extents
    (1, 17, 11, 13, 7, 3, 3),
    (2, 16, 9, 19, 5, 2, 5),
    (1, 31, 7, 5, 3, 3, 1),
]


def _plan(kernel, sizes=None) -> str:
    return kernel.inspect("plan", sizes=sizes)


def _input_gradient_case(source, shape, seed=0):
    n, c, h, w, f, kh, kw = shape
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, c, h, w), dtype=np.float32)
    wt = r.standard_normal((f, c, kh, kw), dtype=np.float32)
    out = tl.compile(source)(x, wt)
    d_out = r.standard_normal(out.shape, dtype=np.float32)
    sizes = dict(N=n, C=c, H=h, W=w, F=f, KH=kh, KW=kw, O_2=out.shape[2], O_3=out.shape[3])
    return tl.grad(source), (x, wt, d_out), sizes


def _agree(got, want):
    for a, b in zip(got, want):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


SLOW = pytest.mark.slow  # the default run keeps one case of each test (compiling takes 1-6 s)


@pytest.mark.parametrize(
    "source, shape",
    [
        (CONV, SHAPES[0]),
        *(
            pytest.param(src, shape, marks=SLOW)
            for src in (CONV, DILATED)
            for shape in SHAPES
            if shape != SHAPES[0]
        ),
        pytest.param(DILATED, SHAPES[0], marks=SLOW),
    ],
    ids=str,
)
def test_input_gradient_runs_the_direct_convolution(source, shape):
    grad, args, sizes = _input_gradient_case(source, shape)
    reference = tl.compile(grad, options=tl.Options(optimize=False))(*args)
    kernel = tl.compile(grad)
    assert "direct convolution dI += dO * Wt" in _plan(kernel, sizes)
    _agree(kernel(*args), reference)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(tl.Options(specialize=False), marks=SLOW),
        tl.Options(threads=2),
        pytest.param(tl.Options(direct_conv=False), marks=SLOW),
    ],
    ids=["generic", "two-threads", "gemm-path"],
)
def test_input_gradient_under_other_options(options):
    grad, args, sizes = _input_gradient_case(CONV, SHAPES[1], seed=1)
    reference = tl.compile(grad, options=tl.Options(optimize=False))(*args)
    kernel = tl.compile(grad, options=options)
    direct = "direct convolution dI" in _plan(kernel, None if not options.specialize else sizes)
    assert direct == options.direct_conv
    _agree(kernel(*args), reference)


@pytest.mark.parametrize(
    "shape, specialize",
    [
        ((1, 16, 5, 7, 3, 3, 3), True),
        *(
            pytest.param(shape, specialize, marks=SLOW)
            for shape in ((1, 16, 5, 7, 3, 3, 3), (2, 19, 1, 1, 4, 2, 3), (1, 16, 13, 11, 2, 5, 5))
            for specialize in (True, False)
            if (shape[1], specialize) != (16, True) or shape[2] != 5
        ),
    ],
    ids=str,
)
def test_users_transposed_convolution(shape, specialize):
    n, c, h, w, f, kh, kw = shape
    r = np.random.default_rng(2)
    x = r.standard_normal((n, f, h, w), dtype=np.float32)
    wt = r.standard_normal((f, c, kh, kw), dtype=np.float32)
    want = np.zeros((n, c, h + kh - 1, w + kw - 1), np.float64)
    for i in range(kh):
        for j in range(kw):  # each input pixel adds its window, weighted by the filter tap
            want[:, :, i : i + h, j : j + w] += np.einsum("nfhw,fc->nchw", x, wt[:, :, i, j])
    kernel = tl.compile(TRANSPOSED, options=tl.Options(specialize=specialize))
    sizes = dict(N=n, F=f, H=h, W=w, C=c, KH=kh, KW=kw) if specialize else None
    assert "direct convolution Y += X * Wt" in _plan(kernel, sizes)
    _agree([kernel(x, wt)], [want])
