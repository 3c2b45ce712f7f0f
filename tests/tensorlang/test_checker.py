"""Checker: names and scopes, typing with explicit casts, reductions, `!`, temporaries, def selection."""

from __future__ import annotations

import warnings

import pytest

from tensorlang import ir
from tensorlang.dtypes import ScalarType
from tensorlang.errors import SemanticError, TensorLangWarning
from tensorlang.frontend import check_source

F32, F64, I32, BOOL = ScalarType.FLOAT32, ScalarType.FLOAT64, ScalarType.INT32, ScalarType.BOOL


def program(src: str, name: str | None = None) -> ir.Program:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TensorLangWarning)
        return check_source(src, name)


def rhs_of(body: str, params: str = "float(N) A") -> ir.Expr:
    return program(f"def f({params}) -> (O) {{ {body} }}").statements[0].rhs


def test_binary_operands_are_cast_to_the_matched_type():
    expr = rhs_of("O(i) = A(i) + B(i) * C(i)", "float(N) A, int32(N) B, double(N) C")
    assert expr.dtype == F64
    for node in ir.walk(expr):
        if isinstance(node, ir.Binary):
            assert node.lhs.dtype == node.rhs.dtype
    assert any(isinstance(n, ir.Cast) and n.dtype == F64 for n in ir.walk(expr))


def test_comparison_gives_bool_and_logic_needs_bool():
    expr = rhs_of("O(i) = A(i) < 1 || !(A(i) > 2)")
    assert expr.dtype == BOOL
    with pytest.raises(SemanticError, match="expected boolean but found float"):
        rhs_of("O(i) = A(i) && A(i) < 1")
    with pytest.raises(SemanticError, match="expected boolean but found int32"):
        rhs_of("O(i) = i ? 1 : 0")


def test_literals_and_the_capital_e_deviation():
    assert rhs_of("O(i) = A(i) * 0 + 2").dtype == F32
    expr = rhs_of("O(i) = i + 3E-5 where i in 0:N")  # TC typed 3E-5 as int32 (= 0); tensorlang says float
    assert expr.dtype == F32
    assert rhs_of("O(i) = i + 3 where i in 0:4", "").dtype == I32


def test_builtins_promote_to_float_and_check_arity():
    assert rhs_of("O(i) = exp(i) + A(i)").dtype == F32
    assert rhs_of("O(i) = pow(A(i), 2)", "double(N) A").dtype == F64
    call = rhs_of("O(i) = fmax(A(i), 0)")
    assert isinstance(call, ir.Call) and all(a.dtype == F32 for a in call.args)
    with pytest.raises(SemanticError, match="expected 2 but found 1"):
        rhs_of("O(i) = pow(A(i))")


def test_casts_min_max_select_and_sizes():
    expr = rhs_of("O(i) = min(int32(A(i)), N) > 0 ? max(A(i), 1) : float(i)")
    assert isinstance(expr, ir.Select) and expr.dtype == F32
    assert isinstance(expr.cond, ir.Binary) and expr.cond.lhs.op == "min"
    assert any(isinstance(n, ir.SizeRef) for n in ir.walk(expr))


def test_zero_d_tensors_are_bare_names_and_let_is_inlined():
    p = program("def f(float s, float(N) A) -> (O) { O(i) = x * s where x = A(i) + 1 }")
    rhs = p.statements[0].rhs
    assert any(isinstance(n, ir.Read) and n.tensor == "s" and n.indices == () for n in ir.walk(rhs))
    assert any(isinstance(n, ir.Read) and n.tensor == "A" for n in ir.walk(rhs))


def test_reduction_indices_flags_and_ops():
    p = program("def f(float(M, N) A) -> (O) { O(i) +=! A(i, j) O(i) max= A(i, j) }")
    first, second = p.statements
    assert (first.op, first.bang, first.initializes, first.uninitialized) == ("+", True, True, False)
    assert first.reduction_indices == ("j",) and [r.var for r in first.ranges] == ["i", "j"]
    assert (second.op, second.bang, second.initializes, second.uninitialized) == ("max", False, False, False)


def test_reduction_without_initialization_warns_and_is_recorded():
    with pytest.warns(TensorLangWarning, match=r"Reduction without initialization.*\+=! instead of \+="):
        p = check_source("def f(float(M, N) A) -> (O) { O(i) += A(i, j) }")
    assert p.statements[0].uninitialized and len(p.warnings) == 1


def test_temporaries_are_allowed():
    p = program("def f(float(N) A) -> (O) { T(i) = A(i) * 2 O(i) = T(i) + 1 }")
    assert [t.name for t in p.temporaries] == ["T"] and p.temporaries[0].role == "temporary"


