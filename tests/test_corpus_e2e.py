"""End to end on the public TC corpus: every case compiles and matches its NumPy reference;
every invalid program gets a located error (or a call-time ArgumentError)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import load_corpus

import tensorlang as tl

CORPUS = load_corpus() or {"cases": [], "invalid": []}
CASES = {c["name"]: c for c in CORPUS["cases"]}
INVALID = {c["name"]: c for c in CORPUS["invalid"]}
pytestmark = pytest.mark.skipif(not CASES, reason="../shared/tc_corpus/public.json not found")


def make_inputs(case: dict, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs per the corpus conventions (value_ranges, int_ranges, special_inputs)."""
    arrays: dict[str, np.ndarray] = {}
    specials = case.get("special_inputs", {})
    for name, shape in case["inputs"].items():
        dtype = np.dtype(case["input_dtypes"][name])
        if name in specials:
            value = eval(specials[name], {"np": np}, dict(arrays))  # noqa: S307 - corpus-provided expression
            arrays[name] = np.asarray(value, dtype=dtype).reshape(shape)
            continue
        if dtype.kind == "f":
            lo, hi = case.get("value_ranges", {}).get(name, [-1.0, 1.0])
            arrays[name] = rng.uniform(lo, hi, size=shape).astype(dtype)
        else:
            lo, hi = case.get("int_ranges", {}).get(name, [0, 4])
            arrays[name] = rng.integers(lo, hi, size=shape).astype(dtype)
    return list(arrays.values())


def reference(case: dict):
    scope: dict = {"np": np}
    exec(case["reference"], scope)  # noqa: S102 - corpus-provided reference
    return scope["ref"]


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind == "f":
        tol = 1e-4 if actual.dtype == np.float32 else 1e-10
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def run_cases_whose_plan_mentions(options: tl.Options, mention: str) -> int:
    """Compile every corpus case with `options`; run those whose `inspect("plan")` mentions
    `mention` (a GEMM call, a direct convolution) against their references. Returns how many ran."""
    ran = 0
    for name, case in sorted(CASES.items()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tl.TensorLangWarning)
            kernel = tl.compile(case["tc"], case.get("entry"), options=options)
        if mention not in kernel.inspect("plan"):
            continue
        ran += 1
        rng = np.random.default_rng(0)
        inputs = make_inputs(case, rng)
        preinit = {
            k: rng.uniform(-1, 1, size=v).astype(case["output_dtypes"][k])
            for k, v in case.get("preinit", {}).items()
        }
        expected = reference(case)(*inputs, *[p.copy() for p in preinit.values()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tl.TensorLangWarning)
            result = kernel(*inputs, out={k: v.copy() for k, v in preinit.items()} or None)
        results = result if isinstance(result, tuple) else (result,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for out_name, actual, want in zip(case["outputs"], results, expected):
            assert_close(actual, want, f"{name}:{out_name}")
    return ran


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_reference(name: str) -> None:
    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        kernel = tl.compile(case["tc"], case.get("entry"))
    ref = reference(case)
    for seed in range(2):
        rng = np.random.default_rng(seed)
        inputs = make_inputs(case, rng)
        preinit = {
            k: rng.uniform(-1, 1, size=v).astype(case["output_dtypes"][k])
            for k, v in case.get("preinit", {}).items()
        }
        expected = ref(*inputs, *[p.copy() for p in preinit.values()])
        out = {k: v.copy() for k, v in preinit.items()} or None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tl.TensorLangWarning)
            result = kernel(*inputs, out=out)
        results = result if isinstance(result, tuple) else (result,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        names = list(case["outputs"])
        assert len(results) == len(names)
        for out_name, actual, exp in zip(names, results, expected):
            assert actual.dtype == np.dtype(case["output_dtypes"][out_name]), out_name
            assert list(actual.shape) == case["outputs"][out_name], out_name
            assert_close(actual, exp, f"{name}:{out_name} seed {seed}")


@pytest.mark.parametrize(
    "name", sorted(n for n, c in INVALID.items() if "call_with" not in c and "tensorlang" not in c)
)
def test_invalid_program_gets_located_error(name: str) -> None:
    case = INVALID[name]
    with pytest.raises((tl.ParseError, tl.SemanticError)) as info:
        tl.compile(case["tc"])
    err = info.value
    assert err.line >= 1 and err.column >= 1
    assert "^" in str(err)  # the caret excerpt


def test_wrong_input_type_is_a_call_time_error() -> None:
    case = INVALID["E8_wrong_input_type"]
    kernel = tl.compile(case["tc"])
    with pytest.raises(tl.ArgumentError, match="expected type int32"):
        kernel(np.array(1.5, dtype=np.float32))
    assert kernel(np.array(7, dtype=np.int32)).tolist() == [7] * 10


def test_temporaries_beyond_tc_are_accepted() -> None:
    kernel = tl.compile(INVALID["E20_temporary_tensor"]["tc"])
    a = np.array([2.5], dtype=np.float32)
    assert kernel(a).tolist() == [2.5]
    softmax = tl.compile(INVALID["faq_temporary_not_output"]["tc"])
    x = np.random.default_rng(0).uniform(-1, 1, size=(5, 7)).astype(np.float32)
    o, mx, dist = softmax(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(o, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(dist, e, rtol=1e-5)


def test_ambiguous_precondition_is_checked_at_call_time() -> None:
    """TCC: O(i) +=! I(i, i + j, j) reads in bounds only when I_0 + I_2 - 1 <= I_1."""
    kernel = tl.compile(INVALID["TCC_ambiguous_precondition"]["tc"])
    good = np.random.default_rng(1).uniform(size=(3, 6, 4)).astype(np.float32)
    expected = np.array([sum(good[i, i + j, j] for j in range(4)) for i in range(3)], dtype=np.float32)
    np.testing.assert_allclose(kernel(good), expected, rtol=1e-5)
    with pytest.raises(tl.ArgumentError, match="out of bounds"):
        kernel(np.zeros((3, 5, 4), dtype=np.float32))


def test_size_dependent_zero_start_is_checked_at_call_time() -> None:
    """convolution_igrad: h starts at KH - 1, zero-based only for 1x1 filters."""
    case = CASES["convolution_igrad_1x1"]
    kernel = tl.compile(case["tc"], case["entry"])
    w = np.ones((4, 3, 3, 3), np.float32)
    d_o = np.ones((2, 4, 5, 6), np.float32)
    with pytest.raises(tl.ArgumentError, match=r"index h of d_I starts at KH - 1.*here it is 2"):
        kernel(w, d_o)
