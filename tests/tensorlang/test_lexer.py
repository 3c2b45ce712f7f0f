"""Lexer: TC's token set, longest match, numbers as strtod reads them, comments, stray characters."""

from __future__ import annotations

import pytest

from tensorlang.errors import ParseError, Source
from tensorlang.lexer import tokenize


def kinds(text: str) -> list[str]:
    return [t.kind for t in tokenize(Source(text))][:-1]


def texts(text: str) -> list[str]:
    return [t.text for t in tokenize(Source(text))][:-1]


def test_numbers_are_scanned_like_strtod_without_sign():
    assert texts("3 3. .5 1.4 3e-3 .5e-7 3E-5") == ["3", "3.", ".5", "1.4", "3e-3", ".5e-7", "3E-5"]
    assert texts("1+3") == ["1", "+", "3"]
    assert texts("-1") == ["-", "1"]
    assert texts("0..2") == ["0.", ".2"]  # why `where r in 0..2` fails to parse
    assert texts("3e") == ["3", "e"]


def test_longest_match_and_keywords():
    assert kinds("min=! max= min minx <=> <= += +=! *=!") == [
        "min=!", "max=", "min", "ident", "<=>", "<=", "+=", "+=!", "*=!",
    ]  # fmt: skip
    assert kinds("def where in exists float double int32 half") == [
        "def", "where", "in", "exists", "float", "double", "int32", "half",
    ]  # fmt: skip
    assert kinds("and or") == ["ident", "ident"]
    assert texts("O(i) =! x") == ["O", "(", "i", ")", "=", "!", "x"]
    assert texts("a-=b") == ["a", "-", "=", "b"]


def test_comments_and_whitespace_are_skipped():
    assert texts("a # comment ; @\n b\n\t#x") == ["a", "b"]


def test_spans_give_line_and_column():
    tokens = tokenize(Source("def f\n  (x)"))
    assert [(t.text, t.span.line, t.span.column) for t in tokens[:3]] == [
        ("def", 1, 1), ("f", 1, 5), ("(", 2, 3),
    ]  # fmt: skip
    assert tokens[-1].kind == "eof"


@pytest.mark.parametrize("char", [";", "@", ".", "&", "$", "é", "\x00"])
def test_stray_character_is_a_located_error(char):
    with pytest.raises(ParseError, match="expected a valid token but found") as info:
        tokenize(Source(f"a +\n  b{char}"))
    assert (info.value.line, info.value.column) == (2, 4)
