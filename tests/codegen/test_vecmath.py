"""codegen.emit.vecmath: accuracy over the whole float range, special values, vectorisation, speed."""

from __future__ import annotations

import ctypes
import math
import os
import re
import time

import llvmlite.binding as llvm
import llvmlite.ir as ir
import mpmath
import numpy as np
import pytest

from codegen.emit.builtins import emit_builtin
from codegen.emit.vecmath import VECMATH_BUILTINS, emit_vecmath
from codegen.lowering.jit import _lock, new_target_machine, optimise

DTYPES = (np.float32, np.float64)
_LLTY = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}
_CTY = {np.float32: ctypes.c_float, np.float64: ctypes.c_double}
NAMES = sorted(VECMATH_BUILTINS)

# Documented accuracy (codegen/vecmath.py): max ulp from the correctly rounded result.
MAX_ULP = {np.float32: 1, np.float64: 1}
# float32 tanh trades accuracy for speed (a rational approximation, documented at 5 ulp)
MAX_ULP_OVERRIDE = {("tanh", np.float32): 5}


def max_ulp(name: str, dtype) -> int:
    return MAX_ULP_OVERRIDE.get((name, dtype), MAX_ULP[dtype])


# ---------------------------------------------------------------------------------------------
# JIT harness: `void f_<name>(T* out, T* a, i64 n)` loops, optionally via the libm path
# ---------------------------------------------------------------------------------------------


def _loop(mod: ir.Module, fname: str, ty: ir.Type, emit) -> None:
    i64 = ir.IntType(64)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ty.as_pointer(), ty.as_pointer(), i64]), fname)
    out, a, n = fn.args
    for p in (out, a):
        p.add_attribute("noalias")
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.store(emit(b, b.load(b.gep(a, [i]))), b.gep(out, [i]))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()


def _libm_emit(name: str):
    """The pre-vecmath lowering: an LLVM intrinsic or a libm call (scalarised when vectorised)."""

    def emit(b: ir.IRBuilder, x):
        ty = x.type
        sfx = "f32" if isinstance(ty, ir.FloatType) else "f64"
        fname = f"llvm.{name}.{sfx}" if name in ("exp", "exp2", "log", "log2", "log10") else name
        if fname == name and sfx == "f32":
            fname += "f"
        fn = b.module.globals.get(fname) or ir.Function(b.module, ir.FunctionType(ty, [ty]), fname)
        return b.call(fn, [x])

    return emit


def build_module(dtype, names, libm: bool = False) -> ir.Module:
    mod = ir.Module(name=f"vecmath_{np.dtype(dtype).name}")
    for name in names:
        emit = _libm_emit(name) if libm else (lambda b, x, nm=name: emit_builtin(b, nm, [x]))
        _loop(mod, f"f_{name}", _LLTY[dtype], emit)
    return mod


