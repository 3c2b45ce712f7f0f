"""Direct convolution: tensorlang's register-tiled direct convolution against its GEMM path and NumPy.

Question: how fast is the direct convolution (polyhedral/convolution.py, codegen/emit/conv_kernel.py)
against NumPy's im2col + sgemm and against tensorlang's own GEMM path (`Options(direct_conv=False)`)
over the shapes convolutions come in: the issue's 64-channel 3×3 layer, a padded ("same") layer
written with guards, a first layer (3 input channels), a 7×7 late layer, a batch of small images,
5×5 filters and float64?

Run: python papers/2026-11-direct-conv/run.py [--quick] [--out DIR] [--threads N] [--repeats N]

One process; NumPy (OpenBLAS) and tensorlang both run on --threads threads (default 1). Each
repeat times every implementation once, interleaved; the median over repeats is reported, with
GFMA/s (multiply-adds of the convolution, padding taps excluded) and the ratio to NumPy. Every
result is checked against NumPy's.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

EXPERIMENT = HERE.name
TITLE = "Direct convolution vs GEMM path vs NumPy im2col + sgemm"
QUESTION = (
    "How fast is tensorlang's register-tiled direct convolution against NumPy's im2col + sgemm and "
    "against tensorlang's GEMM path, over the shapes convolutions come in?"
)
VALID = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
PADDED = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""
IMPLS = ["numpy", "tl", "tl-gemm"]
LABELS = {"numpy": "NumPy im2col + sgemm", "tl": "tensorlang direct", "tl-gemm": "tensorlang GEMM path"}

# name → (program, input shape, filter shape, dtype, padded); full sizes, then quick sizes
FULL = {
    "conv 64ch 56² 3×3": (VALID, (1, 64, 58, 58), (64, 64, 3, 3), "float32", False),
    "padded 64ch 56² 3×3": (PADDED, (1, 64, 56, 56), (64, 64, 3, 3), "float32", True),
    "first layer 3ch 224²": (VALID, (1, 3, 226, 226), (64, 3, 3, 3), "float32", False),
    "late layer 512ch 7²": (VALID, (1, 512, 9, 9), (512, 512, 3, 3), "float32", False),
    "batch 8×64ch 16²": (VALID, (8, 64, 18, 18), (64, 64, 3, 3), "float32", False),
    "5×5 32ch 64²": (VALID, (1, 32, 68, 68), (32, 32, 5, 5), "float32", False),
    "float64 64ch 56²": (
        VALID.replace("float(", "double("),
        (1, 64, 58, 58),
        (64, 64, 3, 3),
        "float64",
        False,
    ),
}
QUICK = {
    "conv 16ch 18² 3×3": (VALID, (1, 8, 20, 20), (16, 8, 3, 3), "float32", False),
    "padded 16ch 17² 3×3": (PADDED, (1, 8, 17, 17), (16, 8, 3, 3), "float32", True),
    "float64 8ch 12²": (VALID.replace("float(", "double("), (2, 4, 14, 14), (8, 4, 3, 3), "float64", False),
}


def im2col_conv(x, w, padded: bool):
    """NumPy: (pad,) im2col through a strided view (one copy), then one sgemm/dgemm per image."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    if padded:
        x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, c = x.shape[:2]
    f, _, kh, kw = w.shape
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    out = np.empty((n, f, oh, ow), x.dtype)
    for i in range(n):
        cols = (
            sliding_window_view(x[i], (kh, kw), axis=(1, 2)).transpose(0, 3, 4, 1, 2).reshape(c * kh * kw, -1)
        )
        out[i] = (w.reshape(f, -1) @ cols).reshape(f, oh, ow)
    return out


def fmas(x_shape, w_shape, padded: bool) -> int:
    n, c, h, w = x_shape
    f, _, kh, kw = w_shape
    if padded:  # taps over the padding do no work
        rows = sum(min(h, y + kh - 1) - max(0, y - 1) for y in range(h))
        cols = sum(min(w, x + kw - 1) - max(0, x - 1) for x in range(w))
        return n * f * c * rows * cols
    return n * f * c * kh * kw * (h - kh + 1) * (w - kw + 1)


