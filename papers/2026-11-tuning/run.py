"""How far are the heuristics from the best schedule that search finds? tl.tune on kernels of 2026-11-cpu-kernels.

For each kernel: `tl.tune` with a fixed budget in a fresh tuning database (a temporary cache
directory, so that no earlier record shortens the search), then the default kernel
(`Options(tuned=False)`), the tuned one (`tl.compile` picks the record up) and NumPy are checked
against NumPy's result and timed interleaved in this process. Reported: default and tuned
medians, tuned ÷ default speed-up, trials (failed ones), seconds spent, the options found, and
the convergence (best time over trials, from the database's records) in plot.png.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock /tmp/tl_bench.lock \
        .venv/bin/python papers/2026-11-tuning/run.py --budget 25
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import paperbench  # noqa: E402  (first: it cleans the OpenBLAS presets before NumPy loads)

sys.path.insert(0, str(HERE.parent / "2026-11-cpu-kernels"))

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

QUESTION = "How far are the heuristics from the best schedule that search finds?"
FULL = ("sgemm-256", "atax-4000", "transpose2d-4096", "softmax-4096x1024", "ewchain-4M", "conv2d-64x56")
QUICK = ("transpose2d", "softmax")


def _pick(suite, quick: bool, only: str | None = None):
    wanted = QUICK if quick else FULL
    if only:  # --kernels sgemm,conv2d: those of the set whose names start so
        wanted = tuple(w for w in wanted if any(w.startswith(p) for p in only.split(",")))
    return [k for k in suite if any(k.name.startswith(w) for w in wanted)]


def _median_interleaved(fns: dict, repeats: int) -> dict:
    times = {n: [] for n in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in times.items()}


def _check(got, want, kernel) -> str:
    import numpy as np

    scale = float(np.max(np.abs(want))) or 1.0
    ok = np.allclose(got, want, rtol=kernel.rtol, atol=kernel.atol * scale)
    return "ok" if ok else "wrong"


def main() -> int:
    ap = argparse.ArgumentParser(description=QUESTION)
    paperbench.add_common_args(ap, threads_default="1", peers=False)
    ap.add_argument("--budget", type=float, help="tuning seconds per kernel (default 25; 1 with --quick)")
    ap.add_argument("--kernels", help="comma-separated name prefixes: tune only those kernels of the set")
    args = ap.parse_args()
    budget = args.budget if args.budget is not None else (1.0 if args.quick else 25.0)
    repeats = args.repeats or (3 if args.quick else 15)
    threads = args.threads[0]
    os.environ["TENSORLANG_NUM_THREADS"] = str(threads)
    os.environ["TENSORLANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="tl-tuning-cache-")
    out = paperbench.default_out(HERE, args.quick, args.out, "tuning")

    import kernels as suite_mod
    import numpy as np

    import tensorlang as tl
    from codegen.tune import database

    results = paperbench.new_results(
        "2026-11-tuning",
        QUESTION,
        args.quick,
        {"budget_s": budget, "threads": [threads], "repeats": repeats, "kernels": args.kernels or "all"},
    )
    print(paperbench.header_line(results), flush=True)
    rng = np.random.default_rng(0)
    for kernel in _pick(suite_mod.suite(args.quick), args.quick, args.kernels):
        inputs = kernel.make_inputs(rng)
        want = kernel.numpy(*inputs)
        t0 = time.perf_counter()
        r = tl.tune(kernel.tc, *inputs, budget_s=budget, progress=False)
        spent = time.perf_counter() - t0
        with database.Database() as db:
            trials = db.trials(r.key)
        best, curve = float("inf"), []
        for t in trials:
            if t.status == "ok" and t.seconds:
                best = min(best, t.seconds)
            curve.append(best)
        default = tl.compile(kernel.tc, options=tl.Options(tuned=False))
        tuned = tl.compile(kernel.tc)
        status = {
            "default": _check(default(*inputs), want, kernel),
            "tuned": _check(tuned(*inputs), want, kernel),
        }
        med = _median_interleaved(
            {
                "numpy": functools.partial(kernel.numpy, *inputs),
                "default": functools.partial(default, *inputs),
                "tuned": functools.partial(tuned, *inputs),
            },
            repeats,
        )
        row = {
            "kernel": kernel.name,
            "threads": threads,
            "unit": kernel.unit,
            "median_s": med,
            "ratio_to_numpy": {n: med["numpy"] / med[n] for n in ("default", "tuned")},
            "status": status,
            "speedup": med["default"] / med["tuned"],
            "tuner": {
                "best_s": r.best_s,
                "default_s": r.default_s,
                "speedup": r.default_s / r.best_s,
                "trials": r.trials,
                "failed": sum(t.status != "ok" for t in trials),
                "seconds": spent,
                "options": repr(r.options),
            },
            "convergence_s": curve,
        }
        results["rows"].append(row)
        print(
            f"{kernel.name}: default {med['default'] * 1e3:.3f} ms, tuned {med['tuned'] * 1e3:.3f} ms "
            f"({row['speedup']:.2f}x; tuner {row['tuner']['speedup']:.2f}x) after {r.trials} trials "
            f"({row['tuner']['failed']} failed) in {spent:.0f} s; {status}; {r.options!r}",
            flush=True,
        )
    speedups = [row["speedup"] for row in results["rows"]]
    results["summary"] = {
        "geomean_speedup": float(np.exp(np.mean(np.log(speedups)))) if speedups else None,
        "max_speedup": max(speedups, default=None),
    }
    paperbench.write_results(results, out, _markdown, _plot, "Autotuning: tuned ÷ default")
    return 0 if all(row["status"]["tuned"] == "ok" for row in results["rows"]) else 1


def _markdown(results: dict) -> str:
    lines = [
        paperbench.header_line(results),
        "",
        f"Budget {results['settings']['budget_s']:g} s per kernel, {results['settings']['threads'][0]} thread(s); "
        f"medians of {results['settings']['repeats']} interleaved calls.",
        "",
        "| kernel | NumPy | default | tuned | tuned ÷ default (speed-up) | trials (failed) | tuning s | options found |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        m, t = row["median_s"], row["tuner"]
        lines.append(
            f"| {row['kernel']} | {paperbench.fmt_seconds(m['numpy'])} | {paperbench.fmt_seconds(m['default'])} "
            f"| {paperbench.fmt_seconds(m['tuned'])} | {row['speedup']:.2f}x | {t['trials']} ({t['failed']}) "
            f"| {t['seconds']:.0f} | `{t['options']}` |"
        )
    s = results["summary"]
    if s.get("geomean_speedup"):
        lines += [
            "",
            f"Geometric mean speed-up {s['geomean_speedup']:.2f}x, largest {s['max_speedup']:.2f}x.",
        ]
    lines += [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def _plot(results: dict, path: Path) -> str | None:
    plt, note = paperbench.matplotlib_or_note()
    if plt is None:
        return note
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in results["rows"]:
        curve = row["convergence_s"]
        default = row["tuner"]["default_s"]
        ys = [default / c if c and c != float("inf") else None for c in curve]
        ax.plot(range(1, len(ys) + 1), ys, marker=".", label=row["kernel"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("trial")
    ax.set_ylabel("default ÷ best so far (speed-up)")
    ax.set_title(
        f"Convergence of tl.tune ({results['settings']['budget_s']:g} s per kernel, {results['mode']} mode)"
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


if __name__ == "__main__":
    sys.exit(main())
