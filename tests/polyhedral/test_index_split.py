"""Index-set splitting of affine selects (polyhedral/split.py): statement pieces with exact
domains and accesses, results against NumPy and the unsplit kernel (Options(optimize=False)) on
tiny, odd and prime sizes, and the user's statement kept in names, errors and inspect output."""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest
from conftest import JACOBI_2D_RECURRENCE as JACOBI_2D
from conftest import jacobi_2d_reference

import tensorlang as tl
from polyhedral import build_scop
from tensorlang import frontend

F32 = np.float32
REFERENCE = tl.Options(optimize=False)
OPTIONS = (
    tl.Options(threads=1),
    tl.Options(threads=2),
    tl.Options(tile=(4, 8, 16)),
    tl.Options(fusion="none"),
)


def _scop(src: str, split: bool = True, ctx: isl.Context | None = None):
    return build_scop(frontend.check_source(src, None, "<test>"), ctx, split=split)


def _names(src: str) -> list[str]:
    return [s.name for s in _scop(src).statements]


def _check(src: str, want, *args, **sizes) -> None:
    """Every option set and the unsplit reference give NumPy's answer."""
    reference = tl.compile(src, options=REFERENCE)(*args, **sizes)
    np.testing.assert_allclose(reference, want, rtol=1e-5, atol=1e-5)
    for options in OPTIONS:
        got = tl.compile(src, options=options)(*args, **sizes)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(options))
        np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-6, err_msg=str(options))


JACOBI_1D = """
def jacobi1d(float(N) A) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.33333 * (B(t-1, i-1) + B(t-1, i) + B(t-1, i+1)) : B(t-1, i)
      where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}
"""


HEAT_3D = """
def heat(float(N, M, K) A) -> (O) {
  B(t, i, j, k) = A(i, j, k) where t in 0:1, i in 0:N, j in 0:M, k in 0:K
  B(t, i, j, k) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1 && k >= 1 && k < K - 1)
      ? B(t-1, i, j, k) + 0.125 * (B(t-1, i+1, j, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i-1, j, k))
                        + 0.125 * (B(t-1, i, j+1, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j-1, k))
                        + 0.125 * (B(t-1, i, j, k+1) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j, k-1))
      : B(t-1, i, j, k) where t in 1:T, i in 0:N, j in 0:M, k in 0:K
  O(i, j, k) = B(T - 1, i, j, k) where i in 0:N, j in 0:M, k in 0:K
}
"""


def _jacobi_1d(a, steps):
    b = a.copy()
    for _ in range(steps - 1):
        c = b.copy()
        c[1:-1] = F32(0.33333) * (b[:-2] + b[1:-1] + b[2:])
        b = c
    return b


def _heat_3d(a, steps):
    b = a.copy()
    for _ in range(steps - 1):
        c = b.copy()
        m = b[1:-1, 1:-1, 1:-1]
        c[1:-1, 1:-1, 1:-1] = (
            m
            + 0.125 * (b[2:, 1:-1, 1:-1] - 2 * m + b[:-2, 1:-1, 1:-1])
            + 0.125 * (b[1:-1, 2:, 1:-1] - 2 * m + b[1:-1, :-2, 1:-1])
            + 0.125 * (b[1:-1, 1:-1, 2:] - 2 * m + b[1:-1, 1:-1, :-2])
        )
        b = c
    return b


def test_a_guarded_stencil_becomes_an_interior_and_a_boundary_piece():
    ctx = isl.Context()
    scop = _scop(JACOBI_2D, ctx=ctx)
    assert [s.name for s in scop.statements] == ["S0", "S1_1", "S1_2", "S2"]
    interior, boundary = scop.statement("S1_1"), scop.statement("S1_2")
    assert interior.position == boundary.position == 1
    assert interior.statement.span == scop.program.statements[1].span  # the user's line
    assert not isinstance(interior.statement.rhs, type(scop.program.statements[1].rhs))  # no select
    assert (
        interior.domain.set_tuple_name("S1")
        .union(boundary.domain.set_tuple_name("S1"))
        .is_equal(_scop(JACOBI_2D, split=False, ctx=ctx).statement("S1").domain)
    )
    assert interior.domain.set_tuple_name("x").intersect(boundary.domain.set_tuple_name("x")).is_empty()
    # exact accesses: the boundary piece reads only its own element of the step before
    assert len(boundary.reads) == 1
    deps = str(scop.dependences.raw)
    assert "S1_2[t, i = 0, j] -> S1_1[t' = 1 + t, i' = 1, j' = j]" in deps
    assert "S1_1[t, i, j] -> S1_2" not in deps  # the interior feeds no boundary element


