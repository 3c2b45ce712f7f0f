"""tune: one candidate's task (source, knobs, example inputs, reference outputs) → its status and time, measured in a child process.

`evaluate(task)` is the unit of work, a picklable function of picklable data, so any
concurrent.futures.Executor (a process pool, a Dask or Ray cluster) can run it. It writes the
task to a temporary folder, runs `python -m codegen.tune.measure FOLDER` and kills it past the
task's time limit: a candidate that crashes or hangs is a failed trial, never the tuner's end.
The child compiles the candidate (warming the worker's disk cache), checks its outputs against
the reference (the default options' outputs: allclose at a dtype's tolerance, integers exact),
then, holding a machine-wide lock so that one measurement runs at a time per machine, times it:
one untimed call, then batches of calls of at least BATCH_S each; the time is the median of the
batch means. A "confirm" task times several candidates interleaved (A B C A B C ...), which
removes drift between them before the best is chosen.

Fault injection for the tests: a task's "fault" ("crash", "hang", "wrong") makes its child abort,
sleep forever or perturb its outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH_S = 0.02
BATCHES = 7
MEASURE_CAP_S = 1.5  # stop adding batches past this (slow kernels get fewer)
PRUNE_FACTOR = 5.0  # one call slower than this times the best so far: not timed further


def evaluate(task: dict) -> dict:
    """Run one task in a child process. Returns {"status", "seconds" | "times", "detail",
    "outputs" (when task["keep_outputs"])}."""
    import numpy as np

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tl-tune-") as tmp:
        folder = Path(tmp)
        for i, a in enumerate(task["inputs"]):
            np.save(folder / f"in{i}.npy", np.asarray(a), allow_pickle=False)
        for i, a in enumerate(task.get("reference") or ()):
            np.save(folder / f"ref{i}.npy", np.asarray(a), allow_pickle=False)
        meta = {k: v for k, v in task.items() if k not in ("inputs", "reference")}
        meta["n_inputs"] = len(task["inputs"])
        meta["n_reference"] = len(task.get("reference") or ())
        (folder / "task.json").write_text(json.dumps(meta))
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "codegen.tune.measure", str(folder)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return {"status": "error", "detail": f"could not start: {exc}", "wall_s": 0.0}
        try:
            _, err = proc.communicate(timeout=task["timeout_s"])
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {
                "status": "timeout",
                "detail": f"killed after {task['timeout_s']:.1f} s",
                "wall_s": time.perf_counter() - start,
            }
        wall = time.perf_counter() - start
        result_path = folder / "result.json"
        if proc.returncode != 0 or not result_path.exists():
            tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
            return {
                "status": "crash",
                "detail": f"exit status {proc.returncode}: {' '.join(tail)}"[:500],
                "wall_s": wall,
            }
        result = json.loads(result_path.read_text())
        result["wall_s"] = wall
        if task.get("keep_outputs") and result["status"] == "ok":
            result["outputs"] = [np.load(folder / f"out{i}.npy") for i in range(result.pop("n_outputs"))]
        return result


# ---------------------------------------------------------------------- the child


def _tolerance(dtype) -> float | None:
    import numpy as np

    if not np.issubdtype(dtype, np.inexact):
        return None  # exact
    return {2: 1e-2, 4: 1e-4, 8: 1e-9}.get(np.dtype(dtype).itemsize, 1e-4)


def _same(got, want) -> str | None:
    """None when `got` matches the reference, else what differs."""
    import numpy as np

    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    tol = _tolerance(got.dtype)
    if tol is None:
        return None if np.array_equal(got, want) else "integer outputs differ"
    scale = float(np.nanmax(np.abs(want))) if want.size and np.isfinite(want).any() else 1.0
    if np.allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30), equal_nan=True):
        return None
    return f"outputs differ (max abs error {float(np.nanmax(np.abs(got - want))):.3g})"


def _time(call, best: float | None) -> float:
    call()
    t0 = time.perf_counter()
    call()
    once = time.perf_counter() - t0
    if best is not None and once > PRUNE_FACTOR * best:
        return once  # hopeless: not worth the batches
    per_batch = max(1, int(BATCH_S / max(once, 1e-9)))
    means, spent = [], 0.0
    while len(means) < BATCHES and (spent < MEASURE_CAP_S or len(means) < 3):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        dt = time.perf_counter() - t0
        spent += dt
        means.append(dt / per_batch)
    means.sort()
    return means[len(means) // 2]


class _MachineLock:
    """flock on a file in the cache directory: one measurement at a time on a machine."""

    def __enter__(self):
        import fcntl

        from ..lowering import disk_cache

        path = disk_cache.cache_root() / "tune.measure.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self._fd)  # releases the lock


def _child(folder: Path) -> None:
    import numpy as np

    import tensorlang as tl

    from . import key as key_

    task = json.loads((folder / "task.json").read_text())
    inputs = [np.load(folder / f"in{i}.npy") for i in range(task["n_inputs"])]
    reference = [np.load(folder / f"ref{i}.npy") for i in range(task["n_reference"])]
    base = tl.Options(tuned=False, threads=task.get("threads"))
    fault = task.get("fault")
    candidates = task["candidates"]
    kernels = [tl.compile(task["source"], task["name"], options=key_.from_knobs(c, base)) for c in candidates]
    sizes = task.get("sizes") or {}  # sizes given by keyword (tl.tune(src, A, T=100))
    outputs = []
    for k in kernels:
        result = k(*inputs, **sizes)
        outputs.append(list(result) if isinstance(result, tuple) else [result])
    if fault == "crash":
        os.abort()
    if fault == "hang":
        time.sleep(1e9)
    if fault == "wrong":
        outputs[0][0] = outputs[0][0] + 1
    for outs in outputs:
        for got, want in zip(outs, reference):
            problem = _same(got, want)
            if problem is not None:
                (folder / "result.json").write_text(json.dumps({"status": "wrong", "detail": problem}))
                return
    if task.get("keep_outputs"):
        for i, a in enumerate(outputs[0]):
            np.save(folder / f"out{i}.npy", a, allow_pickle=False)
    with _MachineLock():
        if task["kind"] == "confirm":  # rounds of interleaved batches
            rounds: list[list[float]] = [[] for _ in kernels]
            for _ in range(task.get("rounds", 5)):
                for i, k in enumerate(kernels):
                    rounds[i].append(_time(lambda k=k: k(*inputs, **sizes), None))
            result = {"status": "ok", "times": [sorted(r)[len(r) // 2] for r in rounds], "rounds": rounds}
        else:
            k = kernels[0]
            result = {"status": "ok", "seconds": _time(lambda: k(*inputs, **sizes), task.get("best_s"))}
    result["n_outputs"] = len(outputs[0])
    (folder / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
