"""diagnostics: source positions → located, caret-annotated errors and warnings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """The text of one compilation unit and the name it is reported under."""

    text: str
    filename: str = "<source>"

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1] if 1 <= line <= len(lines) else ""

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return line, column


@dataclass(frozen=True)
class Span:
    """A half-open character range [start, end) of a Source."""

    start: int
    end: int
    source: Source = field(repr=False, compare=False, hash=False)

    @property
    def line(self) -> int:
        return self.source.position(self.start)[0]

    @property
    def column(self) -> int:
        return self.source.position(self.start)[1]

    @property
    def text(self) -> str:
        return self.source.text[self.start : self.end]

    def to(self, other: Span) -> Span:
        """The span covering self through other."""
        return Span(min(self.start, other.start), max(self.end, other.end), self.source)

    def excerpt(self) -> str:
        """The source line of the start, with a caret (and tildes) under the span."""
        line, column = self.source.position(self.start)
        text = self.source.line_text(line)
        end_line, _ = self.source.position(max(self.start, self.end - 1))
        width = max(1, (self.end - self.start) if end_line == line else len(text) - column + 1)
        width = min(width, max(1, len(text) - column + 1))
        marker = " " * (column - 1) + "^" + "~" * (width - 1)
        return f"{line:4d} | {text}\n     | {marker}"

    def __str__(self) -> str:
        return f"{self.source.filename}:{self.line}:{self.column}"


class TensorLangError(Exception):
    """Base of every error tensorlang raises for a user mistake."""


class LocatedError(TensorLangError):
    """An error in the source text: carries .line, .column, .span and a caret excerpt."""

    def __init__(self, message: str, span: Span | None = None):
        self.message = message
        self.span = span
        self.line = span.line if span is not None else 0
        self.column = span.column if span is not None else 0
        super().__init__(self._render())

    def _render(self) -> str:
        if self.span is None:
            return self.message
        return f"{self.span}: {self.message}\n{self.span.excerpt()}"


class ParseError(LocatedError):
    """The source does not lex or parse."""


class SemanticError(LocatedError):
    """The source parses but breaks a rule of the language (names, types, range inference)."""


class InternalError(TensorLangError):
    """A compiler invariant broke (a `verify()` failed): a bug in tensorlang, reported as an error
    instead of generating wrong code."""


def verification_enabled() -> bool:
    """Whether every stage's `verify()` runs in the pipeline (TENSORLANG_VERIFY=1; on in the tests).
    The cheap checks run always; this turns on the ones that cost isl work at each compile."""
    import os

    return os.environ.get("TENSORLANG_VERIFY", "") not in ("", "0")


class ArgumentError(TensorLangError):
    """A kernel was called with arguments that do not fit its definition."""


class TensorLangWarning(UserWarning):
    """Something legal but probably unintended (e.g. a reduction without initialisation)."""


def located_warning_text(message: str, span: Span) -> str:
    return f"{span}: {message}\n{span.excerpt()}"
