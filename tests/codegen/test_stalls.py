"""Small GEMM teams that stalled rest on one thread for a while (runtime/stalls.py); results do not change."""

import numpy as np

import codegen.runtime.parallel as parallel
import codegen.runtime.stalls as stalls
import tensorlang as tl

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def test_a_call_far_slower_than_the_fastest_starts_a_rest(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(stalls.time, "perf_counter", lambda: now[0])
    teams = stalls.SmallTeams()
    work = 1 << 17  # 0.16 ms by the cost model
    teams.timed(work, 1e-4)
    teams.timed(work, 3.9e-4)  # below 4x the fastest: no stall
    assert not teams.resting()
    teams.timed(work, 5e-4)
    assert teams.resting()
    now[0] += stalls.REST_S * 1.01
    assert not teams.resting()


def test_a_first_call_is_recorded_then_calls_are_judged_by_the_cost_model_too():
    """The first call (cold) is not judged; a slow first call does not hide later stalls."""
    work = 1 << 17
    serial = work * stalls.SECONDS_PER_WORK
    teams = stalls.SmallTeams()
    teams.timed(work, 50 * serial)
    assert not teams.resting()
    teams.timed(work, 3 * serial)  # faster than the first, within 4x the serial estimate
    assert not teams.resting()
    teams.timed(work, 5 * serial)  # slower than 4x the serial estimate (the fastest: 3x)
    assert teams.resting()
    teams = stalls.SmallTeams()
    for _ in range(100):  # bounded memory
        teams.timed(work, 1e-4)
        work += 1
    assert len(teams._fastest) <= stalls._KEPT


def test_resting_small_teams_give_the_same_bits(monkeypatch):
    """A resting small GEMM team runs on the calling thread: bitwise one thread's result, also on
    odd sizes (211 is prime: 211³ is just above the team threshold)."""
    k1 = tl.compile(MM, options=tl.Options(threads=1))
    k2 = tl.compile(MM, options=tl.Options(threads=2))
    rng = np.random.default_rng(3)
    for m, kk, n in ((211, 211, 211), (256, 256, 256), (223, 257, 199)):
        A = rng.standard_normal((m, kk), dtype=np.float32)
        B = rng.standard_normal((kk, n), dtype=np.float32)
        want = k1(A, B)
        np.testing.assert_allclose(want, A @ B, rtol=1e-4, atol=1e-3)
        resting = stalls.SmallTeams()
        resting._rest_until = float("inf")
        for teams in (stalls.SmallTeams(), resting):
            monkeypatch.setattr(parallel, "_small_teams", teams)
            got = k2(A, B)
            assert np.array_equal(got, want)
        assert resting.resting() and not resting._fastest  # no team ran, nothing was timed
