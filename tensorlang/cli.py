"""cli: command line → a stage's text (`--emit`) or a timed run on random inputs (`run`).

`main` dispatches on the first word: a name in `COMMANDS` runs that subcommand with the rest of
the arguments; anything else is the `--emit` form. A new subcommand is one more entry there
(a function from its arguments to an exit status that raises TensorLangError for user mistakes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence

from .errors import TensorLangError

EMIT_STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "plan", "loops", "llvm", "asm")
TARGETS = ("cpu", "cuda")  # --target
CUDA_STAGES = ("ptx",)  # stages of --target cuda only (its asm)
FUSION_CHOICES = ("auto", "max", "none")

USAGE = (
    """\
tensorlang FILE.tc [--name N] --emit STAGE [--size N=8 ...] [OPTIONS]
tensorlang run FILE.tc [--name N] --shape A=8x12 [--shape B=12x10 ...] [--size T=100 ...] [--bench] [--seed S] [OPTIONS]
tensorlang export FILE.tc [--name N] [--shape A=8x12 ... | --size N=8 ...] -o DIR [OPTIONS]
tensorlang grad FILE.tc [--name N] [--wrt A,B]
tensorlang cache info|clear
tensorlang --version

stages: """
    + ", ".join(EMIT_STAGES + CUDA_STAGES)
    + """
