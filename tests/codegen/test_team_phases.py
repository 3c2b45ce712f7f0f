"""Loop teams (issues 12 and 13): a phase whose outer loop is sequential with parallel loops inside
(a stencil's time loop) runs on every thread at once, with barriers in the generated code.

Small sizes run on one thread by design (parallel.MIN_PARALLEL_WORK, TEAM_STEP_WORK); the
`forced` fixture lowers those thresholds so that odd, prime and tiny sizes run as teams too.
Every result is compared with NumPy and with the one-thread kernel.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import JACOBI_2D_RECURRENCE as JACOBI_2D
from conftest import jacobi_2d_reference as jacobi_2d

import tensorlang as tl
from codegen.emit.gemm_team import TEAM_LOOP_BYTES, WHOLE_SPLIT, WHOLE_TEAM
from codegen.planning.plan import Split
from codegen.runtime import parallel
from scheduler import timetile

REPO = Path(__file__).resolve().parents[2]

JACOBI_1D = """
def heat(double(N) A) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? (B(t-1, i-1) + B(t-1, i) + B(t-1, i+1)) / 3.0 : B(t-1, i)
            where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}
"""

# two fields in one statement (the language's form of a recurrence over several arrays)
TWO_FIELDS = """
def two(double(N) A) -> (U) {
  B(t, f, i) = A(i) where t in 0:1, f in 0:2, i in 0:N
  B(t, f, i) = (f == 0) ? 0.5 * (B(t-1, 1, i) + B(t-1, 0, i)) : 0.25 * B(t-1, 0, i) + 0.75 * B(t-1, 1, i)
               where t in 1:T, f in 0:2, i in 0:N
  U(i) = B(T - 1, 0, i) - B(T - 1, 1, i) where i in 0:N
}
"""

# a scan along j inside each time step: only the i loop is parallel
SCAN_IN_STEP = """
def scan(double(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (j >= 1) ? 0.5 * B(t, i, j-1) + B(t-1, i, j) : B(t-1, i, j)
               where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}
"""


def heat_1d(a: np.ndarray, steps: int) -> np.ndarray:
    b = a.copy()
    for _ in range(1, steps):
        c = b.copy()
        c[1:-1] = (b[:-2] + b[1:-1] + b[2:]) / 3.0
        b = c
    return b


def two_fields(a: np.ndarray, steps: int) -> np.ndarray:
    p, q = a.copy(), a.copy()
    for _ in range(1, steps):
        p, q = 0.5 * (q + p), 0.25 * p + 0.75 * q
    return p - q


def scan_in_step(a: np.ndarray, steps: int) -> np.ndarray:
    b = a.copy()
    for _ in range(1, steps):
        c = b.copy()
        for j in range(1, b.shape[1]):
            c[:, j] = 0.5 * c[:, j - 1] + b[:, j]
        b = c
    return b


@pytest.fixture
def teams_taken(monkeypatch):
    """What ran on teams: "loop" for each loop-team phase dispatched alone, and for each
    whole-call team the modes of its phases (emit/gemm_team.py WHOLE_*)."""
    taken: list = []
    take, whole = parallel._teams.take, parallel._whole_call

    def counting(threads, nbytes=None):
        if nbytes == TEAM_LOOP_BYTES:
            taken.append("loop")
        return take(threads, nbytes)

    def recording(plans, threads):
        found = whole(plans, threads)
        if found is not None:
            (buf, address), _ = found
            start = address - buf.ctypes.data + TEAM_LOOP_BYTES
            table = buf[start:].view(np.int64)[: len(plans) * (2 + 2 * threads)]
            taken.append(tuple(int(m) for m in table[:: 2 + 2 * threads]))
        return found

    monkeypatch.setattr(parallel._teams, "take", counting)
    monkeypatch.setattr(parallel, "_whole_call", recording)
    return taken


def loop_team_ran(taken) -> bool:
    return any(t == "loop" or (isinstance(t, tuple) and WHOLE_TEAM in t) for t in taken)


@pytest.fixture
def forced(monkeypatch, teams_taken):
    """Teams for any work (the thresholds would keep these sizes on one thread)."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 1)
    monkeypatch.setattr(parallel, "TEAM_STEP_WORK", 1)
    return teams_taken


def phase_lines(kernel, sizes) -> list[str]:
    return [line for line in kernel.inspect("plan", sizes=sizes).splitlines() if line.startswith("// phase")]


def test_the_time_loop_is_a_team_phase():
    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    lines = phase_lines(k, {"N": 300, "M": 301, "T": 40})
    assert any("a team of threads runs the sequential loop" in line for line in lines), lines
    # the reference path stays untransformed
    ref = tl.compile(JACOBI_2D, options=tl.Options(optimize=False))
    assert not any("team" in line for line in phase_lines(ref, {"N": 300, "M": 301, "T": 9}))


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (1, 1, 4), (2, 3, 3), (3, 5, 2), (7, 11, 13), (37, 41, 7)]
    + [pytest.param((5, 97, 31), marks=pytest.mark.slow)],  # ~4 s a case
)
def test_jacobi_2d_matches_numpy_and_one_thread(forced, monkeypatch, whole, threads, shape):
    if not whole:  # one dispatch per phase (kernels with a GEMM phase, or a single phase)
        monkeypatch.setattr(parallel, "_whole_call", lambda plans, threads: None)
    n, m, steps = shape
    a = np.random.default_rng(n * m + steps).random((n, m), dtype=np.float32)
    one = tl.compile(JACOBI_2D, options=tl.Options(threads=1))(a, T=steps)
    got = tl.compile(JACOBI_2D, options=tl.Options(threads=threads))(a, T=steps)
    np.testing.assert_array_equal(got, one)  # each element computed as on one thread
    np.testing.assert_allclose(got, jacobi_2d(a, steps), rtol=1e-4, atol=1e-5)
    if steps > 2 and min(n, m) > 2:
        assert loop_team_ran(forced), "no loop team ran"


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", [(1, 2), (2, 5), (3, 3), (17, 19), (101, 7), (4, 64)])
def test_heat_1d_matches_numpy(forced, threads, shape):
    n, steps = shape
    a = np.random.default_rng(n).random(n)
    got = tl.compile(JACOBI_1D, options=tl.Options(threads=threads))(a, T=steps)
    np.testing.assert_allclose(got, heat_1d(a, steps), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", [(1, 3), (2, 2), (5, 7), (31, 11), (97, 23)])
def test_two_fields_in_the_time_loop(forced, threads, shape):
    n, steps = shape
    a = np.random.default_rng(n).random(n)
    got = tl.compile(TWO_FIELDS, options=tl.Options(threads=threads))(a, T=steps)
    np.testing.assert_allclose(got, two_fields(a, steps), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, tl.compile(TWO_FIELDS, options=tl.Options(optimize=False))(a, T=steps))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 3, 4), (7, 5, 3), (29, 13, 6)])
