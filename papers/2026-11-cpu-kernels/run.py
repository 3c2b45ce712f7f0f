"""CPU kernels: tensorlang against NumPy (and numba, torch when installed), on 1 thread and on all threads.

Question: how fast is the code tensorlang generates for the kernels people write (matrix products,
a convolution, an MLP layer, PolyBench kernels, data movement, an elementwise chain, a softmax),
against NumPy at its best, on one thread and on every core?

Usage: python papers/2026-11-cpu-kernels/run.py [--quick] [--out DIR] [--threads 1,all]
       [--peers auto|on|off] [--repeats N] [--rounds N] [--only NAMES] [--render] [--update-readme]

Every (thread count, group of implementations) is timed in a process of its own (a worker: this
script with --worker), because multi-threaded pools do not mix on a 2-core machine: OpenBLAS's
workers keep spinning after each call and slow whatever runs next. On one thread NumPy
(OPENBLAS_NUM_THREADS=1) and tensorlang are interleaved in one worker; on T > 1 threads NumPy
(OpenBLAS on T threads), tensorlang (Options(threads=T)) and each peer have a worker each. The
workers run in --rounds rounds, in an order that rotates from round to round, and the reported
time is the median of all samples of all rounds. Ratio to NumPy = NumPy's median at the same
thread count / the implementation's median.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# FIRST, before NumPy: importing paperbench unsets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE.
import paperbench as pb  # noqa: E402, I001

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import kernels as ks  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402

EXPERIMENT = HERE.name
QUESTION = (
    "How fast is the code tensorlang generates for common CPU kernels, against NumPy at its best, "
    "on one thread and on every core?"
)
TITLE = "tensorlang CPU kernels — results"


# ---------------------------------------------------------------------------- timing


def _timed(fn: Callable[[], object], number: int) -> float:
    """Seconds per call, over `number` back-to-back calls, with the garbage collector paused."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    finally:
        if gc_was:
            gc.enable()


@dataclass
class Timing:
    """The samples of one implementation of one kernel."""

    fn: Callable[[], object]
    number: int = 1  # back-to-back calls per sample
    warmup_s: float = 0.0
    spent: float = 0.0
    samples: list[float] = field(default_factory=list)

    def warm_up(self, budget: float, target: float) -> None:
        """Two warm-up calls (the first may pay for thread start-up or page faults) set `number`."""
        t = _timed(self.fn, 1)
        self.spent = t
        if t < budget / 4:
            t2 = _timed(self.fn, 1)
            self.spent += t2
            t = min(t, t2)
        self.warmup_s = t
        self.number = max(1, min(100_000, int(target / max(t, 1e-9))))
        if t >= budget / 2:  # a slow kernel: its warm-up call is its one sample
            self.samples.append(t)

    def sample(self, repeats: int, budget: float) -> None:
        if self.samples and (self.spent >= budget or len(self.samples) >= repeats):
            return
        t = _timed(self.fn, self.number)
        self.samples.append(t)
        self.spent += t * self.number

    def summary(self) -> dict:
        return {
            "median_s": float(np.median(self.samples)),
            "min_s": float(np.min(self.samples)),
            "samples_s": self.samples,
            "number": self.number,
            "warmup_s": self.warmup_s,
        }


@dataclass
class Case:
    """One kernel under test: its record (results.json) and the timings of its implementations."""

    kernel: ks.Kernel
    record: dict
    timings: dict[str, Timing]
    compiled: dict[str, object]  # tensorlang variant → Kernel (for compile_count)


def measure(cases: list[Case], args: argparse.Namespace) -> None:
    """Interleaved medians over the whole suite.

    After the warm-ups, each repeat sweeps every kernel and, within a kernel, takes one sample of
    every implementation in an order that rotates from repeat to repeat. The samples of one kernel are
    thus spread over the whole run, and a burst of load from elsewhere on the shared machine spoils a
    few samples of every kernel rather than all samples of one. An implementation stops repeating
    once it has used `budget` seconds (it keeps at least one sample).
    """
    for case in cases:
        for name, t in case.timings.items():
            try:
                t.warm_up(args.budget, args.target)
            except Exception as exc:  # noqa: BLE001 - recorded like any other failure
                _timing_failed(case, name, exc)
    for r in range(args.repeats):
        for case in cases:
            names = list(case.timings)
            for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
                try:
                    case.timings[name].sample(args.repeats, args.budget)
                except Exception as exc:  # noqa: BLE001
                    _timing_failed(case, name, exc)


