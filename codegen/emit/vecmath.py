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
from .floatir import FloatIR

__all__ = ["VECMATH_BUILTINS", "emit_vecmath"]

# ---------------------------------------------------------------------------------------------
# Coefficients, highest degree first (see the module docstring for how they were derived).
# ---------------------------------------------------------------------------------------------

# (e^r - 1 - r) / r² on |r| <= ln2/2
_EXP_F = (
    0.00019892999262083322, 0.0013935458846390247, 0.00833330862224102, 0.04166644811630249,
    0.1666666716337204, 0.5,
)  # fmt: skip
_EXP_D = (
    2.0916218856461214e-09, 2.510736219601001e-08, 2.7557269888171584e-07, 2.7557250141961856e-06,
    2.4801587328568198e-05, 0.00019841269879050321, 0.0013888888888882868, 0.0083333333333249,
    0.04166666666666667, 0.1666666666666667, 0.5,
)  # fmt: skip
# (2^r - 1 - r·ln2) / r² on |r| <= 1/2
_EXP2_F = (
    1.5292494936147705e-05, 0.0001545517152408138, 0.0013333519455045462, 0.009618078358471394,
    0.05550410971045494, 0.24022650718688965,
)  # fmt: skip
_EXP2_D = (
    2.5726966735584423e-11, 4.455341656697629e-10, 7.054898994258197e-09, 1.017806050210123e-07,
    1.3215486804514463e-06, 1.525273383308984e-05, 0.00015403530393374936, 0.0013333558146414958,
    0.009618129107628479, 0.0555041086648216, 0.24022650695910072,
)  # fmt: skip
# (10^r - 1 - r·ln10) / r² on |r| <= log10(2)/2
_EXP10_F = (
    0.068266861140728, 0.2076898068189621, 0.5393813848495483, 1.1712490320205688,
    2.0346786975860596, 2.650949001312256,
)  # fmt: skip
_EXP10_D = (
    4.645915609675709e-05, 0.00024219965356453595, 0.001154497712730025, 0.005013916268448627,
    0.019597694647788513, 0.0680893652040292, 0.2069958486967784, 0.5393829291950359,
    1.1712551489122671, 2.034678592293477, 2.650949055239199,
)  # fmt: skip
# float32 exp / exp2 with AVX-512 (the vscalef form): (b^r - 1) / r on |r| <= log_b(2)/2, degree 5
_EXPQ_F = {
    "e": (
        0.0013935451861470938, 0.00837059784680605, 0.04166644811630249, 0.16666491329669952, 0.5, 1.0,
    ),
    "2": (
        0.0001545517152408138, 0.0013393183471634984, 0.009618078358471394, 0.05550352856516838,
        0.24022650718688965, 0.6931471824645996,
    ),
}  # fmt: skip
# (2 atanh(s)/s - 2) / s² in z = s² on [0, ((√2-1)/(√2+1))²]
_LOG_F = (0.2960069179534912, 0.3998831808567047, 0.6666668653488159)
_LOG_D = (
    0.14643628601909797, 0.15329500754204178, 0.18182956608063458, 0.2222221019926421,
    0.28571428631764334, 0.39999999999886615, 0.666666666666667,
)  # fmt: skip
# (tanh(x) - x) / x³ in z = x² on [0, 0.625²]
_TANH_F = (
    0.002292744815349579, -0.008343945257365704, 0.02176891826093197, -0.053959257900714874,
    0.13333304226398468, -0.3333333432674408,
)  # fmt: skip
_TANH_D = (
    6.485163482793113e-06, -3.12011014257974e-05, 9.257116129556769e-05, -0.0002375906496055562,
    0.0005896606577757043, -0.0014557754120478055, 0.0035921217511549622, -0.008863235103240878,
    0.021869488519008305, -0.05396825396789699, 0.13333333333333042, -0.3333333333333333,
)  # fmt: skip

_TANH_SMALL = 0.625


