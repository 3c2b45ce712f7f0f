"""bench: tl_gemm_f32/f64 (codegen.emit.gemm_kernel) against single-threaded NumPy/OpenBLAS → GFLOP/s (medians).

Question: does tensorlang's BLIS-style GEMM in LLVM IR (packing + a 6×64 / 6×32 AVX-512
micro-kernel) match OpenBLAS on one core, for every operand layout?

Run: python papers/gemm-microkernel/bench.py [--quick] [--out DIR] [--threads 1] [--repeats N]
     [--sizes 256,512,1024] [--dtypes float32,float64] [--layouts NN,NT,TN,TT] [--seconds 1.5]
tl_gemm is a serial routine (the threaded GEMM is measured in papers/2026-11-cpu-kernels), so
NumPy runs with OPENBLAS_NUM_THREADS=1 and the two alternate call by call in one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# Before NumPy is imported: paperbench unsets the OpenBLAS presets; OpenBLAS on one thread.
import paperbench as pb  # noqa: E402, I001

os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from codegen import host  # noqa: E402
from codegen.lowering.gemm_jit import compile_gemm  # noqa: E402

EXPERIMENT = HERE.name
QUESTION = (
    "Does tensorlang's BLIS-style GEMM in LLVM IR match single-threaded OpenBLAS (NumPy) for float32 "
    "and float64 and every operand layout?"
)
TITLE = "tl_gemm micro-kernel against OpenBLAS — results"
SHORT = {"float32": "sgemm", "float64": "dgemm"}


def workspace(dtype: str) -> np.ndarray:
    raw = np.empty(host.workspace_bytes(dtype) + 64, np.uint8)
    return raw[(-raw.ctypes.data) % 64 :]


def caller(dtype: str):
    compiled = compile_gemm(dtype)
    ptr = ctypes.POINTER(ctypes.c_float if dtype == "float32" else ctypes.c_double)
    ws = workspace(dtype)

    def run(a, b, c):
        item = a.itemsize
        args = [a.shape[0], b.shape[1], a.shape[1]]
        for x in (a, b, c):
            args += [x.ctypes.data_as(ptr), x.strides[0] // item, x.strides[1] // item]
        compiled.fn(*args, ws.ctypes.data)

    run.keep = compiled  # keep the engine alive
    return run


def operands(dtype: str, n: int, layout: str, rng):
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.zeros((n, n), dtype)
    if layout[0] == "T":
        a = np.ascontiguousarray(a.T).T
    if layout[1] == "T":
        b = np.ascontiguousarray(b.T).T
    return a, b, c


def measure(run, dtype: str, n: int, layout: str, seconds: float, min_reps: int) -> dict:
    """One row: C += A·B checked against NumPy, then tl_gemm and `a @ b` alternated call by call."""
    rng = np.random.default_rng(n)
    a, b, c = operands(dtype, n, layout, rng)
    run(a, b, c)
    tol = 1e-3 if dtype == "float32" else 1e-9
    correct = bool(np.allclose(c, a @ b, rtol=tol, atol=tol * n))
    flops = 2.0 * n**3
    reps = max(min_reps, int(seconds * 150e9 / flops))
    samples: dict[str, list[float]] = {"tl_gemm": [], "numpy": []}
    for i in range(reps):  # interleaved (alternating which goes first), so both see the same machine state
        for name in ("tl_gemm", "numpy") if i % 2 == 0 else ("numpy", "tl_gemm"):
            t = time.perf_counter()
            if name == "tl_gemm":
                run(a, b, c)
            else:
                a @ b
            samples[name].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    return {
        "kernel": f"{SHORT[dtype]}-{layout}-{n}",
        "threads": 1,
        "unit": "GFLOP/s",
        "dtype": dtype,
        "layout": layout,
        "n": n,
        "flops": flops,
        "median_s": med,
        "throughput": {k: flops / v / 1e9 for k, v in med.items()},
        "ratio_to_numpy": {k: med["numpy"] / v for k, v in med.items()},
        "status": {"tl_gemm": "ok" if correct else "wrong", "numpy": "ok"},
        "samples_s": {k: sample_summary(v) for k, v in samples.items()},
    }


def sample_summary(values: list[float]) -> dict:
    """Small problems take thousands of calls: keep quantiles, not every sample."""
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {"n": len(values), **dict(zip(("min", "p25", "median", "p75", "max"), map(float, q)))}


def markdown(results: dict) -> str:
    lines = [
        pb.header_line(results),
        "",
        "One thread (OPENBLAS_NUM_THREADS=1), tl_gemm and `a @ b` alternated call by call; medians of "
        f"at least {results['settings']['repeats']} calls each. Layout: N = row-major, T = transposed view "
        "(A then B).",
        "",
        "| kernel | dtype | layout | n | tl_gemm GFLOP/s | NumPy (1 thread) GFLOP/s | ratio |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        tput = row["throughput"]
        wrong = "" if row["status"]["tl_gemm"] == "ok" else " **wrong**"
        lines.append(
            f"| `{row['kernel']}` | {row['dtype']} | {row['layout']} | {row['n']} | {tput['tl_gemm']:.1f}{wrong} | "
            f"{tput['numpy']:.1f} | {pb.fmt_ratio(row['ratio_to_numpy']['tl_gemm'])} |"
        )
    lines.append("")
    for dtype, blocking in results["settings"]["blocking"].items():
        lines.append(f"- {dtype}: {blocking}")
    lines += [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> str | None:
    return pb.plot_ratios(results, path, "tl_gemm vs OpenBLAS", ["tl_gemm"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(
        parser,
        threads_default="1",
        threads_help="thread counts; only 1: tl_gemm is a serial routine (papers/2026-11-cpu-kernels "
        "measures the threaded GEMM)",
        peers=False,
    )
    parser.add_argument("--sizes", help="comma list (default 256,512,1024; 96,160 with --quick)")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--layouts", help="comma list of NN, NT, TN, TT (default NN; NN,TT with --quick)")
    parser.add_argument(
        "--seconds", type=float, help="rough time per measurement (default 1.5; 0.02 with --quick)"
    )
    args = parser.parse_args(argv)
    if args.threads != [1]:
        parser.error("--threads: only 1 (tl_gemm is serial); see papers/2026-11-cpu-kernels for threads")
    sizes = [int(s) for s in (args.sizes or ("96,160" if args.quick else "256,512,1024")).split(",")]
    layouts = (args.layouts or ("NN,TT" if args.quick else "NN")).split(",")
    seconds = args.seconds if args.seconds is not None else (0.02 if args.quick else 1.5)
    repeats = args.repeats or (5 if args.quick else 7)
    dtypes = args.dtypes.split(",")
    out = pb.default_out(HERE, args.quick, args.out, "gemm-microkernel")
    print(pb.env_note(), flush=True)
    results = pb.new_results(
        EXPERIMENT,
        QUESTION,
        args.quick,
        {
            "threads": [1],
            "repeats": repeats,
            "seconds": seconds,
            "sizes": sizes,
            "dtypes": dtypes,
            "layouts": layouts,
            "blocking": {
                d: str(host.gemm_blocking(d)) + f", workspace {host.workspace_bytes(d)} bytes" for d in dtypes
            },
        },
    )
    results["notes"].append(
        "Peers: none (NumPy/OpenBLAS is the reference; torch/numba add nothing to a GEMM routine)"
    )
    for dtype in dtypes:
        run = caller(dtype)
        for layout in layouts:
            for n in sizes:
                row = measure(run, dtype, n, layout, seconds, repeats)
                results["rows"].append(row)
                t = row["throughput"]
                print(
                    f"{row['kernel']:16s} tl_gemm {t['tl_gemm']:7.1f}  numpy {t['numpy']:7.1f} GFLOP/s  "
                    f"ratio {row['ratio_to_numpy']['tl_gemm']:.2f}  {row['status']['tl_gemm']}",
                    flush=True,
                )
    all_ok = all(row["status"]["tl_gemm"] == "ok" for row in results["rows"])
    results["summary"] = {"all_correct": all_ok}
    print(pb.write_results(results, out, markdown, plot, TITLE))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
