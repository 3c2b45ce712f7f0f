"""Interrupts (issue 9, item 4): Ctrl-C during a call raises KeyboardInterrupt only after every
worker has stopped touching the call's memory, and stops a long kernel early (threaded, serial, GEMM).

Each case runs in a child process: a threading.Timer sends SIGINT to the process during a call that
would run for seconds; the child then allocates sentinel arrays the size of the call's output (the
allocator hands back the memory the call dropped), checks after a second that nothing wrote into
them, and calls the kernel again. A worker still running after KeyboardInterrupt either overwrites
a sentinel or, where the output was unmapped, crashes the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    # Ctrl-C raises KeyboardInterrupt even where this process started with SIGINT ignored (a
    # shell's background job): Python then leaves SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    import tensorlang as tl

    case = json.loads(sys.argv[1])
    rng = np.random.default_rng(0)
    if case["kind"] == "rows":
        # N rows of K sin() each: about 5e9 instances, several seconds even on two threads
        src = "def f(float(N) A, float(K) W) -> (O) { O(n) +=! sin(A(n) * W(k)) }"
        n, kk = case["n"], case["k"]
        big = [rng.uniform(0, 1, n).astype(np.float32), rng.uniform(0, 1, kk).astype(np.float32)]
        small = [rng.uniform(0, 1, 37).astype(np.float32), rng.uniform(0, 1, 53).astype(np.float32)]
        want = np.sin(small[0][:, None] * small[1][None, :]).sum(axis=1)
        out_shape, sizes = (n,), {"N": n, "K": kk}
    elif case["kind"] == "elementwise":
        # one loop of N elements (a phase with no loop inside its outer loop), eight sin() each
        src = "def f(float(N) A) -> (O) { O(i) = sin(sin(sin(sin(sin(sin(sin(sin(A(i))))))))) }"
        n = case["n"]
        big = [rng.uniform(0, 1, n).astype(np.float32)]
        small = [rng.uniform(0, 1, 70001).astype(np.float32)]
        want = small[0]
        for _ in range(8):
            want = np.sin(want)
        out_shape, sizes = (n,), {"N": n}
    else:
        src = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
        n = case["n"]
        big = [rng.random((n, n), dtype=np.float32) - 0.5 for _ in range(2)]
        small = [rng.uniform(-1, 1, s).astype(np.float32) for s in [(301, 257), (257, 129)]]
        want = small[0].astype(np.float64) @ small[1].astype(np.float64)
        out_shape, sizes = (n, n), {"M": n, "N": n, "K": n}
    k = tl.compile(src, options=tl.Options(threads=case["threads"]))
    k._specialisation(sizes)  # compile before the timed call

    signalled = []

    def interrupt():
        signalled.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(case["after"], interrupt)
    start = time.perf_counter()
    timer.start()
    result = {"interrupted": False}
    try:
        k(*big)
    except KeyboardInterrupt:
        result["interrupted"] = True
    stopped = time.perf_counter()
    timer.join()
    sentinels = [np.full(out_shape, 7.0, dtype=np.float32) for _ in range(8 if len(out_shape) == 1 else 2)]
    time.sleep(1.0)
    result["sentinels_intact"] = all(bool((s == 7.0).all()) for s in sentinels)
    result["ran_s"] = stopped - start
    result["stop_latency_s"] = stopped - signalled[0] if signalled else None
    got = k(*small)  # the pool is idle again and the kernel still works
    result["correct_after"] = bool(np.allclose(got, want, rtol=1e-4, atol=1e-3))
    print(json.dumps(result))
    """
)


def run_child(tmp_path, case: dict, timeout: float = 120) -> dict:
    script = tmp_path / "interrupt_child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(result: dict, latency_s: float) -> None:
    assert result["interrupted"], result
    # the kernel would run for several seconds more: it was stopped, not waited for
    assert result["stop_latency_s"] < latency_s, result
    assert result["sentinels_intact"], result
    assert result["correct_after"], result


