"""Conventions shared by the experiments in papers/ (2026-11-cpu-kernels, 2026-11-fusion, gemm-microkernel).

Import this module FIRST, before NumPy: importing it removes OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
from the environment. These machines preset them (Haswell), which halves OpenBLAS's sgemm on their
AVX-512 cores; a user's machine has no such setting (DESIGN.md §5). Child processes inherit the
cleaned environment.

Every experiment follows one convention:

- flags: ``--quick`` (tiny sizes, few repeats: what the tests run), ``--out DIR`` (default
  ``results/`` beside the script, a temp folder with ``--quick``), ``--threads LIST`` (``1,all``
  style, where relevant), ``--peers on|off|auto`` (where there are peers), ``--repeats N``;
- outputs in ``--out``: ``results.json`` (the schema below), ``results.md`` (a Markdown table) and
  ``plot.png`` (ratio to NumPy; skipped, with a line on stdout, when matplotlib is not importable);
- ``results.json``: ``{"experiment", "schema", "question", "mode", "metadata", "settings",
  "peers", "rows", "notes", "summary"}`` where ``metadata`` holds the machine, CPU, versions, date,
  command and the environment variables removed, and each row is
  ``{"kernel", "threads", "unit", "median_s": {impl: s}, "ratio_to_numpy": {impl: x},
  "throughput": {impl: x}, "status": {impl: "ok" | "wrong" | "error"}, ...}``.

This module imports NumPy only inside functions, so importing it first is safe.
"""

from __future__ import annotations

import os

OPENBLAS_PRESETS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REMOVED_ENV: dict[str, str] = {k: os.environ.pop(k) for k in OPENBLAS_PRESETS if k in os.environ}

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