options: --threads N, --fusion auto|max|none, --tile 32,32,64 (or 32), --no-specialize, --fast-math
target (emit, run): --target cpu|cuda (cuda: --emit ptx gives PTX; running needs a GPU runtime)"""
)


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    """The compilation options (tl.Options) both forms accept; values are checked by `_options`."""
    g = p.add_argument_group("compilation options")
    g.add_argument("--threads", metavar="N", help="threads for parallel loops (default: all cores)")
    g.add_argument("--fusion", metavar="auto|max|none", help="fusion strategy (default auto)")
    g.add_argument("--tile", metavar="32,32,64", help="tile sizes of the outermost band (or one int for all)")
    g.add_argument("--no-specialize", action="store_true", help="one parametric kernel for every size")
    g.add_argument("--fast-math", action="store_true", help="allow floating-point reassociation")


def _emit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlang", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to compile when the file holds several")
    p.add_argument("--emit", required=True, choices=EMIT_STAGES + CUDA_STAGES, help="the stage to print")
    p.add_argument(
        "--size", action="append", default=[], metavar="N=8", help="specialise plan/loops/llvm/asm to a size"
    )
    _add_target_flag(p)
    _add_option_flags(p)
    return p


def _add_target_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="cpu",
        help="cpu (default) or cuda (PTX through LLVM's NVPTX back end)",
    )


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlang run", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to compile when the file holds several")
    p.add_argument("--shape", action="append", default=[], metavar="A=8x12", help="shape of an input tensor")
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="T=100",
        help="a size no input's shape gives (k(..., T=100))",
    )
    p.add_argument("--bench", action="store_true", help="time repeated calls and report the median")
    p.add_argument("--repeat", type=int, default=20, help="calls timed with --bench (default 20)")
    p.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    _add_target_flag(p)
    _add_option_flags(p)
    return p


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TensorLangError(f"cannot read {path}: {exc}") from exc


def _parse_int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TensorLangError(f"{flag} {text!r}: expected an integer") from None


def _parse_tile(text: str) -> int | tuple[int, ...]:
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        raise TensorLangError(
            f"--tile {text!r}: expected an integer or integers separated by commas, e.g. 32,32,64"
        ) from None
    return sizes[0] if len(sizes) == 1 else sizes


def _options(args: argparse.Namespace):
    """The tl.Options the flags ask for (tl.Options checks the values: a bad one is a TensorLangError)."""
    import tensorlang as tl

    chosen: dict[str, object] = {}
    if args.threads is not None:
        chosen["threads"] = _parse_int(args.threads, "--threads")
    if args.fusion is not None:
        if args.fusion not in FUSION_CHOICES:
            raise TensorLangError(f"--fusion {args.fusion!r}: choose one of {', '.join(FUSION_CHOICES)}")
        chosen["fusion"] = args.fusion
    if args.tile is not None:
        chosen["tile"] = _parse_tile(args.tile)
    if args.no_specialize:
        chosen["specialize"] = False
    if args.fast_math:
        chosen["fast_math"] = True
    try:
        return tl.Options(**chosen)
    except TensorLangError as exc:
        flags = {"threads": "--threads", "tile": "--tile", "fusion": "--fusion"}
        named = [f for k, f in flags.items() if k in chosen and k in str(exc)]
        raise TensorLangError(f"{named[0] if named else 'option'}: {exc}") from None


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


def _parse_sizes(flags: Sequence[str]) -> dict[str, int]:
    """--size N=8 ... as {name: value}."""
    sizes: dict[str, int] = {}
    for item in flags:
        name, value = _parse_assignment(item, "--size")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise TensorLangError(f"--size {item!r}: the value must be an integer") from None
    return sizes


def _check_names(given: Sequence[str], valid: Sequence[str], flag: str, what: str, program: str) -> None:
    """An unknown NAME in --size/--shape NAME=... is an error naming it and listing the valid ones."""
    unknown = [n for n in given if n not in valid]
    if unknown:
        named = f"{what}{'s' if len(unknown) > 1 else ''} named {', '.join(unknown)}"
        raise TensorLangError(
            f"{flag}: {program} has no {named}; its {what}s are: {', '.join(valid) if valid else 'none'}"
        )


def _random_input(rng, tensor, shape):
    """Random values for an input, made directly in its dtype (no float64 array first): floats
    uniform in [-1, 1), integers in [0, 4), booleans either."""
    import numpy as np

    dtype = np.dtype(tensor.dtype.numpy_name)
    if dtype.kind == "f":
        if dtype in (np.float32, np.float64):
            values = rng.random(shape, dtype=dtype)
        else:  # float16: the generator makes float32 or float64 only
            values = rng.random(shape, dtype=np.float32).astype(dtype)
        values *= 2
        values -= 1
        return values
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape, dtype=bool)
    return rng.integers(0, 4, size=shape, dtype=dtype)


def _emit(argv: Sequence[str]) -> int:
    import tensorlang as tl

    args = _emit_parser().parse_args(argv)
    options = _options(args)
    kernel = tl.compile(_read(args.file), args.name, options=options, filename=args.file, target=args.target)
    sizes = None
    if args.size:
        sizes = _parse_sizes(args.size)
        _check_names(list(sizes), kernel.interface.sizes, "--size", "size", kernel.name)
    print(kernel.inspect(args.emit, sizes=sizes))
    return 0


def _run(argv: Sequence[str]) -> int:
    import numpy as np

    import tensorlang as tl

    args = _run_parser().parse_args(argv)
    options = _options(args)
    shapes = dict(_parse_shape(s) for s in args.shape)
    t0 = time.perf_counter()
    kernel = tl.compile(_read(args.file), args.name, options=options, filename=args.file, target=args.target)
    compile_seconds = time.perf_counter() - t0
    program = kernel.interface  # names, dtypes and ranks: no front end when the cache has the def
    _check_names(list(shapes), [t.name for t in program.inputs], "--shape", "input", program.name)
    given = _parse_sizes(args.size)
    _check_names(list(given), program.sizes, "--size", "size", program.name)
    bound = {value for t in program.inputs for kind, value in t.dims if kind == "size"}
    unbound = [s for s in program.sizes if s not in bound and s not in given]
    if unbound:
        raise TensorLangError(
            f"run: no input's shape gives {', '.join(unbound)}: give it with --size {unbound[0]}=8"
        )
    missing = [t.name for t in program.inputs if t.name not in shapes and t.rank > 0]
    if missing:
        raise TensorLangError(f"run: give the shape of {', '.join(missing)} with --shape NAME=AxB")
    rng = np.random.default_rng(args.seed)
    inputs = [_random_input(rng, t, shapes.get(t.name, ())) for t in program.inputs]
    t0 = time.perf_counter()
    result = kernel(*inputs, **given)
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
            kernel(*inputs, **given)
            times.append(time.perf_counter() - t0)
        print(
            f"  median {statistics.median(times) * 1e3:.4f} ms over {len(times)} calls (min {min(times) * 1e3:.4f} ms)"
        )
    return 0


def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlang export", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to export when the file holds several")
    p.add_argument(
        "--shape", action="append", default=[], metavar="A=8x12", help="specialise to an input's shape"
    )
    p.add_argument("--size", action="append", default=[], metavar="N=8", help="specialise to a size")
    p.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="directory for NAME.o, NAME.h, NAME.so"
    )
    _add_option_flags(p)
    return p


def _export_sizes(program, shape_flags: Sequence[str], size_flags: Sequence[str]) -> dict[str, int]:
    """Every size symbol's value from --size N=8 and the input shapes of --shape A=8x12."""
    sizes = _parse_sizes(size_flags)
    _check_names(list(sizes), [s.name for s in program.sizes], "--size", "size", program.name)
    shapes = dict(_parse_shape(s) for s in shape_flags)
    _check_names(list(shapes), [t.name for t in program.inputs], "--shape", "input", program.name)
    for t in program.inputs:
        if t.name not in shapes:
            continue
        dims = shapes[t.name]
        if len(dims) != t.rank:
            raise TensorLangError(
                f"--shape {t.name}: {t.name} has {t.rank} dimensions, the shape gives {len(dims)}"
            )
        for extent, value in zip(t.shape, dims):
            if extent.is_Symbol:  # other extents follow from the sizes
                if sizes.setdefault(str(extent), value) != value:
                    raise TensorLangError(
                        f"--shape {t.name}: {extent} is {sizes[str(extent)]} elsewhere, here {value}"
                    )
    missing = [s.name for s in program.sizes if s.name not in sizes]
    if missing:
        raise TensorLangError(
            f"export: --shape/--size leave {', '.join(missing)} unknown (give all, or none)"
        )
    return sizes


