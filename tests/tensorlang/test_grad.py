"""tl.grad, the front-end side: golden gradient programs, the programs it writes check, wrt, and
located errors for what it cannot differentiate (numbers: tests/test_grad_numeric.py).

After an intended change of the output, rewrite the golden files with
`python -m pytest tests/tensorlang/test_grad.py --accept` and read the diff before committing.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import tensorlang as tl
from tensorlang import cli, frontend

GOLDEN = Path(__file__).resolve().parent / "golden_grad"
GOLDEN_KERNELS = sorted(p.stem for p in GOLDEN.glob("*.tc"))

MATMUL = (GOLDEN / "matmul.tc").read_text()


def _checks(text: str) -> None:
    """The program parses and checks without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frontend.check_source(text)


@pytest.mark.parametrize("kernel", GOLDEN_KERNELS)
def test_grad_text_matches_golden(kernel, request):
    text = tl.grad((GOLDEN / f"{kernel}.tc").read_text())
    path = GOLDEN / f"{kernel}.grad"
    if request.config.getoption("--accept"):
        path.write_text(text)
        return
    assert path.exists(), f"{path.name} missing: run with --accept"
    assert text == path.read_text(), (
        f"{path.name} changed; if intended, rerun with --accept and review the diff"
    )
    _checks(text)


def test_golden_kernels_are_there():
    assert {"matmul", "softmax"} <= set(GOLDEN_KERNELS)


def test_matmul_gradient_is_two_contractions():
    text = tl.grad(MATMUL)
    assert (
        "def matmul_grad(float(M, K) A, float(K, N) B, float(M, N) dC) -> (float(M, K) dA, float(K, N) dB)"
        in text
    )
    assert "dA(m, k) +=! dC(m, n) * B(k, n)" in text
    assert "dB(k, n) +=! dC(m, n) * A(m, k)" in text


def test_wrt_selects_inputs():
    only_b = tl.grad(MATMUL, wrt=["B"])
    assert "-> (float(K, N) dB)" in only_b and "dA" not in only_b
    assert tl.grad(MATMUL, wrt="B") == only_b
    assert tl.grad(MATMUL, wrt="B, A").count("+=!") == 2
    assert "-> (float(K, N) dB, float(M, K) dA)" in tl.grad(MATMUL, wrt="B, A")


def test_default_wrt_skips_integer_inputs():
    src = "def f(double(N) X, int32(N) K) -> (Y) { Y(i) = X(i) * K(i) }"
    text = tl.grad(src)
    assert "-> (double(N) dX)" in text
    _checks(text)


def test_name_selects_the_def_and_names_the_gradient():
    src = MATMUL + "\ndef twice(float(N) X) -> (Y) { Y(i) = 2.0 * X(i) }\n"
    text = tl.grad(src, "twice")
    assert text.startswith("def twice_grad(float(N) X, float(N) dY) -> (float(N) dX) {")
    with pytest.raises(tl.SemanticError, match="several defs"):
        tl.grad(src)


def _located(exc: tl.SemanticError, source: str, fragment: str) -> None:
    """The error points at `fragment` in the source (line, column and caret)."""
    line = source.splitlines()[exc.line - 1]
    assert line[exc.column - 1 :].startswith(fragment), (line, exc.column, fragment)
    assert "^" in str(exc)


def test_wrt_on_an_integer_input_is_located():
    src = "def f(double(N) X, int32(N) K) -> (Y) {\n    Y(i) = X(i) * K(i)\n}"
    with pytest.raises(tl.SemanticError, match="K is a int32 input and has no gradient") as info:
        tl.grad(src, wrt=["X", "K"])
    _located(info.value, src, "K)")


def test_wrt_on_an_unknown_name_is_located():
    with pytest.raises(tl.SemanticError, match="wrt names 'Z', which is not an input of matmul") as info:
        tl.grad(MATMUL, wrt="Z")
    _located(info.value, MATMUL, "matmul")


def test_gather_gradient_is_a_scatter_add():
    """The adjoint of a gather is a scatter-add over the forward's indices; dT's extent along the
    scattered dimension is T's, from the gradient program's declared output (tests/test_scatter_add.py
    checks it against finite differences)."""
    src = "def emb(float(V, E) T, int32(B) I) -> (O) {\n    O(b, e) = T(I(b), e)\n}"
    text = tl.grad(src)
    assert "-> (float(V, E) dT)" in text
    assert "dT(I(b), e) +=! dO(b, e)" in text
    _checks(text)


def test_gather_with_a_shifted_index_is_a_located_error():
    """`T(I(b), 2 * e)` would need the scatter `dT(I(b), 2 * e)`, which the language cannot write."""
    src = "def f(float(V, E) T, int32(B) I) -> (O) {\n    O(b, e) = T(I(b), 2 * e)\n}"
    with pytest.raises(tl.SemanticError, match="needs scatter-add") as info:
        tl.grad(src)
    _located(info.value, src, "T(I(b), 2 * e)")


