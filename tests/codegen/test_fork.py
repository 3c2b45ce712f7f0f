"""Kernels in child processes (issue 9, item 5): a forked child gets no thread of its parent's pool
and used to hang forever in any kernel with a parallel phase; spawn and forkserver children import
fresh and compile the kernel themselves. Each case runs in a subprocess with a timeout, so that a
regression fails instead of hanging the test session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys
    import threading
    import numpy as np
    import tensorlang as tl

    SRC = "def r(float(N, D) I) -> (O) { O(n) +=! exp(I(n, d)) * 0.5 }"
    X = np.random.default_rng(0).uniform(-1, 1, (517, 1031)).astype(np.float32)  # > MIN_PARALLEL_WORK
    WANT = (np.exp(X.astype(np.float64)) * 0.5).sum(axis=1)
    KERNEL = None

    def run(queue):
        k = KERNEL if KERNEL is not None else tl.compile(SRC, options=tl.Options(threads=2))
        queue.put(bool(np.allclose(k(X), WANT, rtol=1e-5)))

    if __name__ == "__main__":
        method = sys.argv[1]
        if method == "fork":
            # the parent's pool exists (threads started) and a lock is held by another thread at
            # fork time: the child still gets a working pool and free locks
            KERNEL = tl.compile(SRC, options=tl.Options(threads=2))
            assert np.allclose(KERNEL(X), WANT, rtol=1e-5)
            release = threading.Event()
            import codegen.runtime.parallel
            lock = codegen.runtime.parallel._pool_lock
            holder = threading.Thread(target=lambda: (lock.acquire(), release.wait(), lock.release()))
            holder.start()
            while not lock.locked():
                pass
        ctx = mp.get_context(method)
        queue = ctx.Queue()
        child = ctx.Process(target=run, args=(queue,))
        child.start()
        try:
            ok = queue.get(timeout=40)
        except Exception:  # queue.Empty: the child hangs
            ok = False
        finally:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()
        if method == "fork":
            release.set()
            holder.join()
            assert np.allclose(KERNEL(X), WANT, rtol=1e-5)  # and the parent still works
        print("OK" if ok and child.exitcode == 0 else f"BAD {ok} {child.exitcode}")
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_kernel_with_parallel_phase_runs_in_child_process(tmp_path, method):
    script = tmp_path / "fork_child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "OK", proc.stdout + proc.stderr[-3000:]
