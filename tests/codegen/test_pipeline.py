"""Row pipelining (codegen/pipeline.py): when it applies, and that it never changes results."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LAYERNORM, SOFTMAX

import tensorlang as tl

ONE = tl.Options(threads=1)
# the row max and sum are outputs too: not contracted, still read once per row by the division
SOFTMAX_STATS = """def softmax_stats(float(N, D) I) -> (O, mx, s) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
# the division reads the row buffer backwards: at position j it needs what A writes at D-1-j
REVERSED = """def reversed_softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, D - 1 - d) / s(n)
}"""
# two output statements in the last loop, one reading the other's result
TWO_OUTPUTS = """def two(float(N, D) I) -> (O, P) {
    mx(n) max=! I(n, d)
    e(n, d) = tanh(I(n, d) - mx(n)) + exp(I(n, d))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
    P(n, d) = O(n, d) * 2 + mx(n)
}"""


def _pipelined(src: str, sizes: dict[str, int], options: tl.Options = ONE) -> bool:
    return "// pipelined" in tl.compile(src, options=options).inspect("loops", sizes=sizes)


def test_softmax_is_pipelined_on_one_thread_or_several():
    assert _pipelined(SOFTMAX, {"N": 64, "D": 1024})
    assert _pipelined(SOFTMAX, {"N": 64, "D": 1024}, tl.Options(threads=2))
    assert _pipelined(SOFTMAX_STATS, {"N": 64, "D": 1024})
    assert _pipelined(TWO_OUTPUTS, {"N": 64, "D": 1024})


def test_not_pipelined_when_off_or_not_worth_it():
    assert not _pipelined(SOFTMAX, {"N": 64, "D": 1024}, tl.Options(threads=1, pipeline=False))
    assert not _pipelined(SOFTMAX, {"N": 64, "D": 1024}, tl.Options(threads=1, fusion="none"))
    # layer norm's loop before the last does too little arithmetic to hide the stores
    assert not _pipelined(LAYERNORM, {"N": 64, "D": 1024})


def test_not_pipelined_when_the_last_loop_reads_another_position_of_the_row_buffer():
    assert not _pipelined(REVERSED, {"N": 64, "D": 1024})


SHAPES = [(1, 7), (2, 1), (3, 5), (5, 16), (7, 1021), (13, 3), (2, 4099)]


@pytest.mark.parametrize("src", [SOFTMAX, SOFTMAX_STATS, REVERSED, TWO_OUTPUTS, LAYERNORM])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_pipelining_never_changes_results(monkeypatch, src, shape):
    import codegen.runtime.parallel

    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)  # split even tiny row loops
    rng = np.random.default_rng(7)
    x = rng.uniform(-6, 6, size=shape).astype(np.float32)
    if shape[0] > 2:
        x[1, 0] = np.nan  # a NaN row and an inf row propagate the same way
        x[2, -1] = np.inf
    want = tl.compile(src, options=tl.Options(optimize=False))(x)
    options_grid = (ONE, tl.Options(threads=1, pipeline=False), tl.Options(threads=2), tl.Options(threads=3))
    for options in options_grid:
        got = tl.compile(src, options=options)(x)
        for g, w in zip(
            got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)
        ):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7, equal_nan=True, err_msg=str(options))


def test_pipelined_kernel_stays_correct_when_threads_change_after_compiling(monkeypatch):
    """Each thread pipelines its own rows, whatever the thread count at call time."""
    import codegen.runtime.parallel

    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    monkeypatch.delenv("TENSORLANG_NUM_THREADS", raising=False)
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "1")
    k = tl.compile(SOFTMAX)
    x = np.random.default_rng(3).uniform(-3, 3, size=(37, 129)).astype(np.float32)
    first = k(x)
    assert "// pipelined" in k.inspect("loops", sizes={"N": 37, "D": 129})
    monkeypatch.setenv("TENSORLANG_NUM_THREADS", "2")
    np.testing.assert_array_equal(k(x), first)
