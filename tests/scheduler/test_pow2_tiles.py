"""Transposing bands get tiles with few rows on the vectorised member (scheduler/postpass.py
`_auto_tile`): results match NumPy and the unscheduled reference at power-of-two, prime and tiny
sizes, and the chosen tiles are the same whatever the sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensorlang as tl
from scheduler import postpass
from scheduler.machine import cache_ways

TRANSPOSE = "def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) }"
TRANSPOSE64 = "def tr(double(N,M) A) -> (B) { B(j,i) = A(i,j) }"
PERMUTE = "def permute(float(N,C,H,W) A) -> (B) { B(n,h,w,c) = A(n,c,h,w) }"
SCALE_T = "def tr2(float(N,M) A) -> (B) { B(j,i) = A(i,j) * 2.0 }"

SIZES_2D = [
    (1, 1),
    (2, 3),
    (7, 5),
    (8, 32),
    (31, 37),
    (64, 64),
    (97, 101),
    (128, 256),
    (256, 128),
    (512, 512),
]


def _opts(**kw):
    return tl.Options(threads=1, tuned=False, **kw)


@pytest.mark.parametrize(("n", "m"), SIZES_2D)
@pytest.mark.parametrize("src", [TRANSPOSE, TRANSPOSE64, SCALE_T])
def test_transpose_matches_numpy_and_reference(src, n, m):
    dtype = np.float64 if "double" in src else np.float32
    a = np.random.default_rng(n * 1000 + m).standard_normal((n, m)).astype(dtype)
    expected = a.T * (2.0 if "2.0" in src else 1.0)
    got = tl.compile(src, options=_opts())(a)
    reference = tl.compile(src, options=_opts(optimize=False))(a)
    np.testing.assert_array_equal(got, expected.astype(dtype))
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize(
    "shape", [(1, 1, 1, 1), (2, 5, 6, 7), (2, 16, 8, 8), (1, 64, 16, 16), (3, 13, 11, 17)]
)
def test_permute_matches_numpy_and_reference(shape):
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    got = tl.compile(PERMUTE, options=_opts())(a)
    reference = tl.compile(PERMUTE, options=_opts(optimize=False))(a)
    np.testing.assert_array_equal(got, a.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(got, reference)


def test_two_threads_match_numpy():
    a = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    np.testing.assert_array_equal(tl.compile(TRANSPOSE, options=tl.Options(threads=2, tuned=False))(a), a.T)


def _steps(src, sizes):
    """The step of each loop of the listing: the tile edges."""
    loops = tl.compile(src, options=_opts()).inspect("loops", sizes=sizes)
    return [int(s) for s in re.findall(r"\+= (\d+)\)", loops)]


def test_rows_per_set_below_associativity():
    rows = postpass._rows_per_set()
    assert rows >= 2 and rows & (rows - 1) == 0
    assert rows < cache_ways(1) or rows == 2
    assert rows * 2 >= cache_ways(1) or rows == 2


@pytest.mark.parametrize("n", [4096, 4000, 2048, 2000])
def test_transpose_tiles_do_not_depend_on_sizes(n):
    rows = postpass._rows_per_set()
    loops = tl.compile(TRANSPOSE, options=_opts()).inspect("loops", sizes={"N": n, "M": n})
    # the tile loops: first the innermost member's (32 columns of B, rows of A), then strips of
    # `rows` rows of B; then the point loops: `rows` rows (vectorised by LLVM), 32 columns
    assert [int(s) for s in re.findall(r"\+= (\d+)\)", loops)] == [32, rows, 1, 1]
    assert f"c2 <= {rows - 1};" in loops and ("c3 <= 31;" in loops or "c3 <= min(31," in loops)
    assert "B[c1 + c2][c0 + c3] = A[c0 + c3][c1 + c2]" in loops


def test_permute_tiles():
    rows = postpass._rows_per_set()
    steps = _steps(PERMUTE, {"N": 16, "C": 64, "H": 56, "W": 56})
    assert rows in steps and 32 in steps


def test_explicit_tile_wins():
    loops = tl.compile(TRANSPOSE, options=_opts(tile=(32, 32))).inspect("loops", sizes={"N": 4096, "M": 4096})
    assert [int(s) for s in re.findall(r"\+= (\d+)\)", loops)][:2] == [32, 32]


def test_stride_one_kernels_are_not_tiled():
    src = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }"
    assert _steps(src, {"N": 4096, "M": 4096}) == [1, 1]