class _Fmt:
    """Per-precision constants."""

    def __init__(self, f32: bool):
        self.f32 = f32
        self.bits = 32 if f32 else 64
        self.mant = 23 if f32 else 52  # explicit mantissa bits
        self.bias = 127 if f32 else 1023
        # rint(x·log2 e) etc. and the Cody–Waite splits: c_hi = c rounded to the precision (the
        # first fma of the reduction is then exact), c_lo = c - c_hi.
        self.log2e = 1.4426950216293335 if f32 else 1.4426950408889634
        self.ln2 = (
            (0.6931471824645996, -1.9046542121259336e-09)
            if f32
            else (0.6931471805599453, 2.3190468138462996e-17)
        )
        self.log2_10 = 3.321928024291992 if f32 else 3.321928094887362
        # ln2 and ln10 as hi + lo (the linear term of 2^r and 10^r)
        self.ln2w = (
            (0.6931471824645996, -1.9046542121259336e-09)
            if f32
            else (0.6931471805599453, 2.3190468138462996e-17)
        )
        self.ln10w = (
            (2.3025851249694824, -3.1975435632602967e-08)
            if f32
            else (2.302585092994046, -2.1707562233822494e-16)
        )
        self.lg2 = (
            (0.3010300099849701, -1.432098883924482e-08)
            if f32
            else (0.3010299956639812, -2.8037281277851704e-18)
        )
        # For log: k·c_hi must be exact (c_hi has >= 11 trailing zero bits), c = c_hi + c_lo.
        self.ln2_k = (
            (0.693145751953125, 1.428606765330187e-06)
            if f32
            else (0.6931471805601177, -1.7239444525614835e-13)
        )
        self.lg2_k = (
            (0.301025390625, 4.605039066518657e-06) if f32 else (0.3010299956640665, -8.532344317057107e-14)
        )
        self.inv_ln2 = (
            (1.4426950216293335, 1.925963033500011e-08)
            if f32
            else (1.4426950408889634, 2.0355273740931033e-17)
        )
        self.inv_ln10 = (
            (0.4342944920063019, -1.0103049952192578e-08)
            if f32
            else (0.4342944819032518, 1.098319650216765e-17)
        )
        self.sqrt_half_bits = 0x3F3504F3 if f32 else 0x3FE6A09E667F3BCD
        self.sub_scale = 25 if f32 else 54  # subnormal inputs to log are multiplied by 2^this
        self.tiny = 2.0**-126 if f32 else 2.0**-1022
        # exp clamps: beyond them the result is inf / 0 (and n stays in the two-step range)
        self.exp_lo, self.exp_hi = (-104.0, 89.0) if f32 else (-746.0, 710.0)
        self.exp2_lo, self.exp2_hi = (-151.0, 129.0) if f32 else (-1076.0, 1025.0)
        self.exp10_lo, self.exp10_hi = (-46.0, 39.5) if f32 else (-326.0, 309.5)
        self.expm1_lo = -30.0 if f32 else -60.0  # expm1 rounds to -1 below
        self.expm1_big = 24.0 if f32 else 53.0  # n above: 2^n - 1 is inexact
        self.tanh_clamp = 44.0 if f32 else 88.0  # 2|x| clamp: tanh rounds to ±1 well before
        self.exp_coeffs = _EXP_F if f32 else _EXP_D
        self.exp2_coeffs = _EXP2_F if f32 else _EXP2_D
        self.exp10_coeffs = _EXP10_F if f32 else _EXP10_D
        self.log_coeffs = _LOG_F if f32 else _LOG_D
        self.tanh_coeffs = _TANH_F if f32 else _TANH_D


_FMT = {True: _Fmt(True), False: _Fmt(False)}


# ---------------------------------------------------------------------------------------------
# IR helper bound to one builder and one floating type
# ---------------------------------------------------------------------------------------------


