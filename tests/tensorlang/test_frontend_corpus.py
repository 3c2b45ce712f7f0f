"""The TC corpus through the front end: valid cases, expected errors, range inference, warnings
(on the subset in tests/corpus_min.json when ../shared/tc_corpus is absent)."""

from __future__ import annotations

import random
import re
import warnings

import pytest
import sympy
from conftest import load_corpus

from tensorlang import ir
from tensorlang.errors import ParseError, SemanticError, TensorLangWarning
from tensorlang.frontend import check_source

CORPUS = load_corpus()


def entries(key: str) -> list:
    return [pytest.param(e, id=e["name"]) for e in CORPUS.get(key, [])]


def quiet_check(text: str, name: str | None = None) -> ir.Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorLangWarning)
        return check_source(text, name)


def evaluate(shape: tuple[sympy.Expr, ...], sizes: dict[str, int]) -> list[int]:
    values = {ir.size_symbol(k): v for k, v in sizes.items()}
    return [int(sympy.sympify(d).subs(values)) for d in shape]


# ---------------------------------------------------------------- valid programs

# Range inference gives h in [KH-1, H): zero-based only for 1x1 kernels, so the start becomes a
# requirement (KH - 1 == 0) checked at call time.
CALL_TIME_ZERO_START = {"convolution_igrad_1x1"}


@pytest.mark.parametrize("case", entries("cases"))
def test_corpus_case_checks_with_expected_shapes_and_dtypes(case):
    program = quiet_check(case["tc"], case.get("entry"))
    assert bool(program.requirements) == (case["name"] in CALL_TIME_ZERO_START)
    assert [t.name for t in program.inputs] == list(case["inputs"])
    for tensor in program.inputs:
        assert str(tensor.dtype) == case["input_dtypes"][tensor.name]
    sizes = case.get("sizes") or {}
    by_name = {t.name: t for t in program.outputs}
    assert list(by_name) == list(case["outputs"])
    for name, expected in case["outputs"].items():
        assert evaluate(by_name[name].shape, sizes) == expected, name
        assert str(by_name[name].dtype) == case["output_dtypes"][name]
    expects_warning = any("Reduction without initialization" in w for w in case.get("interp_warnings") or [])
    assert bool(program.warnings) == expects_warning


# ---------------------------------------------------------------- invalid programs

# Where the error is: statement errors at the LHS tensor, access errors at the subscript or `(`.
INVALID_POSITIONS = {
    "E1_missing_param_list": (1, 7),
    "E11_non_integral_index": (1, 37),
    "E13_tensor_in_range_bound_output_size": (1, 67),
    "reduction_var_without_reduction_op": (3, 7),
    "Transpose5D_lhs_index_unused": (2, 21),
    "AmbiguousRotate": (3, 5),
    "IllegalIndirectWhere": (3, 28),
    "doc_maxpool_dotdot_range": (3, 42),
    "doc_and_keyword": (2, 35),
    "old_where_interval_syntax": (3, 93),
    "builtin_name_as_parameter": (1, 16),
    "repeated_lhs_index": (1, 33),
    "builtin_arity": (1, 38),
    "implicit_narrowing_to_annotated_output": (1, 37),
    "non_bool_condition": (1, 35),
    "undefined_tensor": (1, 35),
    "semicolon_is_not_a_token": (1, 39),
}
ERROR_CLASS = {
    "lexer": ParseError,
    "parser": ParseError,
    "sema": SemanticError,
    "range inference": SemanticError,
}


def message_fragment(expected_error: str) -> str:
    """TC's message up to its first sentence end, without the `here:` suffix."""
    return expected_error.split(" here:")[0].split(". ")[0].rstrip(".").strip()


@pytest.mark.parametrize("entry", entries("invalid"))
def test_corpus_invalid_program(entry):
    if "tensorlang" in entry:
        quiet_check(entry["tc"])  # TC rejected it; tensorlang accepts (temporaries, run-time checks)
        return
    if entry["stage"] not in ERROR_CLASS:
        quiet_check(entry["tc"])  # a call-time error (E8): the definition itself is fine
        return
    with pytest.raises(ERROR_CLASS[entry["stage"]]) as info:
        quiet_check(entry["tc"])
    assert message_fragment(entry["expected_error"]) in info.value.message
    if entry["asserted_fragment"]:
        assert entry["asserted_fragment"] in info.value.message
    assert (info.value.line, info.value.column) == INVALID_POSITIONS[entry["name"]]


def test_every_invalid_entry_has_a_position():
    located = {
        e["name"] for e in CORPUS.get("invalid", []) if e["stage"] in ERROR_CLASS and "tensorlang" not in e
    }
    assert located <= set(INVALID_POSITIONS)


# ---------------------------------------------------------------- range inference

# TC threw only because test_inference.cc turns "precondition will not be checked" warnings into
# errors; tensorlang accepts these and leaves the precondition to the later (run-time) checks.
ACCEPTED_WITH_RUNTIME_CHECKS = {"TCC", "TCE", "RuntimeCheckOnDerivedSize"}


def parse_expected(text: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    mins_text, extents_text = text.split("extents:")
    pattern = re.compile(r"(\w+)@\[(.*)\]")

    def table(part: str) -> dict[str, list[str]]:
        return {m[1]: [x.strip() for x in m[2].split(";") if x.strip()] for m in pattern.finditer(part)}

    return table(mins_text), table(extents_text)


def eval_tc_extent(text: str, sizes: dict[str, int]) -> int:
    """Evaluate a Halide-printed extent; `/` is floor division there."""
    return eval(text.replace("/", "//"), {"min": min, "max": max}, dict(sizes))


@pytest.mark.parametrize("entry", entries("range_inference_tests"))
def test_corpus_range_inference(entry):
    name, expected = entry["name"], entry["expected"]
    if expected.startswith("throws"):
        if name in ACCEPTED_WITH_RUNTIME_CHECKS:
            quiet_check(entry["tc"])
        else:
            with pytest.raises(SemanticError):
                quiet_check(entry["tc"])
        return
    mins, extents = parse_expected(expected)
    if any(m != "0" for m in sum(mins.values(), [])):
        with pytest.raises(SemanticError, match="does not start at 0"):  # Shift1D, PaddedConv, EmptySetWhere
            quiet_check(entry["tc"])
        return
    program = quiet_check(entry["tc"])
    size_names = [s.name for s in program.sizes]
    rng = random.Random(name)
    for _ in range(3):
        sizes = {s: rng.randint(1, 40) for s in size_names}
        for tensor in program.tensors:
            want = [eval_tc_extent(e, sizes) for e in extents[tensor.name]]
            assert evaluate(tensor.shape, sizes) == want, (tensor.name, sizes)


# ---------------------------------------------------------------- warnings


def test_reduction_without_initialization_warns():
    (entry,) = [w for w in CORPUS["warnings"] if w["message"].startswith("WARNING: \nReduction")]
    for example in entry["examples"]:
        with pytest.warns(TensorLangWarning, match="Reduction without initialization") as record:
            program = check_source(example)
        assert len(program.warnings) == 1
        assert "<source>:1:" in str(record[0].message) and "^" in str(record[0].message)


def test_pitfalls_with_uninitialized_reductions_warn():
    for pitfall in CORPUS["pitfalls"]:
        if pitfall["name"].startswith("uninitialised"):
            with pytest.warns(TensorLangWarning, match="Reduction without initialization"):
                check_source(pitfall["tc"])
