"""emit: a small helper that emits scalar floating-point LLVM IR for one builder and one type."""

from __future__ import annotations

import llvmlite.ir as ir


class FloatIR:
    """Arithmetic, comparisons and intrinsic calls on values of one floating type (float or double)."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type):
        self.b = b
        self.ty = ty
        self.mod: ir.Module = b.module
        self.is_f32 = isinstance(ty, ir.FloatType)
        self.sfx = "f32" if self.is_f32 else "f64"
        self.ity = ir.IntType(32 if self.is_f32 else 64)

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, v)

    def add(self, x, y):
        return self.b.fadd(x, y)

    def sub(self, x, y):
        return self.b.fsub(x, y)

    def mul(self, x, y):
        return self.b.fmul(x, y)

    def div(self, x, y):
        return self.b.fdiv(x, y)

    def neg(self, x):
        return self.b.fneg(x)

    def sel(self, cond, x, y):
        return self.b.select(cond, x, y)

    def cmp(self, op: str, x, y):
        """Ordered comparison (false if either is NaN)."""
        return self.b.fcmp_ordered(op, x, y)

    def isnan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def intr(self, base: str, *args):
        """A call of the LLVM intrinsic `llvm.<base>.<f32|f64>` (declared once per module)."""
        name = f"llvm.{base}.{self.sfx}"
        fn = self.mod.globals.get(name)
        if fn is None:
            fn = ir.Function(self.mod, ir.FunctionType(self.ty, [self.ty] * len(args)), name)
        return self.b.call(fn, list(args))

    def fma(self, x, y, z):
        return self.intr("fma", x, y, z)

    def horner(self, x, coeffs):
        """A polynomial in x, coefficients highest degree first, as a chain of fmas."""
        acc = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc


def libm_float_name(base: str) -> str:
    """The float variant of a double libm function: `sin` → `sinf`, `lgamma_r` → `lgammaf_r`."""
    return base[:-2] + "f_r" if base.endswith("_r") else base + "f"