def _export(argv: Sequence[str]) -> int:
    import tensorlang as tl

    from . import frontend

    args = _export_parser().parse_args(argv)
    options = _options(args)
    source = _read(args.file)
    sizes = None
    if args.shape or args.size:  # specialised; neither: the generic kernel
        with warnings.catch_warnings():  # tl.export reports the front end's warnings once
            warnings.simplefilter("ignore")
            program = frontend.check_source(source, args.name, args.file)
        sizes = _export_sizes(program, args.shape, args.size)
    result = tl.export(source, args.name, sizes=sizes, options=options, path=args.output, filename=args.file)
    for path in (result.object, result.header, result.shared):
        if path is not None:
            print(path)
    if result.shared is None:
        print("note: no linker found (cc, or the ziglang wheel): no shared library", file=sys.stderr)
    return 0


def _grad(argv: Sequence[str]) -> int:
    """`grad`: print the gradient program of a def (tl.grad), ready for `tl.compile`."""
    import tensorlang as tl

    p = argparse.ArgumentParser(prog="tensorlang grad", usage=USAGE)
    p.add_argument("file", help="source file (.tc)")
    p.add_argument("--name", help="the def to differentiate when the file holds several")
    p.add_argument("--wrt", metavar="A,B", help="inputs to differentiate by (default: every float input)")
    args = p.parse_args(argv)
    print(tl.grad(_read(args.file), args.name, wrt=args.wrt, filename=args.file), end="")
    return 0


def _cache(argv: Sequence[str]) -> int:
    """`cache info`: where the compilation cache is and what it holds; `cache clear`: empty it."""
    import tensorlang as tl

    p = argparse.ArgumentParser(prog="tensorlang cache", description="the persistent compilation cache")
    p.add_argument("action", choices=("info", "clear"))
    args = p.parse_args(argv)
    if args.action == "clear":
        entries = tl.cache_info()["entries"]
        freed = tl.clear_cache()
        print(f"removed {entries} entries ({freed} bytes) from {tl.cache_info()['path']}")
        return 0
    for key, value in tl.cache_info().items():
        print(f"{key}: {value}")
    return 0


