"""codegen.emit.builtins: every builtin, float32 and float64, JIT-compiled and checked against references."""

from __future__ import annotations

import ctypes
import math
import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import mpmath
import numpy as np
import pytest

from codegen.emit.builtins import LIBM_SYMBOLS, emit_builtin, ensure_libm_loaded
from tensorlang.builtins import BUILTINS

DTYPES = (np.float32, np.float64)
_LLTY = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}
_CTY = {np.float32: ctypes.c_float, np.float64: ctypes.c_double}

# ---------------------------------------------------------------------------------------------
# JIT harness: one module per dtype holding `void f_<name>(T* out, T* a, ..., i64 n)` for all
# builtins.
# ---------------------------------------------------------------------------------------------


def build_module(dtype) -> ir.Module:
    ty = _LLTY[dtype]
    i64 = ir.IntType(64)
    mod = ir.Module(name=f"builtins_{np.dtype(dtype).name}")
    mod.triple = llvm.get_process_triple()
    for name, arity in BUILTINS.items():
        fnty = ir.FunctionType(ir.VoidType(), [ty.as_pointer()] * (arity + 1) + [i64])
        fn = ir.Function(mod, fnty, f"f_{name}")
        out, *ins, n = fn.args
        entry = fn.append_basic_block("entry")
        loop = fn.append_basic_block("loop")
        done = fn.append_basic_block("done")
        b = ir.IRBuilder(entry)
        b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(ir.Constant(i64, 0), entry)
        vals = [b.load(b.gep(p, [i])) for p in ins]
        b.store(emit_builtin(b, name, vals), b.gep(out, [i]))
        nxt = b.add(i, ir.Constant(i64, 1))
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
        b.position_at_end(done)
        b.ret_void()
    return mod


class Jit:
    """Compiled module (O3, host CPU) with numpy-callable wrappers."""

    def __init__(self, dtype):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.dtype = dtype
        self.ir_text = str(build_module(dtype))
        mod = llvm.parse_assembly(self.ir_text)
        mod.verify()
        target = llvm.Target.from_default_triple()
        self.tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(),
            features=llvm.get_host_cpu_features().flatten(),
            opt=3,
            jit=True,
        )
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        self.ee = llvm.create_mcjit_compiler(mod, self.tm)
        self.ee.finalize_object()
        self.mod = mod

    def __call__(self, name: str, *arrays: np.ndarray) -> np.ndarray:
        ptr = ctypes.POINTER(_CTY[self.dtype])
        addr = self.ee.get_function_address(f"f_{name}")
        cfn = ctypes.CFUNCTYPE(None, *([ptr] * (len(arrays) + 1)), ctypes.c_int64)(addr)
        ins = [np.ascontiguousarray(a, dtype=self.dtype) for a in arrays]
        out = np.empty_like(ins[0])
        cfn(*(a.ctypes.data_as(ptr) for a in [out, *ins]), out.size)
        return out


@pytest.fixture(scope="module")
def jit():
    return {dt: Jit(dt) for dt in DTYPES}


# ---------------------------------------------------------------------------------------------
# Input grids
# ---------------------------------------------------------------------------------------------


