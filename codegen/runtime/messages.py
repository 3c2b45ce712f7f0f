"""runtime: a kernel's status code or a failed size check → a located ArgumentError naming the user's tensor and statement."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from tensorlang.errors import ArgumentError

from ..lowering.status import ERROR_DIVISION, ERROR_INDEX, ERROR_MEMORY

if TYPE_CHECKING:  # only called once the stages exist (runtime errors need the Scop's checks)
    from polyhedral import Scop
    from tensorlang import ir


def runtime_error(name: str, scop: Scop, code: int, error: np.ndarray) -> ArgumentError:
    """The error of a kernel that returned `code`, with the details it left in `error`."""
    if code == ERROR_INDEX:
        check = scop.checks[int(error[1])]
        dim, value = int(error[2]), int(error[3])
        stmt = scop.statement(check.statement).statement
        where = statement_location(stmt)
        if check.read is not None:
            access = source_text(check.read)
        elif stmt.is_scatter:  # a scatter's data-dependent left-hand side
            access = f"the write {source_text(_write(stmt))}"
        else:
            access = f"{check.tensor} (write)"
        return ArgumentError(
            f"{name}: index {value} out of range for dimension {dim} of {check.tensor} "
            f"in {access}{where}; generated code never accesses out of bounds, so the call was stopped"
        )
    if code == ERROR_DIVISION:
        stmt = scop.program.statements[int(error[1])]
        return ArgumentError(
            f"{name}: integer division by zero in statement {stmt.tensor}{statement_location(stmt)}"
        )
    if code == ERROR_MEMORY:
        return ArgumentError(
            f"{name}: out of memory: {int(error[1])} bytes of scratch memory could not be allocated"
        )
    return ArgumentError(f"{name}: kernel failed with code {code}")


def check_preconditions(
    name: str, scop: Scop, sizes: Mapping[str, int], describe: Callable[[str, Mapping[str, int]], str]
) -> None:
    """Accesses proved in bounds only for some sizes: raise for sizes that break one.
    `describe(tensor, sizes)` says the tensor's shape at these sizes."""
    fixed = None
    for check in scop.checks:
        if check.violation is None:
            continue
        fixed = fixed if fixed is not None else scop.params.fixed_context(sizes)
        if not check.violation.intersect(fixed).is_empty():
            stmt = scop.statement(check.statement).statement
            access = source_text(check.read) if check.read is not None else f"the write of {check.tensor}"
            raise ArgumentError(
                f"{name}: with {sizes_text(sizes)}, {access} would access {check.tensor} "
                f"out of bounds ({describe(check.tensor, sizes)}){statement_location(stmt)}"
            )


def _write(stmt: ir.Statement) -> ir.Read:
    from tensorlang.ir import Read

    return Read(tensor=stmt.tensor, indices=stmt.lhs, dtype=stmt.rhs.dtype)


def source_text(read: ir.Read) -> str:
    """An access as the user would write it: `A(i * i)` rather than `A((i * i))`."""
    from tensorlang.ir import Binary

    def bare(e: ir.Expr) -> str:
        text = str(e)
        return text[1:-1] if isinstance(e, Binary) and e.op not in ("min", "max") else text

    return f"{read.tensor}({', '.join(bare(i) for i in read.indices)})" if read.indices else read.tensor


def sizes_text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) or "no sizes"


def statement_location(stmt: ir.Statement) -> str:
    if stmt.span is None:
        return ""
    line = stmt.span.source.line_text(stmt.span.line).strip()
    return f" (line {stmt.span.line}: {line})"
