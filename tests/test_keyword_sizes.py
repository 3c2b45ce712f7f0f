"""Sizes that no input's shape gives (a time-step count): declared by a `where` bound, passed by
keyword at the call (`k(A, T=100)`) and by `--size T=100` on the command line."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from tensorlang.cli import main
from tensorlang.frontend import check_source

RAMP = "def ramp(float(N) A) -> (B) {\n  B(t, i) = A(i) * t where t in 0:T, i in 0:N\n}"
# the dummy-tensor form users wrote before: T bound by an input that is never read
DUMMY = "def ramp(float(N) A, float(T) steps) -> (B) {\n  B(t, i) = A(i) * t where t in 0:T, i in 0:N\n}"
SHIFT = "def shift(float(N) A) -> (B) {\n  B(i) = A(i) + K where i in 0:N - K\n}"


def _ramp(a: np.ndarray, t: int) -> np.ndarray:
    return np.arange(t, dtype=np.float32)[:, None] * a[None, :]


def test_a_name_in_a_where_bound_declares_a_call_time_size():
    program = check_source(RAMP)
    assert [(s.name, s.tensor, s.dim) for s in program.sizes] == [("N", "A", 0), ("T", None, None)]
    assert "size T (given at the call)" in str(program)
    assert str(program.outputs[0].shape) == "(T, N)"


@pytest.mark.parametrize(
    "src, message",
    [
        # an index of the statement is not a size (triangular bounds are not part of the language)
        ("def f(float(N) A) -> (B) { B(i, j) = A(i) where i in 0:N, j in 0:i }", "undefined variable i"),
        # a name used only in an index expression declares nothing
        ("def f(float(N) A) -> (B) { B(i) = A(i + K) }", "K"),
        ("def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:exp }", "exp"),
    ],
)
def test_names_that_are_not_call_time_sizes_stay_errors(src, message):
    with pytest.raises(tl.SemanticError, match=message):
        check_source(src)


@pytest.mark.parametrize("n, t", [(1, 1), (5, 3), (7, 13), (3, 0)])
def test_keyword_sizes_at_the_call(n, t):
    k = tl.compile(RAMP)
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(k(a, T=t), _ramp(a, t))
    np.testing.assert_array_equal(k(a, T=np.int64(t)), _ramp(a, t))  # NumPy integers too
    np.testing.assert_array_equal(tl.compile(DUMMY)(a, np.zeros(t, np.float32)), _ramp(a, t))


def test_a_size_in_index_expressions_after_its_declaration():
    k = tl.compile(SHIFT)
    a = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(k(a, K=2), a[:7] + 2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda k, a: k(a), r"no input's shape gives the size T: pass it by keyword, as in k\(\.\.\., T=8\)"),
        (lambda k, a: k(a, T=2, Q=1), r"Q= is not a size of the def \(its sizes: N, T\)"),
        (lambda k, a: k(a, T=2.0), r"size T must be an integer in \[0, 2\^31\), got 2.0"),
        (lambda k, a: k(a, T=True), "size T must be an integer"),
        (lambda k, a: k(a, T=-1), "size T must be an integer"),
        (lambda k, a: k(a, T=2**31), "size T must be an integer"),
        (lambda k, a: k(a, T=2, N=4), "N=4 but the input shapes give N = 3"),
    ],
)
def test_bad_keyword_sizes_are_argument_errors(call, message):
    k = tl.compile(RAMP)
    with pytest.raises(tl.ArgumentError, match=message):
        call(k, np.ones(3, np.float32))


def test_a_keyword_agreeing_with_the_inputs_is_accepted():
    k = tl.compile(RAMP)
    a = np.ones(3, np.float32)
    np.testing.assert_array_equal(k(a, T=2, N=3), _ramp(a, 2))


def test_keyword_sizes_with_a_cache_warm_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(tmp_path))
    a = np.arange(4, dtype=np.float32)
    tl.compile(RAMP)(a, T=5)
    hot = tl.compile(RAMP)
    assert hot._stages is None  # from the program record
    np.testing.assert_array_equal(hot(a, T=5), _ramp(a, 5))
    with pytest.raises(tl.ArgumentError, match="pass it by keyword"):
        hot(a)


def test_inspect_and_generic_code_with_a_call_time_size():
    k = tl.compile(RAMP, options=tl.Options(specialize=False))
    a = np.ones(6, np.float32)
    for t in (1, 4):
        np.testing.assert_array_equal(k(a, T=t), _ramp(a, t))
    assert "T" in tl.compile(RAMP).inspect("plan", sizes={"N": 6, "T": 3})


def test_command_line_run_with_size(tmp_path, capsys):
    path = tmp_path / "ramp.tc"
    path.write_text(RAMP)
    assert main(["run", str(path), "--shape", "A=5", "--size", "T=3"]) == 0
    assert "B: float32[3, 5]" in capsys.readouterr().out
    assert main(["run", str(path), "--shape", "A=5"]) == 1
    assert "give it with --size T=8" in capsys.readouterr().err
