"""Parser: grammar, precedence, error wording and positions, formatter round trip."""

from __future__ import annotations

import pytest

from tensorlang import syntax
from tensorlang.errors import ParseError
from tensorlang.frontend import def_names, parse_source
from tensorlang.parser import MAX_EXPRESSION_DEPTH, MAX_EXPRESSION_HEIGHT


def rhs(expr_text: str) -> syntax.Expression:
    module = parse_source(f"def f() -> (O) {{ O = {expr_text} }}")
    return module.defs[0].statements[0].rhs


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a + b * c", "a + b * c"),
        ("(a + b) * c", "(a + b) * c"),
        ("a - (b - c)", "a - (b - c)"),
        ("a - b - c", "a - b - c"),
        ("-a * b", "-a * b"),
        ("-(a * b)", "-(a * b)"),
        ("!(a < .5) || b > .5", "!(a < .5) || b > .5"),
        ("a ? 3 : b ? 3 : 4", "a ? 3 : b ? 3 : 4"),
        ("(a ? 3 : b) ? 3 : 4", "(a ? 3 : b) ? 3 : 4"),
        ("c ? 0.0 : X * Y", "c ? 0.0 : X * Y"),
        ("a || b && c", "a || b && c"),
        ("(a || b) && c", "(a || b) && c"),
        ("a < b == c", "a < b == c"),
        ("min(a, max(b,c)) % 2", "min(a, max(b, c)) % 2"),
        ("float(x) / int32(B(i, j + 1))", "float(x) / int32(B(i, j + 1))"),
        ("f()", "f()"),
    ],
)
def test_precedence_and_formatting(text, expected):
    assert str(rhs(text)) == expected
    assert rhs(expected) == rhs(text)


def test_ternary_is_right_associative_and_lowest():
    tree = rhs("a || b ? x : y ? z : w")
    assert isinstance(tree, syntax.Ternary)
    assert isinstance(tree.cond, syntax.BinaryOp) and tree.cond.op == "||"
    assert isinstance(tree.if_false, syntax.Ternary)


def test_unary_binds_tighter_than_binary():
    tree = rhs("!a < b")
    assert isinstance(tree, syntax.BinaryOp) and tree.op == "<"
    assert isinstance(tree.lhs, syntax.UnaryOp)


def test_statement_forms_and_where_clauses():
    src = """
    def f(float(N, M) A, float s) -> (O, int32(N) P) {
        O(i, j) +=! A(i, k) * s <=> matmul(A(i, k), s) where k in 0:M, x = 2 * i, exists A(i, j)
        P(i) max= int32(A(i, 0))
        O(i, j) min=! 1
    }
    """
    (d,) = parse_source(src).defs
    assert [p.name.name for p in d.params] == ["A", "s"]
    assert d.params[1].type == syntax.TensorType(type_name="float", dims=None)
    assert d.returns[0].type is None and d.returns[1].type.type_name == "int32"
    ops = [s.op for s in d.statements]
    assert ops == ["+=!", "max=", "min=!"]
    first = d.statements[0]
    assert [type(w).__name__ for w in first.wheres] == ["WhereRange", "WhereLet", "WhereExists"]
    assert first.equivalent is not None and first.equivalent.name == "matmul"


def test_statements_need_no_separator_and_newlines_are_free():
    src = "def f(float(1)\na) -> (b) { b(\ni)\n =\n a(i) b(i) = b(i) + 1 }"
    (d,) = parse_source(src).defs
    assert len(d.statements) == 2


def test_several_defs_and_names():
    src = "def a(float x) -> (y) { y = x }\ndef b(float x) -> (y) { y = x }"
    assert def_names(src) == ["a", "b"]


