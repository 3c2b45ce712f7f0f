"""export: a def's signature + the error table → the C header that documents and declares the exported functions."""

from __future__ import annotations

from collections.abc import Mapping

from tensorlang import ir
from tensorlang.dtypes import ScalarType

from .wrapper import ERROR_MESSAGES, size_symbols

C_TYPES: dict[ScalarType, str] = {
    ScalarType.BOOL: "uint8_t",  # one byte, 0 or 1 (as NumPy stores bool)
    ScalarType.INT8: "int8_t",
    ScalarType.INT16: "int16_t",
    ScalarType.INT32: "int32_t",
    ScalarType.INT64: "int64_t",
    ScalarType.UINT8: "uint8_t",
    ScalarType.UINT16: "uint16_t",
    ScalarType.UINT32: "uint32_t",
    ScalarType.UINT64: "uint64_t",
    ScalarType.FLOAT16: "uint16_t",  # IEEE binary16 bits: C has no portable half type
    ScalarType.FLOAT32: "float",
    ScalarType.FLOAT64: "double",
}

ERROR_NAMES = {
    0: "OK",
    1: "INDEX",
    2: "DIVISION",
    3: "CANCELLED",
    4: "SIZES",
    5: "NOT_EXPORTED_SIZES",
    6: "NO_MEMORY",
}


def _shape(t: ir.Tensor) -> str:
    return f"[{', '.join(str(d) for d in t.shape)}]" if t.shape else "scalar"


def c_header(program: ir.Program, name: str, sizes: Mapping[str, int] | None) -> str:
    """The header text: include guard, extern "C", the ABI in comments and three prototypes."""
    guard = f"TENSORLANG_{name.upper()}_H"
    symbols = size_symbols(program)
    ins = [f"const {C_TYPES[t.dtype]}* {t.name}" for t in program.inputs]
    outs = [f"{C_TYPES[t.dtype]}* {t.name}" for t in program.outputs]
    args = ", ".join(ins + outs + [f"int64_t {s}" for s in symbols])
    ndims = sum(t.rank for t in program.outputs)
    fixed = ", ".join(f"{k}={v}" for k, v in sizes.items()) if sizes is not None else None
    lines = [
        f"/* {name}.h: ahead-of-time export of the tensorlang def `{program.name}` (generated; do not edit).",
        " *",
        f" * int32_t {name}(inputs..., outputs..., sizes...) computes the def: inputs in def order,",
        " * outputs caller-allocated in return order, then one int64_t per size symbol in order of",
        " * first appearance in the signature. Tensors are dense row-major arrays that must not",
        f" * overlap. It returns 0, or an error code that {name}_error explains; on error the outputs",
        " * may hold partial results. Outputs accumulated with `+=` (no `!`) add to the caller's values.",
        " * Export runs serially: one call uses the calling thread only, and calls on different",
        " * threads may run at once. Temporaries and scratch memory are malloc'ed and freed per call.",
        " *",
    ]
    for t in program.inputs:
        lines.append(f" *   input  {t.name}: {t.dtype} {_shape(t)}")
    for t in program.outputs:
        lines.append(f" *   output {t.name}: {t.dtype} {_shape(t)}")
    if fixed is not None:
        lines.append(
            f" * Specialised to {fixed}: other sizes return {name.upper()}_ERROR_NOT_EXPORTED_SIZES."
        )
    else:
        lines.append(" * Generic: any sizes that satisfy the def (each 0 .. 2^31-1).")
    lines += [" */", f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", ""]
    lines += ["#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    for code, text in ERROR_MESSAGES.items():
        lines.append(f"#define {name.upper()}_ERROR_{ERROR_NAMES[code]} {code} /* {text} */")
    lines.append(f"#define {name.upper()}_OUTPUT_DIMS {ndims} /* entries {name}_output_shape writes */")
    lines += [
        "",
        f"int32_t {name}({args});",
        "",
        "/* A static message for an error code (never NULL). */",
        f"const char* {name}_error(int32_t code);",
        "",
        "/* The extents of every output, concatenated in return order. */",
        f"void {name}_output_shape({', '.join([f'int64_t {s}' for s in symbols] + ['int64_t* dims'])});",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {guard} */",
    ]
    return "\n".join(lines) + "\n"
