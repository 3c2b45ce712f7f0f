"""lexer: source text → tokens with spans (TC's token set, longest match, `#` comments)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ParseError, Source, Span

# Words the lexer turns into keyword tokens. TC reserves exactly these (tc/lang/lexer.h); we add
# `half` so that a float16 spelling gets a clear "not supported" error instead of "undefined".
TYPE_KEYWORDS = frozenset(
    "bool uint8 uint16 uint32 uint64 int8 int16 int32 int64 float16 float32 float64 float double half".split()
)
KEYWORDS = frozenset("def where in exists min max".split()) | TYPE_KEYWORDS

# Longest first, so that `+=!` wins over `+=` over `+` and `<=>` over `<=`.
OPERATORS = (
    "min=!", "max=!", "<=>", "+=!", "*=!", "min=", "max=",
    "->", "+=", "*=", ">=", "<=", "==", "!=", "&&", "||",
    "+", "-", "*", "/", "(", ")", "[", "]", "?", ":", ",", "=", "{", "}", ">", "<", "!", "%",
)  # fmt: skip
_SYMBOL_OPERATORS = tuple(op for op in OPERATORS if not op[0].isalpha())

# strtod-style decimal numbers without a sign: `3`, `3.`, `.5`, `1.4`, `3e-3`, `.5e-7`, `3E-5`.
_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = "0123456789"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"(?:\s+|#[^\n]*)+")


@dataclass(frozen=True)
class Token:
    """kind is "ident", "number", "eof", a keyword, or the operator text itself."""

    kind: str
    text: str
    span: Span

    def describe(self) -> str:
        """How TC names a token in "expected X but found 'Y'" messages."""
        return self.kind if self.kind in ("ident", "number", "eof") else self.text


def tokenize(source: Source) -> list[Token]:
    """All tokens of `source`, ending with one "eof" token. Raises ParseError on a stray character."""
    text = source.text
    tokens: list[Token] = []
    pos = 0
    while True:
        space = _SPACE.match(text, pos)
        if space:
            pos = space.end()
        if pos >= len(text):
            tokens.append(Token("eof", "", Span(len(text), len(text), source)))
            return tokens
        token = _next_token(source, pos)
        tokens.append(token)
        pos = token.span.end


def _next_token(source: Source, pos: int) -> Token:
    text = source.text
    char = text[pos]
    if char in _DIGITS or (char == "." and text[pos + 1 : pos + 2] in _DIGITS and pos + 1 < len(text)):
        match = _NUMBER.match(text, pos)
        assert match is not None
        return Token("number", match.group(), Span(pos, match.end(), source))
    if char.isascii() and (char.isalpha() or char == "_"):
        match = _IDENT.match(text, pos)
        assert match is not None
        word = match.group()
        if word in ("min", "max"):
            # `min=` / `min=!` are single tokens: the longer match beats the keyword.
            for suffix in ("=!", "="):
                if text.startswith(suffix, match.end()):
                    end = match.end() + len(suffix)
                    return Token(word + suffix, word + suffix, Span(pos, end, source))
        kind = word if word in KEYWORDS else "ident"
        return Token(kind, word, Span(pos, match.end(), source))
    for op in _SYMBOL_OPERATORS:
        if text.startswith(op, pos):
            return Token(op, op, Span(pos, pos + len(op), source))
    raise ParseError(f"expected a valid token but found {char!r}", Span(pos, pos + 1, source))
