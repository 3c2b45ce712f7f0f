"""tl.grad, the numbers: every gradient program compiles with tl.compile and agrees with central
finite differences in float64 along random directions (`<dX, V>` against the derivative of
`<dO, f(X + eps V)>`), on odd and prime sizes; the max=/min= tie rule against hand-computed even
splits (and torch.amax where torch is installed); every differentiable program of the corpus."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import LAYERNORM, SOFTMAX, load_corpus
from gradcheck import as_double, check

import tensorlang as tl

RNG = np.random.default_rng(2026)


def _r(*shape):
    return RNG.uniform(-1.0, 1.0, shape)


PROGRAMS = {
    "matmul": (
        "def matmul(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
        [(5, 7), (7, 3)],
    ),
    "batched_matmul": (
        "def bmm(double(B, M, K) A, double(B, K, N) Bm) -> (C) { C(b, m, n) +=! A(b, m, k) * Bm(b, k, n) }",
        [(3, 5, 7), (3, 7, 2)],
    ),
    "conv2d_stride": (
        """def conv(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * Wt(f, c, kh, kw)
}""",
        [(2, 3, 11, 9), (2, 3, 3, 2)],
    ),
    "conv2d_padding": (
        """def conv(double(N, C, H, W) I, double(F, C, 3, 3) Wt, double(F) Bias) -> (O) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
        ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
    O(n, f, h, w) = O(n, f, h, w) + Bias(f)
}""",
        [(2, 3, 7, 5), (2, 3, 3, 3), (2,)],
    ),
    "maxpool": (
        "def maxpool(double(B, C, H, W) I) -> (O) { O(b, c, h, w) max=! I(b, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2 }",
        [(2, 3, 7, 9)],
    ),
    "avgpool": (
        "def avgpool(double(B, C, H, W) I) -> (O) { O(b, c, h, w) +=! I(b, c, 2 * h + kh, 2 * w + kw) / 4.0 where kh in 0:2, kw in 0:2 }",
        [(2, 3, 7, 9)],
    ),
    "softmax": (as_double(SOFTMAX), [(5, 7)]),
    "log_softmax": (
        """def logsoftmax(double(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    s(n) +=! exp(I(n, d) - mx(n))
    O(n, d) = I(n, d) - mx(n) - log(s(n))
}""",
        [(5, 7)],
    ),
    "layer_norm": (as_double(LAYERNORM), [(5, 7)]),
    "batch_norm": (
        """def batchnorm(double(N, C) X, double(C) gamma, double(C) beta) -> (Y) {
    mean(c) +=! X(n, c) / N
    var(c) +=! (X(n, c) - mean(c)) * (X(n, c) - mean(c)) / N
    Y(n, c) = gamma(c) * (X(n, c) - mean(c)) * rsqrt(var(c) + 1e-5) + beta(c)
}""",
        [(7, 5), (5,), (5,)],
    ),
    "mlp_fmax": (
        """def mlp(double(B, M) I, double(N, M) W1, double(N) B1, double(P, N) W2, double(P) B2) -> (O2) {
    H1(b, n) +=! I(b, m) * W1(n, m)
    H1(b, n) = fmax(H1(b, n) + B1(n), 0)
    O2(b, p) +=! H1(b, n) * W2(p, n)
    O2(b, p) = O2(b, p) + B2(p)
}""",
        [(3, 5), (7, 5), (7,), (2, 7), (2,)],
    ),
    "tanh_chain": (
        """def chain(double(N) X, double(N) Wt) -> (Y) {
    a(i) = tanh(X(i) * Wt(i))
    b(i) = tanh(a(i) + 1.0 / (1.0 + exp(-a(i))))
    Y(i) = tanh(b(i)) * a(i)
}""",
        [(7,), (7,)],
    ),
    "scan": (
        """def scan(double(N) X) -> (S) {
    S(i) = X(i)
    S(i) = S(i - 1) * 0.5 + X(i) * S(i - 1) + X(i) where i in 1:N
}""",
        [(11,)],
    ),
    "scan_two_steps_2d": (
        """def scan2(double(B, N) X) -> (S) {
    S(b, i) = X(b, i)
    S(b, i) = 0.5 * S(b, i - 1) + 0.25 * S(b, i - 2) * X(b, i) where i in 2:N
}""",
        [(3, 13)],
    ),
    "kru_step": (
        """def Kronecker3Full(double(D0, N0) W0, double(D1, N1) W1, double(D2, N2) W2, double(M, N0, N1, N2) X) -> (Y, XW2, XW2W1) {
    XW2(m, n0, n1, d2) +=! X(m, n0, n1, r_n2) * W2(d2, r_n2)
    XW2W1(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1)
    Y(m, d0, d1, d2) +=! XW2W1(m, r_n0, d1, d2) * W0(d0, r_n0)
}""",
        [(3, 5), (2, 3), (3, 2), (3, 5, 3, 2)],
    ),
    "builtins": (
        """def b(double(N) X, double(N) Y) -> (Z) {
    Z(i) = exp(X(i)) * log(Y(i) + 2.0) + sqrt(Y(i) + 1.5) * rsqrt(X(i) + 2.0) + erf(X(i))
        - fabs(Y(i)) / (1.0 + pow(X(i) + 2.0, Y(i))) + max(X(i), Y(i)) * min(X(i), 0.3)
        + fmin(X(i), Y(i)) + sinh(X(i)) + atan2(X(i), Y(i) + 3.0) + hypot(X(i), Y(i)) + cbrt(Y(i) + 2.0)
        + expm1(X(i)) + log1p(Y(i) + 1.5) + asin(X(i) / 2.0) + atan(Y(i)) + cos(X(i)) * tan(Y(i))
}""",
        [(7,), (7,)],
    ),
    "strided_read": ("def strided(double(N, M) I) -> (O) { O(i, j) = I(j, 5 * i) }", [(3, 12)]),
    "diagonal_and_constant_subscripts": (
        "def d(double(N, N) A, double(N, 3) W) -> (O) { O(i) = A(i, i) * W(i, 1) + A(i, 0) }",
        [(5, 5), (5, 3)],
    ),
    "partial_update_and_scalar": (
        """def p(double(N) X, double a) -> (O) {
    O(i) = X(i) * X(i)
    O(i) = a * O(i) + X(i - 1) where i in 1:N
}""",
        [(7,), ()],
    ),
}


def _inputs(shapes):
    return [_r(*s) if s else np.float64(RNG.uniform(-1, 1)) for s in shapes]


@pytest.mark.parametrize(
    "program",  # "builtins" compiles a gradient per builtin (~10 s): slow
    [pytest.param(p, marks=pytest.mark.slow) if p == "builtins" else p for p in sorted(PROGRAMS)],
)
def test_gradient_matches_finite_differences(program):
    source, shapes = PROGRAMS[program]
    check(source, _inputs(shapes))


def test_wrt_subset_matches_finite_differences():
    source, shapes = PROGRAMS["batch_norm"]
    text = check(source, _inputs(shapes), wrt="gamma,X")
    assert "-> (double(C) dgamma, double(N, C) dX)" in text


def test_product_reduction_with_zero_terms():
    """`*=!` with one zero term in a row (it alone gets a gradient) and two (none does)."""
    source = "def prod(double(N, D) X) -> (P) { P(n) *=! X(n, d) }"
    X = _r(5, 7)
    X[1, 3] = 0.0
    X[2, 1] = X[2, 4] = 0.0
    check(source, [X])
    grad = tl.compile(tl.grad(source))(X, np.ones(5))
    assert grad[1, 3] == pytest.approx(np.prod(np.delete(X[1], 3)))
    assert np.all(grad[1, np.arange(7) != 3] == 0.0) and np.all(grad[2] == 0.0)


def test_plus_eq_without_bang_has_the_gradient_of_plus_eq_bang():
    A, B = _r(3, 5), _r(5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        check("def mm(double(M, K) A, double(K, N) B) -> (C) { C(m, n) += A(m, k) * B(k, n) }", [A, B])


# ---------------------------------------------------------------- ties


def _grad_kernel(source):
    return tl.compile(tl.grad(source))


def test_max_ties_split_the_adjoint_evenly():
    X = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.5, -1.0, 0.25, 0.5, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    dO = np.array([0.6, -2.0, 1.5])
    dI = _grad_kernel("def amax(double(N, D) I) -> (O) { O(n) max=! I(n, d) }")(X, dO)
    expected = np.zeros_like(X)
    expected[0, [1, 2, 4]] = 0.6 / 3
    expected[1, [0, 3]] = -2.0 / 2
    expected[2, :] = 1.5 / 5
    np.testing.assert_allclose(dI, expected, rtol=1e-15)


def test_min_ties_and_ties_with_the_initial_value():
    """The rule is per statement: a `min=` onto an initialised tensor splits among its own terms
    and the tensor's previous value (one term), as torch.amin of torch.amin would."""
    X = np.array([[1.0, -3.0, -3.0], [0.0, 1.0, 2.0]])
    B = np.array([[-3.0, 5.0], [4.0, 0.0]])
    src = "def f(double(N, D) I, double(N, E) B) -> (O) { O(n) min=! I(n, d)\n O(n) min= B(n, e) }"
    dI, dB = _grad_kernel(src)(X, B, np.array([0.9, 1.2]))
    # row 0: B(0, 0) ties with the previous value -3 (0.45 each), which splits among I's two -3s
    np.testing.assert_allclose(dI, [[0.0, 0.225, 0.225], [0.6, 0.0, 0.0]])
    np.testing.assert_allclose(dB, [[0.45, 0.0], [0.0, 0.6]])


def test_maxpool_ties_inside_windows():
    X = np.zeros((1, 1, 4, 4))
    X[0, 0, 0, 0] = X[0, 0, 1, 1] = 1.0  # a tie in the first window; the others are all zeros
    src = PROGRAMS["maxpool"][0]
    dI = _grad_kernel(src)(X, np.ones((1, 1, 2, 2)))
    expected = np.full((4, 4), 0.25)
    expected[:2, :2] = [[0.5, 0.0], [0.0, 0.5]]
    np.testing.assert_allclose(dI[0, 0], expected)


def test_binary_max_ties_split_like_torch_maximum():
    dX, dY = _grad_kernel("def f(double(N) X, double(N) Y) -> (O) { O(i) = max(X(i), Y(i)) }")(
        np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 0.0]), np.ones(3)
    )
    np.testing.assert_allclose(dX, [0.5, 0.0, 1.0])
    np.testing.assert_allclose(dY, [0.5, 1.0, 0.0])