def _tune(argv: Sequence[str]) -> int:
    """`tune FILE.tc --shape A=8x12 ... --budget 60`: search for the fastest options of the def for
    those shapes (tl.tune, random inputs) and record them; `tune --list` prints the database's
    records; `tune --export FILE` / `tune --import FILE` move records (JSON) between machines
    of one kind."""
    import json

    p = argparse.ArgumentParser(prog="tensorlang tune", description="autotuning (tl.tune) and its database")
    p.add_argument("file", nargs="?", help="source file (.tc)")
    p.add_argument("--name", help="the def to tune when the file holds several")
    p.add_argument("--shape", action="append", default=[], metavar="A=8x12", help="an input's shape")
    p.add_argument("--size", action="append", default=[], metavar="N=8", help="a size")
    p.add_argument("--budget", type=float, default=60.0, metavar="S", help="seconds to search (default 60)")
    p.add_argument("--seed", type=int, default=0, help="random inputs' seed")
    p.add_argument("--list", action="store_true", help="list the tuning database's records")
    p.add_argument("--export", metavar="FILE", help="write every record to FILE (JSON)")
    p.add_argument("--import", dest="import_", metavar="FILE", help="add the records of FILE (JSON)")
    args = p.parse_args(argv)
    if args.list or args.export or args.import_:
        import tensorlang as tl

        with tl._tune_database() as db:
            if args.import_:
                try:
                    with open(args.import_, encoding="utf-8") as f:
                        added = db.import_(json.load(f))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise TensorLangError(f"tune --import {args.import_}: {exc}") from None
                print(f"imported {added} trials into {db.path}")
            if args.export:
                data = db.export()
                with open(args.export, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1)
                print(
                    f"exported {len(data['programs'])} programs, {len(data['trials'])} trials to {args.export}"
                )
            if args.list:
                print(f"{db.path}")
                for row in db.programs():
                    sizes = ",".join(f"{k}={v}" for k, v in row["sizes"].items())
                    if row["best_s"] is None:
                        timing = "no best record yet"
                    else:
                        ratio = row["default_s"] / row["best_s"] if row["best_s"] else float("nan")
                        timing = f"best {row['best_s'] * 1e3:.4g} ms, default {row['default_s'] * 1e3:.4g} ms ({ratio:.2f}x)"
                    print(
                        f"{row['name']} [{sizes}] {'/'.join(row['dtypes'])} threads={row['threads']}: "
                        f"{row['trials']} trials ({row['failed']} failed), {timing}; options {json.dumps(row['options'])}"
                    )
        return 0
    if args.file is None:
        raise TensorLangError("tune: give a source file (or --list, --export FILE, --import FILE)")
    import numpy as np

    import tensorlang as tl

    from . import frontend

    source = _read(args.file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = frontend.check_source(source, args.name, args.file)
    sizes = _export_sizes(program, args.shape, args.size)
    rng = np.random.default_rng(args.seed)
    inputs = []
    for t in program.inputs:
        shape = tuple(
            int(d.subs({s: sizes[str(s)] for s in d.free_symbols})) if hasattr(d, "subs") else int(d)
            for d in t.shape
        )
        inputs.append(_random_input(rng, t, shape))
    shaped = {str(d) for t in program.inputs for d in t.shape if getattr(d, "is_Symbol", False)}
    keyword = {k: v for k, v in sizes.items() if k not in shaped}  # --size T=100: no input gives T
    result = tl.tune(source, *inputs, name=program.name, budget_s=args.budget, progress=True, **keyword)
    print(
        f"{program.name}: best {result.best_s * 1e3:.4g} ms, default {result.default_s * 1e3:.4g} ms "
        f"({result.default_s / result.best_s:.2f}x) after {result.trials} trials"
    )
    print(f"options: {result.options!r}")
    return 0


def _version(argv: Sequence[str]) -> int:
    import tensorlang

    print(f"tensorlang {tensorlang.__version__}")
    return 0


# Subcommands: the first argument → its handler (the rest of the arguments → exit status).
COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "run": _run,
    "export": _export,
    "grad": _grad,
    "cache": _cache,
    "tune": _tune,
    "--version": _version,
}


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
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
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
