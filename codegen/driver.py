"""codegen: source text → Kernel, running every stage (front end, polyhedral, scheduler, codegen)."""

from __future__ import annotations

import islpy as isl

from polyhedral import build_scop
from scheduler import compute_schedule
from tensorlang import frontend
from tensorlang.errors import TensorLangError
from tensorlang.options import Options

from .kernel import Kernel


def compile(source: str, name: str | None = None, *, options: Options | None = None) -> Kernel:  # noqa: A001
    """Compile the def `name` (or the only def) of `source` into a Kernel."""
    if not isinstance(source, str):
        raise TensorLangError(
            f"tensorlang.compile expects the source text as a str, got {type(source).__name__}"
        )
    if name is not None and not isinstance(name, str):
        raise TensorLangError(f"name= must be a str, got {type(name).__name__}")
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise TensorLangError(f"options= must be a tensorlang.Options, got {type(options).__name__}")
    program = frontend.check_source(source, name)
    syntax_text = str(frontend.select_def(frontend.parse_source(source), program.name))
    try:
        scop = build_scop(program)
        schedule = compute_schedule(scop, options)
    except (isl.Error, RuntimeError, ValueError) as exc:  # a failure here is a compiler bug
        raise TensorLangError(
            f"{program.name}: internal compiler error in the polyhedral stages: {exc}"
        ) from exc
    return Kernel(program, schedule, options, syntax_text)
