"""Row vectors (codegen/lowering/row_analysis.py, row_vectors.py) and padded rows of folded
temporaries (codegen/planning/folding.py): innermost loops whose reads are neighbours along the
contiguous dimension run as explicit store-aligned vectors with lane shifts. Results are
bit-identical to the same schedule without vectorisation (Options(vectorize=False): the same
operations in the same order, lane by lane) and match the untransformed kernel
(Options(optimize=False)) at odd and prime sizes, rows shorter than a vector, a few vectors,
and sizes where the masked head and tail blocks meet; loops with a dependence the vectors would
break are left scalar."""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.lowering.row_vectors import RowVectorLowering

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_stencils import CASES, _args, _as_tuple  # noqa: E402

SIZES = {  # rows from below two vectors (scalar) to several vectors with ragged ends
    "jacobi1d": [(5,), (31,), (32,), (33,), (97,), (1009,)],
    "jacobi2d": [(3, 31), (5, 33), (7, 61), (4, 67), (11, 128), (3, 257)],
    "heat3d": [(3, 3, 33), (4, 5, 47), (3, 4, 67)],
    "seidel2d": [(5, 37), (6, 67)],
    "fdtd": [(5, 37), (4, 67)],
}

_KERNELS: dict = {}


def kernel(src, options):
    key = (src, options)
    if key not in _KERNELS:
        _KERNELS[key] = tl.compile(src, options=options)
    return _KERNELS[key]


def row_statements(src, options, sizes, monkeypatch) -> set[str]:
    """The statements whose innermost loop lowering runs as row vectors."""
    found = set()
    original = RowVectorLowering.row_plan

    def spy(self, node, name):
        row = original(self, node, name)
        if row is not None:
            found.add(self.ast.leaves[node.for_get_body().get_annotation().get_name()].statement)
        return row

    monkeypatch.setattr(RowVectorLowering, "row_plan", spy)
    kernel(src, options).inspect("llvm", sizes=sizes)
    return found


ONE_THREAD = tl.Options(threads=1)


def _check(src, args, options=ONE_THREAD, sizes_note=""):
    got = _as_tuple(kernel(src, options)(*args))
    same_schedule = _as_tuple(kernel(src, dataclasses.replace(options, vectorize=False))(*args))
    reference = _as_tuple(kernel(src, tl.Options(optimize=False))(*args))
    for g, s, r in zip(got, same_schedule, reference):
        if not options.fast_math:  # the same operations in the same order
            np.testing.assert_array_equal(g, s, err_msg=sizes_note)
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5, err_msg=sizes_note)


# heat-3d, jacobi-2d and fdtd-2d compile for seconds (their other tests here cover jacobi-2d,
# tests/test_stencils.py covers fdtd-2d): slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in ("heat3d", "jacobi2d", "fdtd") else n for n in SIZES],
)
def test_stencils_match_the_scalar_and_untransformed_kernels(name):
    src = CASES[name][0]
    rng = np.random.default_rng(3)
    for shape in SIZES[name]:
        for t in (2, 5):
            _check(
                src,
                _args("fdtd" if name == "fdtd" else "", shape, t, rng),
                sizes_note=f"{name} {shape} T={t}",
            )


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(tl.Options(threads=2), marks=pytest.mark.slow),  # ~5 s; team phases test 2 threads
        pytest.param(tl.Options(threads=1, vector_width=256), marks=pytest.mark.slow),  # ~5 s
        pytest.param(tl.Options(threads=1, vector_width=128), marks=pytest.mark.slow),
        tl.Options(threads=1, specialize=False),
        # the time band is entry 0 on one thread (the copies run in its tiles)
        pytest.param(tl.Options(threads=1, band_tiles=((4, 8),)), marks=pytest.mark.slow),
        pytest.param(tl.Options(threads=1, fast_math=True), marks=pytest.mark.slow),
    ],
    ids=lambda o: repr(o)[8:60],
)
def test_jacobi_with_other_options(options):
    src = CASES["jacobi2d"][0]
    rng = np.random.default_rng(5)
    for shape in [(5, 33), (7, 61), (4, 67)]:
        _check(src, _args("", shape, 5, rng), options, f"{shape}")