def test_the_interior_loop_has_no_guard():
    loops = tl.compile(JACOBI_2D, options=tl.Options(threads=1)).inspect(
        "loops", sizes=dict(N=100, M=100, T=10)
    )
    # one line per piece of the tile the AST generator makes (full and partial groups of steps)
    interior = [x for x in loops.splitlines() if x.rstrip().endswith("// S1_1")]
    assert interior and all("?" not in line and " : " not in line for line in interior)
    assert any(x.rstrip().endswith("// S1_2") for x in loops.splitlines())
    # the pieces share one loop nest (scheduler/fusion.py fuses them like statements of a region)
    # (on one thread the copies into the first plane and out of the last share it too)
    (region,) = [r for r in loops.split("// region ")[1:] if "// S1_1" in r]
    assert sum(1 for x in region.splitlines() if x.startswith("for ")) == 1
    unsplit = tl.compile(JACOBI_2D, options=REFERENCE).inspect("loops", sizes=dict(N=100, M=100, T=10))
    assert "?" in unsplit and "S1_" not in unsplit


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 13])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_jacobi_1d_at_tiny_and_odd_sizes(n, steps):
    a = np.random.default_rng(n).standard_normal(n).astype(F32)
    _check(JACOBI_1D, _jacobi_1d(a, steps), a, T=steps)


# ~6 s a shape; tests/test_stencils.py runs jacobi-2d at (1, 1), (2, 3), (3, 3), (5, 7), (11, 13)
@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 1), (5, 2), (2, 3), (3, 3), (1, 7), (13, 11), (17, 31)])
def test_jacobi_2d_at_tiny_odd_and_prime_sizes(shape):
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(F32)
    for steps in (1, 3, 6):
        _check(JACOBI_2D, jacobi_2d_reference(a, steps), a, T=steps)


@pytest.mark.parametrize(
    "shape",
    # ~6 s each (heat-3d's split pieces compile slowly); tests/test_stencils.py runs heat-3d,
    # split, in the default run
    [pytest.param(s, marks=pytest.mark.slow) for s in ((3, 3, 3), (1, 2, 3), (4, 5, 7), (9, 6, 11))],
)
def test_heat_3d(shape):
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(F32)
    assert _names(HEAT_3D) == ["S0", "S1_1", "S1_2", "S2"]
    _check(HEAT_3D, _heat_3d(a, 4), a, T=4)


NESTED = """
def nested(float(N, M) A) -> (O) {
  O(i, j) = i < j ? A(i, j) : (i == j ? 1.0 : (j == 0 ? -A(i, j) : 2.0 * A(i, j - 1)))
      where i in 0:N, j in 0:M
}
"""


@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (5, 2), (7, 7), (11, 3)])
def test_nested_selects_give_one_piece_per_branch(shape):
    assert _names(NESTED) == ["S0_1", "S0_2", "S0_3", "S0_4"]
    loops = tl.compile(NESTED, options=tl.Options(threads=1)).inspect("loops", sizes=dict(N=9, M=9))
    assert sum(1 for x in loops.splitlines() if x.startswith("for ")) == 1  # one pass over O
    a = np.random.default_rng(3).standard_normal(shape).astype(F32)
    i, j = np.indices(shape)
    shifted = np.zeros_like(a)
    shifted[:, 1:] = a[:, :-1]
    want = np.where(i < j, a, np.where(i == j, 1, np.where(j == 0, -a, 2 * shifted)))
    _check(NESTED, want, a)


OR_NOT = """
def or_not(float(N, M) A) -> (O) {
  O(i, j) = !(i == 0 || j == M - 1) ? A(i, j) + A(i - 1, j + 1) : A(i, j)
      where i in 0:N, j in 0:M
}
"""


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (4, 1), (2, 2), (6, 9)])
def test_or_and_not_conditions(shape):
    assert _names(OR_NOT) == ["S0_1", "S0_2"]
    a = np.random.default_rng(5).standard_normal(shape).astype(F32)
    want = a.copy()
    want[1:, :-1] += a[:-1, 1:]
    _check(OR_NOT, want, a)


