"""Stencils written as time recurrences on temporaries (issue 13): results against NumPy, and every
option combination against the untransformed kernel (optimize=False), on tiny, odd and prime sizes."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl

F32 = np.float32

JACOBI_1D = """
def jacobi1d(float(N) A, float(T) steps) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.33333 * (B(t-1, i-1) + B(t-1, i) + B(t-1, i+1)) : B(t-1, i)
      where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}
"""

JACOBI_2D = """
def jacobi(float(N, M) A, float(T) steps) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}
"""

HEAT_3D = """
def heat(float(N, M, K) A, float(T) steps) -> (O) {
  B(t, i, j, k) = A(i, j, k) where t in 0:1, i in 0:N, j in 0:M, k in 0:K
  B(t, i, j, k) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1 && k >= 1 && k < K - 1)
      ? B(t-1, i, j, k) + 0.125 * (B(t-1, i+1, j, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i-1, j, k))
                        + 0.125 * (B(t-1, i, j+1, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j-1, k))
                        + 0.125 * (B(t-1, i, j, k+1) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j, k-1))
      : B(t-1, i, j, k) where t in 1:T, i in 0:N, j in 0:M, k in 0:K
  O(i, j, k) = B(T - 1, i, j, k) where i in 0:N, j in 0:M, k in 0:K
}
"""

# Gauss-Seidel in place: row i-1 and column j-1 already hold this sweep's values.
SEIDEL_2D = """
def seidel(float(N, M) A, float(T) steps) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
      ? (B(t, i-1, j-1) + B(t, i-1, j) + B(t, i-1, j+1)
         + B(t, i, j-1) + B(t-1, i, j) + B(t-1, i, j+1)
         + B(t-1, i+1, j-1) + B(t-1, i+1, j) + B(t-1, i+1, j+1)) / 9.0
      : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}
