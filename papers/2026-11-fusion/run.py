"""Graph-level fusion benchmark: fusion="auto" | "max" | "none" against NumPy (and PyTorch when present).

Question: which statements should share a loop nest? Does fusion="auto" pick the fast choice, how
much does fusing multi-statement kernels gain over leaving them apart ("none"), and how does each
compare with NumPy on one thread?

Run: python papers/2026-11-fusion/run.py [--quick] [--out DIR] [--threads 1] [--peers auto|on|off]
     [--repeats N] [--only a,b]
Single thread for every implementation (tensorlang Options(threads=1), OPENBLAS_NUM_THREADS=1,
torch.set_num_threads(1)); PyTorch eager and torch.compile run, in a process of their own, when
torch is importable and peers are on. Each repeat takes one sample of every implementation, in an
order that rotates from repeat to repeat; a sample is a run of back-to-back calls (about SAMPLE_S
seconds, at least 3 calls, as in the CPU-kernel suite). Reported: the median over repeats of the
time per call of the calls after the first ("steady", what a loop calling the kernel sees), and the
median of the first call of each sample ("after another", which runs right after a different
implementation has evicted the caches and reshaped the heap). Peak memory of one call is measured
with tracemalloc (NumPy and tensorlang allocate through it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# Before NumPy is imported: paperbench unsets the OpenBLAS presets; one BLAS thread everywhere.
import paperbench as pb  # noqa: E402, I001

os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

import tensorlang as tl  # noqa: E402

EXPERIMENT = HERE.name
QUESTION = (
    "Which statements should share a loop nest: does fusion='auto' choose well, how much does fusing "
    "multi-statement kernels gain over 'none', and how does each compare with NumPy on one thread?"
)
TITLE = "Graph-level fusion — results"
IMPLS = ["numpy", "tl-auto", "tl-max", "tl-none", "torch", "torch-compile"]
F32 = np.float32
STRATEGIES = ("auto", "max", "none")

SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N, D) X) -> (Y) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    Y(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""
MLP3 = """def mlp3(float(B, I) X, float(I, H) W1, float(H) b1, float(H, H) W2, float(H) b2, float(H, H) W3, float(H) b3) -> (Y) {
    h1(b, j) +=! X(b, i) * W1(i, j)
    a1(b, j) = fmax(h1(b, j) + b1(j), 0)
    h2(b, k) +=! a1(b, j) * W2(j, k)
    a2(b, k) = fmax(h2(b, k) + b2(k), 0)
    h3(b, o) +=! a2(b, k) * W3(k, o)
    Y(b, o) = fmax(h3(b, o) + b3(o), 0)
}"""
CONV_BIAS_RELU = """def conv_bias_relu(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) Bias) -> (O) {
    T(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
    O(n, f, h, w) = fmax(T(n, f, h, w) + Bias(f), 0)
}"""
CHAIN = """def chain(float(N) a, float(N) b, float(N) c) -> (o) {
    t1(i) = a(i) * b(i) + c(i)
    t2(i) = tanh(t1(i))
    t3(i) = t2(i) * 0.5 + a(i)
    o(i) = t3(i) * t3(i) - b(i)
}"""
GROUPNORM = """def group_normalization(float(N, G, D, H, W) I, float(G, D) gamma, float(G, D) beta) -> (O, sum, sumSquares) {
    sum(n, g) +=! I(n, g, r_d, r_h, r_w)
    sumSquares(n, g) +=! I(n, g, r_d, r_h, r_w) * I(n, g, r_d, r_h, r_w)
    O(n, g, d, h, w) = gamma(g, d) * (I(n, g, d, h, w) - sum(n, g) / (D * H * W))
        * rsqrt(sumSquares(n, g) / (D * H * W) - sum(n, g) * sum(n, g) / (D * H * W) / (D * H * W) + 1e-5)
        + beta(g, d)
}"""


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_layernorm(x):
    m = x.mean(axis=1, keepdims=True)
    c = x - m
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + F32(1e-5))


def np_mlp3(x, w1, b1, w2, b2, w3, b3):
    a = np.maximum(x @ w1 + b1, 0)
    a = np.maximum(a @ w2 + b2, 0)
    return np.maximum(a @ w3 + b3, 0)


def np_conv_bias_relu(x, w, bias):
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    n, c, ho, wo = win.shape[:4]
    cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * ho * wo, c * kh * kw)
    out = (cols @ w.reshape(w.shape[0], -1).T).reshape(n, ho, wo, -1).transpose(0, 3, 1, 2)
    return np.maximum(out + bias[None, :, None, None], 0)


def np_chain(a, b, c):
    t3 = np.tanh(a * b + c) * F32(0.5) + a
    return t3 * t3 - b


def np_groupnorm(x, gamma, beta):
    dhw = F32(x.shape[2] * x.shape[3] * x.shape[4])
    s = x.sum(axis=(2, 3, 4))
    sq = (x * x).sum(axis=(2, 3, 4))
    inv = 1 / np.sqrt(sq / dhw - s * s / dhw / dhw + F32(1e-5))
    out = (
        gamma[None, :, :, None, None] * (x - (s / dhw)[:, :, None, None, None]) * inv[:, :, None, None, None]
    )
    return out + beta[None, :, :, None, None], s, sq


def kernels(quick: bool):
    """(name, source, numpy function, input shapes)"""
    if quick:
        return [
            ("softmax", SOFTMAX, np_softmax, [(37, 65)]),
            ("layernorm", LAYERNORM, np_layernorm, [(29, 70)]),
            ("mlp3", MLP3, np_mlp3, [(9, 17), (17, 33), (33,), (33, 33), (33,), (33, 33), (33,)]),
            ("conv_bias_relu", CONV_BIAS_RELU, np_conv_bias_relu, [(1, 5, 11, 13), (7, 5, 3, 3), (7,)]),
            ("chain", CHAIN, np_chain, [(4099,)] * 3),
            ("groupnorm", GROUPNORM, np_groupnorm, [(2, 3, 4, 5, 6), (3, 4), (3, 4)]),
        ]
    return [
        ("softmax", SOFTMAX, np_softmax, [(4096, 1024)]),
        ("layernorm", LAYERNORM, np_layernorm, [(4096, 1024)]),
        ("mlp3", MLP3, np_mlp3, [(512, 512), (512, 512), (512,), (512, 512), (512,), (512, 512), (512,)]),
        ("conv_bias_relu", CONV_BIAS_RELU, np_conv_bias_relu, [(1, 64, 56, 56), (64, 64, 3, 3), (64,)]),
        ("chain", CHAIN, np_chain, [(4 * 1024 * 1024,)] * 3),
        ("groupnorm", GROUPNORM, np_groupnorm, [(32, 32, 4, 56, 56), (32, 4), (32, 4)]),
    ]


def torch_peers(name) -> dict:
    """PyTorch eager and torch.compile (inductor, C++ on the CPU) versions, when torch imports."""
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(1)
    f = torch.nn.functional
    impl = {
        "softmax": lambda x: torch.softmax(x, dim=1),
        "layernorm": lambda x: f.layer_norm(x, x.shape[1:], eps=1e-5),
        "chain": lambda a, b, c: (lambda t3: t3 * t3 - b)(torch.tanh(a * b + c) * 0.5 + a),
        "mlp3": lambda x, w1, b1, w2, b2, w3, b3: torch.relu(
            torch.relu(torch.relu(x @ w1 + b1) @ w2 + b2) @ w3 + b3
        ),
        "conv_bias_relu": lambda x, w, bias: torch.relu(f.conv2d(x, w, bias)),
    }.get(name)
    if impl is None:
        return {}
    compiled = torch.compile(impl, dynamic=False)

    def call(fn):
        return lambda *arrays: fn(*[torch.from_numpy(a) for a in arrays])

    return {"torch": call(impl), "torch-compile": call(compiled)}


SAMPLE_S = 0.1


def calls_per_sample(fn) -> int:
    """Back-to-back calls in one sample: about SAMPLE_S seconds, 3 to 50 calls (after two warm-ups)."""
    fn()
    t0 = time.perf_counter()
    fn()
    return max(3, min(50, int(SAMPLE_S / max(time.perf_counter() - t0, 1e-6))))


def timed_sample(fn, number: int) -> tuple[float, float]:
    """(seconds of the first call, seconds per call of the other number - 1), garbage collector paused."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        for _ in range(number - 1):
            fn()
        t2 = time.perf_counter()
    finally:
        if gc_was:
            gc.enable()
    return t1 - t0, (t2 - t1) / (number - 1)


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(quick: bool, repeats: int, only: list[str] | None = None, torch_only: bool = False) -> list[dict]:
    """NumPy and tensorlang's strategies; with `torch_only`, NumPy and the PyTorch peers instead
    (run in a process of their own, see main)."""
    rng = np.random.default_rng(0)
    rows = []
    chosen = [k for k in kernels(quick) if only is None or k[0] in only]
    if only is not None and len(chosen) != len(only):
        raise SystemExit(f"unknown kernel in {only}; choose from {[k[0] for k in kernels(quick)]}")
    for name, src, np_fn, shapes in chosen:
        inputs = [rng.uniform(-1, 1, size=s).astype(F32) for s in shapes]
        expected = np_fn(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        impls = {"numpy": lambda f=np_fn, xs=inputs: f(*xs)}
        decisions = {}
        checks = {}
        for strategy in () if torch_only else STRATEGIES:
            kernel = tl.compile(src, options=tl.Options(fusion=strategy, threads=1))
            got = kernel(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            checks[strategy] = all(
                np.allclose(g, e, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(e).max())))
                for g, e in zip(got, expected)
            )
            sizes = kernel.program.sizes
            bound = dict(
                zip(
                    [s.name for s in sizes],
                    [
                        inputs[[t.name for t in kernel.program.inputs].index(s.tensor)].shape[s.dim]
                        for s in sizes
                    ],
                )
            )
            decisions[strategy] = {
                "regions": [
                    r.split(": ")[1] for r in kernel.inspect("graph").splitlines() if r.startswith("region")
                ],
                "contracted": [
                    line.split(":")[0].lstrip("/ ")
                    for line in kernel.inspect("loops", sizes=bound).splitlines()
                    if "contracted" in line
                ],
            }
            impls[f"tl-{strategy}"] = lambda k=kernel, xs=inputs: k(*xs)
        for key, peer in (torch_peers(name) if torch_only else {}).items():
            out = peer(*inputs)
            out = out if isinstance(out, tuple) else (out,)
            checks[key] = all(
                np.allclose(g.numpy(), e, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(e).max())))
                for g, e in zip(out, expected)
            )
            impls[key] = lambda p=peer, xs=inputs: p(*xs)
        if torch_only and len(impls) == 1:
            continue  # no PyTorch version of this kernel
        number = {k: calls_per_sample(fn) for k, fn in impls.items()}
        steady = {k: [] for k in impls}
        first = {k: [] for k in impls}
        keys = list(impls)
        for rep in range(repeats):  # every implementation once per round, in rotating order
            for key in keys[rep % len(keys) :] + keys[: rep % len(keys)]:
                t_first, t_rest = timed_sample(impls[key], number[key])
                first[key].append(t_first)
                steady[key].append(t_rest)
        medians = {k: statistics.median(v) for k, v in steady.items()}
        first_medians = {k: statistics.median(v) for k, v in first.items()}
        rows.append(
            {
                "kernel": name,
                "threads": 1,
                "unit": "s per call",
                "shapes": shapes,
                "median_s": medians,
                "ratio_to_numpy": {k: medians["numpy"] / v for k, v in medians.items()},
                "calls_per_sample": number,
                "after_another_median_s": first_medians,
                "after_another_ratio_to_numpy": {
                    k: first_medians["numpy"] / v for k, v in first_medians.items()
                },
                "peak_bytes": {k: peak_bytes(fn) for k, fn in impls.items()},
                "correct": checks,
                "status": {k: "ok" if checks.get(k, True) else "wrong" for k in impls},
                "decisions": decisions,
            }
        )
        print(
            f"{name:16s} "
            + " ".join(f"{k}={medians['numpy'] / v:.2f}x" for k, v in medians.items())
            + "   after another: "
            + " ".join(f"{k}={first_medians['numpy'] / v:.2f}x" for k, v in first_medians.items()),
            flush=True,
        )
    return rows