def test_interrupt_threaded_call_stops_workers_before_raising(tmp_path):
    """threads=2: KeyboardInterrupt reached the caller at once while both workers went on
    writing into the dropped output for seconds."""
    check(run_child(tmp_path, {"kind": "rows", "threads": 2, "n": 16000, "k": 400000, "after": 0.3}), 2.0)


def test_interrupt_serial_call_stops_within_a_poll(tmp_path):
    """threads=1: the interrupt used to arrive only when the kernel finished (seconds later)."""
    check(run_child(tmp_path, {"kind": "rows", "threads": 1, "n": 16000, "k": 400000, "after": 0.3}), 2.0)


def test_interrupt_single_loop_kernel_stops_between_chunks(tmp_path):
    """A split loop with nothing nested has no poll in its code (it would stop vectorisation):
    the runtime runs each thread's share in chunks and checks the cancel word between them."""
    check(run_child(tmp_path, {"kind": "elementwise", "threads": 2, "n": 1 << 26, "after": 0.3}), 2.0)


def test_interrupt_gemm_stops_inside_the_gemm_body(tmp_path):
    """A lone big sgemm call (one thread) polls the cancel word in its macro-loops."""
    check(run_child(tmp_path, {"kind": "gemm", "threads": 1, "n": 6144, "after": 0.3}), 1.0)


def test_interrupt_threaded_gemm(tmp_path):
    """threads=2 split the GEMM rows; both halves stop, then the call raises."""
    check(run_child(tmp_path, {"kind": "gemm", "threads": 2, "n": 6144, "after": 0.2}), 1.0)


SLOW_WORKERS = textwrap.dedent(
    """
    import json, os, signal, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in CHILD
    import numpy as np
    from codegen.runtime.parallel import Workspaces, run_phases
    from codegen.planning.plan import PhasePlan

    finished = []

    def entry(*args):  # buffers, params, error, phase, lo, hi, workspace, cancel
        # a worker that takes 0.6 s to notice the cancel word (as a kernel between two polls)
        time.sleep(0.6)
        finished.append(time.perf_counter())
        return 0

    def interrupt(at):
        time.sleep(at)
        os.kill(os.getpid(), signal.SIGINT)

    for at in (0.1, 0.3):  # the second arrives while the first is waiting for the workers
        threading.Thread(target=interrupt, args=(at,), daemon=True).start()
    plans = (PhasePlan(0, (0, 2, 1), 1 << 30),)
    try:
        run_phases(entry, lambda ws: 0, 0, plans, 2, Workspaces(0))
        raised = None
    except KeyboardInterrupt:
        raised = time.perf_counter()
    print(json.dumps({"raised": raised, "finished": finished}))
    """
)


def test_interrupt_is_raised_after_the_last_worker_returns_even_when_repeated(tmp_path):
    """Ctrl-C pressed twice: the second interrupt does not cut the wait for the workers short."""
    script = tmp_path / "slow_workers.py"
    script.write_text(SLOW_WORKERS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["raised"] is not None, result
    assert len(result["finished"]) == 2, result
    assert result["raised"] >= max(result["finished"]), result


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.05, 0.5, 1.5])
def test_interrupt_at_several_moments(tmp_path, after):
    check(run_child(tmp_path, {"kind": "rows", "threads": 2, "n": 16000, "k": 400000, "after": after}), 2.0)


ELEMENTWISE = "def ew(float(N) a, float(N) b) -> (o) { o(i) = tanh(a(i) * b(i)) * 0.5 + a(i) }"


def test_cancel_polling_keeps_single_loop_kernels_vectorised():
    """Polling once per element put an exit in the inner loop and LLVM stopped vectorising it
    (an elementwise chain ran 6.8x slower); the loop is strip-mined so that it polls per block."""
    import tensorlang as tl

    llvm = tl.compile(ELEMENTWISE, options=tl.Options(threads=1)).inspect("llvm", sizes={"N": 1 << 20})
    assert "x float>" in llvm  # vector arithmetic in the optimised module


