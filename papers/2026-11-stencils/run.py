"""Time-tiled stencils: tensorlang's time recurrences against sweep-at-a-time code (tensorlang's own
step kernels, NumPy slicing, numba loops) on 1 thread and all threads.

Question: how much does compiling the whole time recurrence (time tiles, folded storage) buy over
sweep-at-a-time code, and how close does it come to the machine's limits?

Run: python papers/2026-11-stencils/run.py [--quick] [--out DIR] [--threads 1,all] [--peers auto|on|off]
     [--repeats N] [--only a,b]

Every implementation runs in a worker process of its own (one per kernel, implementation and thread
count), started once and kept alive, so that thread pools (numba's, tensorlang's) never share a
process and nothing is compiled twice. The parent takes the samples interleaved: each repeat asks
every worker for one sample, in an order that rotates from repeat to repeat. A sample is the
median of up to MAX_CALLS back-to-back whole runs (all T steps), about SAMPLE_S in all; with
threads the parent pauses SETTLE_S before each sample, so that the threads of the worker sampled
before (numba's, OpenBLAS's spin after a call) are idle. Reported: the median over
repeats, GFLOP/s from the interior updates times the flops of one update, the ratio to NumPy and
to numba's serial loops, and the peak memory growth of the first run (ru_maxrss). Every result
is checked against the reference (NumPy slicing; for seidel, the untransformed tensorlang program).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import stencils as st  # noqa: E402

EXPERIMENT = HERE.name
QUESTION = (
    "How much does compiling a stencil's whole time recurrence (time tiles, folded storage) buy over "
    "sweep-at-a-time code (tensorlang step kernels, NumPy slicing, numba loops), and how close does "
    "it come to the machine's limits?"
)
TITLE = "Time-tiled stencils — results"
SAMPLE_S = 0.05  # a sample: the median of back-to-back runs of about this long in all
MAX_CALLS = 5
SETTLE_S = 0.2  # with threads: a pause before each sample (other workers' threads stop spinning)
IMPLS = ["numpy", "numba", "tl-sweep", "tl"]
LABELS = {
    "numpy": "NumPy slicing",
    "numba": "numba loops",
    "tl-sweep": "tensorlang, one call per step",
    "tl": "tensorlang recurrence",
}


# ---------------------------------------------------------------------------- worker


def worker(kernel: str, impl: str, threads: int, quick: bool, dump: Path) -> None:
    """Build one implementation, run it once (peak memory), then answer 'sample' / 'dump' / 'quit'
    lines on stdin with one JSON line each."""
    import resource
    import time

    import numpy as np

    stencil = st.STENCILS[kernel]
    shape, steps = stencil.quick if quick else stencil.full
    args = st.inputs(stencil, shape, steps)
    t0 = time.perf_counter()
    if impl == "numpy":
        run = st.numpy_impl(stencil, args, steps)
    elif impl == "numba":
        run = st.numba_impl(stencil, args, steps, parallel=threads > 1)
    elif impl in ("tl", "tl-sweep"):
        run = st.tensorlang_impl(stencil, args, steps, threads, sweep=impl == "tl-sweep")
    elif impl == "reference":
        run = st.reference_impl(stencil, args, steps)
    else:
        raise SystemExit(f"unknown implementation {impl}")
    if run is None:
        print(json.dumps({"unavailable": True}), flush=True)
        return
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = run()  # compiles (JIT) on first use
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    t = time.perf_counter()
    out = run()
    # a sample is the median of this many back-to-back runs, some SAMPLE_S of them (one run of a
    # few ms is too noisy on a shared machine)
    calls = max(1, min(MAX_CALLS, int(SAMPLE_S / max(time.perf_counter() - t, 1e-9))))
    print(
        json.dumps({"ready": True, "setup_s": time.perf_counter() - t0, "peak_growth_mb": growth_mb}),
        flush=True,
    )
    for line in sys.stdin:
        command = line.strip()
        if command == "sample":
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                out = run()
                times.append(time.perf_counter() - t)
            print(json.dumps({"s": sorted(times)[len(times) // 2]}), flush=True)
        elif command == "dump":
            result = out if isinstance(out, tuple) else (out,)
            np.savez(dump, *[np.asarray(r) for r in result])
            print(json.dumps({"dumped": str(dump)}), flush=True)
        else:
            return


class Worker:
    def __init__(self, kernel: str, impl: str, threads: int, quick: bool, scratch: Path):
        self.kernel, self.impl, self.threads = kernel, impl, threads
        self.dump = scratch / f"{kernel}-{impl}-{threads}.npz"
        env = pb.child_env(
            TENSORLANG_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
            OMP_NUM_THREADS=threads,
            NUMBA_NUM_THREADS=threads,
        )
        command = [sys.executable, __file__, "--worker", kernel, impl, str(threads), str(self.dump)]
        if quick:
            command.append("--quick")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=pb.REPO
        )
        self.info = self._answer()
        self.samples: list[float] = []

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            return {"error": f"worker exited with {self.proc.returncode}"}
        return json.loads(line)

    @property
    def ok(self) -> bool:
        return bool(self.info.get("ready"))

    def sample(self) -> None:
        self.proc.stdin.write("sample\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if "s" not in answer:
            self.info = answer
            return
        self.samples.append(answer["s"])

    def result(self):
        import numpy as np

        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        if "dumped" not in self._answer():
            return None
        with np.load(self.dump) as data:
            return [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        self.proc.wait(timeout=60)


# ---------------------------------------------------------------------------- parent


def measure(kernel: str, threads: int, impls: list[str], repeats: int, quick: bool, scratch: Path, want):
    import numpy as np

    stencil = st.STENCILS[kernel]
    shape, steps = stencil.quick if quick else stencil.full
    workers = [Worker(kernel, impl, threads, quick, scratch) for impl in impls]
    try:
        live = [w for w in workers if w.ok]
        for r in range(repeats):
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for w in order:
                if w.ok:
                    if threads > 1:  # the last worker's threads (numba's, OpenBLAS's) spin a while
                        time.sleep(SETTLE_S)
                    w.sample()
        row = {
            "kernel": kernel,
            "threads": threads,
            "shape": list(shape),
            "steps": steps,
            "unit": "GFLOP/s",
            "median_s": {},
            "throughput": {},
            "ratio_to_numpy": {},
            "ratio_to_numba_1t": {},
            "peak_growth_mb": {},
            "status": {},
        }
        flops = stencil.points(shape, steps) * stencil.flops_per_point
        for w in workers:
            if w.info.get("unavailable"):
                continue
            if not w.ok or not w.samples:
                row["status"][w.impl] = "error"
                print(f"  {kernel} {w.impl} t={threads}: {w.info}", flush=True)
                continue
            got = w.result()
            good = (
                got is not None
                and len(got) == len(want)
                and all(
                    g.shape == x.shape and np.allclose(g, x, rtol=1e-3, atol=1e-4) for g, x in zip(got, want)
                )
            )
            row["status"][w.impl] = "ok" if good else "wrong"
            median = statistics.median(w.samples)
            row["median_s"][w.impl] = median
            row["throughput"][w.impl] = flops / median / 1e9
            row["peak_growth_mb"][w.impl] = round(w.info.get("peak_growth_mb", 0.0), 1)
        base = row["median_s"].get("numpy")
        for impl, s in row["median_s"].items():
            if base:
                row["ratio_to_numpy"][impl] = base / s
        return row
    finally:
        for w in workers:
            w.close()


def reference(kernel: str, quick: bool, scratch: Path):
    w = Worker(kernel, "reference", 1, quick, scratch)
    try:
        if not w.ok:
            raise SystemExit(f"the reference of {kernel} failed: {w.info}")
        return w.result()
    finally:
        w.close()


def markdown(results: dict) -> str:
    lines = [pb.header_line(results), "", f"**Question.** {results['question']}", ""]
    lines.append(
        "| kernel | size, T | threads | "
        + " | ".join(f"{LABELS[i]} GFLOP/s (× NumPy)" for i in IMPLS)
        + " | tl ÷ numba 1T | tl memory growth |"
    )
    lines.append("|---|---|---|" + "---|" * len(IMPLS) + "---|---|")
    for row in results["rows"]:
        cells = []
        for impl in IMPLS:
            if impl not in row["median_s"]:
                cells.append("–")
                continue
            flag = "" if row["status"].get(impl) == "ok" else f" **{row['status'].get(impl)}**"
            cells.append(
                f"{pb.fmt_rate(row['throughput'][impl])} ({pb.fmt_ratio(row['ratio_to_numpy'].get(impl))}){flag}"
            )
        size = "×".join(map(str, row["shape"])) + f", {row['steps']}"
        vs = pb.fmt_ratio(row["ratio_to_numba_1t"].get("tl"))
        mem = row["peak_growth_mb"].get("tl")
        lines.append(
            f"| {row['kernel']} | {size} | {row['threads']} | "
            + " | ".join(cells)
            + f" | {vs} | {'–' if mem is None else f'{mem:.0f} MB'} |"
        )
    if results["notes"]:
        lines += ["", *[f"- {n}" for n in results["notes"]]]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> str | None:
    return pb.plot_ratios(results, path, "Stencils", [i for i in IMPLS if i != "numpy"], LABELS)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kernel, impl, threads, dump = sys.argv[2:6]
        worker(kernel, impl, int(threads), "--quick" in sys.argv, Path(dump))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pb.add_common_args(ap)
    ap.add_argument("--only", help="comma-separated kernels (default: all)")
    a = ap.parse_args()
    out = pb.default_out(HERE, a.quick, a.out, "stencils")
    repeats = a.repeats or (2 if a.quick else 5)
    kernels = a.only.split(",") if a.only else list(st.STENCILS)
    peers = pb.detect_peers(["numba"], implemented=["numba"])
    with_numba = pb.peers_enabled(a.peers, a.quick) and peers["numba"]["available"]
    impls = ["numpy"] + (["numba"] if with_numba else []) + ["tl-sweep", "tl"]
    results = pb.new_results(
        EXPERIMENT,
        QUESTION,
        a.quick,
        {"threads": a.threads, "repeats": repeats, "kernels": kernels, "impls": impls},
        extra_versions=["numba"],
    )
    results["peers"] = peers
    print(pb.header_line(results), flush=True)
    print(pb.peers_line(peers, with_numba), flush=True)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="tl-stencils-") as tmp:
        scratch = Path(tmp)
        for kernel in kernels:
            want = reference(kernel, a.quick, scratch)
            numba_1t = None
            for threads in a.threads:
                row = measure(kernel, threads, impls, repeats, a.quick, scratch, want)
                if threads == 1:
                    numba_1t = row["median_s"].get("numba")
                if numba_1t:
                    row["ratio_to_numba_1t"] = {i: numba_1t / s for i, s in row["median_s"].items()}
                results["rows"].append(row)
                failures += sum(s != "ok" for s in row["status"].values())
                shown = ", ".join(
                    f"{i} {pb.fmt_seconds(s)} {row['throughput'][i]:.3g} GFLOP/s [{row['status'][i]}]"
                    for i, s in row["median_s"].items()
                )
                print(f"{kernel} threads={threads}: {shown}", flush=True)
    pb.write_results(results, out, markdown, plot, TITLE)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
