"""papers: jacobi-2d's recurrence against its own schedule written by hand in AVX-512 C → time per step, a call's fixed part, and the loop's bound with its rows in L1.

The stencil paper's second question is how close the recurrence comes to the machine's limits.
This answers it for jacobi-2d on one thread with three measurements taken interleaved in one
process: tensorlang's recurrence (`k(A, T=T, out=O)`), c_reference/jacobi2d_avx512.c (the same
parallelogram tiles, steps grouped by four, two planes, aligned vectors with `valignd`
neighbours; built here with the system's C compiler), and that C file's row loop on rows that stay
in L1 (the update's own bound on this core). Each runs at two step counts, so a call splits into
time per step and the rest (for tensorlang: the copies of A into the first plane and of the last
plane into O, the call path, whatever else a call does once). The C result must equal tensorlang's bit for bit (same order of
additions). Needs gcc or cc and an AVX-512 host; says why and exits 0 where either is missing.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock /tmp/tl_bench.lock \\
        .venv/bin/python papers/2026-11-stencils/c_limit.py              # results/c_limit/
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)
from scheduler.timetile import TimeBand, auto_sizes  # noqa: E402

SOURCE = HERE / "c_reference" / "jacobi2d_avx512.c"
QUESTION = (
    "How close does jacobi-2d's recurrence come to the machine: against the same schedule written by "
    "hand in AVX-512 C, and against the update's loop with its rows in L1?"
)
# the recurrence's tiles for jacobi-2d on one thread, as scheduler/timetile.py sizes them on this
# host (64 steps by as many skewed rows as the L2 holds; 16 by 32 before 2026-11-29), steps
# grouped by four
TILE_STEPS, TILE_ROWS = auto_sizes(TimeBand(3, 4), wavefront=False)[:2]
JAM_STEPS = 4


def compiler() -> str | None:
    """$CC (default gcc) when on PATH, else cc, else None."""
    return next((c for c in (os.environ.get("CC", "gcc"), "cc") if shutil.which(c)), None)


def why_not() -> str | None:
    """Why the C reference cannot run here, or None."""
    if compiler() is None:
        return "no C compiler ($CC, gcc or cc) on PATH"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "no /proc/cpuinfo to tell whether the host has AVX-512"
    if " avx512f" not in flags:
        return "the host has no AVX-512"
    return None


def build(folder: Path) -> ctypes.CDLL:
    library = folder / "jacobi2d_avx512.so"
    subprocess.run(
        [compiler(), "-O2", "-march=native", "-shared", "-fPIC", str(SOURCE), "-o", str(library)], check=True
    )
    lib = ctypes.CDLL(str(library))
    lib.ref_init.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
    lib.ref_init.restype = ctypes.c_int
    lib.ref_reset.argtypes = [ctypes.c_void_p]
    lib.ref_run.argtypes = [ctypes.c_long] * 4
    lib.ref_result.argtypes = [ctypes.c_long, ctypes.c_void_p]
    lib.ref_rows_in_l1.argtypes = [ctypes.c_long, ctypes.c_long]
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    ap.add_argument("--size", default="1000x1000", help="the grid, NxM")
    ap.add_argument("--steps", default="20,100", help="the two step counts T")
    a = ap.parse_args()
    if a.quick:
        a.size, a.steps = "67x71", "3,9"
    n, m = (int(x) for x in a.size.split("x"))
    if n < 3 or m < 3:  # no interior point: nothing to time per step
        raise SystemExit(f"c_limit: --size {a.size}: both sides must be at least 3")
    short, long_ = (int(x) for x in a.steps.split(","))
    repeats = a.repeats or (3 if a.quick else 15)
    print(pb.env_note(), flush=True)
    reason = why_not()
    if reason is not None:
        print(f"c_limit: skipped: {reason}")
        return

    import numpy as np
    import stencils as S

    import tensorlang as tl

    out = pb.default_out(HERE, a.quick, a.out, "c-limit", "c_limit")
    with tempfile.TemporaryDirectory(prefix="tl-c-limit-") as folder:
        lib = build(Path(folder))
        A = np.random.default_rng(0).random((n, m), dtype=np.float32)
        if lib.ref_init(n, m, A.ctypes.data) != 0:
            raise SystemExit("c_limit: the C reference could not map its planes")
        k = tl.compile(S.JACOBI_2D, options=tl.Options(threads=1))
        out_tl = np.empty_like(A)
        got = np.empty_like(A)
        for steps in (short, long_):  # bitwise the same answer, and every build warmed up
            k(A, T=steps, out=out_tl)
            lib.ref_reset(A.ctypes.data)
            lib.ref_run(steps, TILE_STEPS, TILE_ROWS, JAM_STEPS)
            lib.ref_result(steps, got.ctypes.data)
            if not np.array_equal(out_tl, got):
                raise SystemExit(f"c_limit: the C reference differs from tensorlang at T={steps}")
        ring, rows_timed = min(8, n), 10000 * max(1, 1000 // m)  # a ring of the first plane's rows
        samples: dict[str, list[float]] = {}
        for _ in range(repeats):
            for steps in (short, long_):
                t0 = time.perf_counter()
                k(A, T=steps, out=out_tl)
                samples.setdefault(f"tl{steps}", []).append(time.perf_counter() - t0)
                lib.ref_reset(A.ctypes.data)
                t0 = time.perf_counter()
                lib.ref_run(steps, TILE_STEPS, TILE_ROWS, JAM_STEPS)
                samples.setdefault(f"c{steps}", []).append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lib.ref_rows_in_l1(ring, rows_timed)
            samples.setdefault("l1", []).append((time.perf_counter() - t0) / rows_timed)
    med = {key: statistics.median(v) for key, v in samples.items()}
    flops_per_step = 5.0 * (n - 2) * (m - 2)
    rows = []
    for impl, label in (("tl", "tensorlang recurrence"), ("c", "C, the same schedule")):
        step = (med[f"{impl}{long_}"] - med[f"{impl}{short}"]) / (long_ - short)
        rows.append(
            {
                "implementation": label,
                "call_s": med[f"{impl}{long_}"],
                "step_s": step,
                "fixed_s": med[f"{impl}{long_}"] - (long_ - 1) * step,
                "step_gflops": flops_per_step / step / 1e9 if step > 0 else None,
            }
        )
    l1_step = med["l1"] * (n - 2)
    rows.append(
        {
            "implementation": "C, rows in L1 (the loop's bound)",
            "call_s": None,
            "step_s": l1_step,
            "fixed_s": None,
            "step_gflops": flops_per_step / l1_step / 1e9,
        }
    )
    results = pb.new_results(
        "2026-11-stencils/c_limit",
        QUESTION,
        a.quick,
        {
            "size": [n, m],
            "steps": [short, long_],
            "repeats": repeats,
            "threads": [1],
            "tile": [TILE_STEPS, TILE_ROWS, JAM_STEPS],
        },
    )
    results["rows"] = rows

    def over(x: float, y: float) -> float | None:  # a quick run's per-step fit can come out <= 0
        return x / y if x > 0 and y > 0 else None

    results["summary"] = {
        "tensorlang_step_over_c_step": over(rows[0]["step_s"], rows[1]["step_s"]),
        "tensorlang_step_over_l1_bound": over(rows[0]["step_s"], l1_step),
    }
    pb.write_results(results, out, _markdown, None, "jacobi-2d against hand-written AVX-512 C")


def _markdown(results: dict) -> str:
    s = results["settings"]
    (n, m), (short, long_) = s["size"], s["steps"]
    lines = [
        pb.header_line(results),
        "",
        f"jacobi-2d {n}x{m}, one thread; per step from calls at T={short} and T={long_} "
        f"(medians of {s['repeats']} interleaved repeats).",
        "",
        f"| implementation | call at T={long_} | per step | GFLOP/s per step | fixed part of a call |",
        "|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['implementation']} | {pb.fmt_seconds(row['call_s'])} | {pb.fmt_seconds(row['step_s'])} | "
            f"{pb.fmt_rate(row['step_gflops'])} | {pb.fmt_seconds(row['fixed_s'])} |"
        )
    summary = results["summary"]
    lines += [
        "",
        f"tensorlang's step ÷ the C step: {pb.fmt_ratio(summary['tensorlang_step_over_c_step'])}; "
        f"÷ the rows-in-L1 bound: {pb.fmt_ratio(summary['tensorlang_step_over_l1_bound'])}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
