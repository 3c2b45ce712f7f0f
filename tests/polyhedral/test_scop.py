"""The polyhedral model: domains, access relations, bounds proofs and dependences."""

from __future__ import annotations

import islpy as isl
import sympy

from polyhedral import build_scop
from polyhedral.sizes import compile_size_expr, make_param_space, to_pwaff
from tensorlang.frontend import check_source


def scop_of(src, name=None):
    return build_scop(check_source(src, name))


def test_matmul_domains_and_accesses():
    scop = scop_of("def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
    assert [s.name for s in scop.statements] == ["I0", "S0"]
    body = scop.statement("S0")
    assert body.domain.dim(isl.dim_type.set) == 3
    assert [a.tensor for a in body.accesses] == ["C", "C", "A", "B"]
    assert all(a.exact for a in body.accesses)
    assert not scop.checks  # everything provably in bounds
    raw = scop.dependences.raw
    assert not raw.is_empty()
    # the init feeds the first update of each element
    assert "I0" in str(raw) and "S0" in str(raw)


def test_gather_gets_a_dynamic_check():
    scop = scop_of("def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }")
    [check] = scop.checks
    assert check.tensor == "T" and check.dynamic_dims == (0,) and check.violation is None


def test_affine_guard_proves_bounds():
    src = """def f(float(B, N) X, float(DF) Dil) -> (O) {
        O(b, n) = (n - DF >= 0) ? X(b, n - DF) : 0.0 where n in 0:N
    }"""
    scop = scop_of(src)
    assert not scop.checks


def test_unprovable_affine_access_becomes_call_time_precondition():
    scop = scop_of("def f(float(N, NM, M) I) -> (O) { O(i) +=! I(i, i + j, j) }")
    [check] = scop.checks
    assert check.dynamic_dims == () and check.violation is not None
    fixed_good = scop.params.fixed_context({"N": 3, "NM": 6, "M": 4})
    fixed_bad = scop.params.fixed_context({"N": 3, "NM": 5, "M": 4})
    assert check.violation.intersect(fixed_good).is_empty()
    assert not check.violation.intersect(fixed_bad).is_empty()


def test_non_affine_size_becomes_derived_parameter():
    ctx = isl.Context()
    n, m = sympy.Symbol("N", integer=True), sympy.Symbol("M", integer=True)
    params = make_param_space(ctx, ("N", "M"), [n * m + 1])
    assert len(params.derived) == 1
    pa = to_pwaff(n * m + 1, params, params.set_space([]))
    assert "d0_" in str(pa)
    assert params.values({"N": 3, "M": 5})["d0_"] == 15


def test_size_expressions_evaluate_exactly():
    n = sympy.Symbol("N", integer=True)
    assert compile_size_expr(sympy.floor((n + 122) / 123))({"N": 124}) == 2
    assert compile_size_expr(sympy.Min(n, 3) + sympy.ceiling(n / 2))({"N": 5}) == 6