@pytest.mark.parametrize("n", [1, 7, 65535, 65536, 65537, 2 * 65536 + 3])
@pytest.mark.parametrize("threads", [1, 3])
def test_strip_mined_single_loop_matches_numpy(monkeypatch, n, threads):
    """Block boundaries of the strip-mined loop (blocks of 65536), also with split iterations."""
    import numpy as np

    import codegen.runtime.parallel
    import tensorlang as tl

    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    rng = np.random.default_rng(n)
    a, b = (rng.uniform(-2, 2, n).astype(np.float32) for _ in range(2))
    got = tl.compile(ELEMENTWISE, options=tl.Options(threads=threads))(a, b)
    want = np.tanh(a * b) * np.float32(0.5) + a
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


SCAN = """def scan(float(N) A, float(N) Z) -> (B) {
  B(i) = Z(i)
  B(i) = B(i - 1) + A(i) where i in 1:N
}"""


@pytest.mark.parametrize("n", [7, 65536, 65537, 2 * 65536 + 3])
def test_serial_single_loop_is_strip_mined_and_polls(n):
    """A lone loop that threads cannot split (a scan) polls once per block of 65536 iterations
    inside the generated code: the blocks join up exactly, and a set cancel word stops it."""
    import ctypes

    import numpy as np

    import tensorlang as tl
    from codegen.lowering.abi import ERROR_CANCELLED

    k = tl.compile(SCAN, options=tl.Options(threads=1))
    a = np.random.default_rng(n).uniform(0, 1, n).astype(np.float32)
    z = np.zeros(n, np.float32)
    got = k(a, z)
    want = np.concatenate([[0.0], np.add.accumulate(a[1:], dtype=np.float32)]).astype(np.float32)
    np.testing.assert_array_equal(got, want)  # sequential float32 sums, bit for bit

    spec = k._specialisation({"N": n})
    from codegen.planning.plan import Split

    plan = k._plan({"N": n})
    serial = [d.index for d in plan.phases if d.split is Split.SERIAL]
    assert serial and not any(d.chunked for d in plan.phases if d.index in serial)
    arrays = {"A": a, "Z": z, "B": np.full(n, -1.0, np.float32)}
    pointers = (ctypes.c_void_p * len(spec.buffers))(*[arrays[t].ctypes.data for t in spec.buffers])
    error, cancel = np.zeros(4, np.int64), np.ones(1, np.int32)
    args = (ctypes.addressof(pointers), spec.params_address, error.ctypes.data)
    code = spec.code.entry(*args, serial[-1], -(2**63), 2**63 - 1, 0, cancel.ctypes.data)
    assert code == ERROR_CANCELLED
    assert (arrays["B"][1:] == -1.0).all()  # stopped before its first block


def test_chunked_phase_runs_in_chunks_and_stops_between_them():
    """A split loop with nothing nested does not poll in its code: the runtime runs it in chunks
    of about CHUNK_WORK instances and checks the cancel word between them."""
    from codegen.planning.plan import PhasePlan
    from codegen.runtime.parallel import CHUNK_WORK, piece_calls

    plan = PhasePlan(0, (0, 10 * CHUNK_WORK + 7, 1), 10 * CHUNK_WORK + 7, chunked=True)
    ranges = piece_calls(plan, 0, 10 * CHUNK_WORK + 7)
    assert len(ranges) == 11 and ranges[0][0] == 0 and ranges[-1][1] == 10 * CHUNK_WORK + 7
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no gap or overlap
    assert piece_calls(PhasePlan(0, (0, 100, 1), 100, chunked=True), 0, 100) == [(0, 100)]
    assert piece_calls(PhasePlan(0, (0, 100, 1), 1 << 40), 0, 100) == [(0, 100)]  # not chunked
