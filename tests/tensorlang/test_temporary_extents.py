"""Extents of temporaries (issue 13): a temporary's extent is the hull of the ranges its statements
write (a later statement's `where` range may extend it upward); an output keeps its first
statement's shape; errors are located with a caret."""

from __future__ import annotations

import warnings

import pytest
import sympy

from tensorlang.errors import SemanticError, TensorLangWarning
from tensorlang.frontend import check_source
from tensorlang.ir import size_symbol as S


def program(src: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TensorLangWarning)
        p = check_source(src)
    p.verify()
    return p


JACOBI = """def jacobi(float(N, M) A, float(T) steps) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}"""


def test_a_time_recurrence_extends_its_temporary():
    p = program(JACOBI)
    (b,) = p.temporaries
    # the hull of t in 0:1 and t in 1:T: the first statement still writes B(0) when T = 0
    assert b.shape == (sympy.Max(1, S("T")), S("N"), S("M"))
    assert p.outputs[0].shape == (S("N"), S("M"))
    assert "temporary float32(Max(1, T), N, M) B" in str(p)
    assert p.statements[1].range_of("t").lo == 1 and p.statements[1].range_of("t").hi == S("T")


def test_a_provably_larger_range_gives_its_end():
    p = program(
        "def f(float(N) A, float(T) s) -> (O) {"
        " B(t, i) = A(i) where t in 0:1, i in 0:N"
        " B(t, i) = B(t - 1, i) * 2 where t in 1:T + 1, i in 0:N"
        " O(i) = B(T, i) where i in 0:N }"
    )
    assert p.temporaries[0].shape == (S("T") + 1, S("N"))


def test_a_range_inside_keeps_the_extent_and_several_dimensions_grow():
    p = program(
        "def f(float(N) A, float(M) C) -> (O) {"
        " B(t, i) = A(i) where t in 0:3, i in 0:N"
        " B(t, i) = 1.0 where t in 1:2, i in 0:N"
        " B(t, i) = 2.0 where t in 0:2, i in 0:N + M"
        " O(i) = B(2, i) where i in 0:N }"
    )
    assert p.temporaries[0].shape == (3, S("N") + S("M"))


def test_later_statements_see_the_extent_so_far():
    p = program(
        "def f(float(N) A, float(T) s) -> (O, P) {"
        " B(t, i) = A(i) where t in 0:1, i in 0:N"
        " P(t, i) = B(t, i)"  # before the recurrence: t in 0:1
        " B(t, i) = B(t - 1, i) + 1 where t in 1:T, i in 0:N"
        " O(t, i) = B(t, i) }"  # after it: all of B
    )
    assert p.outputs[1].shape == (1, S("N"))
    assert p.outputs[0].shape == (sympy.Max(1, S("T")), S("N"))


def test_an_index_without_where_does_not_extend():
    p = program(
        "def f(float(N) A, float(M) C) -> (O) { B(i) = A(i) where i in 0:2 B(i) = B(i) + C(i) O(i) = B(i) }"
    )
    assert p.temporaries[0].shape == (2,)
    assert p.statements[1].range_of("i").hi == sympy.Min(2, S("M"))
    assert p.outputs[0].shape == (2,)


def test_outputs_keep_the_first_statements_shape():
    p = program("def f(float(N) A, float(T) s) -> (O) { O(i) = A(i) O(i) = 1.0 where i in 0:T }")
    assert p.outputs[0].shape == (S("N"),)  # unchanged: checked against N at call time
    with pytest.raises(SemanticError, match="outside O's dimension"):
        check_source("def f(float(N) A) -> (O) { O(i) = A(i) O(i) = 1.0 where i in 0:N+1 }")


@pytest.mark.parametrize(
    "src, fragment, line, column",
    [
        (  # a later statement may not start a temporary below 0
            "def f(float(N) A) -> (O) {\n B(t, i) = A(i) where t in 0:1\n"
            " B(t, i) = 0.0 where t in -1:1, i in 0:N\n O(i) = B(0, i) }",
            "starts below 0; a later statement may extend temporary B upward only",
            3,
            4,
        ),
        (  # the first statement still starts at 0
            "def f(float(N) A, float(T) s) -> (O) {\n B(t, i) = A(i) where t in 1:T\n O(i) = B(1, i) }",
            "first statement writing B defines its shape",
            2,
            4,
        ),
        (  # an output does not grow
            "def f(float(N) A) -> (O) {\n O(t, i) = A(i) where t in 0:1\n"
            " O(t, i) = O(t - 1, i) where t in 1:3, i in 0:N }",
            "outside O's dimension of extent 1",
            3,
            4,
        ),
    ],
)
def test_errors_are_located(src, fragment, line, column):
    with pytest.raises(SemanticError) as info:
        check_source(src)
    assert fragment in info.value.message
    assert (info.value.line, info.value.column) == (line, column)
    assert "^" in str(info.value)