"""

# The three fields in one temporary F(t, f, i, j), f = 0 (ey), 1 (ex), 2 (hz): each step updates
# ey, then ex, then hz from this step's ex and ey, as the loop order (t, f, i, j) runs them.
FDTD_2D = """
def fdtd(float(NX, NY) ex0, float(NX, NY) ey0, float(NX, NY) hz0, float(T) fict) -> (ex, ey, hz) {
  F(t, f, i, j) = f == 0 ? ey0(i, j) : f == 1 ? ex0(i, j) : hz0(i, j)
      where t in 0:1, f in 0:3, i in 0:NX, j in 0:NY
  F(t, f, i, j) = f == 0 ? (i == 0 ? fict(t - 1) : F(t-1, 0, i, j) - 0.5 * (F(t-1, 2, i, j) - F(t-1, 2, i-1, j)))
                : f == 1 ? (j >= 1 ? F(t-1, 1, i, j) - 0.5 * (F(t-1, 2, i, j) - F(t-1, 2, i, j-1)) : F(t-1, 1, i, j))
                : (i < NX - 1 && j < NY - 1)
                  ? F(t-1, 2, i, j) - 0.7 * (F(t, 1, i, j+1) - F(t, 1, i, j) + F(t, 0, i+1, j) - F(t, 0, i, j))
                  : F(t-1, 2, i, j)
      where t in 1:T, f in 0:3, i in 0:NX, j in 0:NY
  ex(i, j) = F(T - 1, 1, i, j) where i in 0:NX, j in 0:NY
  ey(i, j) = F(T - 1, 0, i, j) where i in 0:NX, j in 0:NY
  hz(i, j) = F(T - 1, 2, i, j) where i in 0:NX, j in 0:NY
}
"""


def ref_jacobi1d(a, t):
    b = a.copy()
    for _ in range(t - 1):
        n = b.copy()
        n[1:-1] = F32(0.33333) * ((b[:-2] + b[1:-1]) + b[2:])
        b = n
    return b


def ref_jacobi2d(a, t):
    b = a.copy()
    for _ in range(t - 1):
        n = b.copy()
        s = (((b[1:-1, 1:-1] + b[:-2, 1:-1]) + b[2:, 1:-1]) + b[1:-1, :-2]) + b[1:-1, 2:]
        n[1:-1, 1:-1] = F32(0.2) * s
        b = n
    return b


def ref_heat3d(a, t):
    b = a.copy()
    c, two = F32(0.125), F32(2.0)
    for _ in range(t - 1):
        n = b.copy()
        m = b[1:-1, 1:-1, 1:-1]
        di = b[2:, 1:-1, 1:-1] - two * m + b[:-2, 1:-1, 1:-1]
        dj = b[1:-1, 2:, 1:-1] - two * m + b[1:-1, :-2, 1:-1]
        dk = b[1:-1, 1:-1, 2:] - two * m + b[1:-1, 1:-1, :-2]
        n[1:-1, 1:-1, 1:-1] = m + c * di + c * dj + c * dk
        b = n
    return b


def ref_seidel2d(a, t):
    b = a.copy()
    n, m = b.shape
    for _ in range(t - 1):
        for i in range(1, n - 1):
            for j in range(1, m - 1):
                w = b[i - 1 : i + 2, j - 1 : j + 2]
                s = F32(0)
                for v in w.ravel():
                    s = F32(s + v)
                b[i, j] = s / F32(9.0)
    return b


def ref_fdtd2d(ex, ey, hz, fict):
    ex, ey, hz = ex.copy(), ey.copy(), hz.copy()
    half, c = F32(0.5), F32(0.7)
    for t in range(len(fict) - 1):
        ey[0, :] = fict[t]
        ey[1:, :] = ey[1:, :] - half * (hz[1:, :] - hz[:-1, :])
        ex[:, 1:] = ex[:, 1:] - half * (hz[:, 1:] - hz[:, :-1])
        hz[:-1, :-1] = hz[:-1, :-1] - c * (ex[:-1, 1:] - ex[:-1, :-1] + ey[1:, :-1] - ey[:-1, :-1])
    return ex, ey, hz


def _args(kind, shape, t, rng):
    if kind == "fdtd":
        return [rng.standard_normal(shape).astype(F32) for _ in range(3)] + [
            rng.standard_normal(t).astype(F32)
        ]
    return [rng.standard_normal(shape).astype(F32), np.zeros(t, F32)]


CASES = {
    "jacobi1d": (JACOBI_1D, lambda a, s: ref_jacobi1d(a, len(s)), [(1,), (2,), (3,), (7,), (13,)]),
    "jacobi2d": (JACOBI_2D, lambda a, s: ref_jacobi2d(a, len(s)), [(1, 1), (2, 3), (3, 3), (5, 7), (11, 13)]),
    "heat3d": (HEAT_3D, lambda a, s: ref_heat3d(a, len(s)), [(1, 1, 1), (2, 3, 2), (3, 3, 3), (5, 7, 3)]),
    "seidel2d": (SEIDEL_2D, lambda a, s: ref_seidel2d(a, len(s)), [(1, 1), (2, 3), (3, 3), (5, 7), (7, 5)]),
    "fdtd": (FDTD_2D, ref_fdtd2d, [(1, 1), (2, 3), (3, 2), (5, 7)]),
}

_KERNELS: dict = {}


def kernel(name, options):
    key = (name, options)
    if key not in _KERNELS:
        _KERNELS[key] = tl.compile(CASES[name][0], options=options)
    return _KERNELS[key]


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("name", list(CASES))
def test_stencil_matches_numpy(name):
    src, ref, shapes = CASES[name]
    rng = np.random.default_rng(13)
    k = kernel(name, tl.Options())
    reference = kernel(name, tl.Options(optimize=False))
    for shape in shapes:
        for t in (1, 2, 7):
            args = _args("fdtd" if name == "fdtd" else "", shape, t, rng)
            want = _as_tuple(ref(*args))
            got = _as_tuple(k(*args))
            base = _as_tuple(reference(*args))
            for w, g, b in zip(want, got, base):
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {shape} T={t}")
                np.testing.assert_allclose(b, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {shape} T={t} ref")


OPTION_SETS = [
    tl.Options(fusion="none", threads=1),
    tl.Options(fusion="max", threads=2),
    tl.Options(fusion="auto", threads=2, tile=(2, 3, 5)),
    tl.Options(fusion="max", threads=1, tile=4, specialize=False),
    tl.Options(threads=2, unroll=2, specialize=False),
]


# the tiled 3-d and Gauss-Seidel cases compile for 5-6 s each: in the slow tier
_SLOW_OPTION_CASES = {("heat3d", 2), ("seidel2d", 2), ("jacobi2d", 2), ("fdtd", 2)}  # ~6 s each


@pytest.mark.parametrize(
    "name, options",
    [
        pytest.param(name, options, marks=pytest.mark.slow)
        if (name, i) in _SLOW_OPTION_CASES
        else (name, options)
        for i, options in enumerate(OPTION_SETS)
        for name in CASES
    ],
    ids=lambda v: repr(v)[8:60] if isinstance(v, tl.Options) else v,
)
def test_stencil_options_agree_with_the_untransformed_kernel(name, options):
    _, _, shapes = CASES[name]
    rng = np.random.default_rng(7)
    reference = kernel(name, tl.Options(optimize=False))
    k = kernel(name, options)
    for shape in shapes[1::2] + shapes[-1:]:
        for t in (2, 7):
            args = _args("fdtd" if name == "fdtd" else "", shape, t, rng)
            for g, b in zip(_as_tuple(k(*args)), _as_tuple(reference(*args))):
                np.testing.assert_allclose(g, b, rtol=1e-6, atol=1e-6, err_msg=f"{name} {shape} T={t}")


def test_zero_steps_is_a_located_call_error():
    k = kernel("jacobi2d", tl.Options())
    with pytest.raises(tl.ArgumentError, match=r"B\(T - 1, i, j\) would access B out of bounds"):
        k(np.ones((3, 3), F32), np.zeros(0, F32))


def test_the_time_recurrence_is_scheduled_not_serialised():
    k = kernel("jacobi2d", tl.Options())
    deps = k.inspect("deps")
    # step t reads step t - 1 (S1_1 is the interior piece of S1: polyhedral/split.py)
    assert "S1_1[t, i, j] -> S1_1[t' = 1 + t, i', j']" in deps
    assert "S1_2[t, i = 0, j] -> S1_2[t' = 1 + t, i' = 0, j' = j]" in deps  # the boundary copies
    assert "strategy: regions" in k.inspect("schedule")  # the isl schedule, not the textual fallback


FDTD_THREE_STATEMENTS = """def fdtd(float(NX, NY) ey0, float(NX, NY) hz0, float(T) s) -> (ey) {
  EY(t, i, j) = ey0(i, j) where t in 0:1, i in 0:NX, j in 0:NY
  HZ(t, i, j) = hz0(i, j) where t in 0:1, i in 0:NX, j in 0:NY
  EY(t, i, j) = i == 0 ? 0.0 : EY(t-1, i, j) - 0.5 * (HZ(t-1, i, j) - HZ(t-1, i-1, j)) where t in 1:T, i in 0:NX, j in 0:NY
  HZ(t, i, j) = (i < NX - 1) ? HZ(t-1, i, j) - 0.7 * (EY(t, i+1, j) - EY(t, i, j)) : HZ(t-1, i, j) where t in 1:T, i in 0:NX, j in 0:NY
  ey(i, j) = EY(T-1, i, j) where i in 0:NX, j in 0:NY
}"""


@pytest.mark.parametrize(
    "src, fragment, line, column",
    [
        (  # each statement runs over all t: EY's reads HZ(t - 1) before HZ's statement writes it
            FDTD_THREE_STATEMENTS,
            "reads elements of temporary HZ that no earlier statement writes (for example when",
            4,
            57,
        ),
        (  # a hole in the hull: B(1) is never written
            "def f(float(N) A, float(T) s) -> (O) {\n  B(t, i) = A(i) where t in 0:1, i in 0:N\n"
            "  B(t, i) = B(t - 2, i) where t in 2:T, i in 0:N\n  O(i) = B(T - 1, i) where i in 0:N }",
            "reads elements of temporary B that no earlier statement writes",
            3,
            14,
        ),
        (  # Gauss-Seidel reading the next row of this step, not yet computed
            "def f(float(N) A, float(T) s) -> (O) {\n  B(t, i) = A(i) where t in 0:1, i in 0:N\n"
            "  B(t, i) = i < N - 1 ? B(t, i + 1) : B(t - 1, i) where t in 1:T, i in 0:N\n"
            "  O(i) = B(T - 1, i) where i in 0:N }",
            "temporary B that no earlier statement writes",
            3,
            26,
        ),
    ],
)
def test_reading_an_unwritten_element_of_a_temporary_is_a_located_error(src, fragment, line, column):
    with pytest.raises(tl.SemanticError) as info:
        tl.compile(src)
    assert fragment in info.value.message
    assert (info.value.line, info.value.column) == (line, column)
    assert "^" in str(info.value)


def test_a_temporary_accumulated_without_bang_counts_as_written():
    """`u(n) += ...` starts u from zeros, so reading u is fine even where no term is added (D = 0)."""
    src = "def rowsum(float(N, D) I) -> (O) {\n  u(n) += I(n, d) * 2.0\n  O(n) = u(n) + 1.0\n}\n"
    with pytest.warns(tl.TensorLangWarning, match="without initialization"):
        k = tl.compile(src)
    np.testing.assert_array_equal(k(np.zeros((3, 0), F32)), np.ones(3, F32))


@pytest.mark.parametrize("name", list(CASES))
def test_one_thread_runs_the_copies_in_the_time_tiles(name):
    """On one thread the copy into the first plane and the copy out of the last join the
    recurrence's phase (scheduler/fusion.py, _joins_time_band): bitwise the untransformed
    kernel's results and NumPy's, at tiny and odd sizes, for T = 1 (no step: the copies alone),
    2, 7 and past a 64-step tile."""
    src, ref, shapes = CASES[name]
    k = kernel(name, tl.Options(threads=1))
    reference = kernel(name, tl.Options(optimize=False))
    kind = "fdtd" if name == "fdtd" else ""
    sizes = dict(zip(("NX", "NY") if kind else ("N", "M", "K"), shapes[-1], strict=False), T=9)
    # one fusion region (at these sizes isl still runs the copies as loops of their own, each
    # then a phase of its own; past a tile they run in the tiles' phase: the test below)
    regions = k.inspect("loops", sizes=sizes).split("// region")[1:]
    copies = {"S0", "S0_1", "S2"}
    assert any(any(f"// {c}" in r for c in copies) and "// S1_1" in r for r in regions), regions
    rng = np.random.default_rng(11)
    for shape in (shapes[0], shapes[-1]):
        for t in (1, 2, 7, 65):
            args = _args(kind, shape, t, rng)
            got = _as_tuple(k(*args))
            for g, b in zip(got, _as_tuple(reference(*args)), strict=True):
                np.testing.assert_array_equal(g, b, err_msg=f"{name} {shape} T={t}")
            for g, w in zip(got, _as_tuple(ref(*args)), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{name} {shape} T={t}")


# Sizes past a tile: rows long enough for the vector loop (two blocks of 16 lanes and more, with
# odd remainders), more rows than a two-thread tile's 64, and more steps than a one-thread tile's
# 64 or than several two-thread bands of 16; prime and tile-size-plus-one extents. The tiny sizes
# above never reach those paths.
PAST_A_TILE = [
    pytest.param("jacobi1d", (4099,), 100, id="jacobi1d-4099-T100"),
    pytest.param("jacobi1d", (65537,), 18, id="jacobi1d-65537-T18"),
    # (slow: 12 s of compiling two-thread diamonds; 131x33 reaches past a diamond's 64 rows too)
    pytest.param("jacobi2d", (67, 131), 70, id="jacobi2d-67x131-T70", marks=pytest.mark.slow),
    pytest.param("jacobi2d", (131, 33), 66, id="jacobi2d-131x33-T66"),
    pytest.param("jacobi2d", (5, 257), 17, id="jacobi2d-5x257-T17"),
    pytest.param("fdtd", (47, 129), 34, id="fdtd-47x129-T34"),
    pytest.param("fdtd", (129, 65), 17, id="fdtd-129x65-T17"),
    pytest.param("heat3d", (17, 33, 31), 20, id="heat3d-17x33x31-T20", marks=pytest.mark.slow),
    pytest.param("seidel2d", (33, 65), 18, id="seidel2d-33x65-T18", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, shape, steps", PAST_A_TILE)
def test_sizes_past_a_tile_match_numpy_and_two_threads_agree_bitwise(name, shape, steps):
    """One and two threads (different tiles, a wavefront team or, where it cannot pay, plain
    loops) against NumPy; the two must agree bit for bit, as every point adds in the program's
    order whichever tile or thread runs it."""
    kind = "fdtd" if name == "fdtd" else ""
    sizes = dict(zip(("NX", "NY") if kind else ("N", "M", "K"), shape, strict=False), T=steps)
    plan = kernel(name, tl.Options(threads=1)).inspect("plan", sizes=sizes)
    phases = [set(line.split(":")[1].split(";")[0].replace(",", " ").split()) for line in plan.splitlines()
              if line.startswith("// phase")]  # fmt: skip
    # on one thread a copy (the one in or the ones out) runs in the time tiles' phase
    assert any("S1_1" in p and p & {"S0", "S2", "S3", "S4"} for p in phases), plan
    args = _args(kind, shape, steps, np.random.default_rng(sum(shape) + steps))
    want = _as_tuple(CASES[name][1](*args))
    one = _as_tuple(kernel(name, tl.Options(threads=1))(*args))
    two = _as_tuple(kernel(name, tl.Options(threads=2))(*args))
    for w, a, b in zip(want, one, two, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4, err_msg=f"{name} {shape} T={steps}")
        np.testing.assert_array_equal(b, a, err_msg=f"{name} {shape} T={steps}: 2 threads")