def test_gather_of_a_tensor_without_gradient_is_fine():
    src = "def f(float(V, E) T, float(B, E) X, int32(B) I) -> (O) { O(b, e) = T(I(b), e) * X(b, e) }"
    text = tl.grad(src, wrt="X")
    assert "dX(b, e) = dO(b, e) * T(I(b), e)" in text
    _checks(text)


def test_non_affine_subscript_is_located():
    src = "def f(float(N) X) -> (O) {\n    O(i) +=! X(i % j) where i in 0:N, j in 1:N\n}"
    with pytest.raises(tl.SemanticError, match="needs scatter-add") as info:
        tl.grad(src)
    _located(info.value, src, "X(i % j)")


def test_builtin_without_rule_is_located():
    src = "def f(float(N) X) -> (O) {\n    O(i) = lgamma(X(i)) + X(i)\n}"
    with pytest.raises(tl.SemanticError, match="lgamma has no derivative rule") as info:
        tl.grad(src)
    _located(info.value, src, "lgamma")


def test_piecewise_constant_builtin_has_zero_gradient():
    text = tl.grad("def f(float(N) X) -> (O) { O(i) = floor(X(i)) * X(i) }")
    assert "dX(i) = dO(i) * floor(X(i))" in text


def test_uninitialised_max_onto_a_fresh_output_is_rejected():
    src = "def f(float(N, M) X) -> (O) {\n    O(n) max= X(n, m)\n}"
    with pytest.raises(tl.SemanticError, match="write `max=!`") as info:
        tl.grad(src)
    _located(info.value, src, "O(n)")


def test_uninitialised_sum_has_the_gradient_of_the_initialised_one():
    a = tl.grad("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) += A(m, k) * B(k, n) }")
    b = tl.grad("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
    assert a == b


def test_recurrence_other_than_a_scan_is_located():
    src = "def f(float(N) X) -> (S) {\n    S(i) = X(i)\n    S(i) = S(N - 1 - i) + X(i) where i in 0:N\n}"
    with pytest.raises(tl.SemanticError, match="scan form") as info:
        tl.grad(src)
    _located(info.value, src, "S(N - 1 - i)")


def test_reduction_reading_its_own_target_is_located():
    src = "def f(float(N, M) X) -> (S) {\n    S(i) = X(i, 0)\n    S(i) += S(i) * X(i, j)\n}"
    with pytest.raises(tl.SemanticError, match="reads S, the tensor it accumulates into"):
        tl.grad(src)


def test_no_float_output_or_input():
    with pytest.raises(tl.SemanticError, match="no floating-point input"):
        tl.grad("def f(int32(N) K) -> (O) { O(i) = float(K(i)) }")
    with pytest.raises(tl.SemanticError, match="no floating-point output"):
        tl.grad("def f(float(N) X) -> (O) { O(i) = int32(X(i)) }")


def test_in_place_updates_become_versions():
    src = """def fcrelu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, m) * W1(n, m)
    O1(b, n) = O1(b, n) + B1(n)
    O1(b, n) = fmax(O1(b, n), 0)
}"""
    text = tl.grad(src)
    assert "O1_0(b, n) +=! I(b, m) * W1(n, m)" in text
    assert "O1_1(b, n) = O1_0(b, n) + B1(n)" in text
    assert "O1(b, n) = fmax" not in text  # the last version is not needed
    _checks(text)


def test_output_extent_that_is_not_a_size_gets_its_own():
    text = tl.grad((GOLDEN / "conv_stride.tc").read_text())
    assert "float(N, F, O_2, O_3) dO" in text
    assert "(h - kh) % 2 == 0" in text and "dO(n, f, (h - kh) / 2, (w - kw) / 2)" in text


def test_names_do_not_collide():
    src = "def f(float(N) X, float(N) dX) -> (Y) { Y(i) = X(i) * dX(i) }"
    text = tl.grad(src)
    assert "-> (float(N) dX_1, float(N) ddX)" in text
    _checks(text)


def test_grad_does_not_import_the_back_end():
    import subprocess
    import sys

    code = (
        "import sys, tensorlang as tl; tl.grad('def f(float(N) X) -> (Y) { Y(i) = X(i) }'); "
        "print(sorted(m for m in ('islpy', 'llvmlite', 'codegen', 'polyhedral') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_grad_prints_the_program(tmp_path, capsys):
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    assert cli.main(["grad", str(path), "--wrt", "A"]) == 0
    out = capsys.readouterr().out
    assert out == tl.grad(MATMUL, wrt="A")
    assert cli.main(["grad", str(path), "--wrt", "Q"]) == 1
    err = capsys.readouterr().err
    assert "mm.tc:1:5" in err and "wrt names 'Q'" in err
