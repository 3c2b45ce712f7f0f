"""emit: typed scalar operations of the language → LLVM IR instructions (one builder at a time)."""

from __future__ import annotations

import llvmlite.ir as ll

from tensorlang.dtypes import ScalarType

I1, I8, I32, I64 = ll.IntType(1), ll.IntType(8), ll.IntType(32), ll.IntType(64)
F16, F32, F64 = ll.HalfType(), ll.FloatType(), ll.DoubleType()


def register_type(t: ScalarType) -> ll.Type:
    """The LLVM type a value of `t` has in registers (bool is i1)."""
    if t.is_bool:
        return I1
    if t.is_float:
        return {16: F16, 32: F32, 64: F64}[t.bits]
    return ll.IntType(t.bits)


def memory_type(t: ScalarType) -> ll.Type:
    """The LLVM type of an element in memory (NumPy stores bool in one byte)."""
    return I8 if t.is_bool else register_type(t)


def const(t: ScalarType, value: int | float | bool) -> ll.Constant:
    if t.is_float:
        return ll.Constant(register_type(t), float(value))
    if t.is_bool:
        return ll.Constant(I1, int(bool(value)))
    bits = t.bits
    v = int(value) & ((1 << bits) - 1)  # two's complement bit pattern
    return ll.Constant(ll.IntType(bits), v)


def identity(op: str, t: ScalarType) -> ll.Constant:
    """The neutral element of a reduction (floats use ±inf for min/max, not ±FLT_MAX)."""
    if op == "+":
        return const(t, 0)
    if op == "*":
        return const(t, 1)
    if t.is_bool:
        return const(t, op == "min")
    if t.is_float:
        return const(t, float("inf") if op == "min" else float("-inf"))
    if t.is_signed:
        lo, hi = -(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1
    else:
        lo, hi = 0, (1 << t.bits) - 1
    return const(t, hi if op == "min" else lo)


def _intrinsic(b: ll.IRBuilder, name: str, ret: ll.Type, args: list, arg_types: list[ll.Type]) -> ll.Value:
    module = b.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ll.Function(module, ll.FunctionType(ret, arg_types), name)
    return b.call(fn, args)


def _suffix(ty: ll.Type) -> str:
    if isinstance(ty, ll.IntType):
        return f"i{ty.width}"
    return {F16: "f16", F32: "f32", F64: "f64"}[ty] if ty in (F16, F32, F64) else str(ty)


def float_minmax(b: ll.IRBuilder, op: str, x: ll.Value, y: ll.Value) -> ll.Value:
    """NaN-propagating min/max, like NumPy's minimum/maximum (the `min`/`max` keywords)."""
    name = f"llvm.{'minimum' if op == 'min' else 'maximum'}.{_suffix(x.type)}"
    return _intrinsic(b, name, x.type, [x, y], [x.type, x.type])


def combine(
    b: ll.IRBuilder, op: str, t: ScalarType, acc: ll.Value, x: ll.Value, flags: tuple[str, ...]
) -> ll.Value:
    """acc op x for a reduction operator (+, *, min, max)."""
    if t.is_bool:
        return b.or_(acc, x) if op in ("+", "max") else b.and_(acc, x)
    if op == "+":
        return b.fadd(acc, x, flags=flags) if t.is_float else b.add(acc, x)
    if op == "*":
        return b.fmul(acc, x, flags=flags) if t.is_float else b.mul(acc, x)
    if t.is_float:
        return float_minmax(b, op, acc, x)
    pred = "<" if op == "min" else ">"
    cmp = b.icmp_signed(pred, acc, x) if t.is_signed else b.icmp_unsigned(pred, acc, x)
    return b.select(cmp, acc, x)


def compare(b: ll.IRBuilder, op: str, t: ScalarType, x: ll.Value, y: ll.Value) -> ll.Value:
    if t.is_float:
        return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)
    if t.is_signed:
        return b.icmp_signed(op, x, y)
    return b.icmp_unsigned(op, x, y)


def convert(b: ll.IRBuilder, x: ll.Value, src: ScalarType, dst: ScalarType) -> ll.Value:
    """Value conversion with the language's rules (float→int truncates and saturates, NaN → 0)."""
    if src == dst:
        return x
    to = register_type(dst)
    if dst.is_bool:
        if src.is_float:
            return b.fcmp_unordered("!=", x, ll.Constant(x.type, 0.0))
        return b.icmp_unsigned("!=", x, ll.Constant(x.type, 0))
    if src.is_bool:
        return b.uitofp(x, to) if dst.is_float else b.zext(x, to)
    if src.is_float and dst.is_float:
        return b.fpext(x, to) if dst.bits > src.bits else b.fptrunc(x, to)
    if src.is_float:
        name = f"llvm.fpto{'si' if dst.is_signed else 'ui'}.sat.{_suffix(to)}.{_suffix(x.type)}"
        return _intrinsic(b, name, to, [x], [x.type])
    if dst.is_float:
        return b.sitofp(x, to) if src.is_signed else b.uitofp(x, to)
    if dst.bits > src.bits:
        return b.sext(x, to) if src.is_signed else b.zext(x, to)
    if dst.bits < src.bits:
        return b.trunc(x, to)
    return x  # same width, other signedness: same bits


def to_index(b: ll.IRBuilder, x: ll.Value, t: ScalarType) -> ll.Value:
    """An integral value as an i64 subscript."""
    if x.type == I64:
        return x
    if t.is_signed and not t.is_bool:
        return b.sext(x, I64)
    return b.zext(x, I64)


def load_element(b: ll.IRBuilder, ptr: ll.Value, t: ScalarType) -> ll.Value:
    v = b.load(ptr)
    return b.trunc(v, I1) if t.is_bool else v


def store_element(b: ll.IRBuilder, value: ll.Value, ptr: ll.Value, t: ScalarType) -> None:
    b.store(b.zext(value, I8) if t.is_bool else value, ptr)


def float_mod(b: ll.IRBuilder, x: ll.Value, y: ll.Value, flags: tuple[str, ...]) -> ll.Value:
    """Floor modulo for floats (the sign of the divisor), like numpy.mod."""
    zero = ll.Constant(x.type, 0.0)
    r = b.frem(x, y, flags=flags)
    needs_fix = b.and_(
        b.fcmp_ordered("!=", r, zero),
        b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero)),
    )
    return b.select(needs_fix, b.fadd(r, y, flags=flags), r)


def int_div_mod(b: ll.IRBuilder, op: str, t: ScalarType, x: ll.Value, y: ll.Value) -> ll.Value:
    """Floor division / floor modulo of integers; y must already be known non-zero.

    x / -1 is computed without the hardware trap on MIN / -1 (it wraps, like NumPy).
    """
    if not t.is_signed:
        return b.udiv(x, y) if op == "/" else b.urem(x, y)
    ty = x.type
    zero, one, minus_one = ll.Constant(ty, 0), ll.Constant(ty, 1), ll.Constant(ty, -1)
    is_minus_one = b.icmp_signed("==", y, minus_one)
    safe_y = b.select(is_minus_one, one, y)
    q = b.sdiv(x, safe_y)
    r = b.srem(x, safe_y)
    q = b.select(is_minus_one, b.sub(zero, x), q)
    r = b.select(is_minus_one, zero, r)
    # C division truncates; move toward -inf when the remainder's sign differs from y's.
    fix = b.and_(
        b.icmp_signed("!=", r, zero), b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero))
    )
    if op == "/":
        return b.select(fix, b.sub(q, one), q)
    return b.select(fix, b.add(r, y), r)
