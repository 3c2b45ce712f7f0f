"""Range inference through guarded reads (issue 9, item 1): a read that `?:`, `&&` or `||` performs
only where an affine guard holds does not narrow a reduction index when the guard implies its
subscript bounds; otherwise the narrowing stays (TC's rule) but is reported, never silent."""

from __future__ import annotations

import warnings

import pytest
import sympy

from tensorlang import ir
from tensorlang.errors import SemanticError, TensorLangWarning
from tensorlang.frontend import check_source

S = ir.size_symbol

PADDED_CONV = """def c(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""


def quiet(src: str) -> ir.Program:
    """Check `src`, failing on any TensorLangWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", TensorLangWarning)
        return check_source(src)


def ranges_of(p: ir.Program, statement: int = 0) -> dict[str, tuple]:
    return {r.var: (r.lo, r.hi) for r in p.statements[statement].ranges}


def same(a, b) -> bool:
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def test_padded_convolution_sums_every_tap():
    p = quiet(PADDED_CONV)
    r = ranges_of(p)
    assert r["kh"] == (0, 3) and r["kw"] == (0, 3) and r["c"] == (0, S("C"))
    assert r["h"] == (0, S("H")) and r["w"] == (0, S("W"))
    assert p.outputs[0].shape == (S("N"), S("F"), S("H"), S("W"))
    assert not p.warnings


@pytest.mark.parametrize(
    "guard",
    [
        "0 <= h + kh - 1 && h + kh - 1 <= H - 1",  # flipped and non-strict forms
        "h + kh >= 1 && H > h + kh - 1",  # constant moved across, `>` for `<`
        "h + kh - 1 >= 0 && h + kh <= H",
        "!(h + kh - 1 < 0 || h + kh - 1 >= H)",  # a negated disjunction
        "1 <= kh + h && (kh + h - 1 < H && 1 == 1)",  # extra conjuncts, other order
    ],
)
def test_equivalent_guard_forms(guard):
    src = f"def c(float(H) I, float(3) K) -> (O) {{ O(h) +=! ({guard}) ? I(h + kh - 1) * K(kh) : 0.0 where h in 0:H }}"
    assert ranges_of(quiet(src))["kh"] == (0, 3)


def test_false_branch_and_nested_guards_and_lazy_and():
    false_branch = (
        "def c(float(H) I, float(3) K) -> (O) {"
        " O(h) +=! (h + kh - 1 < 0 || h + kh - 1 >= H) ? 0.0 : I(h + kh - 1) * K(kh) where h in 0:H }"
    )
    nested = (
        "def c(float(H) I, float(3) K) -> (O) {"
        " O(h) +=! (h + kh - 1 >= 0) ? ((h + kh - 1 < H) ? I(h + kh - 1) * K(kh) : 0.0) : 0.0 where h in 0:H }"
    )
    lazy_and = (
        "def c(float(H) I, float(3) K) -> (O) {"
        " O(h) +=! (h + kh >= 1 && h + kh <= H && I(h + kh - 1) > 0.0) ? K(kh) : 0.0 where h in 0:H }"
    )
    for src in (false_branch, nested, lazy_and):
        assert ranges_of(quiet(src))["kh"] == (0, 3), src


def test_a_one_sided_guard_drops_only_the_bound_it_implies():
    # causal convolution: the guard implies 0 <= t - k, and t - k < T holds anyway for t < T, k >= 0
    causal = "def c(float(T) X, float(K) Wt) -> (O) { O(t) +=! (t - k >= 0) ? X(t - k) * Wt(k) : 0.0 where t in 0:T }"
    assert ranges_of(quiet(causal))["k"] == (0, S("K"))