@pytest.mark.parametrize(
    "src, fragment, line, column",
    [
        (" def f{} {}", "expected ( but found '{'", 1, 7),
        (
            "def f(float(N) A) -> (B) {\n B(i) -= A(i) }",
            "expected a valid assignment operator but found '-'",
            2,
            7,
        ),
        ("def f(float(N) A) -> (B) { B(i) = A(i); }", "expected a valid token but found ';'", 1, 39),
        ("def f(float(N) A) -> (B) { B(0) = A(0) }", "expected ident but found 'number'", 1, 30),
        ("def f(blah(N) A) -> (B) { }", "expected ) but found '('", 1, 11),
        ("def f(3 A) -> (B) { }", "expected a scalar type but found 'number'", 1, 7),
        ("def f(float(N) A) -> (B) { B(i) = A(i) where i in 0..2 }", "expected : but found 'number'", 1, 53),
        ("def f(float(N) A) -> (B) { B(i) = min(A(i)) }", "expected , but found ')'", 1, 43),
        ("def f(float(N) A) -> (B) { B(i) = A(i) where i = [0, 2[ }", "expected ident but found '['", 1, 50),
        ("", "expected def but found 'eof'", 1, 1),
        ("def f() -> (B) { B = 1 ", "expected ident but found 'eof'", 1, 24),
    ],
)
def test_parse_errors_use_tc_wording_and_point_at_the_token(src, fragment, line, column):
    with pytest.raises(ParseError) as info:
        parse_source(src)
    assert fragment in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)


def test_deep_nesting_is_a_parse_error_not_a_crash():
    with pytest.raises(ParseError, match="nested too deeply"):
        rhs("(" * 5000 + "a" + ")" * 5000)
    with pytest.raises(ParseError, match="nested too deeply"):
        rhs("-" * 5000 + "a")
    with pytest.raises(ParseError, match="expression too long"):
        rhs(" + ".join(["a"] * 5000))
    assert isinstance(rhs(" + ".join(["a"] * 90)), syntax.BinaryOp)


def test_a_long_chain_is_not_nesting():
    # issue 9: a flat sum of 101 terms was "nested too deeply"
    prefix = "def f() -> (O) { O = "
    assert isinstance(rhs(" + ".join(["a"] * 101)), syntax.BinaryOp)
    assert isinstance(rhs(" * ".join(["a"] * MAX_EXPRESSION_HEIGHT)), syntax.BinaryOp)
    # a chain inside nearly the deepest nesting
    assert isinstance(rhs("(" * 95 + " - ".join(["a"] * 150) + ")" * 95), syntax.BinaryOp)
    # one level too many: located at the operator that adds it, not a RecursionError
    text = " + ".join(["a"] * (MAX_EXPRESSION_HEIGHT + 1))
    with pytest.raises(ParseError, match="expression too long") as info:
        rhs(text)
    assert info.value.column == len(prefix) + text.rindex("+") + 1
    assert "^" in str(info.value).splitlines()[-1]


def test_real_nesting_keeps_its_limit_and_caret():
    prefix = "def f() -> (O) { O = "
    depth = MAX_EXPRESSION_DEPTH + 1
    for text, at in [
        ("(" * depth + "a" + ")" * depth, "(" * MAX_EXPRESSION_DEPTH),
        ("-" * depth + "a", "-" * MAX_EXPRESSION_DEPTH),
        ("exp(" * depth + "a" + ")" * depth, "exp(" * MAX_EXPRESSION_DEPTH),
        (
            "".join(f"c ? {k} : " for k in range(depth)) + "a",
            "".join(f"c ? {k} : " for k in range(99)) + "c ? ",
        ),
    ]:
        with pytest.raises(ParseError, match="nested too deeply") as info:
            rhs(text)
        assert (info.value.line, info.value.column) == (1, len(prefix) + len(at) + 1), text[:40]
        assert "^" in str(info.value).splitlines()[-1]


def test_round_trip_of_every_corpus_source(corpus):
    sources = [c["tc"] for key in ("cases", "invalid", "range_inference_tests") for c in corpus[key]]
    sources += [p["tc"] for p in corpus["pitfalls"] if p["tc"]]
    parsed = 0
    for src in sources:
        try:
            module = parse_source(src)
        except ParseError:
            continue
        text = str(module)
        assert parse_source(text) == module, text
        assert str(parse_source(text)) == text
        parsed += 1
    assert parsed >= 60


def test_deepest_accepted_expression_goes_through_the_whole_front_end():
    from tensorlang.frontend import check_source

    nested = "(" * 95 + "A(i)" + " + 1)" * 95
    program = check_source(f"def f(float(N) A) -> (O) {{ O(i) = {nested} + {'-' * 95}A(i) }}")
    assert str(parse_source(str(program.source.text))) == str(parse_source(program.source.text))
    index = "(" * 95 + "i" + " + 0)" * 95
    assert check_source(f"def f(float(N) A) -> (O) {{ O(i) = A({index}) }}").outputs[0].rank == 1
