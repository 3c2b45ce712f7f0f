"""Benchmark kernels: tensorlang source, NumPy implementation, float64 oracle, work counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

F32 = np.float32


@dataclass(frozen=True)
class Kernel:
    """One benchmark case: a tensorlang def and everything needed to check and time it."""

    name: str  # unique, with the size: "sgemm-1024"
    family: str  # "sgemm": selects the peer implementations
    shape: str  # human-readable sizes
    tc: str  # tensorlang source (one def)
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    numpy: Callable[..., np.ndarray]  # NumPy at its best; its float32 output is the reference
    oracle: Callable[..., np.ndarray]  # independent float64 formulation that checks the NumPy code
    flops: float  # counted analytically
    bytes: float  # minimal memory traffic (each input read once, each output written once)
    unit: str  # "GFLOP/s" or "GB/s"
    rtol: float
    atol: float  # absolute tolerance, as a fraction of max |reference|
    params: dict = field(default_factory=dict)


def _uniform(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(F32)


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


# ---------------------------------------------------------------------------- sources

SGEMM = """
def sgemm(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""

BMM = """
def bmm(float(Bt, M, K) A, float(Bt, K, N) B) -> (C) {
    C(b, m, n) +=! A(b, m, k) * B(b, k, n)
}
"""

CONV2D = """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}
"""

MLP = """
def mlp(float(M, K) X, float(K, N) W, float(N) Bias) -> (Y) {
    Y(m, n) +=! X(m, k) * W(k, n)
    Y(m, n) = fmax(Y(m, n) + Bias(n), 0.0)
}
"""

MM2 = """
def mm2(float(N, N) A, float(N, N) B, float(N, N) C) -> (D) {
    T(i, j) +=! A(i, k) * B(k, j)
    D(i, j) +=! T(i, k) * C(k, j)
}
"""

ATAX = """
def atax(float(M, N) A, float(N) x) -> (y) {
    t(i) +=! A(i, j) * x(j)
    y(j) +=! A(i, j) * t(i)
}
"""

TRANSPOSE2D = """
def transpose2d(float(M, N) A) -> (B) {
    B(j, i) = A(i, j)
}
"""

PERMUTE4D = """
def permute4d(float(N, C, H, W) A) -> (B) {
    B(n, h, w, c) = A(n, c, h, w)
}
"""

EWCHAIN = """
def ewchain(float(N) a, float(N) b, float(N) c) -> (o) {
    o(i) = tanh(a(i) * b(i) + c(i)) * 0.5 + a(i)
}
"""

SOFTMAX = """
def softmax(float(M, N) X) -> (Y) {
    mx(m) max=! X(m, n)
    e(m, n) = exp(X(m, n) - mx(m))
    s(m) +=! e(m, n)
    Y(m, n) = e(m, n) / s(m)
}
"""

# Smallest possible kernel: its cached-call time is the per-call overhead of the runtime.
TINY = """
def tiny(float(N) a, float(N) b) -> (c) {
    c(i) = a(i) + b(i)
}
"""

# ---------------------------------------------------------------------------- NumPy implementations


def np_conv2d(inp: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """Valid NCHW convolution as im2col (sliding_window_view) + one BLAS matmul."""
    n, c, h, w = inp.shape
    f, _, kh, kw = wt.shape
    oh, ow = h - kh + 1, w - kw + 1
    win = sliding_window_view(inp, (kh, kw), axis=(2, 3))  # (N, C, OH, OW, KH, KW), a view
    cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow)  # the im2col copy
    return np.matmul(wt.reshape(f, c * kh * kw), cols).reshape(n, f, oh, ow)


def np_mlp(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = x @ w
    y += b
    return np.maximum(y, 0, out=y)


def np_ewchain(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    t = a * b  # in place from here on: one temporary, as a careful NumPy user writes it
    t += c
    np.tanh(t, out=t)
    t *= F32(0.5)
    t += a
    return t


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = x - x.max(axis=1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e


def _oracle_softmax(x: np.ndarray) -> np.ndarray:
    (x,) = _f64(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _oracle_conv2d(inp: np.ndarray, wt: np.ndarray) -> np.ndarray:
    inp, wt = _f64(inp, wt)
    win = sliding_window_view(inp, wt.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,fcij->nfhw", win, wt, optimize=True)


# ---------------------------------------------------------------------------- the suite


def _sgemm(n: int) -> Kernel:
    return Kernel(
        name=f"sgemm-{n}",
        family="sgemm",
        shape=f"{n}×{n}×{n}",
        tc=SGEMM,
        make_inputs=lambda rng: [_uniform(rng, n, n), _uniform(rng, n, n)],
        numpy=lambda a, b: a @ b,
        oracle=lambda a, b: np.matmul(*_f64(a, b)),
        flops=2.0 * n**3,
        bytes=4.0 * 3 * n * n,
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _bmm(b: int, m: int, k: int, n: int) -> Kernel:
    return Kernel(
        name=f"bmm-{b}x{m}",
        family="bmm",
        shape=f"{b}×{m}×{k}×{n}",
        tc=BMM,
        make_inputs=lambda rng: [_uniform(rng, b, m, k), _uniform(rng, b, k, n)],
        numpy=np.matmul,
        oracle=lambda x, y: np.matmul(*_f64(x, y)),
        flops=2.0 * b * m * n * k,
        bytes=4.0 * b * (m * k + k * n + m * n),
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _conv2d(n: int, c: int, h: int, f: int, kk: int) -> Kernel:
    oh = h - kk + 1
    return Kernel(
        name=f"conv2d-{c}x{h}",
        family="conv2d",
        shape=f"in {n}×{c}×{h}×{h}, w {f}×{c}×{kk}×{kk}, valid",
        tc=CONV2D,
        make_inputs=lambda rng: [_uniform(rng, n, c, h, h), _uniform(rng, f, c, kk, kk)],
        numpy=np_conv2d,
        oracle=_oracle_conv2d,
        flops=2.0 * n * f * oh * oh * c * kk * kk,
        bytes=4.0 * (n * c * h * h + f * c * kk * kk + n * f * oh * oh),
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _mlp(n: int) -> Kernel:
    return Kernel(
        name=f"mlp-{n}",
        family="mlp",
        shape=f"relu(X·W+b), {n}×{n}×{n}",
        tc=MLP,
        make_inputs=lambda rng: [_uniform(rng, n, n), _uniform(rng, n, n), _uniform(rng, n)],
        numpy=np_mlp,
        oracle=lambda x, w, b: np.maximum(np.matmul(*_f64(x, w)) + b, 0.0),
        flops=2.0 * n**3 + 2.0 * n * n,
        bytes=4.0 * (3 * n * n + n),
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _mm2(n: int) -> Kernel:
    return Kernel(
        name=f"2mm-{n}",
        family="2mm",
        shape=f"D=(A·B)·C, {n}",
        tc=MM2,
        make_inputs=lambda rng: [_uniform(rng, n, n) for _ in range(3)],
        numpy=lambda a, b, c: (a @ b) @ c,
        oracle=lambda a, b, c: (lambda a, b, c: (a @ b) @ c)(*_f64(a, b, c)),
        flops=4.0 * n**3,
        bytes=4.0 * 4 * n * n,
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _atax(m: int, n: int) -> Kernel:
    return Kernel(
        name=f"atax-{m}" if m == n else f"atax-{m}x{n}",
        family="atax",
        shape=f"y=Aᵀ(Ax), {m}×{n}",
        tc=ATAX,
        make_inputs=lambda rng: [_uniform(rng, m, n), _uniform(rng, n)],
        numpy=lambda a, x: a.T @ (a @ x),
        oracle=lambda a, x: (lambda a, x: a.T @ (a @ x))(*_f64(a, x)),
        flops=4.0 * m * n,
        bytes=4.0 * (m * n + 2 * n),
        unit="GFLOP/s",
        rtol=1e-3,
        atol=1e-4,
    )


def _transpose2d(m: int, n: int) -> Kernel:
    return Kernel(
        name=f"transpose2d-{m}" if m == n else f"transpose2d-{m}x{n}",
        family="transpose2d",
        shape=f"{m}×{n} → {n}×{m}",
        tc=TRANSPOSE2D,
        make_inputs=lambda rng: [_uniform(rng, m, n)],
        numpy=lambda a: np.ascontiguousarray(a.T),
        oracle=lambda a: a.T,
        flops=0.0,
        bytes=4.0 * 2 * m * n,
        unit="GB/s",
        rtol=0.0,
        atol=0.0,
    )


def _permute4d(n: int, c: int, h: int, w: int) -> Kernel:
    return Kernel(
        name=f"permute4d-{n}x{c}x{h}x{w}",
        family="permute4d",
        shape=f"NCHW→NHWC, {n}×{c}×{h}×{w}",
        tc=PERMUTE4D,
        make_inputs=lambda rng: [_uniform(rng, n, c, h, w)],
        numpy=lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)),
        oracle=lambda a: a.transpose(0, 2, 3, 1),
        flops=0.0,
        bytes=4.0 * 2 * n * c * h * w,
        unit="GB/s",
        rtol=0.0,
        atol=0.0,
    )


def _ewchain(n: int) -> Kernel:
    label = f"{n // (1024 * 1024)}M" if n % (1024 * 1024) == 0 else str(n)
    return Kernel(
        name=f"ewchain-{label}",
        family="ewchain",
        shape=f"tanh(a*b+c)*0.5+a, {n}",
        tc=EWCHAIN,
        make_inputs=lambda rng: [_uniform(rng, n) for _ in range(3)],
        numpy=np_ewchain,
        oracle=lambda a, b, c: (lambda a, b, c: np.tanh(a * b + c) * 0.5 + a)(*_f64(a, b, c)),
        flops=5.0 * n,  # mul, add, tanh (counted as one), mul, add
        bytes=4.0 * 4 * n,
        unit="GB/s",
        rtol=1e-5,
        atol=1e-5,
    )


def _softmax(m: int, n: int) -> Kernel:
    return Kernel(
        name=f"softmax-{m}x{n}",
        family="softmax",
        shape=f"rows, {m}×{n}",
        tc=SOFTMAX,
        make_inputs=lambda rng: [rng.standard_normal((m, n)).astype(F32) * F32(4)],
        numpy=np_softmax,
        oracle=_oracle_softmax,
        flops=5.0 * m * n,  # max, subtract, exp, sum, divide
        bytes=4.0 * 2 * m * n,
        unit="GB/s",
        rtol=1e-4,
        atol=1e-5,
    )


def suite(quick: bool) -> list[Kernel]:
    """The kernels at full size, or tiny (odd-ish) sizes for a fast correctness run."""
    if quick:
        return [
            _sgemm(32),
            _sgemm(48),
            _sgemm(64),
            _bmm(4, 16, 24, 20),
            _conv2d(1, 8, 12, 8, 3),
            _mlp(48),
            _mm2(40),
            _atax(72, 56),
            _transpose2d(96, 72),
            _permute4d(2, 5, 6, 7),
            _ewchain(4099),
            _softmax(33, 70),
        ]
    return [
        _sgemm(256),
        _sgemm(512),
        _sgemm(1024),
        _bmm(16, 128, 128, 128),
        _conv2d(1, 64, 56, 64, 3),
        _mlp(512),
        _mm2(1024),
        _atax(4000, 4000),
        _transpose2d(4096, 4096),
        _permute4d(16, 64, 56, 56),
        _ewchain(4 * 1024 * 1024),
        _softmax(4096, 1024),
    ]
