"""Range inference: rounds, for-all elimination, intersection, where ranges, tensorlang's extra rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sympy

from tensorlang import ir
from tensorlang.errors import SemanticError
from tensorlang.frontend import check_source

S = ir.size_symbol


def shapes(src: str) -> dict[str, tuple]:
    return {t.name: t.shape for t in check_source(src).tensors}


def ranges_of(src: str, statement: int = 0) -> dict[str, tuple]:
    st = check_source(src).statements[statement]
    return {r.var: (r.lo, r.hi) for r in st.ranges}


def test_shapes_print_simplified():
    assert str(shapes("def f(float(I_0) I) -> (O) { O(i) = I(123 * i) }")["O"][0]) == "floor((I_0 + 122)/123)"
    conv = "def c(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) { O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * W1(m,c,kh,kw) }"
    assert shapes(conv)["O"] == (S("N"), S("M"), S("H") - S("KH") + 1, S("W") - S("KW") + 1)
    two = "def f(float(A_0, A_1) A, float(B_0) B) -> (O) { O(j) +=! A(i, j) + B(j) }"
    assert str(shapes(two)["O"][0]) == "Min(A_1, B_0)"


def test_two_rounds_and_for_all_elimination():
    r = ranges_of("def f(float(I_0, I_1, I_2) I) -> (O) { O(i) +=! I(j, i + j, k) }")
    assert r["j"] == (0, S("I_0")) and r["k"] == (0, S("I_2"))
    assert sympy.simplify(r["i"][1] - (S("I_1") - S("I_0") + 1)) == 0


def test_negative_coefficients_and_where_fixed_reduction():
    r = ranges_of(
        "def c(float(X) A, float(Xp) K) -> (B) { B(x) +=! A(xp) * K(X - 1 + x - xp) where xp in 0:X }"
    )
    assert r["xp"] == (0, S("X"))
    assert sympy.simplify(r["x"][1] - (S("Xp") - S("X") + 1)) == 0
    r = ranges_of("def r(float(N) A) -> (O) { O(i) = A(N - 1 - i) }")
    assert r["i"] == (0, S("N"))


def test_where_overrides_accesses_and_gathers_give_no_constraint():
    r = ranges_of("def g(float(H, W) I, int32(L) X) -> (O) { O(l, w) = I(X(l), w) where l in 0:2 }")
    assert r["l"] == (0, 2) and r["w"] == (0, S("W"))
    r = ranges_of("def g(float(N) X, int32(A, B) I) -> (Z) { Z(i, j) = X(I(i, j)) }")
    assert r == {"i": (0, S("A")), "j": (0, S("B"))}


def test_exists_constrains_without_being_evaluated():
    p = check_source("def f(float(1) a) -> (b) { b(i) = 4.0 where exists a(i) }")
    assert p.outputs[0].shape == (1,)
    assert not any(isinstance(n, ir.Read) for n in ir.walk(p.statements[0].rhs))


def test_later_statements_stay_inside_the_first_shape():
    src = "def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) O(i) = O(i) + B(i) O(i) = 1.0 where i in 0:2 }"
    p = check_source(src)
    assert p.outputs[0].shape == (S("N"),)  # the first statement fixes the shape (not the last one)
    assert p.statements[1].range_of("i").hi == sympy.Min(S("N"), S("M"))
    with pytest.raises(SemanticError, match="outside O's dimension"):
        check_source("def f(float(N) A) -> (O) { O(i) = A(i) O(i) = 1.0 where i in 0:N+1 }")


@pytest.mark.parametrize(
    "src, fragment, line, column",
    [
        (
            "def f(float(N) I) -> (O) {\n O(i) = I(i - 1) }",
            "index i of O ranges over 1:N + 1, which does not start at 0",
            2,
            4,
        ),
        ("def f(float(N) I) -> (O) { O(i) = I(i) where i in 1:N }", "replace i by i + 1", 1, 30),
        (
            "def f(float(N, M) I) -> (O) { O(i, j) = I(10 + i - j, i + j) }",
            "Could not infer ranges for free variables i, j",
            1,
            33,
        ),
        (
            "def f(float(N) I) -> (O) { O(i, m) = I(i) }",
            "Free variable m was not solved in range inference",
            1,
            33,
        ),
        (
            "def f(float(N) I) -> (O) { O(i) +=! I(i) * k }",
            "Free variable k is unconstrained. Use a 'where' clause",
            1,
            44,
        ),
        ("def f(float(N) I) -> (O) { O(i) +=! I(i * j) }", "Free variable i was not solved", 1, 30),
        ("def f(float(N) I) -> (O) { O(i) +=! I(i) where k in 0:0 }", "undefined variable k", 1, 48),
        (
            "def f(float(N, M) I) -> (O) { O(i) +=! I(i, k) where k in 3:1 }",
            "Inferred an empty range for variable k",
            1,
            54,
        ),
        ("def f(float(N) I) -> (O) { O(i, j) = 3 where i in 0:N, j in 8:4 }", "does not start at 0", 1, 33),
    ],
)
def test_range_inference_errors(src, fragment, line, column):
    with pytest.raises(SemanticError) as info:
        check_source(src)
    assert fragment in info.value.message
    assert (info.value.line, info.value.column) == (line, column)


def test_front_end_imports_no_later_stage():
    forbidden = {"islpy", "llvmlite", "polyhedral", "scheduler", "codegen"}
    package = Path(__file__).resolve().parents[2] / "tensorlang"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            inside_getattr = path.name == "__init__.py"  # the one sanctioned lazy re-export
            for name in names:
                assert inside_getattr or name.split(".")[0] not in forbidden, (path.name, name)