def markdown(results: dict) -> str:
    keys = [k for k in IMPLS if any(k in row["median_s"] for row in results["rows"])]
    lines = [
        pb.header_line(results),
        "",
        f"One thread everywhere; {results['settings']['repeats']} rotating repeats, medians.",
        "",
        "Steady state (median time per call of back-to-back calls; × = NumPy time / this time):",
        "",
        "| kernel | "
        + " | ".join(keys)
        + " | auto vs none | peak MiB (numpy / auto / none) | regions (auto) | contracted (auto) |",
        "|---|" + "---:|" * len(keys) + "---:|---|---|---|",
    ]
    for row in results["rows"]:
        med = row["median_s"]
        cells = [
            f"{pb.fmt_seconds(med[k])} ({row['ratio_to_numpy'][k]:.2f}×)" if k in med else "–" for k in keys
        ]
        auto_vs_none = med["tl-none"] / med["tl-auto"]
        peak = row["peak_bytes"]
        mib = " / ".join(f"{peak[k] / 2**20:.1f}" for k in ("numpy", "tl-auto", "tl-none"))
        dec = row["decisions"]["auto"]
        lines.append(
            f"| {row['kernel']} | " + " | ".join(cells) + f" | {auto_vs_none:.2f}× | {mib} | "
            f"{' · '.join(dec['regions'])} | {', '.join(dec['contracted']) or '–'} |"
        )
    lines += [
        "",
        "First call after a different implementation (caches and heap disturbed by it):",
        "",
        "| kernel | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in results["rows"]:
        med = row["after_another_median_s"]
        ratio = row["after_another_ratio_to_numpy"]
        cells = [f"{pb.fmt_seconds(med[k])} ({ratio[k]:.2f}×)" if k in med else "–" for k in keys]
        lines.append(f"| {row['kernel']} | " + " | ".join(cells) + " |")
    failures = [
        f"{row['kernel']} {k}" for row in results["rows"] for k, v in row["status"].items() if v != "ok"
    ]
    lines += ["", "Failures: " + ", ".join(failures) if failures else "Every implementation matched NumPy."]
    lines += [""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> str | None:
    return pb.plot_ratios(results, path, "fusion strategies vs NumPy (steady state)", IMPLS[1:])


def merge_torch(results: dict, repeats: int, kernels: str | None) -> None:
    """PyTorch eager and torch.compile, timed in a process of their own (as in the CPU-kernel
    suite: torch's thread pools and inductor's compile workers disturb other code in the same
    process on this 2-core machine), each with that process's NumPy as its reference."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--torch-only", "--out", tmp, "--repeats", str(repeats)]
        if kernels:
            cmd += ["--only", kernels]
        done = subprocess.run(cmd, capture_output=True, text=True, env=pb.child_env(OPENBLAS_NUM_THREADS=1))
        if done.returncode != 0 or not (Path(tmp) / "results.json").exists():
            print(f"torch peers failed:\n{done.stderr[-2000:]}")
            results["notes"].append(f"torch: its benchmark process failed ({done.stderr.strip()[-300:]})")
            return
        peers = {r["kernel"]: r for r in json.loads((Path(tmp) / "results.json").read_text())["rows"]}
    for row in results["rows"]:
        peer = peers.get(row["kernel"])
        if peer is None:
            continue
        for key in ("torch", "torch-compile"):
            if key not in peer["median_s"]:
                continue
            for field in (
                "median_s",
                "ratio_to_numpy",
                "after_another_median_s",
                "after_another_ratio_to_numpy",
            ):
                row[field][key] = peer[field][key]
            row["peak_bytes"][key] = peer["peak_bytes"][key]
            row["correct"][key] = peer["correct"][key]
            row["status"][key] = peer["status"][key]
        row["torch_process_numpy_median_s"] = peer["median_s"]["numpy"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(
        ap,
        threads_default="1",
        threads_help="thread counts; only 1: this experiment is about fusion on one thread "
        "(2026-11-cpu-kernels measures every core)",
    )
    ap.add_argument("--only", "--kernels", dest="only", help="comma-separated subset, e.g. softmax,layernorm")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads != [1]:
        ap.error("--threads: only 1 is measured here (fusion on one thread); see papers/2026-11-cpu-kernels")
    repeats = args.repeats or (3 if args.quick else 11)
    out = pb.default_out(HERE, args.quick, args.out, "fusion")
    only = args.only.split(",") if args.only else None
    if args.torch_only:  # internal: the PyTorch peers in a process of their own
        pb.save_json({"rows": run(args.quick, repeats, only, torch_only=True)}, out / "results.json")
        return 0
    print(pb.env_note(), flush=True)
    use_peers = pb.peers_enabled(args.peers, args.quick)
    found = pb.detect_peers(("torch", "numba", "tvm", "halide"), implemented=("torch",))
    peer_line = pb.peers_line(found, use_peers)
    print(peer_line, flush=True)
    results = pb.new_results(
        EXPERIMENT,
        QUESTION,
        args.quick,
        {"threads": [1], "repeats": repeats, "peers": args.peers, "only": args.only, "sample_s": SAMPLE_S},
        extra_versions=["torch"],
    )
    results["peers"] = found
    results["notes"].append(peer_line)
    results["rows"] = run(args.quick, repeats, only)
    if use_peers and found["torch"]["available"]:
        merge_torch(results, repeats, args.only)
    all_ok = all(v == "ok" for row in results["rows"] for v in row["status"].values())
    results["summary"] = {"all_correct": all_ok}
    text = pb.write_results(results, out, markdown, plot, TITLE)
    print(text)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
