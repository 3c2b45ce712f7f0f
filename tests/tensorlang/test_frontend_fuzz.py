"""Property tests: mutated corpus sources raise only TensorLangError; the formatter round-trips."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorlang.errors import Source, TensorLangError
from tensorlang.frontend import check_source, def_names, parse_source
from tensorlang.lexer import OPERATORS, tokenize

CORPUS_PATH = Path(__file__).resolve().parents[2].parent / "shared" / "tc_corpus" / "public.json"
CORPUS = json.loads(CORPUS_PATH.read_text()) if CORPUS_PATH.exists() else {}
SOURCES = [c["tc"] for key in ("cases", "invalid", "range_inference_tests") for c in CORPUS.get(key, [])]
SOURCES += [w for entry in CORPUS.get("warnings", []) for w in entry["examples"]]
needs_corpus = pytest.mark.skipif(not SOURCES, reason="corpus not found")

SNIPPETS = list(OPERATORS) + [
    "def", "where", "in", "exists", "float", "int32", "half", "uint8", "bool", "double",
    " i ", " j ", "k", "N", "A", "O", "exp", "(", ")", "0", "1", "3.5", "1e400", "99999999999",
    "0:N", "+=!", "#", "\n", ";", "@", ".", "\x00", "é", "A(i, j)", "A(i)", "O(i)", "(((", ")))",
]  # fmt: skip


def corpus_tokens(text: str) -> list[str]:
    try:
        return [t.text for t in tokenize(Source(text))][:-1]
    except TensorLangError:
        return text.split()


@st.composite
def token_mutated_sources(draw):
    """Delete, duplicate, move or replace whole tokens of a corpus source."""
    tokens = corpus_tokens(draw(st.sampled_from(SOURCES)))
    for _ in range(draw(st.integers(1, 3))):
        if not tokens:
            break
        i = draw(st.integers(0, len(tokens) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "move", "replace"]))
        if kind == "delete":
            del tokens[i]
        elif kind == "duplicate":
            tokens.insert(i, tokens[i])
        elif kind == "move":
            tokens.insert(draw(st.integers(0, len(tokens))), tokens.pop(i))
        else:
            tokens[i] = draw(st.sampled_from(SNIPPETS + tokens))
    return " ".join(tokens)


@st.composite
def char_mutated_sources(draw):
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        length = draw(st.integers(1, 8))
        snippet = draw(st.one_of(st.sampled_from(SNIPPETS), st.text(max_size=3)))
        if kind == "delete":
            text = text[:pos] + text[pos + length :]
        elif kind == "insert":
            text = text[:pos] + snippet + text[pos:]
        elif kind == "replace":
            text = text[:pos] + snippet + text[pos + length :]
        else:
            text = text[:pos] + text[pos : pos + 4 * length] + text[pos:]
    return text


def mutated_sources():
    return st.one_of(char_mutated_sources(), token_mutated_sources())


def check_everything(text: str) -> None:
    """Run the whole front end on every def of `text`; only TensorLangError may escape."""
    try:
        names = def_names(text)
    except TensorLangError:
        return
    for name in [None, *names]:
        try:
            check_source(text, name)
        except TensorLangError:
            pass


@needs_corpus
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_mutated_sources_raise_only_tensorlang_errors(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_everything(text)


@needs_corpus
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_formatter_round_trips_whatever_parses(text):
    try:
        module = parse_source(text)
    except TensorLangError:
        return
    assert parse_source(str(module)) == module


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_arbitrary_text_raises_only_tensorlang_errors(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_everything(text)


@pytest.mark.slow
@needs_corpus
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_many_mutated_sources_raise_only_tensorlang_errors(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_everything(text)
        try:
            module = parse_source(text)
        except TensorLangError:
            return
        assert parse_source(str(module)) == module