def _timing_failed(case: Case, name: str, exc: BaseException) -> None:
    case.timings.pop(name, None)
    case.record["implementations"][name].update(
        status="error", correct=False, error="while timing: " + _error_text(exc)
    )


# ---------------------------------------------------------------------------- checking


def compare(out: object, ref: np.ndarray, rtol: float, atol_frac: float) -> dict:
    """allclose against the reference with atol = atol_frac · max|ref|, plus the observed errors."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return {"correct": False, "detail": f"shape {out.shape}, expected {ref.shape}"}
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    atol = atol_frac * scale
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    err = float(np.max(diff)) if diff.size else 0.0
    ok = bool(np.all(np.isfinite(out))) and bool(np.allclose(out, ref, rtol=rtol, atol=atol))
    return {
        "correct": ok,
        "dtype": str(out.dtype),
        "max_abs_err": err,
        "max_err_over_max_ref": err / scale if scale else err,
        "rtol": rtol,
        "atol": atol,
    }


def _error_text(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {exc}\n" + "".join(tb[-3:])


# ---------------------------------------------------------------------------- one kernel, in a worker


def prepare(k: ks.Kernel, impls: list[str], threads: int, check_oracle: bool) -> Case:
    """Inputs, compilation, and a check of every implementation against NumPy's result (and, with
    `check_oracle`, of NumPy's result against an independent float64 formulation)."""
    rng = np.random.default_rng(20261101)
    inputs = k.make_inputs(rng)
    record: dict = {"name": k.name, "implementations": {}}
    entries: dict[str, dict] = record["implementations"]
    runners: dict[str, Callable[[], object]] = {}
    compiled: dict[str, object] = {}

    reference = k.numpy(*inputs)
    if "numpy" in impls:
        entry = {"status": "ok", "correct": True}
        if check_oracle:
            entry.update(
                compare(reference, k.oracle(*inputs), k.rtol, k.atol), checked_against="float64 oracle"
            )
            entry["status"] = "ok" if entry["correct"] else "wrong"
        entries["numpy"] = entry
        runners["numpy"] = lambda: k.numpy(*inputs)

    if "tensorlang" in impls:
        import tensorlang as tl

        opts = tl.Options(threads=threads)
        entry = entries.setdefault("tensorlang", {"options": repr(opts)})
        try:
            t0 = time.perf_counter()
            kern = tl.compile(k.tc, options=opts)
            t1 = time.perf_counter()
            compiled["tensorlang"] = kern
            out = kern(*inputs)
            t2 = time.perf_counter()
            entry.update(compile_s=t1 - t0, first_call_s=t2 - t0, disk_hits=getattr(kern, "disk_hits", None))
            entry.update(compare(out, reference, k.rtol, k.atol))
            entry["status"] = "ok" if entry["correct"] else "wrong"
            runners["tensorlang"] = lambda kern=kern: kern(*inputs)
        except Exception as exc:  # noqa: BLE001 - record and go on with the other kernels
            entry.update(status="error", correct=False, error=_error_text(exc))

    for peer in impls:
        if peer in ("numpy", "tensorlang"):
            continue
        try:
            factory = peers.FACTORIES[peer](k.family)
            if factory is None:
                continue
            run = factory(inputs)
            t0 = time.perf_counter()
            out = peers.CONVERT[peer](run())
            entry = {"first_call_s": time.perf_counter() - t0, **compare(out, reference, k.rtol, k.atol)}
            entry["status"] = "ok" if entry["correct"] else "wrong"
            runners[peer] = run
        except Exception as exc:  # noqa: BLE001
            entry = {"status": "error", "correct": False, "error": _error_text(exc)}
        entries[peer] = entry
    return Case(k, record, {name: Timing(fn) for name, fn in runners.items()}, compiled)