def test_the_jacobi_row_runs_as_vectors_with_padded_rows(monkeypatch):
    src = CASES["jacobi2d"][0]
    k = kernel(src, tl.Options(threads=1))
    sizes = dict(N=7, M=67, T=5)
    assert row_statements(src, tl.Options(threads=1), sizes, monkeypatch) == {"S1_1"}  # not the copies
    assert "rows padded from 67 to 80 elements" in k.inspect("loops", sizes=sizes)
    assert "rows padded" not in k.inspect("loops", sizes=dict(N=7, M=61, T=5))  # 244 bytes: left alone
    assert not row_statements(src, tl.Options(threads=1, vectorize=False), sizes, monkeypatch)


JACOBI_DOUBLE = CASES["jacobi2d"][0].replace("float(N, M) A", "double(N, M) A")


def test_double_rows(monkeypatch):
    rng = np.random.default_rng(9)
    for shape in [(5, 17), (6, 33), (4, 67)]:
        a = rng.standard_normal(shape)
        _check(JACOBI_DOUBLE, [a, np.zeros(4, np.float32)], sizes_note=f"{shape}")
    assert row_statements(JACOBI_DOUBLE, tl.Options(threads=1), dict(N=5, M=67, T=4), monkeypatch)


# A stencil on an input (no time loop): the reads are of another tensor, so nothing orders them.
SMOOTH = """def smooth(float(N, M) A) -> (O) {
  O(i, j) = 0.25 * A(i, j) + 0.5 * A(i, j + 1) + 0.25 * A(i, j + 2) - A(i, j + 3) / 3.0 where i in 0:N, j in 0:M-3
}"""

# In place: X(i, j) becomes X(i, j) + X(i, j+1), reading the old X(i, j+1) (an anti-dependence:
# the vectors read before they store, so they may run).
SHIFT_UP = """def up(float(N, M) A) -> (O) {
  X(i, j) = A(i, j) where i in 0:N, j in 0:M
  X(i, j) = X(i, j) + X(i, j + 1) where i in 0:N, j in 0:M-1
  O(i, j) = X(i, j) where i in 0:N, j in 0:M
}"""

# In place the other way: X(i, j) + X(i, j-1) reads this loop's new X(i, j-1), a running sum
# that vectors would break; the loop must stay scalar.
RUNNING = """def running(float(N, M) A) -> (O) {
  X(i, j) = A(i, j) where i in 0:N, j in 0:M
  X(i, j) = X(i, j) + X(i, j - 1) where i in 0:N, j in 1:M
  O(i, j) = X(i, j) where i in 0:N, j in 0:M
}"""


@pytest.mark.parametrize("n", [4, 35, 64, 101])
def test_a_plain_stencil_on_an_input(n, monkeypatch):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((3, n)).astype(np.float32)
    _check(SMOOTH, [a], sizes_note=f"{n}")
    want = 0.25 * a[:, :-3] + 0.5 * a[:, 1:-2] + 0.25 * a[:, 2:-1] - a[:, 3:] / 3.0
    got = kernel(SMOOTH, tl.Options(threads=1))(a)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert row_statements(SMOOTH, tl.Options(threads=1), dict(N=3, M=64), monkeypatch) == {"S0"}


UNFUSED = tl.Options(threads=1, fusion="none")  # each statement its own loop nest


@pytest.mark.parametrize("n", [3, 40, 97])
def test_in_place_rows_keep_the_loop_order(n, monkeypatch):
    a = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)
    _check(SHIFT_UP, [a], UNFUSED, f"{n}")
    _check(RUNNING, [a], UNFUSED, f"{n}")
    up = kernel(SHIFT_UP, UNFUSED)(a)
    want = a.copy()
    want[:, :-1] = a[:, :-1] + a[:, 1:]
    np.testing.assert_array_equal(up, want)
    run = kernel(RUNNING, UNFUSED)(a)
    np.testing.assert_allclose(run, np.cumsum(a, axis=1, dtype=np.float32), rtol=1e-5, atol=1e-5)
    sizes = dict(N=3, M=97)
    assert row_statements(SHIFT_UP, UNFUSED, sizes, monkeypatch) == {"S1"}
    assert not row_statements(RUNNING, UNFUSED, sizes, monkeypatch)