class Compiled:
    def __init__(self, mod: ir.Module, dtype):
        with _lock:
            self.ref = optimise(mod)
            self.ir_text = str(self.ref)
            self.engine = llvm.create_mcjit_compiler(self.ref, new_target_machine())
            self.engine.finalize_object()
        self.dtype = dtype
        self._fns = {}

    def __call__(self, name: str, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        ptr = ctypes.POINTER(_CTY[self.dtype])
        fn = self._fns.get(name)
        if fn is None:
            addr = self.engine.get_function_address(f"f_{name}")
            fn = self._fns[name] = ctypes.CFUNCTYPE(None, ptr, ptr, ctypes.c_int64)(addr)
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if out is None:
            out = np.empty_like(x)
        fn(out.ctypes.data_as(ptr), x.ctypes.data_as(ptr), x.size)
        return out


@pytest.fixture(scope="module")
def compiled():
    return {dt: Compiled(build_module(dt, NAMES), dt) for dt in DTYPES}


# ---------------------------------------------------------------------------------------------
# Inputs and references
# ---------------------------------------------------------------------------------------------

# Where each function is not trivially 0 / 1 / inf: sampled uniformly on top of the bit patterns.
_INTERESTING = {
    "exp": (-760.0, 720.0), "exp2": (-1100.0, 1040.0), "exp10": (-330.0, 320.0),
    "expm1": (-50.0, 720.0), "tanh": (-25.0, 25.0), "log": (0.0, 4.0), "log2": (0.0, 4.0),
    "log10": (0.0, 4.0), "log1p": (-1.0, 4.0),
}  # fmt: skip


def special_values(dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    it = np.uint32 if dtype == np.float32 else np.uint64
    sub = np.array([1, 2, 3, 1 << (fi.nmant - 1), (1 << fi.nmant) - 1], dtype=it).view(dtype)
    pos = np.concatenate(
        [
            sub,
            [0.0, fi.tiny, fi.eps, fi.epsneg, 0.5, 1.0, 2.0, 10.0, float(fi.max), math.inf],
            [88.72283, 88.7228, 89.0, -87.33654, -103.27893, -103.97208, -104.0],  # float32 exp
            [709.782712893384, 709.79, -708.39641853226, -744.44007192138, -745.1332191019412],
            [128.0, 127.99999, -126.0, -149.0, -149.5, -150.0, 1024.0, -1022.0, -1074.0, -1075.0],
            [38.53, 308.25, -37.9, -45.0, -307.6, -323.3, -324.0],  # exp10
            [9.01, 9.1, 19.06, 0.625, 0.62499994, 0.55, 1e-4, 1e-8, 1e-20],  # tanh
            [1 - 1e-7, 1 + 1e-7, 0.7071067811865476, 1.4142135623730951],  # log
        ]
    )
    with np.errstate(over="ignore"):
        pos = pos.astype(dtype)
    nan = np.array([math.nan], dtype=dtype)
    return np.concatenate(
        [pos, -pos, nan, -nan, np.nextafter(pos, dtype(math.inf)), np.nextafter(pos, dtype(0))]
    )


def sample(name: str, dtype, n: int, seed: int = 0) -> np.ndarray:
    """Random finite bit patterns (every binade), uniform samples of the interesting range, a
    log-spaced grid of both signs and the special values."""
    rng = np.random.default_rng(seed)
    it = np.uint32 if dtype == np.float32 else np.uint64
    bits = rng.integers(0, np.iinfo(it).max, n, dtype=it, endpoint=True).view(dtype)
    bits = bits[np.isfinite(bits)]
    lo, hi = _INTERESTING[name]
    uni = rng.uniform(lo, hi, n // 2)
    fi = np.finfo(dtype)
    with np.errstate(over="ignore"):
        grid = np.geomspace(float(fi.smallest_subnormal), float(fi.max), n // 8)
    with np.errstate(over="ignore"):
        parts = [bits, uni.astype(dtype), grid.astype(dtype), -grid.astype(dtype), special_values(dtype)]
    if name == "log1p":
        parts.append(-np.geomspace(float(fi.smallest_subnormal), 1.0, n // 8).astype(dtype))
    return np.concatenate(parts)


_NP = {
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(x.dtype.type(10), x),
    "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "tanh": np.tanh,
}  # fmt: skip


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """float32: NumPy in float64; float64: NumPy in x87 long double (64-bit mantissa)."""
    wide = np.float64 if x.dtype == np.float32 else np.longdouble
    with np.errstate(all="ignore"):
        return _NP[name](x.astype(wide))


def ordered(x: np.ndarray) -> np.ndarray:
    """Floats to integers counting ulps (±0 → 0, inf just past max)."""
    it = np.int32 if x.dtype == np.float32 else np.int64
    i = x.view(it).astype(np.int64)
    mag = i & np.iinfo(it).max
    return np.where(i < 0, -mag, mag)


def ulp_errors(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ulp distance from the correctly rounded reference, NaN mismatch mask)."""
    with np.errstate(over="ignore", invalid="ignore"):
        ref_d = ref.astype(got.dtype)
    nan_mismatch = np.isnan(got) != np.isnan(ref_d)
    ok = ~np.isnan(got) & ~np.isnan(ref_d)
    err = np.zeros(got.shape, dtype=np.int64)
    err[ok] = np.abs(ordered(got[ok]) - ordered(ref_d[ok]))
    return err, nan_mismatch


def _longdouble_is_extended() -> bool:
    return np.finfo(np.longdouble).nmant >= 63


# ---------------------------------------------------------------------------------------------
# Accuracy
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_accuracy_whole_range(compiled, name, dtype):
    if dtype == np.float64 and not _longdouble_is_extended():
        pytest.skip("needs x87 long double for the float64 reference")
    x = sample(name, dtype, 1 << 18 if dtype == np.float32 else 1 << 16)
    got = compiled[dtype](name, x)
    err, nan_mismatch = ulp_errors(got, reference(name, x))
    bad = nan_mismatch | (err > max_ulp(name, dtype))
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        rows = [f"  x={x[i]!r} got={got[i]!r} ref={reference(name, x[i : i + 1])[0]!r}" for i in idx]
        pytest.fail(f"{name}[{np.dtype(dtype).name}]: {bad.sum()} bad of {x.size}\n" + "\n".join(rows))


@pytest.mark.parametrize("name", NAMES)
def test_float64_against_mpmath(compiled, name):
    """Spot check of the long double reference (and the float64 code) with mpmath."""
    rng = np.random.default_rng(7)
    lo, hi = _INTERESTING[name]
    x = np.concatenate([rng.uniform(lo, hi, 150), rng.uniform(-1, 1, 50) * 10.0 ** rng.integers(-30, 3, 50)])
    if name.startswith("log"):
        x = np.abs(x) if name != "log1p" else np.maximum(x, -1 + 1e-9)
    fns = {
        "exp": mpmath.exp, "exp2": lambda v: mpmath.power(2, v), "exp10": lambda v: mpmath.power(10, v),
        "expm1": mpmath.expm1, "log": mpmath.log, "log2": lambda v: mpmath.log(v, 2),
        "log10": mpmath.log10, "log1p": mpmath.log1p, "tanh": mpmath.tanh,
    }  # fmt: skip
    with mpmath.workdps(40):
        ref = np.array([float(fns[name](mpmath.mpf(float(v)))) if v != 0 else np.nan for v in x])
    keep = ~np.isnan(ref) & np.isfinite(ref) & (ref != 0)
    got = compiled[np.float64](name, x)
    err, _ = ulp_errors(got[keep], ref[keep])
    assert err.max() <= MAX_ULP[np.float64], (name, x[keep][err.argmax()])


def _check(compiled, dtype, name, x, expected):
    got = compiled[dtype](name, np.array([x], dtype=dtype))[0]
    if math.isnan(expected):
        assert np.isnan(got), (name, x, got)
    else:
        want = dtype(expected)
        assert got == want and np.signbit(got) == np.signbit(want), (name, x, got, expected)


INF, NAN = math.inf, math.nan
SPECIAL = [
    ("exp", NAN, NAN), ("exp", INF, INF), ("exp", -INF, 0.0), ("exp", 0.0, 1.0), ("exp", -0.0, 1.0),
    ("exp", 1e4, INF), ("exp", -1e4, 0.0), ("exp2", 0.0, 1.0), ("exp2", 3.0, 8.0),
    ("exp2", -INF, 0.0), ("exp2", INF, INF), ("exp2", -149.0, 2.0**-149), ("exp2", NAN, NAN),
    ("exp2", -1074.0, 5e-324), ("exp10", 0.0, 1.0), ("exp10", 2.0, 100.0), ("exp10", INF, INF),
    ("exp10", -INF, 0.0), ("exp10", NAN, NAN), ("expm1", 0.0, 0.0), ("expm1", -0.0, -0.0),
    ("expm1", INF, INF), ("expm1", -INF, -1.0), ("expm1", NAN, NAN), ("expm1", 1e-30, 1e-30),
    ("expm1", 1e4, INF), ("log", 0.0, -INF), ("log", -0.0, -INF), ("log", 1.0, 0.0),
    ("log", -1.0, NAN), ("log", -INF, NAN), ("log", INF, INF), ("log", NAN, NAN),
    ("log2", 8.0, 3.0), ("log2", 2.0**-149, -149.0), ("log2", 0.0, -INF), ("log2", -2.0, NAN),
    ("log2", INF, INF), ("log2", 1.0, 0.0), ("log10", 1000.0, 3.0), ("log10", 1e-30, -30.0),
    ("log10", 0.0, -INF), ("log10", -0.5, NAN), ("log10", INF, INF), ("log10", NAN, NAN),
    ("log1p", 0.0, 0.0), ("log1p", -0.0, -0.0), ("log1p", -1.0, -INF), ("log1p", -2.0, NAN),
    ("log1p", INF, INF), ("log1p", -INF, NAN), ("log1p", NAN, NAN), ("log1p", 1e-30, 1e-30),
    ("tanh", 0.0, 0.0), ("tanh", -0.0, -0.0), ("tanh", INF, 1.0), ("tanh", -INF, -1.0),
    ("tanh", 30.0, 1.0), ("tanh", -30.0, -1.0), ("tanh", NAN, NAN), ("tanh", 1e-30, 1e-30),
    ("tanh", -1e-40, -1e-40),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize(("name", "x", "expected"), SPECIAL)
def test_special_values(compiled, dtype, name, x, expected):
    with np.errstate(under="ignore"):
        if dtype == np.float32 and x != 0 and abs(x) < np.finfo(np.float32).smallest_subnormal:
            x = expected = 0.0 if name != "exp2" else x
        if dtype == np.float32 and name == "exp2" and x == -1074.0:
            expected = 0.0
        if dtype == np.float32 and name == "log2" and x == 2.0**-149:
            pass
    _check(compiled, dtype, name, x, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_subnormal_results_and_thresholds(compiled, dtype):
    fi = np.finfo(dtype)
    # exp: overflow threshold, smallest normal / subnormal results, NaN payload preserved as NaN
    ln_max = math.log(float(fi.max))
    x = np.array([np.nextafter(dtype(ln_max), dtype(0)), ln_max * (1 + 4 * float(fi.eps)), math.log(float(fi.tiny)),
                  math.log(float(fi.smallest_subnormal)), math.log(float(fi.smallest_subnormal)) - 1],
                 dtype=dtype)  # fmt: skip
    got = compiled[dtype]("exp", x)
    assert np.isfinite(got[0]) and got[1] == np.inf
    assert got[2] > 0 and got[3] > 0 and got[4] == 0
    # subnormal inputs to log come out right (scaled internally)
    sub = np.array([float(fi.smallest_subnormal) * k for k in (1, 2, 3, 1000)], dtype=dtype)
    err, nan_mismatch = ulp_errors(compiled[dtype]("log", sub), reference("log", sub))
    assert not nan_mismatch.any() and err.max() <= MAX_ULP[dtype]


# ---------------------------------------------------------------------------------------------
# Vectorisation and the builtin routing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_loops_vectorise_without_calls(compiled, dtype):
    text = compiled[dtype].ir_text
    vec = r"<(8|16) x float>" if dtype == np.float32 else r"<(4|8) x double>"
    for name in NAMES:
        start = text.index(f"define void @f_{name}(")
        body = text[start : text.index("\n}\n", start)]
        assert re.search(vec, body), f"f_{name} was not vectorised"
        callees = set(re.findall(r"call [^@]*@([\w.\"]+)", body))
        assert all(c.startswith("llvm.") for c in callees), (name, callees)
        assert not any(re.match(r"llvm\.(exp|log|tanh)", c) for c in callees), (name, callees)
        assert not re.search(r"@(expf?|logf?|tanhf?|expm1f?|log1pf?)\b", body)


def test_builtins_route_to_vecmath():
    mod = ir.Module()
    for ty in (ir.FloatType(), ir.DoubleType(), ir.HalfType()):
        fn = ir.Function(mod, ir.FunctionType(ty, [ty]), f"g_{ty}")
        b = ir.IRBuilder(fn.append_basic_block())
        acc = fn.args[0]
        for _ in range(2):
            for name in NAMES:
                acc = emit_builtin(b, name, [acc])
        b.ret(acc)
    text = str(mod)
    for name in NAMES:
        for sfx in ("f32", "f64"):
            assert len(re.findall(rf"define internal \w+ @\"?__tl_vm_{name}_{sfx}(_scalef)?\b", text)) == 1
    declared = re.findall(r"^declare .*?@\"?([\w.]+)", text, re.M)
    assert all(
        d.startswith(("llvm.fma", "llvm.rint", "llvm.fabs", "llvm.copysign", "llvm.m", "llvm.ldexp"))
        for d in declared
    )
    llvm.parse_assembly(text).verify()


def test_emit_vecmath_rejects_unknown():
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.DoubleType(), [ir.DoubleType()]), "g")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(ValueError):
        emit_vecmath(b, "sin", [fn.args[0]])


# ---------------------------------------------------------------------------------------------
# Speed (report only)
# ---------------------------------------------------------------------------------------------


def _ns_per_element(f, n: int) -> float:
    f()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


def test_speed_report(compiled, capsys):
    n = 1 << 22
    rng = np.random.default_rng(3)
    names = ("exp", "log", "tanh")
    libm = {dt: Compiled(build_module(dt, names, libm=True), dt) for dt in DTYPES}
    rows = []
    for dt in DTYPES:
        for name in names:
            x = rng.uniform(0.01, 10.0, n) if name == "log" else rng.uniform(-10.0, 10.0, n)
            x = x.astype(dt)
            out = np.empty_like(x)
            np_f = _NP[name]
            t_vm = _ns_per_element(lambda nm=name, x=x, o=out, d=dt: compiled[d](nm, x, o), n)
            t_libm = _ns_per_element(lambda nm=name, x=x, o=out, d=dt: libm[d](nm, x, o), n)
            t_np = _ns_per_element(lambda f=np_f, x=x, o=out: f(x, out=o), n)
            rows.append(f"{name:6s} {np.dtype(dt).name:8s} {t_vm:8.3f} {t_libm:8.3f} {t_np:8.3f}")
    with capsys.disabled():
        print("\nns/element, 4M elements:  vecmath   libm-path   numpy")
        print("\n".join(rows))


# ---------------------------------------------------------------------------------------------
# Both float32 exp-family implementations, whatever the host: the vscalef form (chosen on
# AVX-512 hosts) and the portable one (elsewhere)
# ---------------------------------------------------------------------------------------------

EXP_FAMILY = ("exp", "exp2", "exp10")


@pytest.fixture(scope="module", params=[True, False], ids=["scalef", "portable"])
def exp_variant(request):
    mod = ir.Module(name=f"exp_variant_{request.param}")
    for name in EXP_FAMILY:
        _loop(mod, f"f_{name}", ir.FloatType(),
              lambda b, x, nm=name: emit_vecmath(b, nm, [x], scalef=request.param))  # fmt: skip
    return Compiled(mod, np.float32)


@pytest.mark.parametrize("name", EXP_FAMILY)
def test_exp_family_variants_accuracy_and_specials(exp_variant, name):
    x = sample(name, np.float32, 1 << 18, seed=11)
    got = exp_variant(name, x)
    err, nan_mismatch = ulp_errors(got, reference(name, x))
    assert not nan_mismatch.any() and err.max() <= 1, (name, int(err.max()))
    for xv, want in ((NAN, NAN), (INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (1e4, INF), (-1e4, 0.0)):
        _check({np.float32: exp_variant}, np.float32, name, xv, want)


def test_exp_variants_subnormal_results_and_overflow(exp_variant):
    fi = np.finfo(np.float32)
    for name, f in (("exp", math.log), ("exp2", math.log2), ("exp10", math.log10)):
        # just below overflow, just above; smallest normal and subnormal results; below them
        x = np.array([np.nextafter(np.float32(f(float(fi.max))), np.float32(0)), f(float(fi.max)) * (1 + 4 * float(fi.eps)),
                      f(float(fi.tiny)), f(float(fi.smallest_subnormal)), f(float(fi.smallest_subnormal)) - 1],
                     dtype=np.float32)  # fmt: skip
        got = exp_variant(name, x)
        assert np.isfinite(got[0]) and got[1] == np.inf, name
        assert got[2] > 0 and got[3] > 0 and got[4] == 0, name
        err, _ = ulp_errors(got, reference(name, x))
        assert err.max() <= 1, (name, x, got)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["exp", "exp2"])
def test_exp_scalef_on_every_kth_float32(name):
    """Every STEP-th bit pattern of the 2^32 float32 inputs (STEP = TL_EXHAUSTIVE_STEP, default 97;
    1 is the exhaustive check quoted in codegen/vecmath.py: both functions in about 11 minutes here)."""
    step = int(os.environ.get("TL_EXHAUSTIVE_STEP", "97"))
    mod = ir.Module(name=f"every_{name}")
    _loop(mod, "f_x", ir.FloatType(), lambda b, x: emit_vecmath(b, name, [x], scalef=True))
    compiled = Compiled(mod, np.float32)
    chunk = 1 << 26
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        err, nan_mismatch = ulp_errors(compiled("x", x), reference(name, x))
        assert not nan_mismatch.any() and err.max() <= 1, (name, start, int(err.max()))