PARAMETRIC = """
def halves(float(N) A) -> (O) {
  O(i) = 2 * i < N ? A(i) : (i % 3 == 1 ? -A(N - 1 - i) : A(i / 2))
}
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 11, 12])
def test_parameter_dependent_and_quasi_affine_conditions(n):
    # `i % 3 == 1` divides an index: its pieces would be strided loops, so it stays a select
    assert _names(PARAMETRIC) == ["S0_1", "S0_2"]
    a = np.random.default_rng(n).standard_normal(n).astype(F32)
    i = np.arange(n)
    want = np.where(2 * i < n, a, np.where(i % 3 == 1, -a[n - 1 - i], a[i // 2]))
    _check(PARAMETRIC, want, a)


BOUNDARY_STEPS = """
def counted(float(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) + 1.0 where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}
"""


def test_pieces_in_one_loop_nest_get_a_guard_free_innermost_loop():
    """The boundary depends on the step before, so both pieces run in one band: the AST
    separates its innermost loop (polyhedral/split.py separate_pieces) instead of a guard."""
    loops = tl.compile(BOUNDARY_STEPS, options=tl.Options(threads=1)).inspect(
        "loops", sizes=dict(N=50, M=40, T=7)
    )
    lines = loops.splitlines()
    # one line per piece of the tile the AST generator makes (full and partial groups of steps)
    interior = [k for k, x in enumerate(lines) if x.rstrip().endswith("// S1_1")]
    assert interior
    for n in interior:
        assert lines[n - 1].lstrip().startswith("for ")  # the interior's own loop, no `if` around it
        assert "if" not in lines[n - 1] and "?" not in lines[n]


@pytest.mark.parametrize(
    "shape", [(1, 1), *(pytest.param(s, marks=pytest.mark.slow) for s in ((19, 23), (2, 2), (3, 4), (8, 5)))]
)
def test_pieces_that_depend_on_each_other(shape):
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(F32)
    for steps in (1, 2, 7):
        b = a.copy()
        for _ in range(steps - 1):
            c = b + 1
            c[1:-1, 1:-1] = 0.2 * (b[1:-1, 1:-1] + b[:-2, 1:-1] + b[2:, 1:-1] + b[1:-1, :-2] + b[1:-1, 2:])
            b = c
        _check(BOUNDARY_STEPS, b, a, T=steps)


def test_the_textual_fallback_runs_pieces_in_the_statements_order(monkeypatch):
    import scheduler.schedule

    def give_up(*args, **kwargs):
        raise isl.Error("scheduler gave up (test)")

    monkeypatch.setattr(scheduler.schedule, "partition", give_up)
    k = tl.compile(BOUNDARY_STEPS, options=tl.Options(threads=1))
    assert "textual" in k.inspect("schedule").splitlines()[0]
    a = np.random.default_rng(9).standard_normal((6, 7)).astype(F32)
    np.testing.assert_array_equal(k(a, T=5), tl.compile(BOUNDARY_STEPS, options=REFERENCE)(a, T=5))


def test_a_branch_that_never_runs_is_dropped():
    src = "def f(float(N) A) -> (O) {\n  O(i) = i >= 0 ? A(i) : A(i - 1) where i in 0:N\n}"
    scop = _scop(src)
    assert [s.name for s in scop.statements] == ["S0"]  # decided statically: one statement
    assert str(scop.statement("S0").statement.rhs) == "A(i)"
    assert not scop.checks  # the read A(i - 1) is gone, with its bounds check
    src = "def f(float(N) A) -> (O) {\n  O(i) = i < 0 ? A(i - 1) : 2.0 * A(i) where i in 0:N\n}"
    assert _names(src) == ["S0"]
    a = np.arange(5, dtype=F32)
    _check(src, 2 * a, a)


REDUCTION = """
def tri(float(N, N) A) -> (O) {
  O(i) +=! k <= i ? A(i, k) : 0.0 where k in 0:N
}
"""


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_a_reduction_with_a_select_is_not_split(n):
    assert _names(REDUCTION) == ["I0", "S0"]
    a = np.random.default_rng(n).standard_normal((n, n)).astype(F32)
    _check(REDUCTION, np.tril(a).sum(axis=1), a)


@pytest.mark.parametrize(
    "src",
    [
        "def f(float(N) A) -> (O) {\n  O(i) = A(i) > 0.0 ? A(i) : 0.0\n}",  # on a tensor's value
        "def f(float(N) A) -> (O) {\n  O(i) = i * i < N ? A(i) : 0.0\n}",  # not affine
        "def f(float(N) A) -> (O) {\n  O(i) = i % N == 0 ? A(i) : 0.0\n}",  # modulo a size
        "def f(float(N) A) -> (O) {\n  O(i) = i > 0 && A(i) > 0.0 ? A(i) : 0.0\n}",  # partly affine
    ],
)
def test_non_affine_selects_are_left_alone(src):
    assert _names(src) == ["S0"]
    a = np.random.default_rng(1).standard_normal(9).astype(F32)
    i = np.arange(9)
    got = tl.compile(src, options=tl.Options(threads=1))(a)
    np.testing.assert_array_equal(got, tl.compile(src, options=REFERENCE)(a))
    assert got.shape == (9,) and np.isfinite(got).all() and (i >= 0).all()


def test_a_select_under_an_expression_is_not_split():
    src = "def f(float(N) A) -> (O) {\n  O(i) = 2.0 * (i > 0 ? A(i - 1) : A(i)) where i in 0:N\n}"
    assert _names(src) == ["S0"]
    a = np.arange(6, dtype=F32)
    _check(src, 2 * np.concatenate([a[:1], a[:-1]]), a)


def test_a_piece_names_the_users_statement_in_run_time_errors():
    src = """def g(float(N) A, int32(N) I) -> (O) {
  O(i) = i > 0 ? A(I(i)) : 0.0
}"""
    assert _names(src) == ["S0_1", "S0_2"]
    k = tl.compile(src, options=tl.Options(threads=1))
    a = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(k(a, np.array([9, 3, 2, 0], np.int32)), [0, 3, 2, 0])  # I(0) unread
    with pytest.raises(tl.ArgumentError, match=r"index 7 out of range .* A\(I\(i\)\).*line 2"):
        k(a, np.array([0, 1, 7, 0], np.int32))


def test_integer_division_by_zero_in_a_piece_names_the_statement():
    src = """def d(int32(N) X, int32(N) Y) -> (O) {
  O(i) = i > 0 ? X(i) / Y(i) : 0
}"""
    k = tl.compile(src, options=tl.Options(threads=1))
    x = np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(k(x, np.array([0, 1, 1, 2], np.int32)), [0, 1, 2, 1])
    with pytest.raises(tl.ArgumentError, match=r"division by zero in statement O.*line 2"):
        k(x, np.array([1, 1, 0, 1], np.int32))


FUSED = """
def fused(float(N, M) A) -> (O) {
  C(i, j) = (i > 0 && j > 0) ? A(i, j) - A(i - 1, j - 1) : A(i, j) where i in 0:N, j in 0:M
  O(i, j) = (j < M - 1) ? C(i, j) * C(i, j + 1) : C(i, j) where i in 0:N, j in 0:M
}
"""


@pytest.mark.parametrize("fusion", ["auto", "max", "none"])
def test_pieces_of_fused_statements(fusion):
    assert _names(FUSED) == ["S0_1", "S0_2", "S1_1", "S1_2"]
    a = np.random.default_rng(2).standard_normal((7, 5)).astype(F32)
    c = a.copy()
    c[1:, 1:] -= a[:-1, :-1]
    want = c.copy()
    want[:, :-1] = c[:, :-1] * c[:, 1:]
    k = tl.compile(FUSED, options=tl.Options(fusion=fusion, threads=1))
    np.testing.assert_allclose(k(a), want, rtol=1e-6)
    np.testing.assert_allclose(k(a), tl.compile(FUSED, options=REFERENCE)(a), rtol=1e-6)
    # the pieces of one statement are scheduled in the same region
    regions = re.findall(r"// region \d+", k.inspect("loops", sizes=dict(N=7, M=5)))
    assert len(regions) <= 2


def test_gradient_of_a_guarded_stencil_matches_the_reference():
    src = """def smooth(float(N) A) -> (O) {
  O(i) = (i >= 1 && i < N - 1) ? 0.25 * A(i - 1) + 0.5 * A(i) + 0.25 * A(i + 1) : A(i) where i in 0:N
}"""
    grad = tl.grad(src)
    a = np.random.default_rng(4).standard_normal(9).astype(F32)
    g = np.random.default_rng(5).standard_normal(9).astype(F32)
    got = tl.compile(grad, options=tl.Options(threads=1))(a, g)
    np.testing.assert_allclose(got, tl.compile(grad, options=REFERENCE)(a, g), rtol=1e-6, atol=1e-6)
    want = np.zeros(9, F32)
    want[[0, 8]] += g[[0, 8]]
    for s, w in ((-1, 0.25), (0, 0.5), (1, 0.25)):
        want[1 + s : 8 + s] += w * g[1:8]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
