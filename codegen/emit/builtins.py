"""emit: builtin math calls → LLVM IR (intrinsics, libm, or inline implementations)

`emit_builtin(builder, name, args)` lowers one call of a language builtin (see
`tensorlang.builtins.BUILTINS`) on float32 / float64 values (float16 is computed in float32) to
LLVM IR. Four strategies, in order of preference:

* **Vectorisable inline IR** (`codegen.vecmath`): exp exp2 exp10 expm1 log log2 log10 log1p
  tanh are branch-free ``internal alwaysinline`` functions (range reduction, polynomial,
  exponent bit manipulation; <= 1 ulp measured, see that module's accuracy table), so loops
  using them vectorise instead of calling libm once per element. Their intrinsic / libm entries
  below are no longer used for the builtins themselves (the inline implementations further down
  still call ``llvm.exp`` / ``llvm.log`` internally).
* **LLVM intrinsics** (vectorisable, constant-foldable): sqrt exp exp2 exp10 log log2 log10 fabs
  floor ceil trunc round copysign fma pow sin cos tan asin acos atan atan2 sinh cosh tanh,
  fmax/fmin (``llvm.maxnum``/``llvm.minnum``: a NaN operand is ignored, like C ``fmax``), and
  fmod (the ``frem`` instruction, C ``fmod`` semantics). On x86-64 most of these are lowered to
  the libm calls listed in `LIBM_SYMBOLS`.
* **C math library** (``name`` for double, ``namef`` for float): acosh asinh atanh cbrt erf erfc
  expm1 log1p hypot j0 j1 y0 y1 tgamma logb nextafter remainder, and lgamma through the
  re-entrant ``lgamma_r``/``lgammaf_r`` (no write to the global ``signgam``, so safe in parallel
  loops) wrapped in a small internal function. Double cbrt gets one Newton step with an exactly
  evaluated residual on top (glibc 2.36's cbrt is off by up to 3 ulp, even on exact cubes:
  cbrt(27) = 3.0000000000000004).
* **Inline IR** (small ``internal`` functions defined once per module, or straight-line code):
  fdivide fdim rsqrt rcbrt rhypot norm3d norm4d rnorm3d rnorm4d sinpi cospi erfcx erfinv erfcinv
  normcdf normcdfinv cyl_bessel_i0 cyl_bessel_i1. The float32 variants compute in double and
  round once at the end, so they are essentially correctly rounded.

The inline implementations, their algorithms and their measured accuracy are in
`codegen.emit.special`.

The JIT (MCJIT) resolves the libm symbols from the running process on Linux/glibc without help;
`ensure_libm_loaded()` additionally loads libm permanently into LLVM's symbol search, which makes
``llvmlite.binding.address_of_symbol`` see them and helps on hosts where the process does not
already export libm. A driver may call it once before JIT-compiling; it is idempotent.

"""

from __future__ import annotations

import ctypes.util

import llvmlite.ir as ir

from tensorlang.builtins import BUILTINS

from .floatir import libm_float_name
from .special import SpecialIR, inline_builtin
from .vecmath import VECMATH_BUILTINS, emit_vecmath

__all__ = ["LIBM_SYMBOLS", "emit_builtin", "ensure_libm_loaded"]

# ---------------------------------------------------------------------------------------------
# Strategy tables
# ---------------------------------------------------------------------------------------------

# builtin → LLVM intrinsic base name (``llvm.<base>.f32`` / ``llvm.<base>.f64``).
_INTRINSICS: dict[str, str] = {
    "sqrt": "sqrt", "exp": "exp", "exp2": "exp2", "exp10": "exp10", "log": "log", "log2": "log2",
    "log10": "log10", "fabs": "fabs", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
    "round": "round", "copysign": "copysign", "fma": "fma", "pow": "pow", "sin": "sin",
    "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "atan2": "atan2",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "fmax": "maxnum", "fmin": "minnum",
}  # fmt: skip

# builtin → C math library function (double name; float adds "f").
_LIBM: dict[str, str] = {
    "acosh": "acosh", "asinh": "asinh", "atanh": "atanh", "cbrt": "cbrt", "erf": "erf",
    "erfc": "erfc", "expm1": "expm1", "log1p": "log1p", "hypot": "hypot", "j0": "j0", "j1": "j1",
    "y0": "y0", "y1": "y1", "tgamma": "tgamma", "logb": "logb", "nextafter": "nextafter",
    "remainder": "remainder",
}  # fmt: skip

# Double-precision libm names that may be referenced by the generated code: declared directly,
# called by the inline implementations, or emitted by LLVM when it lowers an intrinsic / frem.
_LIBM_BASES = (
    set(_LIBM.values())
    | {"lgamma_r", "fmod", "sqrt", "exp", "exp2", "exp10", "log", "log2", "log10", "fabs", "floor",
       "ceil", "trunc", "round", "copysign", "fma", "pow", "sin", "cos", "tan", "asin", "acos",
       "atan", "atan2", "sinh", "cosh", "tanh", "fmax", "fmin", "sincos"}
)  # fmt: skip


#: Every external (libm) symbol that code produced by this module may call, for float and double.
LIBM_SYMBOLS: frozenset[str] = frozenset(_LIBM_BASES | {libm_float_name(b) for b in _LIBM_BASES})

_libm_loaded = False


def ensure_libm_loaded() -> None:
    """Make libm's symbols visible to LLVM's symbol search (idempotent).

    MCJIT already resolves libm from the running Python process on Linux/glibc; this also makes
    ``llvmlite.binding.address_of_symbol`` find them and covers hosts where libm is not global.
    """
    global _libm_loaded
    if _libm_loaded:
        return
    import llvmlite.binding as llvm

    path = ctypes.util.find_library("m")
    if path is not None:
        llvm.load_library_permanently(path)
    _libm_loaded = True


def emit_builtin(builder: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """Emit a call of builtin `name` on `args` (all of one float type); returns that type.

    Functions needed are declared (or, for inline implementations, defined with internal
    linkage) in ``builder.module`` once. Raises ValueError for an unknown builtin or a wrong
    number of arguments.
    """
    if name not in BUILTINS:
        raise ValueError(f"unknown builtin {name!r}")
    if len(args) != BUILTINS[name]:
        raise ValueError(f"builtin {name!r} takes {BUILTINS[name]} arguments, got {len(args)}")
    ty = args[0].type
    if isinstance(ty, ir.HalfType):  # compute in float, round once
        f32 = ir.FloatType()
        wide = [builder.fpext(a, f32) for a in args]
        return builder.fptrunc(emit_builtin(builder, name, wide), ty)
    if not isinstance(ty, ir.FloatType | ir.DoubleType):
        raise ValueError(f"builtin {name!r}: unsupported argument type {ty}")
    if name in VECMATH_BUILTINS:  # branch-free inline IR that the loop vectoriser can widen
        return emit_vecmath(builder, name, args)
    e = SpecialIR(builder, ty)
    if name in _INTRINSICS:
        return e.intr(_INTRINSICS[name], *args)
    if name in _LIBM and not (name == "cbrt" and not e.is_f32):
        return e.libm(_LIBM[name], *args)
    return inline_builtin(e, name, args)