def measure(name, spec, threads: int, repeats: int) -> dict:
    import numpy as np

    import tensorlang as tl

    src, xs, ws, dtype, padded = spec
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    want = im2col_conv(x, w, padded)
    calls = {
        "numpy": lambda: im2col_conv(x, w, padded),
        "tl": (lambda k: lambda: k(x, w))(tl.compile(src, options=tl.Options(threads=threads))),
        "tl-gemm": (lambda k: lambda: k(x, w))(
            tl.compile(src, options=tl.Options(threads=threads, direct_conv=False))
        ),
    }
    status, samples = {}, {i: [] for i in IMPLS}
    tol = 2e-3 if dtype == "float32" else 1e-9
    scale = max(1.0, float(np.max(np.abs(want))))
    for impl, call in calls.items():
        try:
            ok = np.allclose(call(), want, rtol=tol, atol=tol * scale)
            status[impl] = "ok" if ok else "wrong"
        except Exception as exc:  # noqa: BLE001 - reported in the row, the run goes on
            status[impl] = f"error: {type(exc).__name__}: {exc}"[:200]
    for r in range(repeats):
        order = IMPLS[r % len(IMPLS) :] + IMPLS[: r % len(IMPLS)]
        for impl in order:
            if status[impl] != "ok":
                continue
            t = time.perf_counter()
            calls[impl]()
            samples[impl].append(time.perf_counter() - t)
    median = {i: sorted(s)[len(s) // 2] for i, s in samples.items() if s}
    work = fmas(xs, ws, padded)
    return {
        "kernel": name,
        "threads": threads,
        "unit": "GFMA/s",
        "shape": {"input": list(xs), "filter": list(ws), "dtype": dtype, "padded": padded},
        "median_s": median,
        "ratio_to_numpy": {i: median["numpy"] / s for i, s in median.items()} if "numpy" in median else {},
        "throughput": {i: work / s / 1e9 for i, s in median.items()},
        "status": status,
    }


def markdown(results: dict) -> str:
    lines = [pb.header_line(results), "", f"Question: {results['question']}", ""]
    lines.append(
        "| kernel | threads | NumPy | tensorlang direct | GEMM path | direct ÷ NumPy | GEMM path ÷ NumPy |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        m, r = row["median_s"], row["ratio_to_numpy"]
        lines.append(
            f"| {row['kernel']} | {row['threads']} | {pb.fmt_seconds(m.get('numpy'))} | "
            f"{pb.fmt_seconds(m.get('tl'))} ({pb.fmt_rate(row['throughput'].get('tl'))} GFMA/s) | "
            f"{pb.fmt_seconds(m.get('tl-gemm'))} | {pb.fmt_ratio(r.get('tl'))} | {pb.fmt_ratio(r.get('tl-gemm'))} |"
        )
    bad = [
        f"{row['kernel']} {i}: {s}" for row in results["rows"] for i, s in row["status"].items() if s != "ok"
    ]
    if bad:
        lines += ["", "Not ok: " + "; ".join(bad)]
    lines += [""] + [f"Note: {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> str | None:
    return pb.plot_ratios(results, path, "direct convolution", IMPLS, LABELS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    ap.add_argument("--threads", type=int, default=1, help="threads for NumPy and tensorlang (default 1)")
    a = ap.parse_args()
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(a.threads)  # before NumPy is imported
    out = pb.default_out(HERE, a.quick, a.out, "direct-conv")
    repeats = a.repeats or (3 if a.quick else 7)
    specs = QUICK if a.quick else FULL
    results = pb.new_results(
        EXPERIMENT, QUESTION, a.quick, {"threads": a.threads, "repeats": repeats, "kernels": list(specs)}
    )
    print(pb.header_line(results), flush=True)
    failures = 0
    for name, spec in specs.items():
        row = measure(name, spec, a.threads, repeats)
        results["rows"].append(row)
        failures += sum(s != "ok" for s in row["status"].values())
        shown = ", ".join(
            f"{i} {pb.fmt_seconds(s)} ({pb.fmt_ratio(row['ratio_to_numpy'].get(i))} NumPy)"
            for i, s in row["median_s"].items()
        )
        print(f"{name}: {shown}", flush=True)
    ratios = [row["ratio_to_numpy"].get("tl") for row in results["rows"] if row["ratio_to_numpy"].get("tl")]
    if ratios:
        results["summary"] = {
            "min_direct_ratio_to_numpy": min(ratios),
            "max_direct_ratio_to_numpy": max(ratios),
        }
    pb.write_results(results, out, markdown, plot, TITLE)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
