"""codegen: source text → Kernel, running every stage (front end, polyhedral, scheduler, codegen)."""

from __future__ import annotations

import warnings
from dataclasses import replace

from tensorlang.errors import TensorLangError, TensorLangWarning

from .options import Options
from .runtime import warm
from .runtime.kernel import Kernel

TARGETS = ("cpu", "cuda")


def compile(  # noqa: A001
    source: str,
    name: str | None = None,
    *,
    options: Options | None = None,
    filename: str = "<source>",
    target: str = "cpu",
):
    """Compile the def `name` (or the only def) of `source` into a Kernel. `filename` is the name
    errors and warnings locate the source by (`matmul.tc:3:14`), as for Python's `compile`.

    With the compilation cache on, a program compiled before (same text, name, filename, options,
    thread count and compiler) is not compiled again: its record (runtime/warm.py) gives the
    Kernel, and its warnings are given again.

    `target="cuda"` gives a CudaKernel (codegen/gpu/): the same stages, then a GPU grid mapping
    and PTX through LLVM's NVPTX back end; the program records are CPU-only and not used."""
    if target not in TARGETS:
        raise TensorLangError(f"unknown target {target!r}; targets are {', '.join(map(repr, TARGETS))}")
    if not isinstance(source, str):
        raise TensorLangError(
            f"tensorlang.compile expects the source text as a str, got {type(source).__name__}"
        )
    if name is not None and not isinstance(name, str):
        raise TensorLangError(f"name= must be a str, got {type(name).__name__}")
    if not isinstance(filename, str):
        raise TensorLangError(f"filename= must be a str, got {type(filename).__name__}")
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise TensorLangError(f"options= must be a tensorlang.Options, got {type(options).__name__}")
    if target == "cuda":
        return _compile_cuda(source, name, options, filename)
    key = warm.program_key(source, name, filename, repr(options), options.schedule.thread_count())
    record = warm.load_program(key)
    if record is not None:
        for message in record.warnings:
            warnings.warn(message, TensorLangWarning, stacklevel=2)
        return Kernel.from_records(record.interface, options, source, filename, key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # all of them, to record; the caller's filters apply below
        program, schedule, syntax_text = run_stages(source, name, options, filename)
    for w in caught:
        warnings.warn(w.message, stacklevel=2)
    kernel = Kernel(program, schedule, options, syntax_text, source=source, filename=filename)
    kernel.program_key = key
    given = [str(w.message) for w in caught if issubclass(w.category, TensorLangWarning)]
    warm.store_program(key, kernel.interface, given)
    return kernel


def _compile_cuda(source: str, name: str | None, options: Options, filename: str):
    """target="cuda": the stages, no disk records (they hold CPU interfaces and machine code)."""
    from .gpu.kernel import CudaKernel

    program, schedule, syntax_text = run_stages(source, name, options, filename, private_reductions=False)
    return CudaKernel(program, schedule, options, syntax_text, source, filename)


def run_stages(
    source: str, name: str | None, options: Options, filename: str, private_reductions: bool = True
):
    """Front end, polyhedral model and schedule of the def: (ir.Program, Schedule, the printed
    syntax tree). Raises the user's errors as TensorLangErrors. `private_reductions`: whether
    the target privatises reductions on threads (ScheduleOptions; the CUDA target does not)."""
    import islpy as isl

    from polyhedral import build_scop
    from scheduler import compute_schedule
    from tensorlang import frontend
    from tensorlang.errors import verification_enabled

    program = frontend.check_source(source, name, filename)
    syntax_text = str(frontend.select_def(frontend.parse_source(source, filename), program.name))
    try:
        # statements whole with optimize=False (the reference), and in a generic kernel
        # (specialize=False): with symbolic bounds each piece multiplies the loop nests LLVM
        # compiles (heat-3d with 4-wide tiles: 27 s to compile split, 0.5 s whole)
        scop = build_scop(program, split=options.optimize and options.specialize)
        schedule = compute_schedule(scop, replace(options.schedule, private_reductions=private_reductions))
        if verification_enabled():  # the tests run every stage's invariant checks
            scop.verify()
            schedule.verify()
    except (isl.Error, RuntimeError, ValueError) as exc:  # a failure here is a compiler bug
        raise TensorLangError(
            f"{program.name}: internal compiler error in the polyhedral stages: {exc}"
        ) from exc
    return program, schedule, syntax_text


def unpickle_kernel(source: str, name: str, options: Options, filename: str) -> Kernel:
    """A pickled Kernel: compiled again from its source (a cache hit: runtime/warm.py). The
    warnings were given when it was first compiled, so they are not repeated (in every worker
    of a pool, say)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorLangWarning)
        return compile(source, name, options=options, filename=filename)
