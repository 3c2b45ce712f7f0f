"""target="cuda" on an H100/H200: tensorlang's first GPU mapping against PyTorch eager and torch.compile.

Question: how far is tensorlang's first, simple GPU mapping (one thread per iteration of the
parallel outer loop(s), every other loop sequential in its thread, no shared memory, no block
reductions, no register tiles) from PyTorch eager (cuDNN, cuBLAS, its own fused softmax and layer
norm kernels) and torch.compile (Triton) on the issue's kernels: softmax and layer norm 32768×4096,
an elementwise tanh chain of 64 Mi elements, sgemm 4096³ and a 3×3 convolution 32×64×56²
(64 filters)? All float32, TF32 off.

Run (on a machine with a CUDA GPU and PyTorch):
    python papers/2026-11-gpu/run.py [--quick] [--out DIR] [--repeats N] [--budget S]

One process. Every implementation gets CUDA tensors that already live on the GPU (tensorlang
through its PyTorch path: torch tensors in, torch tensors out) and is timed call by call, each
call between two torch.cuda.synchronize() (wall clock: what a caller waits, the launch and
argument checks included); the median over the repeats is reported, with GB/s (the bytes each
kernel must read and write once) or TFLOP/s, and the ratio to PyTorch eager. Every result is
checked against PyTorch eager. A slow implementation gets fewer repeats, so that one kernel's
timing stays within --budget seconds. Without a GPU, nothing is measured and the exit code is 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)

import argparse  # noqa: E402
import time  # noqa: E402

EXPERIMENT = HERE.name
TITLE = "tensorlang target='cuda' vs PyTorch eager and torch.compile"
QUESTION = (
    "How far is tensorlang's first GPU mapping (a thread per outer parallel iteration, inner loops "
    "sequential, no shared memory) from PyTorch eager and torch.compile on softmax, layer norm, an "
    "elementwise chain, sgemm and a 3x3 convolution (float32, TF32 off)?"
)
IMPLS = ["torch", "torch.compile", "tl"]
LABELS = {"torch": "PyTorch eager", "torch.compile": "torch.compile", "tl": "tensorlang cuda"}

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
CHAIN = """def chain(float(N) a, float(N) b, float(N) c) -> (o) {
    t1(i) = a(i) * b(i) + c(i)
    t2(i) = tanh(t1(i))
    t3(i) = t2(i) * 0.5 + a(i)
    o(i) = t3(i) * t3(i) - b(i)
}"""
SGEMM = "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
CONV = """def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}"""

# name → (source, input shapes, unit, work: shapes → bytes or flops); full, then quick sizes
FULL = {
    "softmax 32768x4096": (SOFTMAX, [(32768, 4096)], "GB/s", lambda s: 2 * 4 * s[0][0] * s[0][1]),
    "layernorm 32768x4096": (LAYERNORM, [(32768, 4096)], "GB/s", lambda s: 2 * 4 * s[0][0] * s[0][1]),
    "tanh chain 64Mi": (CHAIN, [(64 << 20,)] * 3, "GB/s", lambda s: 4 * 4 * s[0][0]),
    "sgemm 4096": (SGEMM, [(4096, 4096), (4096, 4096)], "TFLOP/s", lambda s: 2 * 4096**3),
    "conv2d 32x64x56² 64x3x3": (
        CONV,
        [(32, 64, 58, 58), (64, 64, 3, 3)],
        "TFLOP/s",
        lambda s: 2 * 32 * 64 * 64 * 9 * 56 * 56,
    ),
}
QUICK = {
    "softmax 257x129": (SOFTMAX, [(257, 129)], "GB/s", lambda s: 2 * 4 * s[0][0] * s[0][1]),
    "layernorm 257x129": (LAYERNORM, [(257, 129)], "GB/s", lambda s: 2 * 4 * s[0][0] * s[0][1]),
    "tanh chain 100003": (CHAIN, [(100003,)] * 3, "GB/s", lambda s: 4 * 4 * s[0][0]),
    "sgemm 129": (SGEMM, [(129, 65), (65, 127)], "TFLOP/s", lambda s: 2 * 129 * 65 * 127),
    "conv2d 2x8x18² 16x3x3": (
        CONV,
        [(2, 8, 18, 18), (16, 8, 3, 3)],
        "TFLOP/s",
        lambda s: 2 * 2 * 16 * 8 * 9 * 16 * 16,
    ),
}


def torch_impl(torch, name: str):
    f = torch.nn.functional
    if name.startswith("softmax"):
        return lambda x: torch.softmax(x, dim=1)
    if name.startswith("layernorm"):
        return lambda x: f.layer_norm(x, x.shape[1:], eps=1e-5)
    if name.startswith("tanh chain"):
        return lambda a, b, c: (lambda t3: t3 * t3 - b)(torch.tanh(a * b + c) * 0.5 + a)
    if name.startswith("sgemm"):
        return lambda a, b: a @ b
    return lambda x, w: f.conv2d(x, w)


def timed(torch, call, repeats: int, budget: float) -> tuple[list[float], float]:
    """(samples, first call's seconds): the first call (compilation included) is not a sample."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    samples: list[float] = []
    while len(samples) < repeats and (sum(samples) < budget or len(samples) < 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    return samples, first


def back_to_back(torch, call, calls: int = 10, batches: int = 3) -> float:
    """Median over `batches` of the mean time of `calls` calls queued back to back, one wait at the
    end: what a pipeline of asynchronous calls sees (launch costs hidden behind running kernels)."""
    means = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        means.append((time.perf_counter() - t) / calls)
    return sorted(means)[len(means) // 2]


def measure(name: str, spec, repeats: int, budget: float) -> dict:
    import torch

    import tensorlang as tl

    src, shapes, unit, work_of = spec
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
    eager = torch_impl(torch, name)
    want = eager(*args)
    calls = {"torch": lambda: eager(*args)}
    status: dict[str, str] = {}
    try:
        compiled = torch.compile(eager, dynamic=False)
        calls["torch.compile"] = lambda: compiled(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the row, the run goes on
        status["torch.compile"] = f"error: {type(exc).__name__}: {exc}"[:300]
    kernel = tl.compile(src, target="cuda")
    calls["tl"] = lambda: kernel(*args)
    scale = max(1.0, float(want.abs().max()))
    tol = 1e-3 if unit == "TFLOP/s" else 1e-4
    samples, first = {}, {}
    for impl, call in calls.items():
        try:
            got = call()
            ok = isinstance(got, torch.Tensor) and got.shape == want.shape
            ok = ok and bool(torch.allclose(got, want, rtol=tol, atol=tol * scale))
            status[impl] = "ok" if ok else "wrong"
            del got
        except Exception as exc:  # noqa: BLE001
            status[impl] = f"error: {type(exc).__name__}: {exc}"[:300]
        if status[impl] == "ok":
            samples[impl], first[impl] = timed(torch, call, repeats, budget)
    median = {i: sorted(s)[len(s) // 2] for i, s in samples.items() if s}
    calls_in_budget = {i: max(2, min(10, int(budget / 3 / max(m, 1e-6)))) for i, m in median.items()}
    streamed = {i: back_to_back(torch, calls[i], calls_in_budget[i]) for i in median}
    work = work_of(shapes)
    scale_unit = 1e9 if unit == "GB/s" else 1e12
    base = median.get("torch")
    return {
        "kernel": name,
        "threads": 1,
        "unit": unit,
        "shapes": [list(s) for s in shapes],
        "median_s": median,
        "samples": {i: len(s) for i, s in samples.items()},
        "first_call_s": first,
        "ratio_to_torch_eager": {i: base / s for i, s in median.items()} if base else {},
        "ratio_to_numpy": {},  # the baseline here is PyTorch eager (paperbench's schema keeps the key)
        "throughput": {i: work / s / scale_unit for i, s in median.items()},
        "back_to_back_s": streamed,
        "back_to_back_ratio_to_torch_eager": (
            {i: streamed["torch"] / s for i, s in streamed.items()} if "torch" in streamed else {}
        ),
        "status": status,
        "tl_plan": [
            line
            for line in kernel.inspect("plan", sizes=_sizes(kernel, shapes)).splitlines()
            if line.startswith("// cuda phase")
        ],  # fmt: skip
    }


def _sizes(kernel, shapes) -> dict[str, int]:
    sizes = {}
    for t, shape in zip(kernel.interface.inputs, shapes):
        for (kind, value), n in zip(t.dims, shape):
            if kind == "size":
                sizes[value] = n
    return sizes


def markdown(results: dict) -> str:
    gpu = results["settings"].get("gpu", {})
    lines = [pb.header_line(results), "", f"GPU: {gpu}", "", f"Question: {results['question']}", ""]
    lines.append(
        "| kernel | PyTorch eager | torch.compile | tensorlang cuda | tensorlang ÷ eager | compile ÷ eager "
        "| back to back: eager / compile / tensorlang |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        m, r, t, u = row["median_s"], row["ratio_to_torch_eager"], row["throughput"], row["unit"]

        def cell(i, m=m, t=t, u=u):
            return f"{pb.fmt_seconds(m.get(i))} ({pb.fmt_rate(t.get(i))} {u})" if i in m else "–"

        streamed = row.get("back_to_back_s", {})
        queued = " / ".join(pb.fmt_seconds(streamed.get(i)) if i in streamed else "–" for i in IMPLS)
        lines.append(
            f"| {row['kernel']} | {cell('torch')} | {cell('torch.compile')} | {cell('tl')} | "
            f"{pb.fmt_ratio(r.get('tl'))} | {pb.fmt_ratio(r.get('torch.compile'))} | {queued} |"
        )
    bad = [
        f"{row['kernel']} {i}: {s}" for row in results["rows"] for i, s in row["status"].items() if s != "ok"
    ]
    if bad:
        lines += ["", "Not ok: " + "; ".join(bad)]
    lines += ["", "tensorlang's grid per kernel (inspect('plan')):", ""]
    for row in results["rows"]:
        lines += [f"- {row['kernel']}: " + " / ".join(p.removeprefix("// ") for p in row.get("tl_plan", []))]
    lines += [""] + [f"Note: {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> str | None:
    """Bars of the ratio to PyTorch eager (log scale) per kernel."""
    plt, note = pb.matplotlib_or_note()
    if plt is None:
        return note
    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(IMPLS)
    for i, impl in enumerate(IMPLS):
        xs = [j + (i - 1) * width for j, row in enumerate(rows) if impl in row["ratio_to_torch_eager"]]
        ys = [row["ratio_to_torch_eager"][impl] for row in rows if impl in row["ratio_to_torch_eager"]]
        bars = ax.bar(xs, ys, width=width, label=LABELS[impl])
        ax.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([row["kernel"] for row in rows], rotation=20, ha="right", fontsize="small")
    ax.set_ylabel("× PyTorch eager (> 1 = faster)")
    ax.set_title(f"{TITLE} ({results['mode']} mode)", fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def gpu_facts(torch) -> dict:
    from codegen.gpu import runtime

    dev = runtime.device(0)
    props = torch.cuda.get_device_properties(0)
    version = runtime.call(dev.drv, "cuDriverGetVersion", what="cuDriverGetVersion")
    return {
        "name": dev.name,
        "arch": dev.arch,
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver_api_version": int(version),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "tf32": "off (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    ap.add_argument(
        "--budget", type=float, default=None, help="seconds of timed calls per implementation and kernel"
    )
    ap.add_argument("--only", default="", help="comma-separated substrings of kernel names to run")
    a = ap.parse_args()
    from codegen.gpu.runtime import unavailable_reason

    reason = unavailable_reason()
    try:
        import torch

        if reason is None and not torch.cuda.is_available():
            reason = "PyTorch sees no CUDA device"
    except ImportError:
        reason = reason or "PyTorch is not installed (the peers and the inputs are torch tensors)"
    if reason is not None:
        print(f"no CUDA GPU here, nothing measured: {reason}", flush=True)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    out = pb.default_out(HERE, a.quick, a.out, "gpu")
    repeats = a.repeats or (3 if a.quick else 10)
    budget = a.budget or (2.0 if a.quick else 20.0)
    specs = QUICK if a.quick else FULL
    if a.only:
        specs = {k: v for k, v in specs.items() if any(s in k for s in a.only.split(","))}
    settings = {"repeats": repeats, "budget_s": budget, "kernels": list(specs), "gpu": gpu_facts(torch)}
    results = pb.new_results(
        EXPERIMENT, QUESTION, a.quick, settings, extra_versions=("torch", "cuda-bindings")
    )
    results["notes"].append(
        "Times are wall-clock per call between torch.cuda.synchronize() calls, inputs already on the GPU "
        "(host overhead included: launches, tensorlang's argument checks and, for kernels with run-time "
        "checks, the read-back of its error record). 'Back to back' is the mean of up to 10 calls queued "
        "with one wait at the end (median of 3 batches): a repeated tensorlang call on contiguous torch "
        "tensors returns without waiting, like a PyTorch operator, when its kernel cannot fail (gpu/fastcall.py)."
    )
    print(pb.header_line(results), flush=True)
    print(f"GPU: {settings['gpu']}", flush=True)
    failures = 0
    for name, spec in specs.items():
        t = time.perf_counter()
        row = measure(name, spec, repeats, budget)
        results["rows"].append(row)
        failures += row["status"].get("tl") != "ok"
        shown = ", ".join(
            f"{i} {pb.fmt_seconds(s)} ({pb.fmt_rate(row['throughput'][i])} {row['unit']}, "
            f"{pb.fmt_ratio(row['ratio_to_torch_eager'].get(i))} eager)"
            for i, s in row["median_s"].items()
        )
        bad = {i: s for i, s in row["status"].items() if s != "ok"}
        print(
            f"{name}: {shown}{'; NOT OK ' + str(bad) if bad else ''} [{time.perf_counter() - t:.0f} s]",
            flush=True,
        )
        pb.write_results(
            results, out, markdown, plot, TITLE
        )  # after each kernel: a cut-off run keeps its rows
    ratios = [row["ratio_to_torch_eager"].get("tl") for row in results["rows"]]
    ratios = [r for r in ratios if r]
    if ratios:
        results["summary"] = {"min_tl_ratio_to_eager": min(ratios), "max_tl_ratio_to_eager": max(ratios)}
    pb.write_results(results, out, markdown, plot, TITLE)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
