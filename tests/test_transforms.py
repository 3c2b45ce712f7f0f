"""Differential tests: every option combination gives the untransformed kernel's results.

The reference is `Options(optimize=False)` (statements in source order, no post-passes, no
contraction path, one thread). Sizes are odd, prime and smaller than a tile, so partial tiles,
remainders of unrolling and uneven thread chunks are all exercised.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from conftest import load_corpus

import codegen.runtime.parallel
import polyhedral.contraction
import tensorlang as tl

KERNELS = {
    "matmul": (
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
        {"A": (13, 7), "B": (7, 11)},
    ),
    "matmul_tn": (
        "def mm(float(K, M) A, float(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
        {"A": (5, 17), "B": (3, 5)},
    ),
    "batched": (
        "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }",
        {"X": (3, 7, 5), "Y": (3, 5, 9)},
    ),
    "conv2d": (
        "def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {"
        " O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }",
        {"I": (2, 3, 11, 9), "W1": (5, 3, 3, 2)},
    ),
    "mlp": (
        """def mlp(float(B, M) X, float(M, N) W, float(N) b) -> (O) {
            O(i, j) +=! X(i, k) * W(k, j)
            O(i, j) = fmax(O(i, j) + b(j), 0)
        }""",
        {"X": (7, 13), "W": (13, 5), "b": (5,)},
    ),
    "softmax": (
        """def softmax(float(N, D) I) -> (O) {
            mx(n) max=! I(n, d)
            e(n, d) = exp(I(n, d) - mx(n))
            s(n) +=! e(n, d)
            O(n, d) = e(n, d) / s(n)
        }""",
        {"I": (7, 19)},
    ),
    "transpose3": ("def t(float(X, Y, Z) A) -> (O) { O(k, i, j) = A(i, j, k) * 2.0 }", {"A": (5, 7, 3)}),
    "atax": (
        """def atax(float(M, N) A, float(N) x) -> (y) {
            t(i) +=! A(i, j) * x(j)
            y(j) +=! A(i, j) * t(i)
        }""",
        {"A": (11, 7), "x": (7,)},
    ),
    "stencil_guarded": (
        "def s(float(N, M) X) -> (O) { O(i, j) = (j >= 1 && j < M - 1) ? X(i, j - 1) + X(i, j + 1) : X(i, j) where j in 0:M }",
        {"X": (6, 13)},
    ),
    "matmul_gemm_sized": (
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
        {"A": (67, 131), "B": (131, 45)},
    ),
    "conv2d_strided_double": (
        "def conv(double(N, C, H, W) I, double(F, C, KH, KW) W1) -> (O) {"
        " O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(f, c, kh, kw) }",
        {"I": (2, 5, 13, 17), "W1": (7, 5, 3, 2)},
    ),
    "gather": (
        "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) + 1.0 }",
        {"T": (9, 5), "I": (7,)},
    ),
}

OPTION_GRID = [
    dict(zip(("tile", "fusion", "unroll", "threads", "prefetch"), combo))
    for combo in itertools.product(
        [None, (3, 5, 7), (16,)], ["auto", "max", "none"], [None, 2, 3], [1, 2], [True, False]
    )
]


def _inputs(program, shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in program.inputs:
        shape = shapes[t.name]
        if t.dtype.is_float:
            out.append(rng.uniform(-1, 1, size=shape).astype(t.dtype.numpy_name))
        else:
            out.append(rng.integers(0, 9, size=shape).astype(t.dtype.numpy_name))
    return out


def _run(src, inputs, options, entry=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        result = tl.compile(src, entry, options=options)(*inputs)
    return result if isinstance(result, tuple) else (result,)


@pytest.fixture(autouse=True)
def _transform_even_tiny_kernels(monkeypatch):
    """Split loops over threads and run contractions as GEMM calls whatever the size."""
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(polyhedral.contraction, "MIN_CONTRACTION_WORK", 0)


def _assert_same(got, want, label):
    for g, w in zip(got, want):
        assert g.shape == w.shape, label
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=label)
        else:
            np.testing.assert_array_equal(g, w, err_msg=label)


# Every value of every option, each pair of (tile, unroll) and (fusion, threads) at least once.
OPTION_SAMPLE = [
    {"tile": None, "fusion": "auto", "unroll": None, "threads": 1},
    {"tile": (3, 5, 7), "fusion": "max", "unroll": 2, "threads": 2},
    {"tile": (16,), "fusion": "none", "unroll": 3, "threads": 2},
    {"tile": None, "fusion": "none", "unroll": 2, "threads": 1, "prefetch": True},
    {"tile": (3, 5, 7), "fusion": "auto", "unroll": 3, "threads": 1},
    {"tile": (16,), "fusion": "max", "unroll": None, "threads": 1},
    {"tile": None, "fusion": "max", "unroll": 3, "threads": 2},
    {"tile": (3, 5, 7), "fusion": "none", "unroll": None, "threads": 2},
    {"tile": (16,), "fusion": "auto", "unroll": 2, "threads": 2, "prefetch": True},
]


def _check_options(name, grid):
    src, shapes = KERNELS[name]
    reference_kernel = tl.compile(src, options=tl.Options(optimize=False))
    inputs = _inputs(reference_kernel.program, shapes)
    want = _run(src, inputs, tl.Options(optimize=False))
    for opts in grid:
        _assert_same(_run(src, inputs, tl.Options(**opts)), want, f"{name} {opts}")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_option_sample_matches_untransformed(name):
    _check_options(name, OPTION_SAMPLE)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_option_combination_matches_untransformed(name):
    _check_options(name, OPTION_GRID)


CORPUS = load_corpus() or {"cases": []}


@pytest.mark.parametrize("case", CORPUS["cases"], ids=lambda c: c["name"])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"tile": (2, 3), "unroll": 2, "threads": 2},
        {"fusion": "max", "threads": 2},
        {"fusion": "none"},
        {"threads": 1},  # one thread: fused row loops may be pipelined
    ],
)
def test_corpus_under_transformations(case, opts):
    src, entry = case["tc"], case.get("entry")
    kernel = tl.compile(src, entry, options=tl.Options(optimize=False))
    shapes = {name: tuple(shape) for name, shape in case["inputs"].items()}
    inputs = _inputs(kernel.program, shapes, seed=3)
    for t, arr in zip(kernel.program.inputs, inputs):  # keep gathers in range
        if not t.dtype.is_float and case.get("int_ranges", {}).get(t.name):
            lo, hi = case["int_ranges"][t.name]
            arr[...] = np.random.default_rng(1).integers(lo, hi, size=arr.shape)
    if "special_inputs" in case:
        pytest.skip("inputs derived from other inputs")
    preinit = case.get("preinit")
    if preinit:
        out = {k: np.ones(v, np.float32) for k, v in preinit.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = kernel(*inputs, out={k: v.copy() for k, v in out.items()})
            got = tl.compile(src, entry, options=tl.Options(**opts))(
                *inputs, out={k: v.copy() for k, v in out.items()}
            )
        _assert_same((got,), (want,), case["name"])
        return
    want = _run(src, inputs, tl.Options(optimize=False), entry)
    _assert_same(_run(src, inputs, tl.Options(**opts), entry), want, f"{case['name']} {opts}")
