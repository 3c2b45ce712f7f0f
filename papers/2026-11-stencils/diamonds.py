"""papers: jacobi-1d and jacobi-2d on two threads with diamond and with parallelogram time tiles, over the number of steps → what diamonds buy.

On threads the time tiles run as a wavefront. Parallelogram tiles of (t, t + i, ...) put each
tile of a time band after the one before it along i, so a wavefront holds one tile per time
band: few when T is small. Diamond tiles of (t - i, t + i, ...) start together along the rows
(scheduler/timetile.py `diamond_skew`). This times, per stencil and T, the one-thread kernel and
two two-thread kernels, one built with diamonds (the default) and one with
`scheduler.timetile.DIAMOND_TILES` off, calls alternating, and reports medians and per-round
ratios. Every two-thread result is checked first: bitwise equal to the one-thread kernel's and
close to NumPy's.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock /tmp/tl_bench.lock \\
        .venv/bin/python papers/2026-11-stencils/diamonds.py          # results/diamonds/
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)

QUESTION = (
    "How much faster do two threads run a stencil's time tiles with diamond tiles than with "
    "parallelogram tiles, and how does that change with the number of steps T?"
)
# (stencil, shape, steps) per mode
FULL = [("jacobi-2d", (1000, 1000), t) for t in (10, 17, 33, 50, 100, 200)] + [
    ("jacobi-1d", (2_000_000,), t) for t in (17, 100)
]
QUICK = [("jacobi-2d", (9, 11), 5), ("jacobi-1d", (9001,), 17)]  # seconds of compiling
KERNELS = ("one_thread", "two_parallelograms", "two_diamonds")


def build(stencil, args, steps: int, threads: int, diamonds: bool):
    """The recurrence's kernel, scheduled (with its plan for these sizes) while
    `DIAMOND_TILES` is `diamonds`; called once here."""
    import stencils as S

    import scheduler.timetile as timetile

    timetile.DIAMOND_TILES = diamonds
    try:
        run = S.tensorlang_impl(stencil, args, steps, threads, False)
        result = run()
    finally:
        timetile.DIAMOND_TILES = True
    return run, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    a = ap.parse_args()
    repeats = a.repeats or (3 if a.quick else 31)
    print(pb.env_note(), flush=True)
    os.environ["TENSORLANG_CACHE"] = "0"  # the two schedules of one source: no disk cache between them

    import numpy as np
    import stencils as S

    out = pb.default_out(HERE, a.quick, a.out, "diamonds", "diamonds")
    rows = []
    for name, shape, steps in QUICK if a.quick else FULL:
        stencil = S.STENCILS[name]
        args = S.inputs(stencil, shape, steps)
        want = S.reference_impl(stencil, args, steps)()
        runs, results = {}, {}
        for kernel, threads, diamonds in zip(KERNELS, (1, 2, 2), (True, False, True), strict=True):
            runs[kernel], got = build(stencil, args, steps, threads, diamonds)
            results[kernel] = np.array(got, copy=True)
        for kernel in KERNELS[1:]:
            if not np.array_equal(results[kernel], results["one_thread"]):
                raise SystemExit(f"diamonds: {name} T={steps}: {kernel} differs from one thread")
        if not np.allclose(results["one_thread"], want, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"diamonds: {name} T={steps}: the result differs from NumPy's")

        times = pb.interleaved_times({k: runs[k] for k in KERNELS}, repeats)
        row = {"stencil": name, "shape": list(shape), "steps": steps}
        for kernel in KERNELS:
            row[f"{kernel}_s"] = statistics.median(times[kernel])
        for kernel in KERNELS[1:]:
            ratios = [one / two for one, two in zip(times["one_thread"], times[kernel])]
            row[f"one_over_{kernel}"] = statistics.median(ratios)
        gains = [p / d for p, d in zip(times["two_parallelograms"], times["two_diamonds"])]
        row["parallelograms_over_diamonds"] = statistics.median(gains)
        rows.append(row)
        print(
            f"{name} {'x'.join(map(str, shape))} T={steps}: 1T {row['one_thread_s'] * 1e3:.2f} ms, "
            f"2T parallelograms {row['two_parallelograms_s'] * 1e3:.2f} ms "
            f"({row['one_over_two_parallelograms']:.2f}x), 2T diamonds {row['two_diamonds_s'] * 1e3:.2f} ms "
            f"({row['one_over_two_diamonds']:.2f}x)",
            flush=True,
        )
    results = pb.new_results(
        "2026-11-stencils/diamonds", QUESTION, a.quick, {"repeats": repeats, "kernels": list(KERNELS)}
    )
    results["rows"] = rows
    pb.write_results(results, out, _markdown, None, "Diamond tiles on two threads")


def _markdown(results: dict) -> str:
    s = results["settings"]
    lines = [
        pb.header_line(results),
        "",
        f"Each stencil's recurrence, calls alternating (1 thread, 2 threads with parallelogram tiles, 2 "
        f"threads with diamond tiles), medians of {s['repeats']} rounds; ratios are per-round medians.",
        "",
        "| stencil | grid, T | 1 thread | 2T parallelograms | 2T diamonds | 1T ÷ 2T parallelograms | "
        "1T ÷ 2T diamonds | parallelograms ÷ diamonds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['stencil']} | {'x'.join(map(str, row['shape']))}, {row['steps']} | "
            f"{pb.fmt_seconds(row['one_thread_s'])} | {pb.fmt_seconds(row['two_parallelograms_s'])} | "
            f"{pb.fmt_seconds(row['two_diamonds_s'])} | {pb.fmt_ratio(row['one_over_two_parallelograms'])} | "
            f"{pb.fmt_ratio(row['one_over_two_diamonds'])} | {pb.fmt_ratio(row['parallelograms_over_diamonds'])} |"
        )
    lines += ["", f"Question: {results['question']}", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