def test_scan_inside_the_time_loop(forced, threads, shape):
    n, m, steps = shape
    a = np.random.default_rng(n * m).random((n, m))
    got = tl.compile(SCAN_IN_STEP, options=tl.Options(threads=threads))(a, T=steps)
    np.testing.assert_allclose(got, scan_in_step(a, steps), rtol=1e-12, atol=1e-12)


MULTI = """
def multi(float(N, M) A, float(N) v) -> (O, S) {
  D(i, j) = A(i, j) * 2.0
  O(i, j) = D(i, j) + v(i)
  S(i) +=! O(i, j)
}
"""


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (7, 5), (97, 13), (5, 101)])
def test_a_whole_call_runs_every_phase_in_one_dispatch(forced, threads, shape):
    """No loop team: split phases (one that polls the cancel word itself, elementwise ones that
    run in chunks) and thread-0 phases, a barrier between them."""
    n, m = shape
    rng = np.random.default_rng(n * m)
    a, v = rng.random((n, m), dtype=np.float32), rng.random(n, dtype=np.float32)
    k = tl.compile(MULTI, options=tl.Options(threads=threads, fusion="none"))
    o, s = k(a, v)
    np.testing.assert_allclose(o, a * 2 + v[:, None], rtol=1e-6)
    np.testing.assert_allclose(s, (a * 2 + v[:, None]).sum(axis=1), rtol=1e-5)
    one = tl.compile(MULTI, options=tl.Options(threads=1, fusion="none"))(a, v)
    np.testing.assert_array_equal(o, one[0])
    np.testing.assert_array_equal(s, one[1])
    if n > 1:
        assert [t for t in forced if isinstance(t, tuple) and WHOLE_SPLIT in t], forced


def test_the_work_per_barrier_decides_without_forcing(teams_taken):
    """Default thresholds: a team runs exactly when the phase's work per barrier reaches
    TEAM_STEP_WORK (and its work MIN_PARALLEL_WORK)."""
    # (below PLANNED_SERIAL_WORK, so that the team is planned and the runtime decides)
    a = np.random.default_rng(1).random((127, 1031), dtype=np.float32)
    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    got = k(a, T=5)
    np.testing.assert_allclose(got, jacobi_2d(a, 5), rtol=1e-4, atol=1e-5)
    plans = [p for p in k._specialisation({"N": 127, "M": 1031, "T": 5}).plans if p.loop_team]
    assert plans
    want = any(
        p.work >= parallel.MIN_PARALLEL_WORK and p.work // p.barriers >= parallel.TEAM_STEP_WORK
        for p in plans
    )
    assert loop_team_ran(teams_taken) == want


