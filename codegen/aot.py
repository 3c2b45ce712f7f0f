"""codegen: source text + sizes (or none) → an exported C kernel on disk (`tensorlang.export`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .driver import compile as compile_source
from .export import ExportResult, export_schedule
from .options import Options


def export(
    source: str,
    name: str | None = None,
    *,
    sizes: Mapping[str, int] | None = None,
    options: Options | None = None,
    path: str | os.PathLike,
    filename: str = "<source>",
) -> ExportResult:
    """Compile the def `name` (or the only def) of `source` ahead of time into the directory
    `path`: `<def>.o`, `<def>.h` and, when a linker exists, `<def>.so`, whose C function is named
    after the def (README "Ahead-of-time export"). With `sizes=` the code is specialised to
    them; otherwise it is the generic kernel. `filename` locates errors, as for `compile`."""
    kernel = compile_source(
        source, name, options=options, filename=filename
    )  # front end, scop, schedule; no JIT
    return export_schedule(kernel.schedule, kernel.options.codegen, path, None, sizes)