def test_guard_that_does_not_imply_the_bounds_narrows_with_a_located_warning():
    src = (
        "def c(float(H) I, float(3) K) -> (O) {\n"
        "  O(h) +=! (h + kh - 1 >= 0) ? I(h + kh - 1) * K(kh) : 0.0 where h in 0:H\n}"
    )
    with pytest.warns(TensorLangWarning) as record:
        p = check_source(src)
    # 0 <= h + kh - 1 is implied (dropped); h + kh - 1 < H is not, and still narrows kh (TC: 1:2)
    assert ranges_of(p)["kh"] == (0, 2)
    (w,) = [str(r.message) for r in record]
    assert "index kh narrowed to 0:2 by the guarded read I(h + kh - 1)" in w
    assert "(the other accesses allow 0:3)" in w
    assert w.startswith("<source>:2:32:")
    assert "   2 |   O(h) +=!" in w and w.endswith(" ^" + "~" * 12)
    assert p.warnings == (w,)
    unrelated = src.replace("(h + kh - 1 >= 0)", "(h >= 1)")  # a guard about another subscript: TC's rule
    with pytest.warns(TensorLangWarning, match="index kh narrowed to 1:2"):
        assert ranges_of(check_source(unrelated))["kh"] == (1, 2)


def test_lhs_index_keeps_tcs_rule_and_warns_when_a_guarded_read_narrows_it():
    src = "def f(float(N) A, float(N) B) -> (O) { O(i) = B(i) + ((i < N - 1) ? A(i + 1) : 0.0) }"
    with pytest.warns(
        TensorLangWarning, match=r"index i narrowed to 0:N - 1 by the guarded read A\(i \+ 1\)"
    ):
        p = check_source(src)
    assert p.outputs[0].shape == (S("N") - 1,)  # the output size TC gives, unchanged


def test_lhs_index_keeps_tcs_rule_even_when_the_guard_implies_the_bounds():
    src = "def f(float(N) A, float(M) B) -> (O) { O(i) = B(i) + ((i < N) ? A(i) : 0.0) }"
    with pytest.warns(TensorLangWarning, match=r"index i narrowed to 0:Min\(M, N\)"):
        p = check_source(src)
    assert same(p.outputs[0].shape[0], sympy.Min(S("M"), S("N")))


def test_index_bounded_only_by_guarded_reads_uses_them_silently():
    scan = "def make_idx(int32(K) Segments) -> (Idx) { Idx(k) +=! (r_k < k) ? Segments(r_k) : 0 where k in 0:K+1 }"
    assert ranges_of(quiet(scan))["r_k"] == (0, S("K"))
    # the guard implies the read's bounds, but dropping them would leave j unbounded: keep them
    implied = "def f(float(N) A) -> (O) { O(i) +=! (j >= 0 && j < N) ? A(j) : 0.0 where i in 0:3 }"
    assert ranges_of(quiet(implied))["j"] == (0, S("N"))
    lhs_only = "def f(float(N) A) -> (O) { O(i) = (i >= 0) ? A(i) : 0.0 }"
    assert quiet(lhs_only).outputs[0].shape == (S("N"),)


def test_non_affine_guards_keep_the_read_constraints():
    src = "def f(float(N) A, float(3) K, float(N) X) -> (O) { O(i) +=! (X(i) > 0.0) ? A(i + k) * K(k) : 0.0 where i in 0:N - 2 }"
    assert ranges_of(quiet(src))["k"] == (0, 3)
    narrowing = "def f(float(N) A, float(3) K, float(N) X) -> (O) { O(i) +=! (X(i) > 0.0) ? A(i + k) * K(k) : 0.0 where i in 0:N }"
    with pytest.warns(TensorLangWarning, match="index k narrowed to 0:1"):
        assert ranges_of(check_source(narrowing))["k"] == (0, 1)


def test_guard_rule_does_not_hide_range_errors():
    with pytest.raises(SemanticError, match="does not start at 0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TensorLangWarning)
            check_source("def f(float(N) A) -> (O) { O(i) = (i >= 1) ? A(i - 1) : 0.0 }")


def test_unguarded_programs_keep_their_ranges():
    conv = "def c(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) { O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * W1(m,c,kh,kw) }"
    r = ranges_of(quiet(conv))
    assert r["kh"] == (0, S("KH")) and same(r["h"][1], S("H") - S("KH") + 1)