def test_a_team_that_cannot_pay_is_planned_as_plain_loops(monkeypatch, cache_dir):
    """With parallelogram tiles and one time tile over every step (T <= 17 on 2 threads), a
    team's only parallel loops are each row's columns, a barrier every few hundred points: the
    runtime would run the phase on one thread, and the team's code there ran 1.6x slower than
    plain loops (jacobi-2d 1000² T=10). Such a phase of PLANNED_SERIAL_WORK or more is planned
    serial; smaller phases keep the team's code (the runtime decides per call, and tests lower
    its thresholds). (jacobi-2d gets diamond tiles on threads, whose wavefronts hold tiles along
    the rows at any T: its parallelograms are asked for here, as stencils that cannot have
    diamonds get them; cache_dir: no plan of the diamond schedule from another test.)"""
    monkeypatch.setattr(timetile, "DIAMOND_TILES", False)
    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    # parallelograms on threads: the copies stay phases of their own, split by rows
    assert len(k._plan({"N": 1000, "M": 1000, "T": 100}).phases) == 3
    for steps, team in ((5, False), (10, False), (17, True), (40, True), (100, True)):
        sizes = {"N": 1000, "M": 1000, "T": steps}
        splits = [d.split for d in k._plan(sizes).phases]
        assert (Split.LOOP_TEAM in splits) == team, (steps, splits)
        if not team:  # the copies in and out still split their loops
            assert Split.SERIAL in splits and Split.OUTER_LOOP in splits
    small = [d.split for d in k._plan({"N": 40, "M": 30, "T": 10}).phases]
    assert Split.LOOP_TEAM in small  # below PLANNED_SERIAL_WORK: left to the runtime
    a = np.random.default_rng(5).random((400, 700), dtype=np.float32)
    assert Split.LOOP_TEAM not in [d.split for d in k._plan({"N": 400, "M": 700, "T": 5}).phases]
    got = k(a, T=5)  # planned serial: the same result as one thread
    np.testing.assert_array_equal(got, tl.compile(JACOBI_2D, options=tl.Options(threads=1))(a, T=5))
    np.testing.assert_allclose(got, jacobi_2d(a, 5), rtol=1e-4, atol=1e-5)


def test_diamond_tiles_give_a_team_work_at_few_steps(cache_dir):
    """jacobi-2d on 2 threads with its diamond tiles: a team runs T = 5 and 10 too (1000², per
    round against one thread: 1.43 and 1.42, where the parallelograms' plain loops ran 1.10),
    and the copies in and out run in its tiles, one phase (scheduler/fusion.py)."""
    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    for steps in (5, 10, 17, 100):
        splits = [d.split for d in k._plan({"N": 1000, "M": 1000, "T": steps}).phases]
        assert splits == [Split.LOOP_TEAM], (steps, splits)
    a = np.random.default_rng(3).random((1000, 1000), dtype=np.float32)
    np.testing.assert_allclose(k(a, T=5), jacobi_2d(a, 5), rtol=1e-4, atol=1e-5)


def test_small_work_stays_on_one_thread(teams_taken):
    a = np.random.default_rng(2).random((40, 30), dtype=np.float32)
    for steps in (2, 50):
        got = tl.compile(JACOBI_2D, options=tl.Options(threads=2))(a, T=steps)
        np.testing.assert_allclose(got, jacobi_2d(a, steps), rtol=1e-4, atol=1e-5)
    assert teams_taken == []


@pytest.mark.parametrize("n, steps", [(5000, 300), (3000, 2000), (100_000, 4)])
def test_short_steps_stay_on_one_thread(teams_taken, n, steps):
    """Many short steps: a team only where each barrier has TEAM_STEP_WORK behind it."""
    b = np.random.default_rng(3).random(n)
    k = tl.compile(JACOBI_1D, options=tl.Options(threads=2))
    np.testing.assert_allclose(k(b, T=steps), heat_1d(b, steps))
    plans = k._specialisation({"N": n, "T": steps}).plans
    want = any(p.loop_team and p.work // p.barriers >= parallel.TEAM_STEP_WORK for p in plans)
    assert loop_team_ran(teams_taken) == want
    for p in plans:
        if p.loop_team:  # the estimate is never below the outer loop's trips
            assert p.barriers >= 1


def test_a_busy_team_pool_runs_the_phase_on_one_thread(forced):
    """Another Python thread's team holds the team pool: this call runs alone, correctly."""
    a = np.random.default_rng(4).random((23, 29), dtype=np.float32)
    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    assert parallel._team_busy.acquire(blocking=False)
    try:
        got = k(a, T=6)
    finally:
        parallel._team_busy.release()
    np.testing.assert_allclose(got, jacobi_2d(a, 6), rtol=1e-4, atol=1e-5)
    assert forced == []


@pytest.mark.slow  # ~7 s
def test_several_python_threads_call_team_kernels_at_once(forced):
    from concurrent.futures import ThreadPoolExecutor

    k = tl.compile(JACOBI_2D, options=tl.Options(threads=2))
    inputs = [np.random.default_rng(s).random((19 + s, 23), dtype=np.float32) for s in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda a: k(a, T=9), inputs))
    for a, got in zip(inputs, results):
        np.testing.assert_allclose(got, jacobi_2d(a, 9), rtol=1e-4, atol=1e-5)


