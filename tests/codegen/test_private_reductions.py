"""Reductions privatised per chunk (polyhedral/privatise.py, planning/private.py,
lowering/private_team.py): a loop that carries only reductions into one tensor runs on a team
of threads, each chunk reducing into its own copy, the copies combined in chunk order. Fusion
that pays on one thread (atax) is kept on several. Differential tests on odd, prime and tiny
sizes against NumPy in float64 and against one thread, on 2, 3 and 7 threads."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from codegen.runtime import parallel
from polyhedral.privatise import private_reductions
from polyhedral.scop import build_scop
from tensorlang.frontend import check_source

ATAX = "def atax(float(M, N) A, float(N) x) -> (y) {\n  t(i) +=! A(i, j) * x(j)\n  y(j) +=! A(i, j) * t(i)\n}"
# y is read again in the same loop: its partial sums would be seen, so it cannot be privatised
READ_BACK = """def rb(float(M, N) A) -> (y, z) {
  y(j) +=! A(i, j)
  z(i, j) = y(j) * A(i, j)
}"""
COLMAX = (
    "def cm(float(M, N) A, float(N) x) -> (y) {\n  t(i) +=! A(i, j) * x(j)\n  y(j) max=! A(i, j) * t(i)\n}"
)
INT_SUM = (
    "def isum(int32(M, N) A, int32(N) x) -> (y) {\n  t(i) +=! A(i, j) * x(j)\n  y(j) +=! A(i, j) + t(i)\n}"
)
# a += with no `!` onto the caller's out= buffer: the copies are added to what it holds
ACCUMULATE = (
    "def acc(float(M, N) A, float(N) x) -> (y) {\n  t(i) +=! A(i, j) * x(j)\n  y(j) += A(i, j) * t(i)\n}"
)


def _private(src: str) -> dict[str, str]:
    scop = build_scop(check_source(src))
    return private_reductions(scop, [s.name for s in scop.statements])


def test_which_reduction_targets_may_be_privatised():
    assert _private(ATAX) == {"y": "+"}  # t is read by y's statement
    assert _private(COLMAX) == {"y": "max"}
    assert _private(READ_BACK) == {}
    mixed = "def mx(float(M, N) A) -> (y) {\n  y(j) +=! A(i, j)\n  y(j) max= A(i, j)\n}"
    assert _private(mixed) == {}  # two operators: no one identity to start a copy at
    plain = "def pl(float(M, N) A) -> (y) {\n  y(j) +=! A(i, j)\n  y(j) = y(j) * 2.0\n}"
    assert _private(plain) == {}


def _plan(src: str, threads: int, sizes: dict[str, int]) -> str:
    return tl.compile(src, options=tl.Options(threads=threads)).inspect("plan", sizes=sizes)


def test_atax_stays_fused_on_threads_with_a_private_y():
    sizes = {"M": 4000, "N": 4000}
    one, two = _plan(ATAX, 1, sizes), _plan(ATAX, 2, sizes)
    assert "region 0: S0 S1" in tl.compile(ATAX, options=tl.Options(threads=2)).inspect("graph")
    phases = [line for line in two.splitlines() if line.startswith("// phase")]
    assert len(phases) == 1 and "its own copy of y (+, 16000 bytes)" in phases[0], two
    assert "combined in chunk order" in phases[0]
    # the same loops as on one thread; one thread has no team
    assert one.split("// region 0", 1)[1] == two.split("// region 0", 1)[1]
    assert "copy" not in one
    # too little work per copied element: no copies (the loop runs on one thread)
    assert "copy" not in _plan(ATAX, 2, {"M": 16, "N": 4000})


def test_a_tensor_read_back_in_the_loop_is_not_privatised():
    plan = _plan(READ_BACK, 2, {"M": 2000, "N": 2000})
    assert "copy" not in plan


@pytest.fixture
def forced(monkeypatch):
    """Teams for any work: the thresholds would keep small sizes on one thread."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 1)
    monkeypatch.setattr(parallel, "TEAM_STEP_WORK", 1)
    taken: list[int] = []
    take = parallel._teams.take

    def recording(threads, nbytes=None):
        taken.append(nbytes or 0)
        return take(threads, nbytes)

    monkeypatch.setattr(parallel._teams, "take", recording)
    return taken


def _reference(src: str, args: list[np.ndarray]) -> np.ndarray:
    A, x = (a.astype(np.float64) for a in args[:2])
    if src is ATAX:
        return A.T @ (A @ x)
    if src is COLMAX:
        return (A * (A @ x)[:, None]).max(axis=0)
    if src is INT_SUM:
        return (A + (A @ x)[:, None]).sum(axis=0)
    raise AssertionError(src)


SIZES = [(1, 1), (2, 3), (7, 5), (64, 1), (97, 13), (131, 257), (1009, 17)]


