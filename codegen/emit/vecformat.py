"""emit: per-precision constants and the IR helper of the vector math (coefficients, bit tricks)."""

from __future__ import annotations

import llvmlite.ir as ir

from .floatir import FloatIR

# ---------------------------------------------------------------------------------------------
# Coefficients, highest degree first (`codegen.emit.vecmath` says how they were derived).
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
EXPQ_F = {
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

TANH_SMALL = 0.625


class VecConstants:
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


CONSTANTS = {True: VecConstants(True), False: VecConstants(False)}


# ---------------------------------------------------------------------------------------------
# IR helper bound to one builder and one floating type
# ---------------------------------------------------------------------------------------------


class VecIR(FloatIR):
    """FloatIR plus integer views of the bits, exponent scaling and clamps, for one precision."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type):
        super().__init__(b, ty)
        self.f32 = self.is_f32
        self.k = CONSTANTS[self.f32]

    def i(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def clamp(self, x, lo: float, hi: float):
        """x limited to [lo, hi]; NaN becomes lo (callers restore NaN at the end)."""
        return self.intr("minnum", self.intr("maxnum", x, self.c(lo)), self.c(hi))

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
