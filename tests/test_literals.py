"""Issue 9, end to end: float literals take the precision of the float type they meet (NEP 50),
and long operator chains are not nesting.

Each comparison below is one rounding in NumPy float64 (or float32), so it is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from tensorlang import exprcheck, ir
from tensorlang.dtypes import ScalarType
from tensorlang.frontend import check_source
from tensorlang.parser import MAX_EXPRESSION_DEPTH, MAX_EXPRESSION_HEIGHT

RNG = np.random.default_rng(9)


def doubles(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- literals in double expressions


def test_decimal_literal_in_a_double_product_is_the_double_nearest():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = 0.2 * A(i) }")
    A = doubles(33)
    B = k(A)
    assert B.dtype == np.float64
    np.testing.assert_array_equal(B, 0.2 * A)  # was float32(0.2) = 0.20000000298 times A


def test_tiny_literal_in_a_double_kernel_is_not_flushed_to_zero():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = A(i) * 1e-300 }")
    A = doubles(17)
    np.testing.assert_array_equal(k(A), A * 1e-300)
    assert np.all(k(A) != 0)


def test_literal_only_subexpression_is_computed_in_double():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = A(i) * (0.1 + 0.2) }")
    A = doubles(19)
    np.testing.assert_array_equal(k(A), A * (0.1 + 0.2))


def test_explicit_double_cast_of_a_literal_is_the_double_nearest():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = double(A(i)) * double(0.2) }")
    A = floats(11)
    B = k(A)
    assert B.dtype == np.float64
    np.testing.assert_array_equal(B, A.astype(np.float64) * 0.2)
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = double(0.2) where i in 0:N }")
    np.testing.assert_array_equal(k(A), np.full(11, 0.2))


def test_explicit_float_cast_keeps_a_literal_float32_in_a_double_expression():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = float(0.2) * A(i) }")
    A = doubles(7)
    np.testing.assert_array_equal(k(A), np.float64(np.float32(0.2)) * A)


def test_builtin_of_a_literal_meeting_a_double_runs_in_double():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = exp(0.2) * A(i) }")
    A = doubles(9)
    # the double exp of 0.2 (within an ulp of NumPy's); float32 exp(0.2) would be ~3e-8 away
    np.testing.assert_allclose(k(A), np.exp(0.2) * A, rtol=4e-16, atol=0)


def test_select_branch_literal_meets_the_double_branch():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = A(i) > 0.0 ? 0.2 : A(i) }")
    A = doubles(40)
    np.testing.assert_array_equal(k(A), np.where(A > 0.0, 0.2, A))


def test_min_max_and_fmax_with_a_literal_in_double():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = min(A(i), 0.1) + fmax(A(i), 0.3) }")
    A = doubles(40)
    np.testing.assert_array_equal(k(A), np.minimum(A, 0.1) + np.fmax(A, 0.3))


def test_reduction_with_a_literal_factor_in_double():
    k = tl.compile("def f(double(N, M) A) -> (B) { B(i) +=! 0.1 * A(i, j) }")
    A = doubles(5, 8)
    B = k(A)
    expected = np.zeros(5)
    for j in range(8):  # the kernel's order: j ascending
        expected = expected + 0.1 * A[:, j]
    np.testing.assert_allclose(B, expected, rtol=1e-15, atol=1e-16)


def test_literal_times_an_integer_tensor_meeting_a_double():
    k = tl.compile("def f(int32(N) I, double(N) A) -> (B) { B(i) = A(i) + I(i) * 0.1 }")
    ints = RNG.integers(-1000, 1000, 13).astype(np.int32)
    A = doubles(13)
    np.testing.assert_array_equal(k(ints, A), A + ints * 0.1)


def test_literal_stored_into_a_declared_double_output_is_the_double_nearest():
    k = tl.compile("def f(double(N) A) -> (double(N) B) { B(i) = 0.1 + 0.2 where i in 0:N }")
    np.testing.assert_array_equal(k(doubles(4)), np.full(4, 0.1 + 0.2))


def test_let_bound_literal_meets_the_double_where_it_is_used():
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = A(i) * s where s = -0.2 }")
    A = doubles(6)
    np.testing.assert_array_equal(k(A), A * -0.2)


# ---------------------------------------------------------------- float32 kernels keep their results


def test_float_kernel_keeps_the_float32_literal():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = 0.2 * A(i) }")
    A = floats(33)
    B = k(A)
    assert B.dtype == np.float32
    np.testing.assert_array_equal(B, np.float32(0.2) * A)


def test_literal_only_expression_stays_float32_in_a_double_kernel():
    # B's type comes from its expression, and an all-literal expression is float32 (as in TC)
    k = tl.compile("def f(double(N) A) -> (B) { B(i) = 0.1 + 0.2 where i in 0:N }")
    B = k(doubles(3))
    assert B.dtype == np.float32
    np.testing.assert_array_equal(B, np.full(3, np.float32(0.1) + np.float32(0.2)))


def test_literal_times_an_integer_tensor_is_float32():
    k = tl.compile("def f(int32(N) I) -> (B) { B(i) = I(i) * 0.5 }")
    ints = RNG.integers(-1000, 1000, 13).astype(np.int32)
    B = k(ints)
    assert B.dtype == np.float32
    np.testing.assert_array_equal(B, ints.astype(np.float32) * np.float32(0.5))


def test_typing_rule_at_the_ir_level():
    rhs = check_source("def f(double(N) A) -> (B) { B(i) = A(i) * (0.1 + 0.2) }").statements[0].rhs
    assert rhs == ir.Binary(
        op="*",
        lhs=ir.Read(tensor="A", indices=(ir.IndexRef(name="i"),), dtype=ScalarType.FLOAT64),
        rhs=ir.Binary(
            op="+",
            lhs=ir.Const(value=0.1, dtype=ScalarType.FLOAT64),
            rhs=ir.Const(value=0.2, dtype=ScalarType.FLOAT64),
            dtype=ScalarType.FLOAT64,
        ),
        dtype=ScalarType.FLOAT64,
    )
    # in a float kernel nothing changes: float32 literals, no conversion
    rhs = check_source("def f(float(N) A) -> (B) { B(i) = A(i) * (0.1 + 0.2) }").statements[0].rhs
    assert {n.dtype for n in ir.walk(rhs)} == {ScalarType.FLOAT32, ScalarType.INT32}
    assert not any(isinstance(n, ir.Cast) for n in ir.walk(rhs))


# ---------------------------------------------------------------- literals float32 cannot hold


@pytest.mark.parametrize(
    ("rhs", "literal", "becomes"),
    [
        ("A(i) * 1e300", "1e300", "inf"),
        ("A(i) + -1e39", "1e39", "inf"),
        ("A(i) * 1e-50", "1e-50", "0.0"),
        ("A(i) + 1e300 * 1e-300", "1e300", "inf"),  # float32 math would give inf * 0 = nan
        ("1e39 where i in 0:N", "1e39", "inf"),
    ],
)
def test_literal_that_float32_cannot_hold_is_a_located_error(rhs, literal, becomes):
    src = f"def f(float(N) A) -> (B) {{\n    B(i) = {rhs}\n}}"
    with pytest.raises(tl.SemanticError, match=f"the literal {literal} is {becomes} in float32") as info:
        tl.compile(src)
    assert (info.value.line, info.value.column) == (2, src.splitlines()[1].index(literal) + 1)
    assert f"double({literal})" in str(info.value)


def test_literal_that_float32_cannot_hold_is_fine_in_double():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = double(A(i)) * 1e300 }")
    A = floats(5)
    np.testing.assert_array_equal(k(A), A.astype(np.float64) * 1e300)


def test_float32_extremes_are_accepted():
    k = tl.compile("def f(float(N) A) -> (B) { B(i) = A(i) * 3.4028234e38 + 1.4e-45 }")
    A = np.ones(2, np.float32)
    expected = A * np.float32(3.4028234e38) + np.float32(1.4e-45)
    np.testing.assert_array_equal(k(A), expected)


# ---------------------------------------------------------------- long chains (issue 9, item 8)


def sequential(op, terms):
    out = terms[0]
    for t in terms[1:]:
        out = op(out, t)
    return out


def chain(n: int, term: str = "A(i)", op: str = "+") -> str:
    return f" {op} ".join([term] * n)


@pytest.mark.parametrize("n", [101, MAX_EXPRESSION_HEIGHT - 1])
def test_flat_sum_of_many_terms_compiles_and_runs(n):
    k = tl.compile(f"def f(float(N) A) -> (B) {{ B(i) = {chain(n)} }}")
    A = floats(37)
    np.testing.assert_array_equal(k(A), sequential(np.add, [A] * n))
    assert "A(i)" in k.inspect("ir")


def test_long_product_chain_compiles_and_runs():
    n = MAX_EXPRESSION_HEIGHT - 1
    k = tl.compile(f"def f(double(N) A, double(N) C) -> (B) {{ B(i) = C(i) * {chain(n - 1, op='*')} }}")
    A = 1 + doubles(21) * 1e-3
    C = doubles(21)
    np.testing.assert_array_equal(k(A, C), sequential(np.multiply, [C] + [A] * (n - 1)))


def test_mixed_chain_with_literals_in_double():
    k = tl.compile(f"def f(double(N) A) -> (B) {{ B(i) = {chain(120, '0.1 * A(i)')} }}")
    A = doubles(8)
    np.testing.assert_array_equal(k(A), sequential(np.add, [0.1 * A] * 120))


def test_chain_of_2000_terms_is_a_located_parse_error_not_a_recursion_error():
    src = f"def f(float(N) A) -> (B) {{\n  B(i) = {chain(2000)}\n}}"
    with pytest.raises(tl.ParseError, match="expression too long") as info:
        tl.compile(src)
    # it points at the operator that makes the tree one level too deep
    line = src.splitlines()[1]
    plus = [i for i, ch in enumerate(line) if ch == "+"][MAX_EXPRESSION_HEIGHT - 2]
    assert (info.value.line, info.value.column) == (2, plus + 1)
    assert "^" in str(info.value)


def test_let_bindings_cannot_build_a_too_long_expression():
    body = chain(150)  # 151 levels, and 59 more for the chain of x below
    src = f"def f(float(N) A) -> (B) {{ B(i) = {chain(60, 'x')} where x = {body} }}"
    with pytest.raises(tl.SemanticError, match="expression too long"):
        tl.compile(src)
    lets = ", ".join(f"a{n + 1} = a{n} + 1" for n in range(3 * MAX_EXPRESSION_DEPTH))
    src = f"def f(float(N) A) -> (B) {{ B(i) = a{3 * MAX_EXPRESSION_DEPTH} where a0 = A(i), {lets} }}"
    with pytest.raises(tl.SemanticError, match="nested too deeply"):
        tl.compile(src)


def test_weak_chain_of_literals_is_widened_without_recursion():
    # the literal-only operand is a 150-deep weak tree; widening it to double must not recurse
    k = tl.compile(f"def f(double(N) A) -> (B) {{ B(i) = A(i) * ({chain(150, '0.1')}) }}")
    A = doubles(4)
    np.testing.assert_array_equal(k(A), A * sequential(lambda a, b: a + b, [0.1] * 150))
    assert (
        exprcheck.height(
            check_source(f"def f(float(N) A) -> (B) {{ B(i) = {chain(150)} }}").statements[0].rhs
        )
        == 151
    )


def test_weak_tree_helpers_do_not_recurse():
    # widen, settle and height walk a tree in a loop: 5000 levels, far past the recursion limit
    node: ir.Expr = ir.Const(value=0.1, dtype=ScalarType.FLOAT32, weak=True)
    for _ in range(5000):
        one = ir.Const(value=0.1, dtype=ScalarType.FLOAT32, weak=True)
        node = ir.Binary(op="+", lhs=node, rhs=one, dtype=ScalarType.FLOAT32, weak=True)
    assert exprcheck.height(node) == 5001
    wide = exprcheck.widen(node)
    assert wide.dtype == ScalarType.FLOAT64 and not exprcheck.is_weak(wide)
    assert wide.lhs.lhs.rhs == ir.Const(value=0.1, dtype=ScalarType.FLOAT64)
    assert not exprcheck.is_weak(exprcheck.settle(node))


def test_ir_text_tells_a_double_literal_from_a_widened_float32_one():
    """inspect("ir") printed both as float64(0.2), although they differ by 3e-9."""
    text = tl.compile("def f(double(N) A) -> (B) { B(i) = 0.2 * A(i) + double(float(0.2)) }").inspect("ir")
    assert "float64(0.2) * A(i)" in text and "float64(float32(0.2))" in text
