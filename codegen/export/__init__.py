"""export: Schedule + sizes (or none) → `<name>.o`, `<name>.h` and `<name>.so` in a directory, a self-contained C ABI kernel."""

from __future__ import annotations

import keyword
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import islpy as isl

from polyhedral.sizes import compile_size_expr
from scheduler import Schedule
from tensorlang import ir
from tensorlang.errors import TensorLangError

from ..lowering.lower import lower_to_llvm
from ..planning.options import CodegenOptions
from ..planning.plan import KernelPlan, plan_kernel
from .header import c_header
from .objects import build_object, link_shared
from .sizes_ir import UnsupportedSizeExpression
from .wrapper import INT32_MAX, define_entry, define_error, define_output_shape, exported_symbols

__all__ = ["ExportResult", "export_schedule"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class ExportResult:
    """What `tensorlang.export` wrote: the object, the header and, with a linker, the shared library."""

    name: str
    object: Path
    header: Path
    shared: Path | None  # None when no linker was found (`cc`, or the `ziglang` wheel)
    sizes: tuple[tuple[str, int], ...] | None  # the sizes it is specialised to; None: generic


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise TensorLangError(f"export: name= must be a C identifier, got {name!r}")


def _check_sizes(program: ir.Program, sizes: object) -> dict[str, int]:
    """sizes= as {symbol: int}, naming every size symbol of the def and nothing else."""
    if not isinstance(sizes, Mapping):
        raise TensorLangError(
            f"export: sizes= must be a mapping of size symbol to int, got {type(sizes).__name__}"
        )
    symbols = [s.name for s in program.sizes]
    unknown = [k for k in sizes if k not in symbols]
    missing = [s for s in symbols if s not in sizes]
    if unknown or missing:
        raise TensorLangError(
            f"{program.name}: export sizes= must name exactly the sizes {', '.join(symbols) or '(none)'}"
            + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    out = {}
    for s in symbols:
        v = sizes[s]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT32_MAX:
            raise TensorLangError(f"{program.name}: export size {s}={v!r} must be an int in 0..2^31-1")
        out[s] = int(v)
    return out


def _check_fixed_sizes(plan: KernelPlan, sizes: Mapping[str, int]) -> None:
    """What the runtime checks once per set of sizes, done once at export for a specialised kernel."""
    program = plan.program
    for r in program.requirements:
        if compile_size_expr(r.expr)(sizes) != 0:
            raise TensorLangError(f"{program.name}: export sizes break a requirement: {r.message}")
    for t in program.tensors:
        for d, extent in enumerate(t.shape):
            if compile_size_expr(extent)(sizes) < 0:
                raise TensorLangError(f"{program.name}: with these sizes {t.name} dimension {d} is negative")
    fixed = None
    for check in plan.scop.checks:
        if check.violation is not None:
            fixed = fixed if fixed is not None else plan.scop.params.fixed_context(sizes)
            if not check.violation.intersect(fixed).is_empty():
                raise TensorLangError(
                    f"{program.name}: with these sizes an access to {check.tensor} is out of bounds"
                )


def export_schedule(
    schedule: Schedule,
    options: CodegenOptions,
    path: str | os.PathLike,
    name: str | None = None,
    sizes: Mapping[str, int] | None = None,
) -> ExportResult:
    """Plan, lower and wrap the schedule's def; write `<name>.o`, `<name>.h` and, when a linker
    exists, `<name>.so` into the directory `path` (created if needed)."""
    program = schedule.scop.program
    name = program.name if name is None else name
    _check_name(name)
    fixed = _check_sizes(program, sizes) if sizes is not None else None
    try:
        plan = plan_kernel(schedule, options, fixed)
    except isl.Error as exc:
        raise TensorLangError(f"{program.name}: internal compiler error while planning: {exc}") from exc
    if fixed is not None:
        _check_fixed_sizes(plan, fixed)
    try:
        module, layout = lower_to_llvm(plan)
        define_entry(module, plan, layout, name)
        define_error(module, name)
        define_output_shape(module, program, name)
        dtypes = tuple(
            sorted({program.tensor(c.c.tensor).dtype.numpy_name for c in plan.contractions.values()})
        )
        dtypes = tuple(sorted(set(map(plan.gemm_variant, dtypes))))  # the GEMM variants it calls
        code = build_object(module, dtypes, exported_symbols(name), plan.vectorize)
    except UnsupportedSizeExpression as exc:
        raise TensorLangError(f"{program.name}: generic export: {exc}; export with sizes=") from exc
    except (isl.Error, RuntimeError) as exc:
        raise TensorLangError(
            f"{program.name}: internal compiler error while generating code: {exc}"
        ) from exc
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        obj, header = directory / f"{name}.o", directory / f"{name}.h"
        obj.write_bytes(code)
        header.write_text(c_header(program, name, fixed))
    except OSError as exc:
        raise TensorLangError(f"export: cannot write into {directory}: {exc}") from exc
    shared = directory / f"{name}.so"
    linked = link_shared(obj, shared)
    return ExportResult(
        name, obj, header, shared if linked else None, tuple(fixed.items()) if fixed is not None else None
    )
