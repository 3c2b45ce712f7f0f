"""Benchmark tensorlang CPU kernels against NumPy (and torch/numba when importable), interleaved medians."""

from __future__ import annotations

import os

# FIRST, before NumPy is imported anywhere: these machines preset OpenBLAS variables that halve NumPy's
# sgemm on AVX-512 CPUs (DESIGN.md §5). A user's machine has no such setting, so compare with NumPy at its best.
REMOVED_ENV = {k: os.environ.pop(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (str(REPO), str(HERE)):  # the packages are used from the checkout, not installed
    if p not in sys.path:
        sys.path.insert(0, p)

import kernels as ks  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402

TL_VARIANTS = ("tensorlang-1t", "tensorlang")  # Options(threads=1), Options() (all cores by default)


def env_note() -> str:
    if REMOVED_ENV:
        removed = ", ".join(f"{k}={v}" for k, v in REMOVED_ENV.items())
        return (
            f"Removed {removed} from the environment before importing NumPy: this machine presets them, "
            "which halves NumPy's (OpenBLAS) sgemm; a user's machine has no such setting."
        )
    return "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were not set; nothing removed from the environment."


# ---------------------------------------------------------------------------- machine description


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(mod, "__version__", getattr(mod, "VERSION", "?")))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keep = ("Model name", "L1d cache", "L2 cache", "L3 cache", "Thread(s) per core", "Hypervisor vendor")
    info = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep:
            info[key.strip()] = value.strip()
    return info


def machine_info() -> dict:
    cpu_model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu_model is None:
                cpu_model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        cpu_model = platform.processor() or None
    blas = None
    try:
        cfg = np.show_config(mode="dicts")
        dep = cfg["Build Dependencies"]["blas"]
        blas = f"{dep.get('name')} {dep.get('version')}"
    except Exception:  # noqa: BLE001
        pass
    threadpools = None
    try:
        from threadpoolctl import threadpool_info

        threadpools = [
            {k: d.get(k) for k in ("internal_api", "num_threads", "version", "architecture")}
            for d in threadpool_info()
        ]
    except Exception:  # noqa: BLE001 - optional
        pass
    import tensorlang

    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    version = None
    try:
        import tomllib

        version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    except Exception:  # noqa: BLE001
        pass
    return {
        "cpu_model": cpu_model,
        "lscpu": _lscpu(),
        "isa": sorted(
            f
            for f in flags
            if f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")
        ),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_blas": blas,
        "threadpools": threadpools,
        "llvmlite": _version("llvmlite"),
        "islpy": _version("islpy"),
        "tensorlang": {
            "version": getattr(tensorlang, "__version__", None) or version,
            "git_commit": commit,
            "git_dirty": bool(dirty) if dirty is not None else None,
        },
        "env": {
            k: os.environ.get(k)
            for k in (
                "TENSORLANG_NUM_THREADS",
                "OMP_NUM_THREADS",
                "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS",
            )
            if os.environ.get(k) is not None
        },
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


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


# ---------------------------------------------------------------------------- one kernel


def prepare(
    k: ks.Kernel,
    peer_names: list[str],
    variants: tuple[str, ...] = TL_VARIANTS,
    time_numpy: bool = True,
) -> Case:
    """Make the inputs, compile, and check every implementation against NumPy (NumPy against float64)."""
    rng = np.random.default_rng(20261101)
    inputs = k.make_inputs(rng)
    record = {
        "name": k.name,
        "family": k.family,
        "shape": k.shape,
        "unit": k.unit,
        "flops": k.flops,
        "bytes": k.bytes,
        "tc": k.tc.strip(),
        "implementations": {},
    }
    impls: dict[str, dict] = record["implementations"]
    runners: dict[str, Callable[[], object]] = {}
    compiled: dict[str, object] = {}

    reference = k.numpy(*inputs)
    impls["numpy"] = {"status": "ok", **compare(reference, k.oracle(*inputs), k.rtol, k.atol)}
    impls["numpy"]["checked_against"] = "float64 oracle"
    if not impls["numpy"]["correct"]:
        impls["numpy"]["status"] = "wrong"
    if time_numpy:
        runners["numpy"] = lambda: k.numpy(*inputs)

    for variant in variants:
        import tensorlang as tl

        opts = tl.Options(threads=1) if variant == "tensorlang-1t" else tl.Options()
        entry = impls.setdefault(variant, {"options": repr(opts)})
        try:
            t0 = time.perf_counter()
            kern = tl.compile(k.tc, options=opts)
            t1 = time.perf_counter()
            compiled[variant] = kern
            out = kern(*inputs)
            t2 = time.perf_counter()
            entry.update(compile_s=t1 - t0, first_call_s=t2 - t0)
            entry.update(compare(out, reference, k.rtol, k.atol))
            entry["status"] = "ok" if entry["correct"] else "wrong"
            runners[variant] = lambda kern=kern: kern(*inputs)
        except Exception as exc:  # noqa: BLE001 - record and go on with the other kernels
            entry.update(status="error", correct=False, error=_error_text(exc))

    for peer in peer_names:
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
        impls[peer] = entry
    return Case(k, record, {name: Timing(fn) for name, fn in runners.items()}, compiled)


def finish(case: Case) -> dict:
    """Medians, throughput and ratios into the record."""
    k, impls = case.kernel, case.record["implementations"]
    work = k.flops if k.unit == "GFLOP/s" else k.bytes
    stats = {name: t.summary() for name, t in case.timings.items() if t.samples}
    base = stats.get("numpy", {}).get("median_s")
    for name, st in stats.items():
        entry = impls[name]
        entry.update(st)
        med = st["median_s"]
        entry["throughput"] = work / med / 1e9 if med > 0 else None
        entry["gflops"] = k.flops / med / 1e9 if k.flops and med > 0 else None
        entry["gbytes_per_s"] = k.bytes / med / 1e9 if med > 0 else None
        entry["ratio_to_numpy"] = base / med if base and med > 0 else None
    for variant, kern in case.compiled.items():
        entry = impls[variant]
        entry["compile_count"] = kern.compile_count
        if entry.get("first_call_s") is not None and entry.get("median_s") is not None:
            # the first call also runs the kernel once: take one cached run away to estimate compile + JIT
            entry["compile_jit_s"] = max(0.0, entry["first_call_s"] - entry["median_s"])
    return case.record


def bench_all(
    kernels: list[ks.Kernel],
    args: argparse.Namespace,
    peer_names: list[str],
    variants: tuple[str, ...] = TL_VARIANTS,
    time_numpy: bool = True,
    log: Callable[[str], None] = lambda _line: None,
) -> list[dict]:
    """Check every kernel, then time them all (see `measure`)."""
    cases = []
    for k in kernels:
        t0 = time.perf_counter()
        case = prepare(k, peer_names, variants, time_numpy)
        cases.append(case)
        states = " ".join(f"{n}={r.get('status')}" for n, r in case.record["implementations"].items())
        log(f"checked {k.name:24s} {states}  ({time.perf_counter() - t0:.1f} s)")
    gc.collect()
    if not time_numpy:
        time.sleep(0.3)  # let OpenBLAS's threads, busy from the reference calls, go idle
    t0 = time.perf_counter()
    measure(cases, args)
    log(f"timed {len(cases)} kernels, {args.repeats} interleaved repeats ({time.perf_counter() - t0:.1f} s)")
    records = [finish(case) for case in cases]
    for record in records:
        record["loadavg_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return records


# ---------------------------------------------------------------------------- call overhead


def call_overhead(args: argparse.Namespace) -> dict:
    """Per-call time of the cached 1-element add kernel (and of np.add for scale)."""
    import tensorlang as tl

    try:
        a = np.ones(1, dtype=np.float32)
        b = np.ones(1, dtype=np.float32)
        t0 = time.perf_counter()
        kern = tl.compile(ks.TINY)
        kern(a, b)
        first = time.perf_counter() - t0
        number = 200 if args.quick else 2000
        samples: dict[str, list[float]] = {"tensorlang": [], "numpy": []}
        for _ in range(args.repeats * 2 + 1):
            samples["tensorlang"].append(_timed(lambda: kern(a, b), number))
            samples["numpy"].append(_timed(lambda: np.add(a, b), number))
        ok = bool(np.array_equal(kern(a, b), a + b))
        return {
            "kernel": ks.TINY.strip(),
            "first_call_s": first,
            "tensorlang_us": float(np.median(samples["tensorlang"])) * 1e6,
            "numpy_us": float(np.median(samples["numpy"])) * 1e6,
            "calls_per_sample": number,
            "samples_us": {n: [s * 1e6 for s in v] for n, v in samples.items()},
            "correct": ok,
            "compile_count": kern.compile_count,
        }
    except Exception as exc:  # noqa: BLE001
        return {"error": _error_text(exc), "correct": False}


# ---------------------------------------------------------------------------- driver


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--quick", action="store_true", help="tiny sizes, 3 repeats: a correctness smoke run (< 60 s)"
    )
    ap.add_argument(
        "--out", type=Path, help="output folder (default: results/ here; a temp folder with --quick)"
    )
    ap.add_argument("--repeats", type=int, help="interleaved repeats (default 9, or 3 with --quick)")
    ap.add_argument("--only", help="comma-separated kernel names or families (e.g. sgemm,softmax-4096x1024)")
    ap.add_argument(
        "--budget", type=float, help="seconds per implementation and kernel before it stops repeating"
    )
    ap.add_argument(
        "--target", type=float, help="approximate seconds per timing sample (several calls if short)"
    )
    ap.add_argument(
        "--peers",
        choices=("auto", "on", "off"),
        default="auto",
        help="torch/numba peers (auto: on, off with --quick)",
    )
    ap.add_argument("--peer", help=argparse.SUPPRESS)  # internal: time one peer (and NumPy) in this process
    ap.add_argument("--peer-json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument(
        "--render", action="store_true", help="only re-render results.md/plot.png from OUT/results.json"
    )
    ap.add_argument(
        "--update-readme", action="store_true", help="also write the table into README.md's Findings"
    )
    ap.add_argument("--strict", action="store_true", help="exit 1 if any implementation failed or was wrong")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 9)
    args.budget = args.budget if args.budget is not None else (0.5 if args.quick else 10.0)
    args.target = args.target if args.target is not None else (0.002 if args.quick else 0.05)
    if args.out is None and not args.peer:
        args.out = (
            Path(tempfile.mkdtemp(prefix="tensorlang-cpu-kernels-quick-")) if args.quick else HERE / "results"
        )
    return args


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


def summarise(results: dict) -> None:
    failures = []
    for k in results["kernels"]:
        for name, res in k["implementations"].items():
            if res.get("status") != "ok":
                failures.append({"kernel": k["name"], "implementation": name, "status": res.get("status")})
    ov = results.get("call_overhead") or {}
    if ov and not ov.get("correct"):
        failures.append({"kernel": "tiny (call overhead)", "implementation": "tensorlang", "status": "error"})
    tl_ok = all(
        k["implementations"].get(v, {}).get("status") == "ok" for k in results["kernels"] for v in TL_VARIANTS
    ) and bool(ov.get("correct", True))
    results["summary"] = {"failures": failures, "tensorlang_all_correct": tl_ok}


def write_outputs(results: dict, out: Path, final: bool) -> str:
    summarise(results)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(out / "results.json")
    if not final:
        return ""
    note = report.plot(results, out / "plot.png")
    if note and note not in results["notes"]:
        results["notes"].append(note)
        (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    table = report.markdown(results)
    (out / "results.md").write_text(f"# tensorlang CPU kernels — results\n\n{table}")
    return table


def peer_worker(args: argparse.Namespace) -> int:
    """Internal mode: time one peer alone (NumPy only gives the reference) and write the records as JSON."""
    kernels = select(ks.suite(args.quick), args.only)
    records = bench_all(kernels, args, [args.peer], variants=(), time_numpy=False)
    args.peer_json.write_text(json.dumps(records))
    return 0


def run_peer(name: str, args: argparse.Namespace, results: dict) -> None:
    """Time a peer alone in a process of its own and merge its entries (ratio to the main NumPy median).

    Thread pools do not mix on a 2-core machine: interleaved call by call with OpenBLAS (whose worker
    keeps spinning after each call), numba's and torch's parallel calls got 10-1000x slower, and they
    slowed np.matmul and tensorlang by up to 100x when all ran in one process. So each peer runs in its
    own process, repeated without interleaving; NumPy and tensorlang stay interleaved with each other.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", name, "--peer-json", str(out)]
        cmd += ["--repeats", str(args.repeats), "--budget", str(args.budget), "--target", str(args.target)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--only", args.only] if args.only else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300 if args.quick else 3600)
            records = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
            problem = None if records is not None else f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
            records, problem = None, f"{type(exc).__name__}: {exc}"
    if records is None:
        first = problem.splitlines()[0] if problem else "?"
        results["notes"].append(f"{name}: its benchmark process failed ({first})")
        results.setdefault("peer_errors", {})[name] = problem
        return
    by_name = {r["name"]: r for r in records}
    for record in results["kernels"]:
        peer_record = by_name.get(record["name"])
        entry = (peer_record or {}).get("implementations", {}).get(name)
        if entry is None:
            continue
        entry["process"] = "own process, not interleaved"
        base = record["implementations"]["numpy"].get("median_s")
        if base and entry.get("median_s"):
            entry["ratio_to_numpy"] = base / entry["median_s"]
        record["implementations"][name] = entry
    print(f"{name}: timed in its own process ({time.perf_counter() - t0:.1f} s)", flush=True)
    for record in results["kernels"]:
        entry = record["implementations"].get(name)
        if entry is not None:
            print(f"  {record['name']:24s} {_describe(name, entry)}", flush=True)


def _describe(name: str, res: dict) -> str:
    if res.get("status") == "error":
        return f"{name}=ERROR({res['error'].splitlines()[0][:120]})"
    rate = res.get("throughput")
    flag = "" if res.get("status") == "ok" else " WRONG"
    return f"{name}={rate:.3g}{flag}" if rate is not None else f"{name}=?{flag}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer:
        return peer_worker(args)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        results = json.loads((args.out / "results.json").read_text())
        table = write_outputs(results, args.out, final=True)
        print(table)
        if args.update_readme and not report.update_readme(HERE / "README.md", table):
            print("README.md has no results markers; not updated", file=sys.stderr)
        return 0

    print(env_note(), flush=True)
    kernels = select(ks.suite(args.quick), args.only)
    use_peers = args.peers == "on" or (args.peers == "auto" and not args.quick)
    found = peers.detect() if use_peers else {}
    peer_names = [n for n, info in found.items() if info["available"] and n in peers.FACTORIES]
    notes = []
    if not use_peers:
        notes.append("Peers (torch, numba, tvm, halide) not run in this mode (use --peers on).")
    for name, info in found.items():
        if not info["available"] or info.get("note"):
            notes.append(f"{name}: {info.get('note')}")
    results = {
        "suite": HERE.name,
        "mode": "quick" if args.quick else "full",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "env_note": env_note(),
        "removed_env": REMOVED_ENV,
        "machine": machine_info(),
        "peers": found,
        "settings": {"repeats": args.repeats, "budget_s": args.budget, "target_sample_s": args.target},
        "notes": notes,
        "kernels": [],
    }
    t_start = time.perf_counter()
    # The overhead run goes first: it also pays the compiler's one-time start-up (imports, LLVM init),
    # so the first-call times of the kernels below are comparable with each other.
    results["call_overhead"] = call_overhead(args)
    ov = results["call_overhead"]
    if "error" in ov:
        print(f"call overhead: ERROR {ov['error'].splitlines()[0]}", flush=True)
    else:
        print(
            f"call overhead: tensorlang {ov['tensorlang_us']:.1f} us, np.add {ov['numpy_us']:.2f} us",
            flush=True,
        )
    results["kernels"] = bench_all(kernels, args, [], log=lambda line: print(line, flush=True))
    for record in results["kernels"]:
        parts = [_describe(name, res) for name, res in record["implementations"].items()]
        print(f"{record['name']:24s} [{record['unit']}] {' '.join(parts)}", flush=True)
    write_outputs(results, args.out, final=False)
    for name in peer_names:
        run_peer(name, args, results)
        write_outputs(results, args.out, final=False)
    results["elapsed_s"] = time.perf_counter() - t_start
    results["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    table = write_outputs(results, args.out, final=True)
    print()
    print(table)
    if args.update_readme and not report.update_readme(HERE / "README.md", table):
        print("README.md has no results markers; not updated", file=sys.stderr)
    print(
        f"wrote {args.out / 'results.json'}, results.md{', plot.png' if (args.out / 'plot.png').exists() else ''}"
    )
    print(f"total {results['elapsed_s']:.1f} s")
    if args.strict and results["summary"]["failures"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