class _V(FloatIR):
    def __init__(self, b: ir.IRBuilder, ty: ir.Type):
        super().__init__(b, ty)
        self.f32 = self.is_f32
        self.k = _FMT[self.f32]

    def i(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def fma(self, x, y, z):
        return self.intr("fma", x, y, z)

    def clamp(self, x, lo: float, hi: float):
        """x limited to [lo, hi]; NaN becomes lo (callers restore NaN at the end)."""
        return self.intr("minnum", self.intr("maxnum", x, self.c(lo)), self.c(hi))

    def horner(self, x, coeffs):
        acc = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc

    def to_int(self, x):
        return self.b.fptosi(x, self.ity)

    def bits(self, x):
        return self.b.bitcast(x, self.ity)

    def from_bits(self, i):
        return self.b.bitcast(i, self.ty)

    def pow2(self, n):
        """2^n for an integer n in the normal exponent range."""
        return self.from_bits(self.b.shl(self.b.add(n, self.i(self.k.bias)), self.i(self.k.mant)))

    def scale2(self, p, n):
        """p·2^n rounded once, for n up to twice the exponent range (overflow / subnormals)."""
        n1 = self.b.ashr(n, self.i(1))
        n2 = self.b.sub(n, n1)
        return self.mul(self.mul(p, self.pow2(n1)), self.pow2(n2))

    def ldexp(self, p, n):
        """p·2^n for an integer vector n (llvm.ldexp: one vscalefps on AVX-512)."""
        name = f"llvm.ldexp.{self.sfx}.i{self.ity.width}"
        fn = self.mod.globals.get(name)
        if fn is None:
            fn = ir.Function(self.mod, ir.FunctionType(self.ty, [self.ty, self.ity]), name)
        return self.b.call(fn, [p, n])

    def nan_passthrough(self, x, r):
        return self.sel(self.isnan(x), self.add(x, x), r)


# ---------------------------------------------------------------------------------------------
# exp family
# ---------------------------------------------------------------------------------------------


def _reduce(v: _V, x, inv: float, c: tuple[float, float]):
    """n = rint(x·inv) (as float) and x - n·(c_hi + c_lo) = r + dr (double-word)."""
    n = v.intr("rint", v.mul(x, v.c(inv)))
    neg_n = v.b.fneg(n)
    r1 = v.fma(neg_n, v.c(c[0]), x)  # exact
    r = v.fma(neg_n, v.c(c[1]), r1)
    dr = v.fma(neg_n, v.c(c[1]), v.sub(r1, r))  # rounding error of r (r1 - r is exact)
    return n, r, dr


def _expm1_reduced(v: _V, base: str, r, dr):
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


def _one_plus(v: _V, hi, lo):
    """1 + hi + lo for |hi| < 1 (Fast2Sum)."""
    s = v.add(v.c(1.0), hi)
    err = v.sub(hi, v.sub(s, v.c(1.0)))
    return v.add(s, v.add(err, lo))


def _exp_base(base: str) -> Callable[[_V, ir.Value], ir.Value]:
    def body(v: _V, x):
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


def _exp_scalef_f32(base: str) -> Callable[[_V, ir.Value], ir.Value]:
    """float32 e^x or 2^x in 14 vector operations, for hosts with AVX-512 (module docstring)."""

    def body(v: _V, x):
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
        p = v.fma(r, v.horner(r, _EXPQ_F[base]), v.c(1.0))  # b^r
        return v.ldexp(p, n_int)  # p·2^n rounded once (vscalefps): overflow, subnormals, NaN

    return body


def _expm1(v: _V, x):
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


def _tanh_f32(v: _V, x):
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


def _tanh(v: _V, x):
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
    res = v.intr("copysign", v.sel(v.cmp("<", ax, v.c(_TANH_SMALL)), small, large), x)  # ±0
    return v.nan_passthrough(x, res)


# ---------------------------------------------------------------------------------------------
# log family
# ---------------------------------------------------------------------------------------------


def _log_core(v: _V, x, scale_subnormals: bool = True):
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


def _log_combine(v: _V, kf, hi, lo, base: str, extra=None):
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


def _log_specials(v: _V, x, r):
    """log_b specials: x = +inf → inf, ±0 → -inf, x < 0 → NaN, NaN → NaN."""
    r = v.sel(v.cmp("==", x, v.c(math.inf)), x, r)
    r = v.sel(v.cmp("==", x, v.c(0.0)), v.c(-math.inf), r)
    r = v.sel(v.cmp("<", x, v.c(0.0)), v.c(math.nan), r)
    return v.nan_passthrough(x, r)


def _log_base(base: str) -> Callable[[_V, ir.Value], ir.Value]:
    def body(v: _V, x):
        kf, hi, lo = _log_core(v, x)
        return _log_specials(v, x, _log_combine(v, kf, hi, lo, base))

    return body


def _log1p(v: _V, x):
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

_BODIES: dict[str, Callable[[_V, ir.Value], ir.Value]] = {
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


_SCALEF_F32: dict[str, Callable[[_V, ir.Value], ir.Value]] = {
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
    v = _V(builder, ty)
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
        inner = _V(ir.IRBuilder(fn.append_basic_block("entry")), ty)
        inner.b.ret(body(inner, fn.args[0]))
    return builder.call(fn, [x])