def base_grid(dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    pos = [
        0.0, float(fi.smallest_subnormal), float(fi.tiny), 1e-30, 1e-8, 0.1, 0.25, 0.5, 0.75,
        1.0, 1.5, 2.0, 2.5, 3.0, math.pi, 7.0, 10.0, 20.0, 50.0, 88.0, 100.0, 700.0, 1e5,
        float(2 ** (fi.nmant + 1)) + 2.0, 1e15, 1e30, float(fi.max), math.inf,
    ]  # fmt: skip
    rng = np.random.default_rng(1234)
    lo = math.log10(float(fi.tiny))
    hi = math.log10(float(fi.max))
    extra = np.concatenate(
        [
            np.linspace(-12.0, 12.0, 241),
            10.0 ** rng.uniform(lo, hi, 60),
            -(10.0 ** rng.uniform(lo, hi, 60)),
        ]
    )
    vals = np.array(pos + [-v for v in pos] + [math.nan] + list(extra), dtype=np.float64)
    return vals.astype(dtype)


def unit_grid(dtype) -> np.ndarray:
    """[-1, 1] densely, with points crowding ±1 and 0, plus just-outside values."""
    eps = float(np.finfo(dtype).eps)
    near = 1.0 - np.array([eps / 2, eps, 4 * eps, 1e-6, 1e-4, 1e-3, 1e-2])
    near = near[near < 1.0]
    small = np.array([1e-30, 1e-10, 1e-5])
    v = np.concatenate([np.linspace(-1, 1, 201), near, -near, small, -small, [1.0 + 4 * eps, -2.0]])
    return v.astype(dtype)


def tail_grid(dtype) -> np.ndarray:
    """(0, 2) for erfcinv: dense in the middle, logarithmic towards 0 and 2."""
    fi = np.finfo(dtype)
    lo = math.log10(float(fi.smallest_subnormal))
    small = 10.0 ** np.linspace(lo, -0.5, 90)
    v = np.concatenate([np.linspace(0, 2, 101), small, 2.0 - small, [-0.5, 2.5, math.inf, math.nan]])
    return v.astype(dtype)


def grid1(name: str, dtype) -> np.ndarray:
    if name in ("erfinv", "asin", "acos", "atanh"):
        g = np.concatenate([unit_grid(dtype), base_grid(dtype)])
    elif name == "erfcinv":
        g = tail_grid(dtype)
    elif name == "normcdfinv":
        g = (tail_grid(dtype).astype(np.float64) / 2).astype(dtype)
    elif name in ("sinpi", "cospi"):
        halves = np.arange(-40, 41) * 0.25
        g = np.concatenate([base_grid(dtype), halves.astype(dtype), [1e7 + 0.5, 2.0**23 + 1, 2.0**52 + 1]])
    elif name in ("tgamma", "lgamma"):
        neg = -np.arange(1, 12) + 0.5
        near = np.array([1 - 1e-7, 1 + 1e-7, 2 - 1e-7, 2 + 1e-7, -1e-7, 1e-7])
        g = np.concatenate([base_grid(dtype), neg, -np.arange(1, 6.0), near])
    else:
        g = base_grid(dtype)
    return np.unique(g.astype(dtype))


def grid_n(dtype, arity: int) -> list[np.ndarray]:
    """Cartesian grid of interesting values for 2-argument builtins; random tuples beyond."""
    sv = np.array(
        [0.0, -0.0, 1e-40, 1e-300, 0.3, -0.3, 1.0, -1.0, 1.5, -2.5, 3.0, 7.25, -10.0, 1e3, -1e5,
         1e20, 1e200, 3e38, -1e308, math.inf, -math.inf, math.nan],
    )  # fmt: skip
    with np.errstate(over="ignore"):
        sv = np.unique(sv.astype(dtype))
    if arity == 2:
        a, b = np.meshgrid(sv, sv)
        return [a.ravel(), b.ravel()]
    rng = np.random.default_rng(arity)
    n = 600
    cols = [rng.choice(sv, n) for _ in range(arity)]
    cols = [np.concatenate([c, (rng.standard_normal(200) * 10.0 ** rng.integers(-5, 5, 200))]) for c in cols]
    return [c.astype(dtype) for c in cols]


# ---------------------------------------------------------------------------------------------
# References (float64 / mpmath on the exact inputs; rounding to the dtype happens at comparison)
# ---------------------------------------------------------------------------------------------

mpmath.mp.dps = 40


def _to_float(v) -> float:
    try:
        return float(v)
    except OverflowError:  # beyond the double range
        return math.copysign(math.inf, float(mpmath.sign(v)))


def _mp(f):
    def g(*xs):
        return np.array([_to_float(f(*map(float, t))) for t in zip(*xs)], dtype=np.float64)

    return g


def _mp_special(f, special):
    """mpmath reference with a hook for arguments mpmath does not handle (returns None to defer)."""

    def h(*t):
        s = special(*t)
        return s if s is not None else f(*(mpmath.mpf(x) for x in t))

    return _mp(h)


def _bessel_special(kind, order):
    def s(x):
        if math.isnan(x):
            return math.nan
        if kind == "y" and x < 0:
            return math.nan
        if kind == "y" and x == 0:
            return -math.inf
        if math.isinf(x):
            return 0.0 if x > 0 or kind == "j" else math.nan
        return None

    return s


def _i_special(order):
    def s(x):
        if math.isnan(x):
            return math.nan
        if math.isinf(x):
            return math.inf if order == 0 else x
        return None

    return s


def _gamma(x):
    if math.isnan(x) or x == -math.inf:
        return math.nan
    if x == math.inf:
        return math.inf
    if x == 0:
        return math.copysign(math.inf, x)
    if x < 0 and x == math.floor(x):
        return math.nan
    return None


def _lgamma(x):
    if math.isnan(x):
        return math.nan
    if math.isinf(x) or (x <= 0 and x == math.floor(x)):
        return math.inf
    return None


def _erfinv_ref(x):
    if math.isnan(x) or abs(x) > 1:
        return math.nan
    if abs(x) == 1:
        return math.copysign(math.inf, x)
    if abs(x) <= 0.5:
        return mpmath.erfinv(mpmath.mpf(x))
    return math.copysign(1, x) * _erfcinv_ref(1.0 - abs(x))  # 1 - |x| exact


def _erfcinv_ref(z):
    if math.isnan(z) or z < 0 or z > 2:
        return math.nan
    if z == 0:
        return math.inf
    if z == 2:
        return -math.inf
    if z > 1:
        return -_erfcinv_ref(2.0 - z)  # exact for z >= 1
    if z >= 0.5:
        return mpmath.erfinv(1 - mpmath.mpf(z))
    mz = mpmath.mpf(z)
    t = -math.log(z)
    y0 = math.sqrt(max(t - 0.5 * math.log(math.pi * t), 0.1)) if t > 2 else 0.5
    return mpmath.findroot(lambda y: mpmath.log(mpmath.erfc(y)) - mpmath.log(mz), y0)


def _normcdfinv_ref(p):
    r = _erfcinv_ref(2.0 * p)
    return -mpmath.sqrt(2) * r if not (isinstance(r, float) and math.isnan(r)) else r


def _erfcx_ref(x):
    if math.isnan(x):
        return math.nan
    if x == math.inf:
        return 0.0
    if x < -30:  # exp(x^2) overflows double
        return math.inf
    if x > 1e8:  # mpmath's erfc gives up on huge arguments; the asymptotic series is exact here
        return (1 - 0.5 / mpmath.mpf(x) ** 2) / (mpmath.mpf(x) * mpmath.sqrt(mpmath.pi))
    return None


def _nan_or_inf(x):
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return math.nan
    return None


def _finite_or(val_for_inf):
    def s(x):
        if math.isnan(x):
            return math.nan
        if math.isinf(x):
            return val_for_inf(x)
        return None

    return s


def _norm_ref(recip):
    def f(*xs):
        if any(math.isinf(x) for x in xs):
            return 0.0 if recip else math.inf
        if any(math.isnan(x) for x in xs):
            return math.nan
        s = mpmath.sqrt(mpmath.fsum(mpmath.mpf(x) ** 2 for x in xs))
        if recip:
            return mpmath.inf if s == 0 else 1 / s
        return s

    return f


def _round(x):
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _logb(x):
    m, e = np.frexp(x)
    r = (e - 1).astype(np.float64)
    r = np.where(x == 0, -np.inf, r)
    return np.where(np.isnan(x) | np.isinf(x), np.abs(x), r)


def _fdim(a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.where(a > b, a - b, 0.0).astype(a.dtype)
        return np.where(np.isnan(a) | np.isnan(b), np.nan, r).astype(a.dtype)


def _fma(a, b, c):
    with mpmath.workprec(2300):
        out = []
        for x, y, z in zip(a, b, c):
            x, y, z = float(x), float(y), float(z)
            if math.isnan(x) or math.isnan(y) or math.isnan(z):
                out.append(math.nan)
            elif math.isinf(x) or math.isinf(y):
                out.append(x * y + z)
            elif math.isinf(z):
                out.append(z)
            else:
                out.append(float(mpmath.mpf(x) * y + z))
        return np.array(out)


def _exp10(x):
    return _mp_special(mpmath.power10 if hasattr(mpmath, "power10") else lambda v: mpmath.mpf(10) ** v,
                       _finite_or(lambda v: math.inf if v > 0 else 0.0))(x)  # fmt: skip


def _vec(f):
    def g(*xs):
        out = []
        for t in zip(*xs):
            try:
                out.append(f(*map(float, t)))
            except (ValueError, OverflowError):
                out.append(math.nan)
        return np.array(out, dtype=np.float64)

    return g


def _remainder(a, b):
    def r(x, y):
        if math.isnan(x) or math.isnan(y) or math.isinf(x) or y == 0:
            return math.nan
        if math.isinf(y):
            return x
        return math.remainder(x, y)

    return _vec(r)(a, b)


# name → (reference(*float64 arrays) → float64 array, exact_in_dtype)
# exact_in_dtype: the reference is evaluated on dtype arrays and is exact there (no f64 detour).
REFS: dict[str, tuple] = {
    "acos": (np.arccos, False), "acosh": (np.arccosh, False), "asin": (np.arcsin, False),
    "asinh": (np.arcsinh, False), "atan2": (np.arctan2, False), "atan": (np.arctan, False),
    "atanh": (np.arctanh, False), "cbrt": (np.cbrt, False), "ceil": (np.ceil, True),
    "copysign": (np.copysign, True), "cos": (np.cos, False), "cosh": (np.cosh, False),
    "cospi": (_mp_special(mpmath.cospi, _nan_or_inf), False),
    "cyl_bessel_i0": (_mp_special(lambda x: mpmath.besseli(0, x), _i_special(0)), False),
    "cyl_bessel_i1": (_mp_special(lambda x: mpmath.besseli(1, x), _i_special(1)), False),
    "erfc": (_vec(math.erfc), False), "erf": (_vec(math.erf), False),
    "erfcinv": (_mp(_erfcinv_ref), False),
    "erfcx": (_mp_special(lambda x: mpmath.exp(x * x) * mpmath.erfc(x), _erfcx_ref), False),
    "erfinv": (_mp(_erfinv_ref), False), "exp10": (_exp10, False), "exp2": (np.exp2, False),
    "exp": (np.exp, False), "expm1": (np.expm1, False), "fabs": (np.fabs, True),
    "fdim": (_fdim, True), "fdivide": (np.divide, True), "floor": (np.floor, True),
    "fma": (_fma, False), "fmax": (np.fmax, True), "fmin": (np.fmin, True),
    "fmod": (np.fmod, True), "hypot": (np.hypot, False),
    "j0": (_mp_special(lambda x: mpmath.besselj(0, x), _bessel_special("j", 0)), False),
    "j1": (_mp_special(lambda x: mpmath.besselj(1, x), _bessel_special("j", 1)), False),
    "lgamma": (_mp_special(lambda x: mpmath.log(abs(mpmath.gamma(x))), _lgamma), False),
    "log10": (np.log10, False), "log1p": (np.log1p, False), "log2": (np.log2, False),
    "logb": (_logb, True), "log": (np.log, False), "nextafter": (np.nextafter, True),
    "norm3d": (_mp(_norm_ref(False)), False), "norm4d": (_mp(_norm_ref(False)), False),
    "normcdf": (_mp_special(mpmath.ncdf, lambda x: x if math.isnan(x) else
                            (0.0 if x < -50 else (1.0 if x > 50 else None))), False),
    "normcdfinv": (_mp(_normcdfinv_ref), False), "pow": (np.power, False),
    "rcbrt": (_mp_special(lambda x: mpmath.sign(x) / mpmath.cbrt(abs(x)),
                          lambda x: math.copysign(math.inf if x == 0 else 0.0, x) if x == 0 or math.isinf(x)
                          else (math.nan if math.isnan(x) else None)), False),
    "remainder": (_remainder, True), "rhypot": (_mp(_norm_ref(True)), False),
    "rnorm3d": (_mp(_norm_ref(True)), False), "rnorm4d": (_mp(_norm_ref(True)), False),
    "round": (_round, True),
    "rsqrt": (_mp_special(lambda x: 1 / mpmath.sqrt(x),  # rsqrt(±0) = ±inf as in CUDA
                          lambda x: math.nan if math.isnan(x) or x < 0 else
                          (0.0 if x == math.inf else (math.copysign(math.inf, x) if x == 0 else None))),
              False),
    "sin": (np.sin, False), "sinh": (np.sinh, False),
    "sinpi": (_mp_special(mpmath.sinpi, _nan_or_inf), False), "sqrt": (np.sqrt, False),
    "tan": (np.tan, False), "tanh": (np.tanh, False),
    "tgamma": (_mp_special(mpmath.gamma, _gamma), False), "trunc": (np.trunc, True),
    "y0": (_mp_special(lambda x: mpmath.bessely(0, x), _bessel_special("y", 0)), False),
    "y1": (_mp_special(lambda x: mpmath.bessely(1, x), _bessel_special("y", 1)), False),
}  # fmt: skip

# Allowed error in ulps of the dtype (float32, float64), plus an absolute error for functions
# with zeros in their range where libm's error is absolute (Bessel J/Y, lgamma near 1 and 2).
TOL_ULP: dict[str, tuple[float, float]] = {name: (2.0, 2.0) for name in BUILTINS}
TOL_ULP.update({
    "ceil": (0, 0), "floor": (0, 0), "trunc": (0, 0), "round": (0, 0), "fabs": (0, 0),
    "copysign": (0, 0), "fmax": (0, 0), "fmin": (0, 0), "fmod": (0, 0), "remainder": (0, 0),
    "nextafter": (0, 0), "logb": (0, 0), "fdim": (0, 0), "fdivide": (0, 0), "fma": (0, 0),
    "sqrt": (0, 0),
    "tgamma": (4, 10), "lgamma": (4, 4), "j0": (4, 4), "j1": (4, 4), "y0": (4, 4), "y1": (4, 4),
    "erfc": (3, 3), "erfcx": (1, 3), "normcdf": (1, 4), "erfinv": (1, 3), "erfcinv": (1, 3),
    "normcdfinv": (1, 3), "cyl_bessel_i0": (1, 4), "cyl_bessel_i1": (1, 4), "sinpi": (1, 1.5),
    "cospi": (1, 1.5), "norm3d": (1, 1.5), "norm4d": (1, 1.5), "rnorm3d": (1, 2),
    "rnorm4d": (1, 2), "rhypot": (1, 2), "rsqrt": (1, 1), "rcbrt": (1, 1), "exp10": (2, 3),
    "tanh": (5, 2),  # float32: a rational approximation documented at 5 ulp (codegen/vecmath.py)
})  # fmt: skip
ABS_TOL = {"j0": 4.0, "j1": 4.0, "y0": 4.0, "y1": 4.0, "lgamma": 4.0}  # in units of eps


def ordered(x: np.ndarray) -> np.ndarray:
    """Map floats to integers that count ulps (±0 → 0, inf just past max)."""
    it = np.int32 if x.dtype == np.float32 else np.int64
    i = x.view(it).astype(np.int64)
    mag = i & (np.iinfo(it).max)
    return np.where(i < 0, -mag, mag)


def assert_close(name, dtype, args, got, ref, ulps, abs_tol=0.0):
    with np.errstate(over="ignore"):
        ref_d = ref.astype(dtype)
    nan_got, nan_ref = np.isnan(got), np.isnan(ref_d)
    bad = nan_got != nan_ref
    ok = ~nan_got & ~nan_ref
    err = np.abs(ordered(got[ok]) - ordered(ref_d[ok])).astype(np.float64)
    tol = np.full(err.shape, float(ulps))
    if abs_tol:
        with np.errstate(invalid="ignore", over="ignore"):
            absolute = np.abs(got[ok].astype(np.float64) - ref[ok])
        tol = np.where(absolute <= abs_tol * float(np.finfo(dtype).eps), np.inf, tol)
    bad[ok] = err > tol + 1e-9
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        rows = [
            f"  args={[a[i] for a in args]} got={got[i]!r} ref={ref_d[i]!r} exact={ref[i]!r}" for i in idx
        ]
        pytest.fail(f"{name}[{np.dtype(dtype).name}]: {bad.sum()} bad of {bad.size}\n" + "\n".join(rows))
    return float(err.max()) if err.size else 0.0


def reference(name, dtype, args):
    f, exact_in_dtype = REFS[name]
    with np.errstate(all="ignore"):
        if exact_in_dtype:
            return np.asarray(f(*args)).astype(np.float64)
        return np.asarray(f(*[a.astype(np.float64) for a in args]), dtype=np.float64)


def inputs(name, dtype):
    arity = BUILTINS[name]
    return [grid1(name, dtype)] if arity == 1 else grid_n(dtype, arity)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_every_builtin_has_a_reference():
    assert set(REFS) == set(BUILTINS)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_matches_reference(jit, name, dtype):
    args = inputs(name, dtype)
    got = jit[dtype](name, *args)
    assert got.dtype == dtype
    ref = reference(name, dtype, args)
    ulps = TOL_ULP[name][0 if dtype is np.float32 else 1]
    assert_close(name, dtype, args, got, ref, ulps, ABS_TOL.get(name, 0.0))


SPECIAL_VALUES = [
    ("sinpi", (-0.0,), -0.0), ("sinpi", (0.0,), 0.0), ("sinpi", (1.0,), 0.0),
    ("sinpi", (-3.0,), -0.0), ("sinpi", (0.5,), 1.0), ("sinpi", (-1.5,), 1.0),
    ("sinpi", (1e30,), 0.0), ("sinpi", (math.inf,), math.nan), ("cospi", (0.5,), 0.0),
    ("cospi", (-2.5,), 0.0), ("cospi", (3.0,), -1.0), ("cospi", (1e30,), 1.0),
    ("cospi", (-math.inf,), math.nan), ("erfinv", (-0.0,), -0.0), ("erfinv", (1.0,), math.inf),
    ("erfinv", (-1.0,), -math.inf), ("erfinv", (1.5,), math.nan), ("erfcinv", (1.0,), 0.0),
    ("erfcinv", (0.0,), math.inf), ("erfcinv", (2.0,), -math.inf), ("erfcinv", (-1.0,), math.nan),
    ("normcdfinv", (0.5,), 0.0), ("normcdfinv", (0.0,), -math.inf),
    ("normcdfinv", (1.0,), math.inf), ("normcdf", (math.inf,), 1.0),
    ("normcdf", (-math.inf,), 0.0), ("normcdf", (0.0,), 0.5), ("erfcx", (math.inf,), 0.0),
    ("erfcx", (-math.inf,), math.inf), ("erfcx", (0.0,), 1.0), ("round", (-0.3,), -0.0),
    ("round", (2.5,), 3.0), ("round", (-2.5,), -3.0),
    ("fdim", (math.inf, math.inf), 0.0), ("fdim", (1.0, 3.0), 0.0), ("fdim", (math.nan, 1.0), math.nan),
    ("fmax", (math.nan, 1.0), 1.0), ("fmin", (2.0, math.nan), 2.0),
    ("cyl_bessel_i1", (-0.0,), -0.0), ("cyl_bessel_i0", (0.0,), 1.0),
    ("cyl_bessel_i0", (-math.inf,), math.inf), ("cyl_bessel_i1", (-math.inf,), -math.inf),
    ("rsqrt", (-0.0,), -math.inf), ("rsqrt", (math.inf,), 0.0), ("rcbrt", (-0.0,), -math.inf),
    ("rcbrt", (-8.0,), -0.5), ("cbrt", (27.0,), 3.0), ("cbrt", (-0.125,), -0.5), ("rhypot", (0.0, 0.0), math.inf), ("hypot", (math.inf, math.nan), math.inf),
    ("norm3d", (math.nan, -math.inf, 1.0), math.inf), ("rnorm4d", (math.nan, 1.0, 2.0, math.inf), 0.0),
    ("norm4d", (math.nan, 1.0, 2.0, 3.0), math.nan), ("logb", (0.0,), -math.inf),
    ("remainder", (5.0, 2.0), 1.0), ("remainder", (7.0, 2.0), -1.0), ("fmod", (-7.0, 2.0), -1.0),
    ("lgamma", (-2.0,), math.inf), ("tgamma", (-0.0,), -math.inf), ("y0", (0.0,), -math.inf),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize(("name", "args", "expected"), SPECIAL_VALUES)
def test_special_values(jit, dtype, name, args, expected):
    got = jit[dtype](name, *[np.array([a], dtype=dtype) for a in args])[0]
    if math.isnan(expected):
        assert np.isnan(got), (name, args, got)
    else:
        exp = dtype(expected)
        assert got == exp and np.signbit(got) == np.signbit(exp), (name, args, got, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_round_just_below_half(jit, dtype):
    x = np.nextafter(np.array([0.5, -0.5, 1.5], dtype=dtype), dtype(0))
    assert list(jit[dtype]("round", x)) == [0.0, -0.0, 1.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_erfcx_large_arguments_stay_finite(jit, dtype):
    x = np.array([1e4, 1e15, float(np.finfo(dtype).max) / 4], dtype=dtype)
    got = jit[dtype]("erfcx", x)
    xd = x.astype(np.float64)
    with np.errstate(over="ignore"):
        exact = (1 - 0.5 / xd**2) / (xd * math.sqrt(math.pi))
    assert np.all(np.isfinite(got)) and np.allclose(got, exact, rtol=4 * float(np.finfo(dtype).eps), atol=0)


def test_norm_no_overflow(jit):
    big = np.array([1e300, 3e307], dtype=np.float64)
    got = jit[np.float64]("norm3d", big, big, big)
    assert np.all(np.isfinite(got[:1])) and np.isclose(got[0], 1e300 * math.sqrt(3), rtol=1e-15)
    assert got[1] == np.inf or np.isclose(got[1], 3e307 * math.sqrt(3))
    tiny = np.array([3e-320], dtype=np.float64)
    assert np.isclose(
        jit[np.float64]("rnorm4d", tiny * 1e10, tiny * 1e10, tiny * 1e10, tiny * 1e10)[0], np.inf
    ) or (jit[np.float64]("rnorm4d", tiny * 1e10, tiny * 1e10, tiny * 1e10, tiny * 1e10)[0] > 1e300)
    got32 = jit[np.float32](
        "norm4d", *[np.array([3e38], dtype=np.float32)] * 2, *[np.zeros(1, np.float32)] * 2
    )
    assert got32[0] == np.inf  # 3e38·√2 overflows float32 (the correct answer)
    got32 = jit[np.float32]("norm3d", *[np.array([1e38], dtype=np.float32)] * 3)
    assert np.isclose(got32[0], 1e38 * math.sqrt(3), rtol=1e-7)


def test_unknown_builtin_raises():
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.DoubleType(), [ir.DoubleType()]), "g")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(ValueError):
        emit_builtin(b, "frobnicate", [fn.args[0]])
    with pytest.raises(ValueError):
        emit_builtin(b, "atan2", [fn.args[0]])


def test_declarations_once_per_module():
    mod = ir.Module()
    for ty in (ir.FloatType(), ir.DoubleType()):
        fn = ir.Function(mod, ir.FunctionType(ty, [ty]), f"g_{ty}")
        b = ir.IRBuilder(fn.append_basic_block())
        acc = fn.args[0]
        for _ in range(3):
            for name in ("erfinv", "j0", "sinpi", "lgamma", "exp10", "norm3d"):
                acc = emit_builtin(b, name, [acc] * BUILTINS[name])
        b.ret(acc)
    text = str(mod)
    assert text.count('declare float @"j0f"') + text.count("declare float @j0f") == 1
    assert (
        text.count("define internal double @__tl_erfinv_f64")
        + text.count('define internal double @"__tl_erfinv_f64"')
        == 1
    )
    llvm.parse_assembly(text).verify()


def test_float16_computed_in_float32():
    mod = ir.Module()
    h = ir.HalfType()
    fn = ir.Function(mod, ir.FunctionType(h, [h]), "g")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(emit_builtin(b, "erfinv", [fn.args[0]]))
    llvm.parse_assembly(str(mod)).verify()


def test_libm_symbols_resolve(jit):
    ensure_libm_loaded()
    ensure_libm_loaded()  # idempotent
    missing = sorted(s for s in LIBM_SYMBOLS if not llvm.address_of_symbol(s))
    assert not missing
    for dt in DTYPES:
        # Every external function the IR declares is one of LIBM_SYMBOLS ...
        declared = {
            f.name for f in jit[dt].mod.functions if f.is_declaration and not f.name.startswith("llvm.")
        }
        assert declared <= LIBM_SYMBOLS, declared - LIBM_SYMBOLS
        # ... and so is every symbol the machine code calls (intrinsics lowered to libm, sincos).
        asm = jit[dt].tm.emit_assembly(jit[dt].mod)
        called = set(re.findall(r"(?:movabsq\s+\$|(?:call|jmp)q?\s+)([A-Za-z_][\w.]*)", asm))
        external = {n for n in called if not n.startswith(("f_", "__tl_", "."))}
        assert external <= LIBM_SYMBOLS, external - LIBM_SYMBOLS


@pytest.mark.parametrize("name", ["sqrt", "fabs", "floor", "fmax", "fma", "copysign", "fdim", "rsqrt"])
def test_intrinsic_builtins_vectorise(jit, name):
    text = str(jit[np.float32].mod)
    start = text.index(f"define void @f_{name}(")
    body = text[start : text.index("\n}\n", start)]
    assert re.search(r"<\d+ x float>", body), f"f_{name} was not vectorised"
