"""Prefetching the next outer iteration's rows: where it is emitted, and that it never changes results."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SOFTMAX

import codegen.runtime.parallel
import tensorlang as tl

BIAS = "def bias(float(N, M) A, float(M) b) -> (B) { B(i, j) = A(i, j) + b(j) }"
TRANSPOSE = "def t(float(N, M) A) -> (B) { B(j, i) = A(i, j) }"
# three input rows per iteration, reached through shifted subscripts
STENCIL = """def stencil(float(N, M) X) -> (O) {
    O(i, j) = X(i, j) + X(i + 1, j) + X(i + 2, j) where i in 0:N-2
}"""
STRIDED = "def strided(double(N, M) X) -> (O) { O(i, j) +=! X(2 * i + r, j) where i in 0:N/2, r in 0:2 }"
GATHER = "def gather(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) * 2 }"
MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


ON = tl.Options(prefetch=True)


def _prefetches_in_ir(src: str, sizes: dict[str, int], **options) -> int:
    text = tl.compile(src, options=tl.Options(**{"prefetch": True, **options})).inspect("llvm", sizes=sizes)
    return text.count("call void @llvm.prefetch")


def test_softmax_prefetches_the_next_row_of_its_input_only():
    k = tl.compile(SOFTMAX, options=ON)
    loops = k.inspect("loops", sizes={"N": 64, "D": 1024})
    assert "// each iteration prefetches what the next reads of I\n" in loops  # not the contracted e
    assert _prefetches_in_ir(SOFTMAX, {"N": 64, "D": 1024}) > 0
    assert _prefetches_in_ir(SOFTMAX, {"N": 64, "D": 1024}, prefetch=False) == 0
    off = tl.compile(SOFTMAX).inspect("loops", sizes={"N": 64, "D": 1024})
    assert "prefetches" not in off  # off by default


def test_rows_that_do_not_move_with_the_loop_are_not_prefetched():
    loops = tl.compile(BIAS, options=ON).inspect("loops", sizes={"N": 64, "M": 1000})
    assert "prefetches what the next reads of A\n" in loops  # b(j) is the same every iteration


def test_scattered_footprints_are_not_prefetched():
    # a 32-column tile of a transpose touches 640 rows: its address range is mostly not read
    # (square 32x32 tiles, as the user asks: the default tiles of a transpose walk whole rows)
    square = tl.Options(prefetch=True, tile=32)
    loops = tl.compile(TRANSPOSE, options=square).inspect("loops", sizes={"N": 640, "M": 1000})
    assert "prefetches" not in loops
    assert _prefetches_in_ir(TRANSPOSE, {"N": 640, "M": 1000}, tile=32) == 0


def test_gathers_and_gemm_phases_are_not_prefetched():
    assert "prefetches" not in tl.compile(GATHER, options=ON).inspect(
        "loops", sizes={"E": 9, "D": 4096, "B": 64}
    )
    assert "prefetches" not in tl.compile(MATMUL, options=ON).inspect(
        "loops", sizes={"M": 256, "K": 256, "N": 256}
    )


def _inputs(kernel, shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in kernel.program.inputs:
        if t.dtype.is_float:
            out.append(rng.uniform(-3, 3, size=shapes[t.name]).astype(t.dtype.numpy_name))
        else:
            out.append(rng.integers(0, shapes["T"][0], size=shapes[t.name]).astype(t.dtype.numpy_name))
    return out


CASES = [
    (SOFTMAX, {"I": (1, 1024)}),  # one row: no next iteration to fetch
    (SOFTMAX, {"I": (7, 1021)}),  # prime row length, not a whole number of lines
    (SOFTMAX, {"I": (13, 3)}),  # rows shorter than a cache line
    (SOFTMAX, {"I": (5, 70000)}),  # a row larger than the prefetch limit
    (BIAS, {"A": (11, 257), "b": (257,)}),
    (STENCIL, {"X": (9, 301)}),
    (STENCIL, {"X": (3, 5)}),
    (STRIDED, {"X": (13, 129)}),
    (GATHER, {"T": (9, 67), "I": (11,)}),
    (TRANSPOSE, {"A": (37, 53)}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("specialize", [True, False])
@pytest.mark.parametrize(("src", "shapes"), CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_prefetch_never_changes_results(monkeypatch, src, shapes, threads, specialize):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    shapes = {**shapes, "T": shapes.get("T", (1,))}
    reference = tl.compile(src, options=tl.Options(optimize=False))
    inputs = _inputs(reference, shapes)
    want = reference(*inputs)
    for prefetch in (True, False):
        options = tl.Options(prefetch=prefetch, threads=threads, specialize=specialize)
        got = tl.compile(src, options=options)(*inputs)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"prefetch={prefetch}")
