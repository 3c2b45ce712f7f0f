"""emit: vectorisable math (exp, log, tanh, ...) → branch-free LLVM IR

`emit_vecmath(builder, name, args)` lowers one of `VECMATH_BUILTINS` on a float32 / float64
value to a call of an ``internal alwaysinline`` function (``__tl_vm_<name>_f32`` / ``_f64``,
defined once per module) whose body is straight-line arithmetic, integer bit manipulation and
``select``s: no calls other than the ``llvm.fma`` / ``llvm.rint`` / ``llvm.fabs`` /
``llvm.copysign`` / ``llvm.maxnum`` / ``llvm.minnum`` intrinsics, which all map to single
AVX-512 instructions. After inlining, LLVM's loop vectoriser therefore widens loops such as
``out(i) = exp(a(i))`` to AVX-512 code (``<8 x float>`` / ``<4 x double>`` with the host's
default 256-bit preference, ``<16 x float>`` / ``<8 x double>`` under
``"prefer-vector-width"="512"``) instead of scalarising libm calls. (The host is assumed to have FMA; without it ``llvm.fma`` becomes a libm call.)

Algorithms (coefficients: Chebyshev fits with ``mpmath.chebyfit`` at 50 digits on the stated
interval, widened by 2 %, rounded to the target precision):

* exp, exp2, exp10: n = rint(x / log_b 2), Cody–Waite reduction x - n·c_hi - n·c_lo = r + dr
  (fmas; the first is exact, dr is the rounding error of r); b^r - 1 = r·ln b + r²·q(r)
  (q of degree 5 for float, 10 for double, on |r| <= log_b(2)/2) kept as hi + lo (exact
  product r·ln b via fma) and added to 1 with Fast2Sum; reconstruction multiplies by 2^(n>>1)
  and 2^(n - (n>>1)) built from exponent bits, so results in the overflow and subnormal ranges
  are rounded once. The argument is clamped first, so ±inf and out-of-range inputs give
  inf / 0. This is the portable form, used for float64 and on hosts without AVX-512.
* exp, exp2 in float32 on AVX-512 hosts (the "vscalef" form, 14 vector operations against
  about 30): the clamp is a compare-and-select that keeps NaN; n = x·log_b 2 rounded
  by adding 1.5·2^23 in the same fma, so the bits of that sum also hold n as an integer (no
  float-to-int conversion, which would be poison for NaN); r by the same Cody–Waite split
  without the dr term (exp2: r = x - n, exact); b^r = 1 + r·q(r) with q of degree 5 fitted to
  (b^r - 1)/r; the result is llvm.ldexp(b^r, n), one vscalefps, which rounds overflow, underflow
  and subnormal results once and passes NaN through. It gives up some of the portable form's
  margin but stays within 1 ulp: checked on every one of the 2^32 float32 inputs, the largest
  error is 0.951 ulp of the exact value for exp and 0.838 for exp2, so results are at most one
  float away from the correctly rounded ones. About 1.8× faster (0.25 against 0.44 ns per
  element in L2 here), which is most of softmax's compute. exp10 in this form reached 1.03 ulp
  of the exact value (ln 10 magnifies the reduction's rounding error), so exp10 keeps the
  portable form everywhere.
* expm1: the same reduction; for |n| <= precision (2^n - 1) + 2^n·hi is summed exactly (2Sum)
  and 2^n·lo added; beyond, (1 + hi + (lo - 2^-n))·2^n; ±0 and NaN pass through, x below -30
  (float) / -60 (double) gives -1.
* log, log2, log10, log1p: subnormals scaled by 2^25 / 2^54; x = 2^k·m with m in [√½, √2)
  from the bits; f = m - 1, s = f/(2+f), log1p(f) = f - f²/2 + s·(f²/2 + R(s²)) (fdlibm's
  decomposition, R degree 2 / 6 in s²) kept as hi + lo, multiplied by 1/ln b in double-word
  arithmetic and added to k·log_b 2 with Fast2Sum. log1p uses u = 1 + x and adds the rounding
  correction (x - (u - 1))/u. log(±0) = -inf, log(x < 0) = NaN, log(inf) = inf.
* tanh, float64: |x| < 0.625: x + x³·T(x²) (degree 11); beyond: 1 - 2/(e^{2|x|} + 1) with the
  inline exp kept as hi + lo and the division and subtraction compensated (exact remainder via
  fma, Fast2Sum); 2|x| is clamped, so large |x| saturates to exactly ±1; tanh(±0) = ±0.
* tanh, float32: the rational minimax approximation x·P(x²)/Q(x²) on |x| <= 7.905 that Eigen
  and XLA use for float tanh (degree 13/6), x itself below 4e-4, ±1 above 9.1. About six times
  fewer operations than the compensated form (0.59 against 0.91 ns/element in cache here), for
  which it gives up accuracy: at most 5 ulp from the correctly rounded result, measured on every
  third float32 bit pattern of (0, 9.2] (the function is odd and the formula symmetric).

Documented accuracy, measured: "ulp" = largest distance in ulps from the correctly rounded
result; "exact" = largest |got - exact| / ulp(exact) over normal results. float32: every 7th
bit pattern of the whole 32-bit space (6.1e8 inputs: all binades, subnormals, ±0, ±inf, NaNs)
against NumPy in float64. float64: 8 × 2^21 random bit patterns plus as many uniform samples of
the non-trivial range, log-spaced grids and special values (~3e7 inputs) against NumPy in x87
long double, spot-checked against mpmath. tests/codegen/test_vecmath.py re-checks the 1-ulp
bound (and exact special values) on smaller samples.

=========  ===================  ===================
builtin    float32 ulp (exact)  float64 ulp (exact)
=========  ===================  ===================
exp        1 (0.650; 0.951 *)   1 (0.653)
exp2       1 (0.587; 0.838 *)   1 (0.603)
exp10      1 (0.703)            1 (0.709)
expm1      1 (0.868)            1 (1.036)
log        1 (0.719)            1 (0.685)
log2       1 (0.803)            1 (0.780)
log10      1 (0.744)            1 (0.675)
log1p      1 (0.736)            1 (0.708)
tanh       5 (rational form)    1 (0.747)
=========  ===================  ===================

(*) the vscalef form used on AVX-512 hosts, measured on all 2^32 float32 inputs.

Results in the subnormal range are rounded once from the same approximation (absolute error
within a unit of the smallest subnormal). Special values: NaN → NaN; exp(-inf) = 0,
exp(+inf) = inf; expm1(-inf) = -1, expm1(±0) = ±0; log(±0) = -inf, log(x < 0) = NaN,
log(+inf) = inf; log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(±0) = ±0; tanh(±inf) = ±1,
tanh(±0) = ±0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import llvmlite.ir as ir

from ..host import host_has_avx512
from .vecformat import EXPQ_F, TANH_SMALL, VecIR

__all__ = ["VECMATH_BUILTINS", "emit_vecmath"]

# ---------------------------------------------------------------------------------------------
# exp family
# ---------------------------------------------------------------------------------------------


def _reduce(v: VecIR, x, inv: float, c: tuple[float, float]):
    """n = rint(x·inv) (as float) and x - n·(c_hi + c_lo) = r + dr (double-word)."""
    n = v.intr("rint", v.mul(x, v.c(inv)))
    neg_n = v.b.fneg(n)
    r1 = v.fma(neg_n, v.c(c[0]), x)  # exact
    r = v.fma(neg_n, v.c(c[1]), r1)
    dr = v.fma(neg_n, v.c(c[1]), v.sub(r1, r))  # rounding error of r (r1 - r is exact)
    return n, r, dr


def _expm1_reduced(v: VecIR, base: str, r, dr):
    """b^(r + dr) - 1 = hi + lo for the reduced argument; hi = r·ln b rounded, |lo| << |hi|."""
    k = v.k
    if base == "e":
        hi, ln_lo, coeffs = r, None, k.exp_coeffs
        lo = dr
    else:
        (ln_hi, ln_lo), coeffs = (k.ln2w, k.exp2_coeffs) if base == "2" else (k.ln10w, k.exp10_coeffs)
        hi = v.mul(r, v.c(ln_hi))
        lo = v.fma(r, v.c(ln_hi), v.b.fneg(hi))  # exact product error
        lo = v.fma(r, v.c(ln_lo), lo)
        if dr is not None:
            lo = v.fma(dr, v.c(ln_hi), lo)
    return hi, v.fma(v.mul(r, r), v.horner(r, coeffs), lo)


def _one_plus(v: VecIR, hi, lo):
    """1 + hi + lo for |hi| < 1 (Fast2Sum)."""
    s = v.add(v.c(1.0), hi)
    err = v.sub(hi, v.sub(s, v.c(1.0)))
    return v.add(s, v.add(err, lo))


def _exp_base(base: str) -> Callable[[VecIR, ir.Value], ir.Value]:
    def body(v: VecIR, x):
        k = v.k
        if base == "2":
            xc = v.clamp(x, k.exp2_lo, k.exp2_hi)
            n = v.intr("rint", xc)
            r, dr = v.sub(xc, n), None  # exact
        elif base == "10":
            xc = v.clamp(x, k.exp10_lo, k.exp10_hi)
            n, r, dr = _reduce(v, xc, k.log2_10, k.lg2)
        else:
            xc = v.clamp(x, k.exp_lo, k.exp_hi)
            n, r, dr = _reduce(v, xc, k.log2e, k.ln2)
        p = _one_plus(v, *_expm1_reduced(v, base, r, dr))
        return v.nan_passthrough(x, v.scale2(p, v.to_int(n)))

    return body


_ROUND_MAGIC_F = 12582912.0  # 1.5·2^23: adding it rounds a float32 of magnitude < 2^22 to an integer


def _exp_scalef_f32(base: str) -> Callable[[VecIR, ir.Value], ir.Value]:
    """float32 e^x or 2^x in 14 vector operations, for hosts with AVX-512 (module docstring)."""

    def body(v: VecIR, x):
        k = v.k
        lo, hi = (k.exp2_lo, k.exp2_hi) if base == "2" else (k.exp_lo, k.exp_hi)
        # clamp with compare-and-select, which keeps NaN (one vmaxps / vminps each)
        xc = v.sel(v.cmp("<", x, v.c(lo)), v.c(lo), x)
        xc = v.sel(v.cmp(">", xc, v.c(hi)), v.c(hi), xc)
        magic = v.c(_ROUND_MAGIC_F)
        # n = x·log_b(2) rounded to an integer by the magic addition; its bits hold n as well
        t = v.add(xc, magic) if base == "2" else v.fma(xc, v.c(k.log2e), magic)
        n = v.sub(t, magic)
        n_int = v.b.sub(v.bits(t), v.bits(magic))  # an integer for NaN too (no fptosi poison)
        if base == "2":
            r = v.sub(xc, n)  # exact
        else:
            c_hi, c_lo = k.ln2
            neg_n = v.b.fneg(n)
            r = v.fma(neg_n, v.c(c_lo), v.fma(neg_n, v.c(c_hi), xc))
        p = v.fma(r, v.horner(r, EXPQ_F[base]), v.c(1.0))  # b^r
        return v.ldexp(p, n_int)  # p·2^n rounded once (vscalefps): overflow, subnormals, NaN

    return body


def _expm1(v: VecIR, x):
    xc = v.clamp(x, v.k.expm1_lo, v.k.exp_hi)
    n, r, dr = _reduce(v, xc, v.k.log2e, v.k.ln2)
    hi, lo = _expm1_reduced(v, "e", r, dr)
    ni = v.to_int(n)
    n1 = v.b.ashr(ni, v.i(1))
    s1 = v.pow2(n1)
    s2 = v.pow2(v.b.sub(ni, n1))
    s = v.mul(s1, s2)  # exact (2^n representable) wherever `moderate` is used
    # moderate n: (s - 1) + s·hi + s·lo, the first two summed exactly (2Sum); s - 1 is exact
    # for |n| <= precision and s·hi is exact.
    a = v.sub(s, v.c(1.0))
    b = v.mul(s, hi)
    t = v.add(a, b)
    bb = v.sub(t, a)
    err = v.add(v.sub(a, v.sub(t, bb)), v.sub(b, bb))
    moderate = v.add(t, v.fma(s, lo, err))
    # large n: (1 + hi + lo - 2^-n)·2^n, the -2^-n folded into the small tail
    inv_s = v.mul(v.pow2(v.b.neg(n1)), v.pow2(v.b.sub(n1, ni)))
    big = v.mul(v.mul(_one_plus(v, hi, v.sub(lo, inv_s)), s1), s2)
    res = v.sel(v.cmp(">", n, v.c(v.k.expm1_big)), big, moderate)
    res = v.sel(v.cmp("==", x, v.c(0.0)), x, res)  # ±0
    return v.nan_passthrough(x, res)


# float32 tanh: odd/even rational minimax approximation on [-7.905, 7.905], the one Eigen and
# XLA use for float tanh: tanh(x) ≈ x·P(x²)/Q(x²). About 15 vector operations and one division,
# against ~90 for the compensated exp form, at ≤ 7 ulp (measured: see the module docstring).
_TANH_F32_P = (
    -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
    1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03,
)  # fmt: skip
_TANH_F32_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
_TANH_F32_CLAMP = 7.90531110763549805
_TANH_F32_TINY = 0.0004  # below: tanh(x) rounds to x
_TANH_F32_ONE = 9.1  # above: tanh(x) rounds to ±1


def _tanh_f32(v: VecIR, x):
    # compare-and-select clamps (one vmaxps / vminps each) keep NaN, which then flows through
    # the arithmetic and both selects below: no separate NaN fix-up
    xc = v.sel(v.cmp("<", x, v.c(-_TANH_F32_CLAMP)), v.c(-_TANH_F32_CLAMP), x)
    xc = v.sel(v.cmp(">", xc, v.c(_TANH_F32_CLAMP)), v.c(_TANH_F32_CLAMP), xc)
    x2 = v.mul(xc, xc)
    p = v.mul(v.horner(x2, _TANH_F32_P), xc)
    q = v.horner(x2, _TANH_F32_Q)
    ax = v.intr("fabs", x)
    r = v.sel(v.cmp("<", ax, v.c(_TANH_F32_TINY)), x, v.div(p, q))  # x keeps ±0 and tiny values exact
    return v.sel(v.cmp(">", ax, v.c(_TANH_F32_ONE)), v.intr("copysign", v.c(1.0), x), r)


def _tanh(v: VecIR, x):
    if v.f32:
        return _tanh_f32(v, x)
    ax = v.intr("fabs", x)
    # small |x|: odd polynomial
    z = v.mul(x, x)
    small = v.fma(v.mul(z, x), v.horner(z, v.k.tanh_coeffs), x)
    # large |x|: 1 - 2/(e^{2|x|} + 1); 2|x| is clamped so a single 2^n scale suffices
    y = v.intr("minnum", v.add(ax, ax), v.c(v.k.tanh_clamp))
    n, r, dr = _reduce(v, y, v.k.log2e, v.k.ln2)
    hi, lo = _expm1_reduced(v, "e", r, dr)
    one = v.c(1.0)
    s1 = v.add(one, hi)  # e^y = (ph + pl)·2^n, normalised with two Fast2Sums
    t = v.add(v.sub(hi, v.sub(s1, one)), lo)
    ph = v.add(s1, t)
    pl = v.add(v.sub(s1, ph), t)
    sc = v.pow2(v.to_int(n))
    eh = v.mul(ph, sc)
    d = v.add(eh, one)  # e^y + 1 = d + dl, Fast2Sum (eh >= 1)
    dl = v.fma(pl, sc, v.sub(one, v.sub(d, eh)))
    q = v.div(v.c(2.0), d)  # 2/(d + dl) = q + ql
    rem = v.fma(v.b.fneg(q), d, v.c(2.0))  # exact
    ql = v.mul(v.fma(v.b.fneg(q), dl, rem), v.mul(q, v.c(0.5)))
    z = v.sub(one, q)  # 1 - q - ql, Fast2Sum (q < 1)
    large = v.add(z, v.sub(v.sub(v.sub(one, z), q), ql))
    res = v.intr("copysign", v.sel(v.cmp("<", ax, v.c(TANH_SMALL)), small, large), x)  # ±0
    return v.nan_passthrough(x, res)


# ---------------------------------------------------------------------------------------------
# log family
# ---------------------------------------------------------------------------------------------


def _log_core(v: VecIR, x, scale_subnormals: bool = True):
    """For finite x > 0: (k, hi, lo) with log(x) = k·ln2 + hi + lo, |hi| <= 0.35, lo tiny."""
    k_ = v.k
    if scale_subnormals:
        sub = v.cmp("<", x, v.c(k_.tiny))
        x = v.sel(sub, v.mul(x, v.c(2.0**k_.sub_scale)), x)
    t = v.b.sub(v.bits(x), v.i(k_.sqrt_half_bits))
    k = v.b.ashr(t, v.i(k_.mant))
    if scale_subnormals:
        k = v.b.add(k, v.sel(sub, v.i(-k_.sub_scale), v.i(0)))
    m = v.from_bits(v.b.add(v.b.and_(t, v.i((1 << k_.mant) - 1)), v.i(k_.sqrt_half_bits)))
    f = v.sub(m, v.c(1.0))  # exact, in [√½ - 1, √2 - 1)
    s = v.div(f, v.add(v.c(2.0), f))
    zz = v.mul(s, s)
    big_r = v.mul(zz, v.horner(zz, k_.log_coeffs))
    hfsq = v.mul(v.c(0.5), v.mul(f, f))
    hi = v.sub(f, hfsq)
    lo = v.add(v.sub(v.sub(f, hi), hfsq), v.mul(s, v.add(hfsq, big_r)))  # first two ops exact
    return v.b.sitofp(k, v.ty), hi, lo


def _log_combine(v: VecIR, kf, hi, lo, base: str, extra=None):
    """k·log_b(2) + (hi + lo)/ln b (+ extra, a small correction in natural-log units)."""
    k_ = v.k
    if extra is not None:
        lo = v.add(lo, extra)
    if base == "e":
        c_hi, c_lo = k_.ln2_k
        a = v.mul(kf, v.c(c_hi))  # exact
        tail = v.fma(kf, v.c(c_lo), lo)
        b = hi
    else:
        if base == "2":
            c_hi, c_lo = 1.0, 0.0
            w_hi, w_lo = k_.inv_ln2
        else:
            c_hi, c_lo = k_.lg2_k
            w_hi, w_lo = k_.inv_ln10
        a = kf if c_hi == 1.0 else v.mul(kf, v.c(c_hi))  # exact
        b = v.mul(hi, v.c(w_hi))
        b_err = v.fma(hi, v.c(w_hi), v.b.fneg(b))  # exact product error
        tail = v.fma(lo, v.c(w_hi), v.fma(hi, v.c(w_lo), b_err))
        if c_lo:
            tail = v.fma(kf, v.c(c_lo), tail)
    s = v.add(a, b)  # Fast2Sum: |a| >= |b| unless a = 0
    err = v.sub(b, v.sub(s, a))
    return v.add(s, v.add(err, tail))


def _log_specials(v: VecIR, x, r):
    """log_b specials: x = +inf → inf, ±0 → -inf, x < 0 → NaN, NaN → NaN."""
    r = v.sel(v.cmp("==", x, v.c(math.inf)), x, r)
    r = v.sel(v.cmp("==", x, v.c(0.0)), v.c(-math.inf), r)
    r = v.sel(v.cmp("<", x, v.c(0.0)), v.c(math.nan), r)
    return v.nan_passthrough(x, r)


def _log_base(base: str) -> Callable[[VecIR, ir.Value], ir.Value]:
    def body(v: VecIR, x):
        kf, hi, lo = _log_core(v, x)
        return _log_specials(v, x, _log_combine(v, kf, hi, lo, base))

    return body


def _log1p(v: VecIR, x):
    u = v.add(v.c(1.0), x)
    # u >= 2^-p is normal for x > -1, so no subnormal scaling; c = rounding error of u, over u
    kf, hi, lo = _log_core(v, u, scale_subnormals=False)
    c = v.div(v.sub(x, v.sub(u, v.c(1.0))), u)
    r = _log_combine(v, kf, hi, lo, "e", extra=c)
    r = v.sel(v.cmp("==", x, v.c(math.inf)), x, r)
    r = v.sel(v.cmp("==", x, v.c(-1.0)), v.c(-math.inf), r)
    r = v.sel(v.cmp("<", x, v.c(-1.0)), v.c(math.nan), r)
    r = v.sel(v.cmp("==", x, v.c(0.0)), x, r)  # ±0
    return v.nan_passthrough(x, r)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------

_BODIES: dict[str, Callable[[VecIR, ir.Value], ir.Value]] = {
    "exp": _exp_base("e"),
    "exp2": _exp_base("2"),
    "exp10": _exp_base("10"),
    "expm1": _expm1,
    "log": _log_base("e"),
    "log2": _log_base("2"),
    "log10": _log_base("10"),
    "log1p": _log1p,
    "tanh": _tanh,
}

#: Builtins implemented here (one float argument each).
VECMATH_BUILTINS: frozenset[str] = frozenset(_BODIES)


_SCALEF_F32: dict[str, Callable[[VecIR, ir.Value], ir.Value]] = {
    "exp": _exp_scalef_f32("e"),
    "exp2": _exp_scalef_f32("2"),
}


def emit_vecmath(
    builder: ir.IRBuilder, name: str, args: list[ir.Value], *, scalef: bool | None = None
) -> ir.Value:
    """Emit `name(args[0])` for a float / double value as a call of an internal alwaysinline
    function defined (once per module) with a branch-free body. `scalef` selects the float32
    exp / exp2 bodies that need AVX-512 (default: when the host has it)."""
    if name not in _BODIES:
        raise ValueError(f"no vectorisable implementation of {name!r}")
    (x,) = args
    ty = x.type
    if not isinstance(ty, ir.FloatType | ir.DoubleType):
        raise ValueError(f"{name}: unsupported argument type {ty}")
    v = VecIR(builder, ty)
    if scalef is None:
        scalef = host_has_avx512()
    use_scalef = scalef and v.f32 and name in _SCALEF_F32
    body = _SCALEF_F32[name] if use_scalef else _BODIES[name]
    fname = f"__tl_vm_{name}_{v.sfx}" + ("_scalef" if use_scalef else "")
    mod = builder.module
    fn = mod.globals.get(fname)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ty, [ty]), fname)
        fn.linkage = "internal"
        for attr in ("nounwind", "alwaysinline"):
            fn.attributes.add(attr)
        inner = VecIR(ir.IRBuilder(fn.append_basic_block("entry")), ty)
        inner.b.ret(body(inner, fn.args[0]))
    return builder.call(fn, [x])