@pytest.mark.parametrize(
    "src, fragment, line, column",
    [
        (
            "def f(float(N) A) -> (O) {\n  O(i) = A + 1 }",
            "expected a scalar but found a tensor expression",
            2,
            10,
        ),
        ("def f(float(N) A) -> (O) {\n  A(i) = 1 where i in 0:N }", "TC inputs are immutable", 2, 3),
        ("def f(float(N) A) -> (O) { O(i) = A(i, i) }", "expected 1 dimensions but found 2", 1, 36),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:A }", "tensor accesses cannot be used", 1, 53),
        (
            "def f(float a, float(N) b) -> (c) { c(i) = b(i) where i in 0:a }",
            "tensor accesses cannot be used",
            1,
            62,
        ),
        (
            "def f(float(N) A) -> (exp) { exp(i) = A(i) }",
            "'exp' is a built-in function and cannot be redefined",
            1,
            23,
        ),
        ("def f(float(N) A) -> (O) { O(i) = A(i) log(i) = A(i) }", "'log' is a built-in function", 1, 40),
        ("def f(float(N) A) -> (O) { O(i) = A(i) + O2(i) }", "undefined variable O2 used here", 1, 42),
        ("def f(float(N) A) -> (O, A) { O(i) = A(i) }", "A already defined", 1, 26),
        ("def f(half(N) A) -> (O) { O(i) = A(i) }", "half precision (float16) is not supported", 1, 7),
        (
            "def f(float(N) A) -> (O) { O(i) = float16(A(i)) }",
            "half precision (float16) is not supported",
            1,
            35,
        ),
        ("def f(float(N) A) -> (O, P) { O(i) = A(i) }", "output P is never written", 1, 26),
        (
            "def f(float(N) A) -> (O) { O(i) = O(i) + A(i) }",
            "O is read here before any statement writes it",
            1,
            35,
        ),
        (
            "def f(float(N) A) -> (O) { O(i) = A(i) O(i, j) = 1 }",
            "O has 1 dimensions but is written here with 2",
            1,
            40,
        ),
        (
            "def f(float(N) A) -> (float(N, N) O) { O(i) = A(i) }",
            "declared as an output with 2 dimensions",
            1,
            40,
        ),
        (
            "def f(float(N) A) -> (int32(N) O) { O(i) = A(i) }",
            "assign type float to narrower type int32",
            1,
            37,
        ),
        ("def f(float(N) A) -> (O) { O(N) = A(N) }", "N already defined", 1, 30),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where x in 0:3 }", "undefined variable x used here", 1, 46),
        (
            "def f(float(N) A) -> (O) { O(i) = a where a = b + A(i), b = a }",
            "let binding a refers to itself",
            1,
            61,
        ),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where z = q }", "undefined variable q used here", 1, 50),
        ("def f(float(N) A) -> (O) { O(i) = 99999999999 + A(i) }", "does not fit in int32", 1, 35),
        ("def f(float(N) A) -> (O) { O(i) = A(i) + exp }", "exp is a built-in function", 1, 42),
        ("def f(A) -> (O) { O = 1 }", "input A needs a type", 1, 7),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:N/0 }", "division by zero", 1, 53),
        (
            "def f(float(N) A, float(M) B) -> (float(N) O) { O(i) = A(i) + B(i) }",
            "declared with size N",
            1,
            41,
        ),
        ("def f(float(N) A) -> (int32(M) O) { O(i) = 1 where i in 0:N }", "size M of output O", 1, 29),
        ("def f(float(N) N) -> (O) { O(i) = 1 }", "both as a size and as a tensor", 1, 13),
    ],
)
def test_semantic_errors_are_located(src, fragment, line, column):
    with pytest.raises(SemanticError) as info:
        program(src)
    assert fragment in info.value.message
    assert (info.value.line, info.value.column) == (line, column)
    assert "^" in str(info.value)


def test_def_selection():
    src = "def a(float x) -> (y) { y = x }\ndef b(float x) -> (y) { y = x + 1 }\ndef c(float x) -> (y) { y = q(1) }"
    with pytest.raises(SemanticError, match="several defs: a, b, c; pass name= to choose one"):
        check_source(src)
    with pytest.raises(SemanticError, match="no def named 'z'.*a, b, c"):
        check_source(src, "z")
    assert check_source(src, "b").name == "b"  # c is broken, but only the selected def is checked
    with pytest.raises(SemanticError, match="undefined variable q"):
        check_source(src, "c")


def test_program_prints_and_verifies():
    p = program("def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
    assert (
        str(p).splitlines()[-1]
        == "  S0: C(m, n) +=! (A(m, k) * B(k, n)) where m in 0:M, n in 0:N, k in 0:K [init]"
    )
    assert [(s.name, s.tensor, s.dim) for s in p.sizes] == [("M", "A", 0), ("K", "A", 1), ("N", "B", 1)]
    p.verify()
