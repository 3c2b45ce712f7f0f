"""Graph-level fusion: regions, array contraction of temporaries, and equal results for every strategy."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LAYERNORM, SOFTMAX

import codegen.runtime.parallel
import tensorlang as tl

MLP3 = """def mlp3(float(B, I) X, float(I, H) W1, float(H) b1, float(H, H) W2, float(H) b2, float(H, O) W3) -> (Y) {
    h1(b, j) +=! X(b, i) * W1(i, j)
    a1(b, j) = fmax(h1(b, j) + b1(j), 0)
    h2(b, k) +=! a1(b, j) * W2(j, k)
    a2(b, k) = fmax(h2(b, k) + b2(k), 0)
    Y(b, o) +=! a2(b, k) * W3(k, o)
}"""


def test_softmax_fuses_into_one_region_and_contracts_its_temporaries():
    k = tl.compile(SOFTMAX)
    assert "region 0: S0 S1 S2 S3" in k.inspect("graph")
    loops = k.inspect("loops", sizes={"N": 64, "D": 33})
    assert "// e: contracted along dimension 0" in loops
    assert "// region 0" in loops


def test_none_keeps_statements_apart():
    k = tl.compile(SOFTMAX, options=tl.Options(fusion="none"))
    graph = k.inspect("graph")
    assert "region 3: S3" in graph
    assert "contracted" not in k.inspect("loops", sizes={"N": 8, "D": 8})


def test_contractions_stay_in_their_own_regions():
    graph = tl.compile(MLP3).inspect("graph")
    assert "S0 [contraction]" in graph and "S2 [contraction]" in graph
    assert "region 0: S0\n" in graph + "\n"


@pytest.mark.parametrize("src", [SOFTMAX, LAYERNORM, MLP3], ids=["softmax", "layernorm", "mlp3"])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_strategy_gives_the_same_results(src, threads, monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    ref = tl.compile(src, options=tl.Options(optimize=False))
    rng = np.random.default_rng(5)
    shapes = {"softmax": [(37, 29)], "layernorm": [(41, 23)]}.get(
        ref.name, [(13, 7), (7, 11), (11,), (11, 11), (11,), (11, 5)]
    )
    inputs = [rng.uniform(-1, 1, size=s).astype(np.float32) for s in shapes]
    want = ref(*inputs)
    for fusion in ("auto", "max", "none"):
        got = tl.compile(src, options=tl.Options(fusion=fusion, threads=threads))(*inputs)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=fusion)


def test_temporaries_with_disjoint_lifetimes_share_one_buffer():
    src = """def f(float(N, D) X) -> (Y) {
        a(n, d) = X(n, d) * 2.0
        s(n) +=! a(n, d)
        b(n, d) = X(n, d) - s(n)
        t(n) max=! b(n, d)
        Y(n, d) = b(n, d) / t(n)
    }"""
    k = tl.compile(src, options=tl.Options(fusion="none"))
    x = np.random.default_rng(2).uniform(0.5, 1, size=(9, 7)).astype(np.float32)
    a = x * 2
    b = x - a.sum(axis=1)[:, None]
    np.testing.assert_allclose(k(x), b / b.max(axis=1)[:, None], rtol=1e-5)
    sharing = next(iter(k._cache.values())).sharing
    assert sharing["a"] == sharing["b"]  # a is dead before b is born


ATAX = """def atax(float(M, N) A, float(N) x) -> (y) {
    t(i) +=! A(i, j) * x(j)
    y(j) +=! A(i, j) * t(i)
}"""


def test_atax_fuses_over_rows():
    """isl's whole-component schedule skews atax; the outer-loop fusion streams A once per row."""
    k = tl.compile(ATAX, options=tl.Options(threads=1))
    assert "region 0: S0 S1" in k.inspect("graph")
    loops = k.inspect("loops", sizes={"M": 5, "N": 4})
    assert "c0 + c1" not in loops and "// t: contracted" in loops
    a = np.random.default_rng(3).uniform(-1, 1, size=(37, 23)).astype(np.float32)
    x = np.random.default_rng(4).uniform(-1, 1, size=23).astype(np.float32)
    np.testing.assert_allclose(
        k(a, x), a.T.astype(np.float64) @ (a.astype(np.float64) @ x), rtol=1e-4, atol=1e-5
    )
    # with threads too: the row loop carries only y's sum, which threads privatise
    # (tests/codegen/test_private_reductions.py)
    assert "region 0: S0 S1" in tl.compile(ATAX, options=tl.Options(threads=2)).inspect("graph")