@pytest.mark.parametrize("src", [ATAX, COLMAX, INT_SUM], ids=["atax", "colmax", "int"])
def test_privatised_reductions_match_numpy_and_one_thread(src, forced):
    rng = np.random.default_rng(11)
    one = tl.compile(src, options=tl.Options(threads=1))
    teams = {t: tl.compile(src, options=tl.Options(threads=t)) for t in (2, 3, 7)}
    privatised = 0
    for m, n in SIZES:
        if src is INT_SUM:
            args = [
                rng.integers(-9, 9, size=(m, n), dtype=np.int32),
                rng.integers(-9, 9, size=n, dtype=np.int32),
            ]
        else:
            args = [
                rng.uniform(-1, 1, size=(m, n)).astype(np.float32),
                rng.uniform(-1, 1, size=n).astype(np.float32),
            ]
        want = _reference(src, args)
        base = one(*args)
        for t, k in teams.items():
            before = len(forced)
            got = k(*args)
            privatised += any(nbytes > parallel.TEAM_LOOP_BYTES for nbytes in forced[before:])
            if src is INT_SUM:  # integer sums regroup exactly
                np.testing.assert_array_equal(got, want.astype(np.int32), err_msg=f"{t} threads, {m}x{n}")
                np.testing.assert_array_equal(got, base)
            else:
                tol = 1e-4 * np.sqrt(m)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=tol, err_msg=f"{t} threads, {m}x{n}")
                np.testing.assert_allclose(got, base, rtol=1e-4, atol=tol)
            # the copies are combined in chunk order: the same bits on every call
            np.testing.assert_array_equal(k(*args), got)
    assert privatised >= 6  # the larger sizes really ran on copies


@pytest.mark.filterwarnings("ignore:Reduction without initialization")
def test_a_reduction_without_bang_adds_the_copies_to_the_out_buffer(forced):
    rng = np.random.default_rng(12)
    k = tl.compile(ACCUMULATE, options=tl.Options(threads=2))
    A = rng.uniform(-1, 1, size=(301, 37)).astype(np.float32)
    x = rng.uniform(-1, 1, size=37).astype(np.float32)
    start = rng.uniform(-1, 1, size=37).astype(np.float32)
    out = start.copy()
    k(A, x, out=out)
    want = start + A.T.astype(np.float64) @ (A.astype(np.float64) @ x)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    assert any(nbytes > parallel.TEAM_LOOP_BYTES for nbytes in forced)


def test_a_team_left_alone_reduces_in_place_as_one_thread_does():
    """Below the thresholds the runtime runs the team's phase on one thread: the chunks then
    reduce into y itself, in order, and give the sequential loop's bits."""
    rng = np.random.default_rng(13)
    A = rng.uniform(-1, 1, size=(131, 257)).astype(np.float32)
    x = rng.uniform(-1, 1, size=257).astype(np.float32)
    two = tl.compile(ATAX, options=tl.Options(threads=2))
    assert "copy of y" in two.inspect("plan", sizes={"M": 131, "N": 257})
    np.testing.assert_array_equal(two(A, x), tl.compile(ATAX, options=tl.Options(threads=1))(A, x))


TOTAL = "def total(float(N) a) -> (s) { s +=! a(i) }"


def test_a_scalar_sum_splits_its_loop_and_is_the_same_on_every_call(forced):
    """The whole loop carries only s's sum: chunks keep their copy on the stack (a register after
    LLVM's promotion) and the team adds the copies."""
    assert "its own copy of s (+, 4 bytes)" in _plan(TOTAL, 2, {"N": 100_000})
    rng = np.random.default_rng(14)
    for n in (1, 2, 1031, 100_003):
        a = rng.uniform(-1, 1, size=n).astype(np.float32)
        want = a.astype(np.float64).sum()
        for t in (2, 3, 7):
            k = tl.compile(TOTAL, options=tl.Options(threads=t))
            got = k(a)
            np.testing.assert_allclose(
                got, want, rtol=1e-5, atol=1e-5 * np.sqrt(n), err_msg=f"{t} threads, {n}"
            )
            np.testing.assert_array_equal(k(a), got)
    assert any(nbytes > parallel.TEAM_LOOP_BYTES for nbytes in forced)


def test_copies_too_large_for_the_stack_are_reduced_in_the_shared_block(forced):
    """17011 floats (68 KB) a copy: over PRIVATE_STACK_BYTES, each chunk reduces into its slot of
    the team's block directly."""
    from codegen.lowering.private_team import PRIVATE_STACK_BYTES

    m, n = 301, 17011
    assert n * 4 > PRIVATE_STACK_BYTES
    assert f"its own copy of y (+, {n * 4} bytes)" in _plan(ATAX, 3, {"M": m, "N": n})
    rng = np.random.default_rng(15)
    A = rng.uniform(-1, 1, size=(m, n)).astype(np.float32)
    x = rng.uniform(-1, 1, size=n).astype(np.float32)
    want = A.T.astype(np.float64) @ (A.astype(np.float64) @ x)
    k = tl.compile(ATAX, options=tl.Options(threads=3))
    got = k(A, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)
    np.testing.assert_array_equal(k(A, x), got)


def test_the_cuda_target_has_no_private_copies_so_atax_stays_unfused():
    """A fused atax would leave the GPU one thread (its row loop carries y's sum, and the
    target keeps no copies per thread): fusion does not count privatisation there."""
    k = tl.compile(ATAX, target="cuda", options=tl.Options(threads=2))
    assert "region 1: S1" in k.inspect("graph")
    assert "copy" not in k.inspect("plan", sizes={"M": 4000, "N": 4000})
