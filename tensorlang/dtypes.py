"""types: the scalar element types of the language and TC's rules for combining them."""

from __future__ import annotations

import enum


class ScalarType(enum.Enum):
    """An element type. The value is the NumPy dtype name."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def numpy_name(self) -> str:
        return self.value

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def storage_bytes(self) -> int:
        """Bytes of one element in memory (bool is stored as one byte)."""
        return 1 if self is ScalarType.BOOL else _BITS[self] // 8

    @property
    def is_float(self) -> bool:
        return self in (ScalarType.FLOAT16, ScalarType.FLOAT32, ScalarType.FLOAT64)

    @property
    def is_bool(self) -> bool:
        return self is ScalarType.BOOL

    @property
    def is_integer(self) -> bool:
        """Integral, bool excluded."""
        return not self.is_float and not self.is_bool

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.value.startswith("int")

    def __str__(self) -> str:
        return self.value


_BITS = {
    ScalarType.BOOL: 1,
    ScalarType.INT8: 8,
    ScalarType.INT16: 16,
    ScalarType.INT32: 32,
    ScalarType.INT64: 64,
    ScalarType.UINT8: 8,
    ScalarType.UINT16: 16,
    ScalarType.UINT32: 32,
    ScalarType.UINT64: 64,
    ScalarType.FLOAT16: 16,
    ScalarType.FLOAT32: 32,
    ScalarType.FLOAT64: 64,
}

# Spellings in source text; `float` and `double` are aliases, `half` is accepted for float16.
TYPE_NAMES: dict[str, ScalarType] = {t.value: t for t in ScalarType} | {
    "float": ScalarType.FLOAT32,
    "double": ScalarType.FLOAT64,
    "half": ScalarType.FLOAT16,
}


def match_types(a: ScalarType, b: ScalarType) -> ScalarType:
    """TC's `match_types`: the common type of a binary arithmetic operation.

    int op float → the float; float op float → the wider; uint op uint → the wider;
    any other integral mix → the signed integer of the larger width. bool counts as an
    integer of width 1 (so bool op bool is bool only for logical operators, see the checker).
    """
    if a == b:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            return a if a.bits >= b.bits else b
        return a if a.is_float else b
    if not a.is_signed and not b.is_signed and not a.is_bool and not b.is_bool:
        return a if a.bits >= b.bits else b
    width = max(a.bits, b.bits, 8)
    return {8: ScalarType.INT8, 16: ScalarType.INT16, 32: ScalarType.INT32, 64: ScalarType.INT64}[width]