def test_a_thread_runs_its_part_of_a_split_row(monkeypatch):
    """jacobi-1d's team phase splits the row loop between threads: each part is vectorised."""
    src = CASES["jacobi1d"][0]
    rng = np.random.default_rng(1)
    for n in (61, 1009):
        _check(src, _args("", (n,), 5, rng), tl.Options(threads=2), f"{n}")
        _check(src, _args("", (n,), 5, rng), tl.Options(threads=1), f"{n}")
    assert row_statements(src, tl.Options(threads=2), dict(N=1009, T=5), monkeypatch) == {"S1_1"}


def test_an_exported_jacobi_allocates_the_padded_planes(tmp_path):
    """The exported entry allocates B's padded rows (FoldedTemporary.allocated_bytes)."""
    src = CASES["jacobi2d"][0]
    sizes = dict(N=9, M=67, T=6)
    result = tl.export(src, sizes=sizes, path=tmp_path)
    if result.shared is None:
        pytest.skip("no linker for a shared library")
    fn = getattr(ctypes.CDLL(str(result.shared)), result.name)
    fn.restype = ctypes.c_int32
    a = np.random.default_rng(2).standard_normal((9, 67)).astype(np.float32)
    steps = np.zeros(6, np.float32)
    got = np.zeros_like(a)
    args = [ctypes.c_void_p(x.ctypes.data) for x in (a, steps, got)]
    assert fn(*args, *[ctypes.c_int64(v) for v in (9, 67, 6)]) == 0
    np.testing.assert_array_equal(got, kernel(src, ONE_THREAD)(a, steps))


# A scalar input read in every iteration (an invariant read, loaded once per row) and a read of
# a second tensor at the same positions (a group of its own).
SCALED = """def scaled(float(N, M) A, float(N, M) W, float alpha) -> (O) {
  O(i, j) = alpha * (A(i, j) + A(i, j + 1)) - W(i, j) where i in 0:N, j in 0:M-1
}"""


@pytest.mark.parametrize("n", [5, 33, 100])
def test_invariant_reads_and_two_tensors(n, monkeypatch):
    rng = np.random.default_rng(n)
    a, w = (rng.standard_normal((4, n)).astype(np.float32) for _ in range(2))
    alpha = np.float32(0.7)
    _check(SCALED, [a, w, alpha], sizes_note=f"{n}")
    want = alpha * (a[:, :-1] + a[:, 1:]) - w[:, :-1]
    np.testing.assert_allclose(kernel(SCALED, ONE_THREAD)(a, w, alpha), want, rtol=1e-5, atol=1e-5)
    assert row_statements(SCALED, ONE_THREAD, dict(N=4, M=100), monkeypatch) == {"S0"}


def test_every_row_length_up_to_five_blocks_with_one_compiled_kernel(monkeypatch):
    """Rows of 4 to 93 points through one generic kernel each: the head block, pairs of unmasked
    blocks, the one more whole block after the pairs (row_vectors.emit) or none, and one or two
    masked blocks at the end, at every offset of the rows' starts against the vector grid.
    Bitwise the scalar loop's results. SHIFT_UP works in place, so a block stored past its row
    would change the next row before that row reads it."""
    generic = tl.Options(threads=1, specialize=False)
    unfused = dataclasses.replace(generic, fusion="none")
    sizes = dict(N=3, M=64)
    assert row_statements(SMOOTH, generic, sizes, monkeypatch) == {"S0"}
    assert row_statements(SHIFT_UP, unfused, sizes, monkeypatch) == {"S1"}
    rng = np.random.default_rng(7)
    for n in range(4, 94):
        a = rng.standard_normal((3, n)).astype(np.float32)
        got = {}
        for src, options in ((SMOOTH, generic), (SHIFT_UP, unfused)):
            got[src] = kernel(src, options)(a)
            same = kernel(src, dataclasses.replace(options, vectorize=False))(a)
            np.testing.assert_array_equal(got[src], same, err_msg=f"{n}")
        smooth = 0.25 * a[:, :-3] + 0.5 * a[:, 1:-2] + 0.25 * a[:, 2:-1] - a[:, 3:] / 3.0
        np.testing.assert_allclose(got[SMOOTH], smooth, rtol=1e-5, atol=1e-5, err_msg=f"{n}")
        up = a.copy()
        up[:, :-1] = a[:, :-1] + a[:, 1:]
        np.testing.assert_array_equal(got[SHIFT_UP], up, err_msg=f"{n}")
