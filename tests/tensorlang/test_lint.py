"""The separately-reduced-product lint (issue 9, item 2): `C(m, n) +=! A(m, k) * B(kk, n)` keeps
TC's meaning, (Σk A)·(Σkk B), but warns at the read, suggesting the close index name."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tensorlang.checker import check_def
from tensorlang.errors import SemanticError, Source, TensorLangWarning
from tensorlang.frontend import check_source
from tensorlang.parser import parse

CORPUS_PATH = Path(__file__).resolve().parents[2].parent / "shared" / "tc_corpus" / "public.json"
CORPUS = json.loads(CORPUS_PATH.read_text()) if CORPUS_PATH.exists() else {}
LINT = ".*reduced over separate indices"


def lint_messages(src: str) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", TensorLangWarning)
        check_source(src)
    return [str(w.message) for w in record if "separate indices" in str(w.message)]


def test_mistyped_index_warns_at_the_read_and_suggests_the_name():
    src = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(kk, n)\n}"
    (message,) = lint_messages(src)
    assert "reduced over separate indices" in message
    assert "A(m, k)" in message and "B(kk, n)" in message
    assert "did you mean `k`" in message
    assert message.startswith("<source>:2:27:")  # at B, the read with the odd index
    assert message.endswith(
        "   2 |     C(m, n) +=! A(m, k) * B(kk, n)\n     |                           ^~~~~~~~"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorLangWarning)
        p = check_source(src)  # TC's meaning is kept: two reduction indices
    assert p.statements[0].reduction_indices == ("k", "kk") and len(p.warnings) == 1


WARNS = [
    ("s +=! A(i) * B(j)", "float(N) A, float(M) B"),  # (ΣA)(ΣB): legal, but usually a typo
    ("O(i) +=! A(i, j) * B(i, k)", "float(N, M) A, float(N, M) B"),
    ("O(i) +=! 2.0 * (A(i, j) * B(k)) + A(i, 0)", "float(N, M) A, float(M) B"),  # nested products
    ("O(i) +=! A(i, j) * B(k) * C(i)", "float(N, M) A, float(M) B, float(N) C"),
    ("O(i) +=! float(A(i, j)) * -B(k)", "int32(N, M) A, float(M) B"),  # through casts and negation
]
QUIET = [
    ("O(i) +=! A(i, j) * B(j)", "float(N, M) A, float(M) B"),  # j shared: matrix-vector
    ("O(i) +=! A(i, k)", "float(N, M) A"),  # a single operand
    ("O(i) +=! A(i, j) * B(i, j)", "float(N, M) A, float(N, M) B"),
    ("O(i) +=! A(i, j) * B(i)", "float(N, M) A, float(N) B"),  # one owner only
    ("O(j) +=! A(i, j)", "float(N, M) A"),  # column sums
    ("O(i, j) = A(i) * B(j)", "float(N) A, float(M) B"),  # outer product, no reduction
    ("O(i) +=! A(i, k) * 2.0", "float(N, M) A"),  # a constant operand
    ("O(i) +=! A(i, k) * s * B(i)", "float(N, M) A, float s, float(N) B"),  # a scalar operand
    ("O(i) +=! A(i, k) * B(k) + C(i, j) * D(j)", "float(N, M) A, float(M) B, float(N, M) C, float(M) D"),
    ("O(i) +=! A(i, j) * B(k) where exists C(j, k)", "float(N, M) A, float(M) B, float(M, M) C"),
    ("O(i) +=! A(i, j) * B(k) + A(i, k) * B(j)", "float(N, M) A, float(M) B"),
    ("O(i) +=! A(i, j * k) where j in 0:2, k in 0:2", "float(N, M) A"),  # index arithmetic
    ("s +=! A(i) * A(i)", "float(N) A"),
]


@pytest.mark.parametrize("body, params, expected", [(*c, 1) for c in WARNS] + [(*c, 0) for c in QUIET])
def test_separately_reduced_products_warn_and_nothing_else_does(body, params, expected):
    out = "(s)" if body.startswith("s ") else "(O)"
    assert len(lint_messages(f"def f({params}) -> {out} {{ {body} }}")) == expected


def _corpus_programs() -> list:
    keys = ("cases", "range_inference_tests")
    return [pytest.param(e["tc"], id=f"{key}:{e['name']}") for key in keys for e in CORPUS.get(key, [])]


@pytest.mark.skipif(not CORPUS, reason=f"corpus not found at {CORPUS_PATH}")
@pytest.mark.parametrize("text", _corpus_programs())
def test_no_valid_corpus_program_trips_the_lint(text):
    source = Source(text)
    for definition in parse(source).defs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TensorLangWarning)
            warnings.filterwarnings("error", LINT, TensorLangWarning)
            try:
                check_def(definition, source)
            except SemanticError:
                continue  # a range-inference test that expects an error; not this lint's business
