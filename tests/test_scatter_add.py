"""Scatter-add (issue 14.2): reductions whose left-hand side reads an integer tensor,
`O(idx(b), e) +=! V(b, e)`, against np.add.at with duplicate indices, on 1 and 2 threads, under
every fusion mode and against Options(optimize=False); every index checked at run time; the
parse and semantic errors; the extent rule."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from tensorlang.frontend import check_source

EMBED_GRAD = """def scatter(int32(B) idx, float(B, D) V, float(E, D) T) -> (float(E, D) O) {
    O(idx(b), e) +=! V(b, e)
}"""
SCATTER_1D = """def scatter1(int32(B) idx, float(B) V) -> (float(E) O) {
    O(idx(b)) +=! V(b)
}"""
# a statement that reads the scattered tensor: must see every contribution, whatever is fused
SCATTER_THEN_READ = """def sr(int32(B) idx, float(B, D) V, float(E, D) T) -> (float(E, D) O, float(E, D) P) {
    O(idx(b), e) +=! V(b, e)
    P(i, e) = O(i, e) * T(i, e) + O(i, e)
}"""
# two scatters into one tensor keep their order around a statement that scales it
TWO_SCATTERS = """def two(int32(B) idx, float(B) V, int32(C) jdx, float(C) W, float(E) T) -> (float(E) O, float(E) R) {
    O(idx(b)) +=! V(b)
    O(i) = O(i) * T(i)
    O(jdx(c)) += W(c)
    R(i) = O(i) * O(i)
}"""
MIXED = """def mixed(int32(B, K) idx, float(B, K, D) V) -> (float(D, E) O) {
    O(e, idx(b, k)) +=! V(b, k, e)
}"""

OPTIONS = [
    tl.Options(optimize=False),
    tl.Options(threads=1),
    tl.Options(threads=2),
    tl.Options(fusion="max", threads=2),
    tl.Options(fusion="none", threads=2),
    tl.Options(fusion="auto", threads=1, tile=(2, 3)),
]
_KERNELS: dict = {}


def kernel(src: str, options: tl.Options) -> tl.Kernel:
    key = (src, options)
    if key not in _KERNELS:
        _KERNELS[key] = tl.compile(src, options=options)
    return _KERNELS[key]


def _scatter_ref(idx, v, e):
    out = np.zeros((e, *v.shape[1:]), np.float64)
    np.add.at(out, idx, v.astype(np.float64))
    return out


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("b, d, e", [(1, 1, 1), (13, 5, 7), (97, 3, 2), (31, 17, 64)])
def test_embedding_scatter_matches_add_at(options, b, d, e):
    rng = np.random.default_rng(b * 100 + d)
    idx = rng.integers(0, e, b).astype(np.int32)  # many duplicates when b > e
    v = rng.standard_normal((b, d)).astype(np.float32)
    t = np.zeros((e, d), np.float32)
    got = kernel(EMBED_GRAD, options)(idx, v, t)
    np.testing.assert_allclose(got, _scatter_ref(idx, v, e), rtol=1e-5, atol=1e-5)


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 3, 501).astype(np.int32)  # three rows, hundreds of contributions each
    v = rng.standard_normal((501, 67)).astype(np.float32)
    t = np.zeros((3, 67), np.float32)
    one = kernel(EMBED_GRAD, tl.Options(threads=1))(idx, v, t)
    two = kernel(EMBED_GRAD, tl.Options(threads=2))(idx, v, t)
    np.testing.assert_array_equal(one, two)  # each element is summed by one thread, in b order


@pytest.mark.parametrize("options", OPTIONS[:3], ids=str)
def test_1d_scatter_with_a_call_time_extent(options):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 11, 29).astype(np.int32)
    v = rng.standard_normal(29).astype(np.float32)
    got = kernel(SCATTER_1D, options)(idx, v, E=11)
    np.testing.assert_allclose(got, _scatter_ref(idx, v, 11), rtol=1e-5, atol=1e-6)
    assert got.shape == (11,)


def test_scatter_with_mixed_subscripts_and_a_2d_index():
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 5, (7, 3)).astype(np.int32)
    v = rng.standard_normal((7, 3, 4)).astype(np.float32)
    want = np.zeros((4, 5))
    for b in range(7):
        for k in range(3):
            want[:, idx[b, k]] += v[b, k]
    for options in OPTIONS[:3]:
        got = kernel(MIXED, options)(idx, v, E=5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_a_statement_reading_the_scatter_sees_every_contribution(options):
    rng = np.random.default_rng(3)
    b, d, e = 41, 6, 5
    idx = rng.integers(0, e, b).astype(np.int32)
    v = rng.standard_normal((b, d)).astype(np.float32)
    t = rng.standard_normal((e, d)).astype(np.float32)
    o, p = kernel(SCATTER_THEN_READ, options)(idx, v, t)
    want = _scatter_ref(idx, v, e)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p, want * t + want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_two_scatters_into_one_tensor_keep_their_order(options):
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 7, 23).astype(np.int32)
    jdx = rng.integers(0, 7, 3).astype(np.int32)
    v, w = rng.standard_normal(23), rng.standard_normal(3)
    t = rng.standard_normal(7)
    f32 = np.float32
    o, r = kernel(TWO_SCATTERS, options)(idx, v.astype(f32), jdx, w.astype(f32), t.astype(f32))
    want = _scatter_ref(idx, v, 7) * t
    np.add.at(want, jdx, w)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r, want * want, rtol=1e-4, atol=1e-5)


def test_accumulating_scatter_adds_onto_out():
    src = """def acc(int32(B) idx, float(B, D) V, float(E, D) T) -> (float(E, D) O) {
    O(idx(b), e) += V(b, e)
}"""
    rng = np.random.default_rng(6)
    idx = rng.integers(0, 4, 9).astype(np.int32)
    v = rng.standard_normal((9, 3)).astype(np.float32)
    t = np.zeros((4, 3), np.float32)
    with pytest.warns(tl.TensorLangWarning, match="Reduction without initialization"):
        k = tl.compile(src)
    start = rng.standard_normal((4, 3)).astype(np.float32)
    out = start.copy()
    k(idx, v, t, out=out)
    np.testing.assert_allclose(out, start + _scatter_ref(idx, v, 4), rtol=1e-5, atol=1e-5)
    with pytest.warns(tl.TensorLangWarning, match="starts from zeros"):
        zeros = k(idx, v, t)
    np.testing.assert_allclose(zeros, _scatter_ref(idx, v, 4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op, ufunc, identity",
    [("max", np.maximum, -np.inf), ("min", np.minimum, np.inf), ("*", np.multiply, 1.0)],
)
def test_max_min_and_product_scatters(op, ufunc, identity):
    src = f"def m(int32(B) idx, float(B) V) -> (float(E) O) {{ O(idx(b)) {op}=! V(b) }}"
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 9, 20).astype(np.int32)
    v = rng.standard_normal(20).astype(np.float32)
    want = np.full(9, identity, np.float32)
    ufunc.at(want, idx, v)
    for options in OPTIONS[:3]:
        np.testing.assert_allclose(kernel(src, options)(idx, v, E=9), want, rtol=1e-6)


def test_scatter_onto_a_temporary_takes_the_extent_of_its_first_statement():
    src = """def tmp(float(E) T, int32(B) idx, float(B) V) -> (O) {
    H(i) = T(i)
    H(idx(b)) += V(b)
    O(i) = 2.0 * H(i)
}"""
    rng = np.random.default_rng(8)
    t = rng.standard_normal(6).astype(np.float32)
    idx = rng.integers(0, 6, 15).astype(np.int32)
    v = rng.standard_normal(15).astype(np.float32)
    want = t.astype(np.float64)
    np.add.at(want, idx, v)
    for options in OPTIONS:
        np.testing.assert_allclose(kernel(src, options)(t, idx, v), 2 * want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ run-time checks


@pytest.mark.parametrize("bad", [-1, 7, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("options", OPTIONS[:3], ids=str)
def test_out_of_range_indices_raise_naming_tensor_index_and_statement(bad, options):
    rng = np.random.default_rng(9)
    idx = rng.integers(0, 7, 12).astype(np.int32)
    idx[5] = bad
    v = rng.standard_normal((12, 3)).astype(np.float32)
    t = np.zeros((7, 3), np.float32)
    with pytest.raises(tl.ArgumentError) as info:
        kernel(EMBED_GRAD, options)(idx, v, t)
    text = str(info.value)
    assert f"index {bad} out of range for dimension 0 of O" in text
    assert "O(idx(b), e)" in text and "line 2" in text


def test_an_out_of_range_index_leaves_a_fresh_output_unreturned_and_out_documented():
    """The call stops at the first bad index: nothing is written out of bounds. A fresh output is
    never returned; an out= buffer may hold the contributions made before the bad index."""
    idx = np.array([0, 1, 9, 2], np.int32)
    v = np.ones((4, 2), np.float32)
    t = np.zeros((3, 2), np.float32)
    guard = np.full((5, 3, 2), 7.0, np.float32)  # memory around out=, never touched
    out = guard[2]
    with pytest.raises(tl.ArgumentError, match="index 9 out of range"):
        kernel(EMBED_GRAD, tl.Options(threads=1))(idx, v, t, out=out)
    np.testing.assert_array_equal(guard[[0, 1, 3, 4]], 7.0)


# ------------------------------------------------------------------ errors at compile time


def _located(error: Exception, fragment: str) -> None:
    text = str(error)
    assert "^" in text, text
    caret_line = text.splitlines()[-1]
    source_line = text.splitlines()[-2]
    column = caret_line.index("^")
    assert source_line[column:].startswith(fragment.split("(")[0]), text


@pytest.mark.parametrize(
    "src, message, fragment",
    [
        (
            "def f(int32(B) idx, float(B) V) -> (float(E) O) {\n    O(idx(b)) = V(b)\n}",
            r"`=` cannot write through a data-dependent subscript \(idx\(b\)\).*`\+=!`",
            "idx(b)",
        ),
        (
            "def f(int32(B) idx, float(B) V) -> (O) {\n    O(idx(b)) +=! V(b)\n}",
            r"extent of dimension 0 of O cannot come from a data-dependent subscript.*declare it",
            "idx(b)",
        ),
        (
            "def f(int32(B) idx, float(B) V) -> (float(B) O) {\n    O(b + 1) +=! V(b)\n}",
            "a left-hand-side subscript must be an index variable, or read a tensor",
            "b + 1",
        ),
        (
            "def f(float(B) idx, float(B) V) -> (float(E) O) {\n    O(idx(b)) +=! V(b)\n}",
            "expected integral type but found float",
            "idx(b)",
        ),
    ],
)
def test_compile_errors_are_located(src, message, fragment):
    with pytest.raises(tl.SemanticError, match=message) as info:
        check_source(src)
    _located(info.value, fragment)


def test_scatter_parses_and_prints_back():
    from tensorlang.errors import Source
    from tensorlang.parser import parse

    tree = parse(Source(EMBED_GRAD))
    assert "O(idx(b), e) +=! V(b, e)" in str(tree)
    assert parse(Source(str(tree))) == tree


def test_the_init_covers_the_whole_tensor_before_the_scatter():
    program = check_source(EMBED_GRAD)
    assert [str(s) for s in program.statements] == [
        "O(i0, i1) = 0.0 where i0 in 0:E, i1 in 0:D",
        "O(idx(b), e) +=! V(b, e) where e in 0:D, b in 0:B",
    ]


# ------------------------------------------------------------------ tl.grad of a gather


GATHERS = {
    "embedding": (
        "def emb(double(V, E) T, int32(B) I) -> (O) {\n    O(b, e) = T(I(b), e)\n}",
        "dT(I(b), e) +=! dO(b, e)",
    ),
    "embedding_bag": (
        "def bag(double(V, E) T, int32(B, L) I, double(E) W) -> (O) {\n    O(b, e) +=! T(I(b, l), e) * W(e)\n}",
        "dT(I(b, l), e) +=! dO(b, e) * W(e)",
    ),
    "gather_of_a_temporary": (
        "def g(double(V, E) T, int32(B) I) -> (O) {\n    H(v, e) = T(v, e) * 2.0\n"
        "    O(b, e) = H(I(b), e) * H(I(b), e)\n}",
        "dH(I(b), e) += ",  # a temporary's adjoint: zeros over its shape first, then the scatter
    ),
}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_gather_gradient_is_a_scatter_add_matching_finite_differences(name):
    from gradcheck import check

    src, expected = GATHERS[name]
    rng = np.random.default_rng(11)
    inputs = {
        "embedding": lambda: [rng.uniform(-1, 1, (7, 5)), rng.integers(0, 7, 23).astype(np.int32)],
        "embedding_bag": lambda: [
            rng.uniform(-1, 1, (5, 3)),
            rng.integers(0, 5, (4, 3)).astype(np.int32),
            rng.uniform(-1, 1, 3),
        ],
        "gather_of_a_temporary": lambda: [
            rng.uniform(-1, 1, (3, 2)),
            rng.integers(0, 3, 11).astype(np.int32),
        ],
    }[name]()
    text = check(src, inputs)
    assert expected in text, text


def test_embedding_gradient_equals_add_at_on_two_threads():
    src = GATHERS["embedding"][0]
    rng = np.random.default_rng(12)
    table, idx = rng.uniform(-1, 1, (13, 6)), rng.integers(0, 13, 101).astype(np.int32)
    d_out = rng.standard_normal((101, 6))
    want = np.zeros_like(table)
    np.add.at(want, idx, d_out)
    for threads in (1, 2):
        got = tl.compile(tl.grad(src), options=tl.Options(threads=threads))(table, idx, d_out)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_gradient_through_a_scatter_is_a_located_error():
    with pytest.raises(tl.SemanticError, match="gradient through a scatter") as info:
        tl.grad(SCATTER_1D.replace("float", "double"), wrt="V")
    assert "^" in str(info.value)
