"""bench: tl_gemm_f32/f64 (codegen.emit.gemm_kernel) vs single-threaded NumPy/OpenBLAS → GFLOP/s table (medians)."""

from __future__ import annotations

import os
import sys

# OpenBLAS must see these before NumPy is imported: one thread, its own core-type and cache detection
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(var, None)
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from codegen import host  # noqa: E402
from codegen.lowering.gemm_jit import compile_gemm  # noqa: E402


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


def measure(run, dtype: str, n: int, layout: str, seconds: float) -> tuple[float, float]:
    rng = np.random.default_rng(n)
    a, b, c = operands(dtype, n, layout, rng)
    run(a, b, c)
    tol = 1e-3 if dtype == "float32" else 1e-9
    assert np.allclose(c, a @ b, rtol=tol, atol=tol * n), "wrong result"
    flops = 2.0 * n**3
    reps = max(7, int(seconds * 150e9 / flops))
    ours, blas = [], []
    for _ in range(reps):  # interleaved, so that both see the same machine state
        t = time.perf_counter()
        run(a, b, c)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        a @ b
        blas.append(time.perf_counter() - t)
    return flops / np.median(ours) / 1e9, flops / np.median(blas) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="256,512,1024")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--layouts", default="NN", help="comma list of NN, NT, TN, TT (T = transposed view)")
    parser.add_argument("--seconds", type=float, default=1.5, help="rough time per measurement")
    args = parser.parse_args()
    print("| dtype | layout | n | tl_gemm GFLOP/s | NumPy (1 thread) GFLOP/s | ratio |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        run = caller(dtype)
        for layout in args.layouts.split(","):
            for n in map(int, args.sizes.split(",")):
                ours, blas = measure(run, dtype, n, layout, args.seconds)
                print(
                    f"| {dtype} | {layout} | {n} | {ours:.1f} | {blas:.1f} | {ours / blas:.2f} |", flush=True
                )
    for dtype in args.dtypes.split(","):
        print(f"{dtype}: {host.gemm_blocking(dtype)}, workspace {host.workspace_bytes(dtype)} bytes")


if __name__ == "__main__":
    main()