SCHEMA = "tensorlang-papers/1"
PAPERS = Path(__file__).resolve().parent
REPO = PAPERS.parent
NUMPY_WAS_IMPORTED = "numpy" in sys.modules  # too late to unset for this process if True
THREAD_ENV = (
    "TENSORLANG_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

if str(REPO) not in sys.path:  # the packages are used from the checkout, not installed
    sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------------------- environment


def env_note(removed: dict[str, str] | None = None) -> str:
    """One line saying which OpenBLAS presets were removed before NumPy was imported."""
    removed = REMOVED_ENV if removed is None else removed
    if removed:
        text = ", ".join(f"{k}={v}" for k, v in removed.items())
        note = (
            f"Unset {text} before importing NumPy: this machine presets them, which halves OpenBLAS's "
            "sgemm on AVX-512; a user's machine has no such setting."
        )
    else:
        note = "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were not set; nothing to unset before importing NumPy."
    if NUMPY_WAS_IMPORTED:
        note += " WARNING: NumPy was imported before papers/paperbench.py; this process saw the presets."
    return note


def child_env(**settings: int | str | None) -> dict[str, str]:
    """The environment for a worker process: this one's (presets already removed), with `settings`
    (None removes a variable)."""
    env = dict(os.environ)
    for k in OPENBLAS_PRESETS:
        env.pop(k, None)
    for k, v in settings.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


# ---------------------------------------------------------------------------- command line


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_threads(text: str) -> list[int]:
    """'1,all' → [1, usable cores]; duplicates dropped, order kept."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        n = usable_cpus() if part == "all" else int(part)
        if n < 1:
            raise argparse.ArgumentTypeError(f"thread count must be >= 1, got {part}")
        if n not in out:
            out.append(n)
    if not out:
        raise argparse.ArgumentTypeError("no thread count given")
    return out


def add_common_args(
    ap: argparse.ArgumentParser,
    *,
    threads_default: str | None = "1,all",
    threads_help: str | None = None,
    peers: bool = True,
) -> None:
    """The flags every experiment takes: --quick, --out, --repeats, and --threads/--peers where relevant."""
    ap.add_argument(
        "--quick", action="store_true", help="tiny sizes, few repeats (seconds): what the tests run"
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="output folder (default: results/ beside the script; a temp folder with --quick)",
    )
    ap.add_argument("--repeats", type=int, help="interleaved repeats (the median is reported)")
    if threads_default is not None:
        ap.add_argument(
            "--threads",
            type=parse_threads,
            default=parse_threads(threads_default),
            help=threads_help
            or f"comma-separated thread counts, 'all' = every usable core (default {threads_default})",
        )
    if peers:
        ap.add_argument(
            "--peers",
            choices=("auto", "on", "off"),
            default="auto",
            help="time the installed peers (auto: on in full mode, off with --quick)",
        )


def default_out(here: Path, quick: bool, out: Path | None, prefix: str, folder: str | None = None) -> Path:
    """`out` if given; else a temp folder with --quick, or `results/` beside the script (its
    sub-folder `folder` when the experiment is one of several there)."""
    if out is None:
        if quick:
            out = Path(tempfile.mkdtemp(prefix=f"tl-{prefix}-quick-"))
        else:
            out = here / "results" if folder is None else here / "results" / folder
    out.mkdir(parents=True, exist_ok=True)
    return out


def interleaved_times(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each of `runs`, called in turn `repeats` times (so that every round
    sees the host alike: the per-round ratios are what compare on a noisy machine)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def peers_enabled(choice: str, quick: bool) -> bool:
    return choice == "on" or (choice == "auto" and not quick)


# ---------------------------------------------------------------------------- peers


def detect_peers(names: Iterable[str], implemented: Iterable[str] = ()) -> dict[str, dict]:
    """Installed or not (and the version), found without importing: importing torch or numba would
    load their thread pools into the process that times tensorlang."""
    implemented = set(implemented)
    found = {}
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            found[name] = {"available": False, "note": "not installed"}
            continue
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        entry: dict = {"available": True, "version": version}
        if name not in implemented:
            entry["note"] = f"installed ({version}), but this experiment has no implementation for it"
        found[name] = entry
    return found


def peers_line(found: dict[str, dict], enabled: bool) -> str:
    """'Peers: torch 2.3 timed; numba, tvm, halide not installed' (or why none ran)."""
    run = [
        f"{n} {i.get('version', '')}".strip() for n, i in found.items() if i["available"] and "note" not in i
    ]
    absent = [n for n, i in found.items() if not i["available"]]
    unused = [n for n, i in found.items() if i["available"] and "note" in i]
    parts = []
    if run:
        parts.append(
            ("timed: " if enabled else "installed but off (--peers on to time them): ") + ", ".join(run)
        )
    if unused:
        parts.append("installed, no implementation here: " + ", ".join(unused))
    if absent:
        parts.append("not installed (skipped): " + ", ".join(absent))
    return "Peers — " + ("; ".join(parts) if parts else "none")


# ---------------------------------------------------------------------------- metadata


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def _cpu_jiffies() -> tuple[float, float] | None:
    """(busy, steal) seconds of all CPUs since boot, from /proc/stat (None where there is none)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0.0
    return (user + nice + system + irq + softirq) / tick, steal / tick


class ForeignLoad:
    """How busy the rest of the machine was while a child process ran: the CPU time of all
    processes (from /proc/stat) less that of this process's children, over the wall time, in cores.
    Use as a context manager around subprocess.run; read `.cores` and `.steal` after."""

    def __enter__(self) -> ForeignLoad:
        import resource
        import time

        self._t = time.perf_counter()
        self._cpu = _cpu_jiffies()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._own = ru.ru_utime + ru.ru_stime + _self_cpu()
        self.cores: float | None = None
        self.steal: float | None = None
        return self

    def __exit__(self, *exc) -> None:
        import resource
        import time

        wall = time.perf_counter() - self._t
        cpu = _cpu_jiffies()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = ru.ru_utime + ru.ru_stime + _self_cpu() - self._own
        if cpu is not None and self._cpu is not None and wall > 0:
            self.cores = max(0.0, (cpu[0] - self._cpu[0] - own) / wall)
            self.steal = max(0.0, (cpu[1] - self._cpu[1]) / wall)


def wait_for_quiet(max_cores: float, timeout: float, window: float = 2.0) -> float | None:
    """Wait until processes other than this one (and its finished children) used less than
    `max_cores` cores over two windows in a row, or `timeout` seconds passed. Returns the cores used
    in the last window (None without /proc/stat)."""
    import time

    deadline = time.monotonic() + timeout
    calm, cores = 0, None
    while True:
        t0, c0, own0 = time.perf_counter(), _cpu_jiffies(), _self_cpu()
        if c0 is None:
            return None
        time.sleep(window)
        c1 = _cpu_jiffies()
        cores = max(0.0, (c1[0] - c0[0] - (_self_cpu() - own0)) / (time.perf_counter() - t0))
        calm = calm + 1 if cores < max_cores else 0
        if calm >= 2 or time.monotonic() > deadline:
            return cores


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def loadavg() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def metadata(extra_versions: Iterable[str] = ()) -> dict:
    """Machine, CPU, versions, date, command and the environment: the `metadata` of results.json."""
    import numpy as np

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
        dep = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{dep.get('name')} {dep.get('version')}"
    except Exception:  # noqa: BLE001 - informative only
        pass
    tl_version = None
    try:
        import tomllib

        tl_version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    except Exception:  # noqa: BLE001
        pass
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    versions = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_blas": blas,
        "llvmlite": _version("llvmlite"),
        "islpy": _version("islpy"),
        "matplotlib": _version("matplotlib"),
        "tensorlang": tl_version,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(dirty) if dirty is not None else None,
    }
    for name in extra_versions:
        versions[name] = _version(name)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "machine": {
            "cpu_model": cpu_model,
            "lscpu": _lscpu(),
            "isa": sorted(
                f
                for f in flags
                if f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")
            ),
            "logical_cpus": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "platform": platform.platform(),
            "loadavg_start": loadavg(),
        },
        "versions": versions,
        "env_unset": {"removed": dict(REMOVED_ENV), "note": env_note()},
        "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
    }


