"""Derived backward kernels: tensorlang.torch ops (backward from tl.grad) against PyTorch's own backward, on one thread.

Question: how fast is the backward pass of a tensorlang.torch op, whose backward kernel tl.grad
derives from the forward source, against PyTorch's hand-written backward for the same operation
(matmul, conv2d, softmax), on one thread?

Usage: python papers/2026-11-torch-backward/run.py [--quick] [--out DIR] [--repeats N]

Both sides run under autograd, as a user's training step does: each sample is
`y.backward(g, retain_graph=True)` on the output of the op (tensorlang.torch.op with
Options(threads=1)) or of the PyTorch function (torch.set_num_threads(1)), the gradients reset to
None before each call. The forward is timed the same way for context. Samples interleave the two
sides; the median is reported. Ratio = PyTorch's median / tensorlang's (above 1: tensorlang is
faster). Every tensorlang gradient is checked against PyTorch's first (status "wrong" otherwise;
the script then exits 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

# FIRST, before NumPy: importing paperbench unsets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE.
import paperbench as pb  # noqa: E402, I001

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

EXPERIMENT = HERE.name
QUESTION = (
    "How fast is the backward pass of a tensorlang.torch op (its backward kernel derived by tl.grad) "
    "against PyTorch's own backward for matmul, conv2d and softmax, on one thread?"
)
TITLE = "tensorlang.torch backward vs PyTorch backward — results"

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = (
    "def cv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
)
SOFTMAX = """def sm(float(N,D) X) -> (Y) {
  mx(n) max=! X(n,d)
  e(n,d) = exp(X(n,d) - mx(n))
  s(n) +=! e(n,d)
  Y(n,d) = e(n,d) / s(n)
}"""


def cases(quick: bool):
    """(kernel, source, input shapes, the PyTorch function, size text)."""
    import torch.nn.functional as F

    if quick:
        mm, conv, sm = (48, 40, 32), ((2, 3, 10, 9), (4, 3, 3, 3)), (16, 24)
    else:
        mm, conv, sm = (512, 512, 512), ((8, 32, 34, 34), (32, 32, 3, 3)), (1024, 1024)
    m, k, n = mm
    return [
        ("matmul", MATMUL, [(m, k), (k, n)], lambda a, b: a @ b, f"{m}x{k} @ {k}x{n}"),
        ("conv2d", CONV, list(conv), F.conv2d, f"input {conv[0]}, weights {conv[1]}, valid"),
        ("softmax", SOFTMAX, [sm], lambda x: torch_softmax(x), f"{sm[0]}x{sm[1]}, rows"),
    ]


def torch_softmax(x):
    import torch

    return torch.softmax(x, dim=1)


def measure(fn, reset, number: int) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            reset()
            fn()
        return (time.perf_counter() - start) / number
    finally:
        gc.enable()


def run_case(name, source, shapes, reference, size_text, repeats, number):
    import torch

    import tensorlang as tl
    import tensorlang.torch as tlt

    op = tlt.op(source, options=tl.Options(threads=1))
    torch.manual_seed(0)
    inputs = [torch.randn(*s, requires_grad=True) for s in shapes]
    ours, theirs = op(*inputs), reference(*inputs)
    g = torch.randn_like(theirs)

    def reset():
        for x in inputs:
            x.grad = None

    def grads(y):
        reset()
        y.backward(g, retain_graph=True)
        return [x.grad.clone() for x in inputs]

    status = "ok"
    try:
        for a, b in zip(grads(ours), grads(theirs)):
            torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3 * float(b.abs().max()))
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-4)
    except AssertionError as exc:
        status = "wrong"
        print(f"{name}: {str(exc)[:300]}", flush=True)
    detached = [x.detach() for x in inputs]
    impls = {
        "torch_backward": (lambda: theirs.backward(g, retain_graph=True), reset),
        "tensorlang_backward": (lambda: ours.backward(g, retain_graph=True), reset),
        "torch_forward": (lambda: reference(*detached), lambda: None),
        "tensorlang_forward": (lambda: op(*detached), lambda: None),
    }
    samples = {k: [] for k in impls}
    for fn, rs in impls.values():  # warm-up (compiles the backward kernel's specialisation)
        measure(fn, rs, 1)
    for r in range(repeats):
        order = list(impls.items())
        order = order[r % len(order) :] + order[: r % len(order)]
        for key, (fn, rs) in order:
            samples[key].append(measure(fn, rs, number))
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = {
        "backward": med["torch_backward"] / med["tensorlang_backward"],
        "forward": med["torch_forward"] / med["tensorlang_forward"],
    }
    return {
        "kernel": name,
        "threads": 1,
        "unit": "s",
        "size": size_text,
        "median_s": med,
        "ratio_to_numpy": {},
        "ratio_to_torch": ratio,
        "throughput": {},
        "status": {"tensorlang_backward": status},
        "samples": repeats,
        "calls_per_sample": number,
    }


def markdown(results: dict) -> str:
    lines = [
        pb.header_line(results),
        "",
        f"PyTorch {results['metadata']['versions'].get('torch')}, one thread on both sides. "
        "Ratio = PyTorch / tensorlang (above 1: tensorlang faster).",
        "",
        "| kernel | size | PyTorch backward | tensorlang backward | ratio | PyTorch forward | tensorlang forward | ratio | gradients |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        m, r = row["median_s"], row["ratio_to_torch"]
        lines.append(
            f"| {row['kernel']} | {row['size']} | {pb.fmt_seconds(m['torch_backward'])} | "
            f"{pb.fmt_seconds(m['tensorlang_backward'])} | {pb.fmt_ratio(r['backward'])} | "
            f"{pb.fmt_seconds(m['torch_forward'])} | {pb.fmt_seconds(m['tensorlang_forward'])} | "
            f"{pb.fmt_ratio(r['forward'])} | {row['status']['tensorlang_backward']} |"
        )
    lines += ["", *results["notes"], ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("this experiment needs PyTorch: pip install 'tensorlang[torch]'")
        return 0 if args.quick else 1
    torch.set_num_threads(1)
    repeats = args.repeats or (3 if args.quick else 15)
    number = 1 if args.quick else 3
    out = pb.default_out(HERE, args.quick, args.out, "torch-backward")
    print(pb.env_note(), flush=True)
    results = pb.new_results(
        EXPERIMENT,
        QUESTION,
        args.quick,
        {"repeats": repeats, "calls_per_sample": number, "threads": 1},
        extra_versions=("torch",),
    )
    for case in cases(args.quick):
        row = run_case(*case, repeats, number)
        results["rows"].append(row)
        m = row["median_s"]
        print(
            f"{row['kernel']:8s} backward torch {pb.fmt_seconds(m['torch_backward'])}, tensorlang "
            f"{pb.fmt_seconds(m['tensorlang_backward'])} ({pb.fmt_ratio(row['ratio_to_torch']['backward'])}); "
            f"forward {pb.fmt_ratio(row['ratio_to_torch']['forward'])} [{row['status']['tensorlang_backward']}]",
            flush=True,
        )
    results["summary"] = {row["kernel"]: row["ratio_to_torch"]["backward"] for row in results["rows"]}
    pb.write_results(results, out, markdown, None, TITLE)
    return 0 if all(r["status"]["tensorlang_backward"] == "ok" for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
