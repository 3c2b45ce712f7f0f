"""lowering: a plan's vector width → the "prefer-vector-width" attribute of the kernel's functions.

LLVM's loop and SLP vectorisers size their vectors by the target's preferred register width (on
x86 the `prefer-vector-width` function attribute: 256 bits on many AVX-512 CPUs). A plan that
chooses another width (Options.vector_width, a tuning knob) sets it on every function the
kernel defines, so the vectorisers build <4 x float> at 128 bits, <16 x float> at 512 (as far as
the CPU has such registers: wider than the hardware, LLVM splits the vectors). It changes only
the choice of instructions, never the order of a reduction without fast-math.
"""

from __future__ import annotations

import llvmlite.ir as ll

VECTOR_WIDTHS = (128, 256, 512)


def check_vector_width(value: object) -> int | None:
    """Options.vector_width validated: None or one of VECTOR_WIDTHS. Raises ValueError."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value in VECTOR_WIDTHS):
        return value
    raise ValueError(f"Options.vector_width must be None or one of {VECTOR_WIDTHS} (bits), got {value!r}")


def apply_vector_width(module: ll.Module, bits: int | None) -> None:
    """Set prefer-vector-width (and min-legal-vector-width, so that calls between the functions
    keep their vector arguments legal) on every function `module` defines."""
    if bits is None:
        return
    for fn in module.functions:
        if not fn.is_declaration:
            # llvmlite's FunctionAttributes accepts only enum attributes; string attributes are
            # printed as they are, so add them to the underlying set
            set.add(fn.attributes, f'"prefer-vector-width"="{bits}"')
            set.add(fn.attributes, f'"min-legal-vector-width"="{bits}"')