def new_results(experiment: str, question: str, quick: bool, settings: dict, extra_versions=()) -> dict:
    return {
        "experiment": experiment,
        "schema": SCHEMA,
        "question": question,
        "mode": "quick" if quick else "full",
        "metadata": metadata(extra_versions),
        "settings": settings,
        "peers": {},
        "rows": [],
        "notes": [],
        "summary": {},
    }


# ---------------------------------------------------------------------------- outputs


def header_line(results: dict) -> str:
    """The first line of every results.md: date, commit, machine, mode, what was unset."""
    md, ver = results["metadata"], results["metadata"]["versions"]
    commit = ver.get("git_commit") or "?"
    if ver.get("git_dirty"):
        commit += " + local changes"
    machine = md["machine"]
    return (
        f"Run {md['date']}, tensorlang {ver.get('tensorlang')} ({commit}), mode **{results['mode']}**, "
        f"{machine.get('cpu_model', '?')} ({machine.get('usable_cpus', '?')} cores), Python {ver['python']}, "
        f"NumPy {ver['numpy']} ({ver.get('numpy_blas')}), llvmlite {ver.get('llvmlite')}. "
        f"{md['env_unset']['note']}"
    )


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}×" if x >= 0.1 else f"{x:.3f}×"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "–"
    if x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def matplotlib_or_note() -> tuple[object | None, str | None]:
    """(pyplot, None), or (None, a note) when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001 - matplotlib is optional (the [papers] extra)
        return None, (
            f"plot.png not written: matplotlib is not importable ({type(exc).__name__}); "
            "pip install -e '.[papers]' for the plot"
        )
    return plt, None


def plot_ratios(
    results: dict,
    path: Path,
    title: str,
    impls: list[str],
    labels: dict[str, str] | None = None,
) -> str | None:
    """Bars of the ratio to NumPy per row (log scale), one panel per thread count. Returns a note
    instead when matplotlib is absent."""
    plt, note = matplotlib_or_note()
    if plt is None:
        return note
    from matplotlib.ticker import FuncFormatter

    labels = labels or {}
    threads = sorted({row.get("threads", 1) for row in results["rows"]})
    panels = [(t, [row for row in results["rows"] if row.get("threads", 1) == t]) for t in threads]
    width_in = max(8.0, 0.75 * max(len(rows) for _t, rows in panels) + 3)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 3.6 * len(panels) + 0.6), squeeze=False)
    shown = [n for n in impls if any(n in (row.get("ratio_to_numpy") or {}) for row in results["rows"])]
    width = 0.8 / max(1, len(shown))
    for ax, (t, rows) in zip(axes[:, 0], panels):
        for i, name in enumerate(shown):
            xs, ys = [], []
            for j, row in enumerate(rows):
                r = (row.get("ratio_to_numpy") or {}).get(name)
                if r:
                    xs.append(j + (i - (len(shown) - 1) / 2) * width)
                    ys.append(r)
            bars = ax.bar(xs, ys, width=width, label=labels.get(name, name))
            if len(shown) <= 3:
                ax.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=6, padding=1)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
        ax.tick_params(axis="y", which="minor", labelsize="x-small")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([row["kernel"] for row in rows], rotation=30, ha="right", fontsize="small")
        ax.set_ylabel("× NumPy (> 1 = faster)")
        ax.set_title(
            f"{title} — {t} thread{'s' if t != 1 else ''} ({results['mode']} mode)", fontsize="medium"
        )
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_results(
    results: dict,
    out: Path,
    markdown: Callable[[dict], str],
    plot: Callable[[dict, Path], str | None] | None,
    title: str,
) -> str:
    """results.json, results.md and plot.png in `out`; prints where they went (and why a plot is
    missing). Returns the Markdown."""
    results["metadata"]["machine"].setdefault("loadavg_end", loadavg())  # kept when re-rendering
    if plot is not None:
        note = plot(results, out / "plot.png")
        if note:
            print(note, flush=True)
            if note not in results["notes"]:
                results["notes"].append(note)
    text = markdown(results)
    (out / "results.md").write_text(f"# {title}\n\n{text}")
    save_json(results, out / "results.json")
    written = ["results.json", "results.md"] + (["plot.png"] if (out / "plot.png").exists() else [])
    print(f"wrote {', '.join(str(out / w) for w in written)}", flush=True)
    return text


def save_json(results: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