def _forked_child(queue) -> None:
    parallel.MIN_PARALLEL_WORK = parallel.TEAM_STEP_WORK = 1
    a = np.arange(15 * 17, dtype=np.float32).reshape(15, 17) / 100
    got = tl.compile(JACOBI_2D, options=tl.Options(threads=2))(a, T=7)
    queue.put(float(np.abs(got - jacobi_2d(a, 7)).max()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_team_kernels_work_in_a_forked_child(forced):
    a = np.random.default_rng(5).random((15, 17), dtype=np.float32)
    tl.compile(JACOBI_2D, options=tl.Options(threads=2))(a, T=7)  # the parent's team pool exists
    assert loop_team_ran(forced)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(queue,))
    child.start()
    error = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert error < 1e-4


GATHER = """
def g(double(N) A, int64(N) I) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = B(t-1, i) + A(I(i)) where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}
"""


@pytest.mark.parametrize("threads", [2, 3])
def test_an_error_in_one_thread_stops_the_team(forced, threads):
    """A failed bounds check leaves one thread early: the others must not wait for it."""
    a = np.random.default_rng(6).random(101)
    index = np.arange(101, dtype=np.int64)[::-1].copy()
    k = tl.compile(GATHER, options=tl.Options(threads=threads))
    np.testing.assert_allclose(k(a, index, T=9), a + 8 * a[index])
    index[90] = 101  # read by the last thread's share
    with pytest.raises(tl.ArgumentError):
        k(a, index, T=9)
    index[90] = 0
    np.testing.assert_allclose(k(a, index, T=9), a + 8 * a[index])
    assert not parallel._team_busy.locked()


CHILD = textwrap.dedent(
    """
    import json, os, signal, threading, time
    import numpy as np
    import tensorlang as tl
    from codegen.runtime import parallel

    # a time loop of many sin() per point: seconds on two threads
    src = '''
    def f(float(N) A) -> (O) {
      B(t, i) = A(i) where t in 0:1, i in 0:N
      B(t, i) = sin(sin(sin(sin(B(t-1, i))))) + 0.5 * B(t-1, (i + 1) % N) where t in 1:T, i in 0:N
      O(i) = B(T - 1, i) where i in 0:N
    }
    '''
    taken = []
    take = parallel._teams.take
    parallel._teams.take = lambda threads, nbytes=None: (taken.append(nbytes), take(threads, nbytes))[1]
    k = tl.compile(src, options=tl.Options(threads=2))
    n = 1 << 16
    big = np.random.default_rng(0).random(n, dtype=np.float32)
    k._specialisation({"N": n, "T": 20000})

    def interrupt():
        signalled.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    signalled = []
    timer = threading.Timer(0.5, interrupt)
    result = {"interrupted": False}
    timer.start()
    start = time.perf_counter()
    try:
        k(big, T=20000)
    except KeyboardInterrupt:
        result["interrupted"] = True
    stopped = time.perf_counter()
    timer.join()
    sentinels = [np.full(n * 20000 // 8, 7.0, dtype=np.float32) for _ in range(8)]
    time.sleep(1.0)
    result["sentinels_intact"] = all(bool((s == 7.0).all()) for s in sentinels)
    result["stop_latency_s"] = stopped - signalled[0] if signalled else None
    result["team_ran"] = any(n is not None for n in taken)
    result["pool_free"] = not parallel._team_busy.locked()
    small = np.random.default_rng(1).random(70001, dtype=np.float32)
    want = small.astype(np.float32)
    for _ in range(1, 3):
        want = np.sin(np.sin(np.sin(np.sin(want)))) + np.float32(0.5) * np.roll(want, -1)
    result["correct_after"] = bool(np.allclose(k(small, T=3), want, rtol=1e-4, atol=1e-5))
    print(json.dumps(result))
    """
)


@pytest.mark.slow  # a child process compiles and runs a kernel for seconds (~19 s here)
def test_interrupting_a_team_phase_stops_every_thread(tmp_path):
    script = tmp_path / "team_child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env, cwd=REPO
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["interrupted"], result
    assert result["team_ran"], result
    assert result["stop_latency_s"] < 2.0, result
    assert result["sentinels_intact"], result
    assert result["pool_free"], result
    assert result["correct_after"], result