def test_max_ties_agree_with_torch_amax():
    torch = pytest.importorskip("torch")
    X = RNG.integers(0, 3, size=(5, 7)).astype(np.float64)
    dO = RNG.standard_normal(5)
    dI = _grad_kernel("def amax(double(N, D) I) -> (O) { O(n) max=! I(n, d) }")(X, dO)
    t = torch.tensor(X, requires_grad=True)
    torch.amax(t, dim=1).backward(torch.tensor(dO))
    np.testing.assert_allclose(dI, t.grad.numpy(), rtol=1e-15)


# ---------------------------------------------------------------- the corpus

CORPUS = load_corpus()
# what tl.grad cannot differentiate yet, or what has nothing to differentiate: a located error
EXPECTED_ERRORS = ("scatter-add", "no derivative rule", "no floating-point")


def _corpus_inputs(case, rng):
    inputs = []
    for name, shape in case["inputs"].items():
        dtype = case["input_dtypes"][name]
        if dtype.startswith("float"):
            lo, hi = case.get("value_ranges", {}).get(name, [-1, 1])
            inputs.append(rng.uniform(lo, hi, shape) if shape else np.float64(rng.uniform(lo, hi)))
        else:
            lo, hi = case.get("int_ranges", {}).get(name, [0, 4])
            inputs.append(rng.integers(lo, hi, shape).astype(dtype))
    return inputs


# the corpus cases whose finite differences take 3-6 s each: in the slow tier (`-m slow`)
HEAVY_GRADIENTS = ("wavenet1", "group_normalization_single_kernel", "func_4fcrelu")


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c["name"] in HEAVY_GRADIENTS else c for c in CORPUS["cases"]],
    ids=lambda c: c["name"],
)
def test_corpus_gradients(case):
    source = as_double(case["tc"])
    try:
        tl.grad(source, case.get("entry"))
    except tl.SemanticError as error:
        assert any(e in str(error) for e in EXPECTED_ERRORS), str(error)
        assert error.line > 0 and "^" in str(error)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)  # `+=` without `!` in the forward
        check(source, _corpus_inputs(case, np.random.default_rng(0)), name=case.get("entry"), directions=1)