def finish(case: Case) -> dict:
    """The samples and facts of every implementation into the record."""
    for name, t in case.timings.items():
        if t.samples:
            case.record["implementations"][name].update(
                samples_s=t.samples, number=t.number, warmup_s=t.warmup_s
            )
    for name, kern in case.compiled.items():
        case.record["implementations"][name]["compile_count"] = kern.compile_count
    return case.record


def bench_all(
    kernels: list[ks.Kernel],
    args: argparse.Namespace,
    impls: list[str],
    threads: int,
    check_oracle: bool,
    log: Callable[[str], None],
) -> list[dict]:
    """Check every kernel, then time them all (see `measure`)."""
    cases = []
    for k in kernels:
        t0 = time.perf_counter()
        case = prepare(k, impls, threads, check_oracle)
        cases.append(case)
        states = " ".join(f"{n}={r.get('status')}" for n, r in case.record["implementations"].items())
        log(f"checked {k.name:24s} {states}  ({time.perf_counter() - t0:.1f} s)")
    gc.collect()
    time.sleep(0.2)  # let any pool that the reference calls woke go idle
    t0 = time.perf_counter()
    measure(cases, args)
    log(f"timed {len(cases)} kernels, {args.repeats} interleaved repeats ({time.perf_counter() - t0:.1f} s)")
    return [finish(case) for case in cases]


def call_overhead(quick: bool, repeats: int) -> dict:
    """Per-call time of the cached 1-element add kernel (and of np.add for scale)."""
    import tensorlang as tl

    try:
        a = np.ones(1, dtype=np.float32)
        b = np.ones(1, dtype=np.float32)
        t0 = time.perf_counter()
        kern = tl.compile(ks.TINY, options=tl.Options(threads=1))
        kern(a, b)
        first = time.perf_counter() - t0
        number = 200 if quick else 2000
        samples: dict[str, list[float]] = {"tensorlang": [], "numpy": []}
        for _ in range(repeats * 2 + 1):
            samples["tensorlang"].append(_timed(lambda: kern(a, b), number))
            samples["numpy"].append(_timed(lambda: np.add(a, b), number))
        return {
            "kernel": ks.TINY.strip(),
            "first_call_s": first,
            "tensorlang_us": float(np.median(samples["tensorlang"])) * 1e6,
            "numpy_us": float(np.median(samples["numpy"])) * 1e6,
            "calls_per_sample": number,
            "correct": bool(np.array_equal(kern(a, b), a + b)),
        }
    except Exception as exc:  # noqa: BLE001
        return {"error": _error_text(exc), "correct": False}


