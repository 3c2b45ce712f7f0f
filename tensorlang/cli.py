"""cli: command line → a stage's text (`--emit`) or a timed run on random inputs (`run`)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Sequence

from .errors import TensorLangError

EMIT_STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "plan", "loops", "llvm", "asm")

USAGE = """\
tensorlang FILE.tc [--name N] --emit STAGE [--size N=8 ...]
tensorlang run FILE.tc [--name N] --shape A=8x12 [--shape B=12x10 ...] [--bench] [--seed S]

stages: """ + ", ".join(EMIT_STAGES)


def _emit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlang", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to compile when the file holds several")
    p.add_argument("--emit", required=True, choices=EMIT_STAGES, help="the stage to print")
    p.add_argument(
        "--size", action="append", default=[], metavar="N=8", help="specialise plan/loops/llvm/asm to a size"
    )
    return p


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlang run", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to compile when the file holds several")
    p.add_argument("--shape", action="append", default=[], metavar="A=8x12", help="shape of an input tensor")
    p.add_argument("--bench", action="store_true", help="time repeated calls and report the median")
    p.add_argument("--repeat", type=int, default=20, help="calls timed with --bench (default 20)")
    p.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    return p


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TensorLangError(f"cannot read {path}: {exc}") from exc


def _parse_assignment(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise TensorLangError(f"{what} must look like NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, value = _parse_assignment(text, "--shape")
    if value in ("", "scalar", "()"):
        return name, ()
    try:
        dims = tuple(int(x) for x in value.lower().split("x"))
    except ValueError:
        raise TensorLangError(
            f"--shape {text!r}: dimensions must be integers separated by 'x', e.g. A=8x12"
        ) from None
    if any(d < 0 for d in dims):
        raise TensorLangError(f"--shape {text!r}: dimensions must be non-negative")
    return name, dims


def _random_input(rng, tensor, shape):
    import numpy as np

    dtype = np.dtype(tensor.dtype.numpy_name)
    if dtype.kind == "f":
        return rng.uniform(-1, 1, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.integers(0, 4, size=shape).astype(dtype)


def _emit(argv: Sequence[str]) -> int:
    import tensorlang as tl

    args = _emit_parser().parse_args(argv)
    kernel = tl.compile(_read(args.file), args.name, filename=args.file)
    sizes = None
    if args.size:
        sizes = {}
        for item in args.size:
            name, value = _parse_assignment(item, "--size")
            try:
                sizes[name] = int(value)
            except ValueError:
                raise TensorLangError(f"--size {item!r}: the value must be an integer") from None
    print(kernel.inspect(args.emit, sizes=sizes))
    return 0


def _run(argv: Sequence[str]) -> int:
    import numpy as np

    import tensorlang as tl

    args = _run_parser().parse_args(argv)
    shapes = dict(_parse_shape(s) for s in args.shape)
    t0 = time.perf_counter()
    kernel = tl.compile(_read(args.file), args.name, filename=args.file)
    compile_seconds = time.perf_counter() - t0
    program = kernel.program
    missing = [t.name for t in program.inputs if t.name not in shapes and t.rank > 0]
    if missing:
        raise TensorLangError(f"run: give the shape of {', '.join(missing)} with --shape NAME=AxB")
    unknown = [n for n in shapes if n not in {t.name for t in program.inputs}]
    if unknown:
        raise TensorLangError(f"run: {', '.join(unknown)} is not an input of {program.name}")
    rng = np.random.default_rng(args.seed)
    inputs = [_random_input(rng, t, shapes.get(t.name, ())) for t in program.inputs]
    t0 = time.perf_counter()
    result = kernel(*inputs)
    first_call = time.perf_counter() - t0
    results = result if isinstance(result, tuple) else (result,)
    print(
        f"{program.name}: compiled in {compile_seconds * 1e3:.1f} ms, first call (incl. JIT) {first_call * 1e3:.1f} ms"
    )
    for t, r in zip(program.outputs, results):
        summary = f"sum={r.sum():.6g}" if r.size else "empty"
        print(f"  {t.name}: {r.dtype}{list(r.shape)} {summary}")
    if args.bench:
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            kernel(*inputs)
            times.append(time.perf_counter() - t0)
        print(
            f"  median {statistics.median(times) * 1e3:.4f} ms over {len(times)} calls (min {min(times) * 1e3:.4f} ms)"
        )
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as `warning: FILE:LINE:COL: ...`, located in the user's file, not in ours."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "run":
            return _run(argv[1:])
        return _emit(argv)
    except TensorLangError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a compiler bug: report it without a traceback
        print(
            f"internal error ({type(exc).__name__}): {exc}\nplease report this with the source file",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