def worker(args: argparse.Namespace) -> int:
    """Internal mode: time one group of implementations at one thread count; write the records as JSON."""
    impls = args.worker.split(",")
    peers.configure(args.worker_threads)
    kernels = select(ks.suite(args.quick), args.only)
    out: dict = {"impls": impls, "threads": args.worker_threads, "loadavg_start": pb.loadavg()}
    if args.call_overhead:
        # first: it also pays the compiler's one-time start-up, so the kernels' first calls compare
        out["call_overhead"] = call_overhead(args.quick, args.repeats)
    out["records"] = bench_all(
        kernels,
        args,
        impls,
        args.worker_threads,
        args.check_oracle,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    out["loadavg_end"] = pb.loadavg()
    args.worker_json.write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------- driver


@dataclass
class Group:
    """Implementations timed together in one worker process, at one thread count."""

    threads: int
    impls: tuple[str, ...]
    blas_threads: int  # OPENBLAS_NUM_THREADS of the worker (1 unless NumPy is timed there)
    first: bool = False  # the single-thread tensorlang worker: call overhead, float64 oracle checks

    @property
    def label(self) -> str:
        return f"{'+'.join(self.impls)} @ {self.threads} thread{'s' if self.threads != 1 else ''}"


def plan_groups(threads: list[int], peer_names: list[str]) -> list[Group]:
    groups = []
    for t in threads:
        if t == 1:  # single-threaded OpenBLAS does not spin: interleave it with tensorlang
            groups.append(Group(1, ("numpy", "tensorlang"), 1))
        else:
            groups.append(Group(t, ("numpy",), t))
            groups.append(Group(t, ("tensorlang",), 1))
        groups += [Group(t, (p,), 1) for p in peer_names]
    if 1 not in threads:  # the oracle checks and the call overhead still need a home
        groups.insert(0, Group(1, ("numpy", "tensorlang"), 1))
    groups[0].first = True
    return groups


def run_worker(group: Group, args: argparse.Namespace, round_no: int, cache_dir: str) -> dict:
    """One worker process; returns its JSON, or {"error": ...} when it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "worker.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(group.impls)]
        cmd += ["--worker-threads", str(group.threads), "--worker-json", str(out)]
        cmd += ["--repeats", str(args.worker_repeats[round_no])]
        cmd += ["--budget", str(args.budget / args.rounds), "--target", str(args.target)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--only", args.only] if args.only else []
        if group.first and round_no == 0:
            cmd += ["--call-overhead", "--check-oracle"]
        t = group.threads
        env = pb.child_env(
            OPENBLAS_NUM_THREADS=group.blas_threads,
            OMP_NUM_THREADS=t,
            MKL_NUM_THREADS=t,
            NUMBA_NUM_THREADS=t,
            TENSORLANG_CACHE_DIR=cache_dir,
        )
        try:
            with pb.ForeignLoad() as foreign:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, env=env, timeout=600 if args.quick else 7200
                )
        except (OSError, subprocess.SubprocessError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        if proc.returncode != 0 or not out.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
        data = json.loads(out.read_text())
        data["foreign_cores"] = foreign.cores
        data["steal_cores"] = foreign.steal
        return data


def merge(results: dict, kernels: list[ks.Kernel], runs: list[tuple[Group, int, dict]]) -> None:
    """Pool the samples of all rounds per (kernel, thread count, implementation) into rows."""
    threads = results["settings"]["threads"]
    rows = {}
    for t in threads:
        for k in kernels:
            rows[(k.name, t)] = {
                "kernel": k.name,
                "threads": t,
                "family": k.family,
                "shape": k.shape,
                "unit": k.unit,
                "flops": k.flops,
                "bytes": k.bytes,
                "median_s": {},
                "min_s": {},
                "throughput": {},
                "ratio_to_numpy": {},
                "status": {},
                "details": {},
            }
    for group, round_no, data in runs:
        if "error" in data:
            for k in kernels:
                row = rows.get((k.name, group.threads))
                for impl in group.impls:
                    if row is not None and impl not in row["details"]:
                        row["status"][impl] = "error"
                        row["details"][impl] = {"error": "worker process failed: " + data["error"]}
            continue
        if data.get("call_overhead") and "call_overhead" not in results:
            results["call_overhead"] = data["call_overhead"]
        for record in data["records"]:
            row = rows.get((record["name"], group.threads))
            if row is None:  # the extra single-thread worker when 1 is not among --threads
                continue
            for impl, entry in record["implementations"].items():
                if impl not in group.impls:
                    continue
                detail = row["details"].setdefault(impl, {"samples_s": [], "rounds": 0})
                samples = entry.pop("samples_s", [])
                detail["samples_s"] = detail.get("samples_s", []) + samples
                detail["rounds"] = detail.get("rounds", 0) + (1 if samples else 0)
                for key, value in entry.items():
                    if round_no == 0 or key not in detail:
                        detail[key] = value
                before = row["status"].get(impl)  # a failure in any round sticks
                row["status"][impl] = before if before in ("wrong", "error") else entry.get("status")
                detail["process"] = group.label
    for row in rows.values():
        work = row["flops"] if row["unit"] == "GFLOP/s" else row["bytes"]
        for impl, detail in row["details"].items():
            if detail.get("samples_s"):
                med = float(np.median(detail["samples_s"]))
                row["median_s"][impl] = med
                row["min_s"][impl] = float(np.min(detail["samples_s"]))
                row["throughput"][impl] = work / med / 1e9 if med > 0 else None
        base = row["median_s"].get("numpy")
        for impl, med in row["median_s"].items():
            row["ratio_to_numpy"][impl] = base / med if base and med > 0 else None
        tl = row["details"].get("tensorlang", {})
        if row["threads"] == 1 and tl.get("first_call_s") is not None and row["median_s"].get("tensorlang"):
            # compile + JIT: the first call also runs the kernel once; take one cached run away
            tl["compile_jit_s"] = max(0.0, tl["first_call_s"] - row["median_s"]["tensorlang"])
    results["rows"] = list(rows.values())


def summarise(results: dict) -> None:
    failures = []
    for row in results["rows"]:
        for impl, status in row["status"].items():
            if status != "ok":
                failures.append(
                    {
                        "kernel": row["kernel"],
                        "threads": row["threads"],
                        "implementation": impl,
                        "status": status,
                    }
                )
    ov = results.get("call_overhead") or {}
    if ov and not ov.get("correct"):
        failures.append(
            {
                "kernel": "tiny (call overhead)",
                "threads": 1,
                "implementation": "tensorlang",
                "status": "error",
            }
        )
    tl_ok = all(
        row["status"].get("tensorlang") == "ok" and row["median_s"].get("tensorlang")
        for row in results["rows"]
    ) and bool(ov.get("correct", True))
    numpy_ok = all(row["status"].get("numpy") == "ok" for row in results["rows"])
    results["summary"] = {
        "failures": failures,
        "tensorlang_all_correct": tl_ok,
        "numpy_all_correct": numpy_ok,
    }


def select(kernels: list[ks.Kernel], only: str | None) -> list[ks.Kernel]:
    if not only:
        return kernels
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    chosen = [k for k in kernels if k.name in wanted or k.family in wanted]
    known = {k.name for k in kernels} | {k.family for k in kernels}
    unknown = wanted - known
    if unknown:
        raise SystemExit(
            f"unknown kernel(s) {', '.join(sorted(unknown))}; choose from {', '.join(sorted(known))}"
        )
    return chosen


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(ap)
    ap.add_argument(
        "--rounds", type=int, help="rounds of worker processes, rotating order (default 3, 1 with --quick)"
    )
    ap.add_argument("--only", help="comma-separated kernel names or families (e.g. sgemm,softmax-4096x1024)")
    ap.add_argument(
        "--budget", type=float, help="seconds per implementation and kernel before it stops repeating"
    )
    ap.add_argument(
        "--target", type=float, help="approximate seconds per timing sample (several calls if short)"
    )
    ap.add_argument(
        "--render", action="store_true", help="only re-render results.md/plot.png from OUT/results.json"
    )
    ap.add_argument(
        "--update-readme", action="store_true", help="also write the tables into README.md's Findings"
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each worker, wait up to S seconds for other processes to use < 0.25 cores",
    )
    ap.add_argument("--strict", action="store_true", help="exit 1 if any implementation (peers too) failed")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: time these implementations here
    ap.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--call-overhead", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check-oracle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 9)
    args.rounds = max(1, args.rounds or (1 if args.quick else 3))
    args.budget = args.budget if args.budget is not None else (0.5 if args.quick else 10.0)
    args.target = args.target if args.target is not None else (0.002 if args.quick else 0.05)
    if not args.worker:
        args.rounds = min(args.rounds, args.repeats)
        # the repeats are shared out over the rounds (9 over 3 rounds: 3 each)
        args.worker_repeats = [
            args.repeats // args.rounds + (r < args.repeats % args.rounds) for r in range(args.rounds)
        ]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    out = pb.default_out(HERE, args.quick, args.out, "cpu-kernels")
    if args.render:
        results = json.loads((out / "results.json").read_text())
        text = pb.write_results(results, out, report.markdown, report.plot, TITLE)
        print(text)
        if args.update_readme and not report.update_readme(HERE / "README.md", text):
            print("README.md has no results markers; not updated", file=sys.stderr)
        return 0

    print(pb.env_note(), flush=True)
    kernels = select(ks.suite(args.quick), args.only)
    use_peers = pb.peers_enabled(args.peers, args.quick)
    found = pb.detect_peers(peers.PEERS, implemented=peers.FACTORIES)
    peer_names = (
        [n for n, info in found.items() if info["available"] and n in peers.FACTORIES] if use_peers else []
    )
    peer_line = pb.peers_line(found, use_peers)
    print(peer_line, flush=True)
    results = pb.new_results(
        EXPERIMENT,
        QUESTION,
        args.quick,
        {
            "threads": args.threads,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "budget_s": args.budget,
            "target_sample_s": args.target,
            "peers": args.peers,
            "only": args.only,
            "wait_quiet_s": args.wait_quiet,
        },
        extra_versions=list(peers.PEERS),
    )
    results["peers"] = found
    results["notes"].append(peer_line)
    results["kernels_tc"] = {k.name: k.tc.strip() for k in kernels}
    groups = plan_groups(args.threads, peer_names)
    results["settings"]["processes"] = [
        {
            "label": g.label,
            "threads": g.threads,
            "impls": list(g.impls),
            "OPENBLAS_NUM_THREADS": g.blas_threads,
        }
        for g in groups
    ]
    t_start = time.perf_counter()
    runs: list[tuple[Group, int, dict]] = []
    results["processes_run"] = []
    with tempfile.TemporaryDirectory(prefix="tl-bench-cache-") as cache_dir:
        # a fresh compilation cache: the first worker's compile + JIT times are cold
        for r in range(args.rounds):
            order = groups[r % len(groups) :] + groups[: r % len(groups)]
            if r == 0:
                order = groups
            for group in order:
                if args.wait_quiet > 0:  # a shared machine: start each worker when the others are idle
                    calm = pb.wait_for_quiet(0.25, args.wait_quiet)
                    if calm is not None and calm >= 0.25:
                        print(
                            f"  (still {calm:.2f} cores busy elsewhere after {args.wait_quiet:.0f} s)",
                            flush=True,
                        )
                t0 = time.perf_counter()
                data = run_worker(group, args, r, cache_dir)
                runs.append((group, r, data))
                state = "FAILED: " + data["error"].splitlines()[0][:200] if "error" in data else "ok"
                if data.get("foreign_cores") is not None:
                    state += f"  (other processes used {data['foreign_cores']:.2f} cores meanwhile)"
                results["processes_run"].append(
                    {
                        "round": r + 1,
                        "label": group.label,
                        "wall_s": time.perf_counter() - t0,
                        "ok": "error" not in data,
                        "foreign_cores": data.get("foreign_cores"),
                        "steal_cores": data.get("steal_cores"),
                    }
                )
                print(
                    f"round {r + 1}/{args.rounds} {group.label:36s} {time.perf_counter() - t0:6.1f} s  {state}",
                    flush=True,
                )
    merge(results, kernels, runs)
    summarise(results)
    results["elapsed_s"] = time.perf_counter() - t_start
    for row in results["rows"]:
        cells = " ".join(
            f"{impl}={pb.fmt_rate(row['throughput'].get(impl))}"
            + (f"({pb.fmt_ratio(row['ratio_to_numpy'].get(impl))})" if impl != "numpy" else "")
            + ("" if row["status"].get(impl) == "ok" else f"[{row['status'].get(impl)}]")
            for impl in row["status"]
        )
        print(f"{row['kernel']:24s} {row['threads']}t [{row['unit']}] {cells}", flush=True)
    text = pb.write_results(results, out, report.markdown, report.plot, TITLE)
    print()
    print(text)
    if args.update_readme and not report.update_readme(HERE / "README.md", text):
        print("README.md has no results markers; not updated", file=sys.stderr)
    print(f"total {results['elapsed_s']:.1f} s")
    failures = results["summary"]["failures"]
    if not results["summary"]["tensorlang_all_correct"] or not results["summary"]["numpy_all_correct"]:
        return 1
    return 1 if args.strict and failures else 0


if __name__ == "__main__":
    sys.exit(main())
