"""GEMMs on several threads: a team of threads packs one panel of B together and takes blocks of
C's rows from a shared counter (codegen/emit/gemm_kernel.py), and a GEMM's zeroing phase is folded
into it (the first K block stores C). Results must be bitwise those of one thread, and close to
the untransformed program, on awkward sizes, with 1, 2 and 3 threads."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import codegen.runtime.parallel
import tensorlang as tl
from codegen.emit.gemm_team import TEAM_DONE, TEAM_SIZE, TEAM_TICKET, gemm_team_bytes
from codegen.host.blocking import workspace_bytes
from codegen.lowering.gemm_jit import compile_gemm

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
DMM = "def dmm(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
MLP = """def mlp(float(M, K) X, float(K, N) W, float(N) b) -> (O) {
  O(i, j) +=! X(i, k) * W(k, j)
  O(i, j) = fmax(O(i, j) + b(j), 0.0)
}"""
MM2 = """def mm2(float(M, K) A, float(K, N) B, float(N, P) C) -> (E) {
  T(i, j) +=! A(i, k) * B(k, j)
  E(i, j) +=! T(i, k) * C(k, j)
}"""
GEMM_THEN_EW = """def ge(float(M, K) A, float(K, N) B) -> (C, D) {
  C(m, n) +=! A(m, k) * B(k, n)
  D(m, n) = tanh(C(m, n)) * 2.0
}"""
BMM = "def bmm(float(Bt, M, K) A, float(Bt, K, N) B) -> (C) { C(b, m, n) +=! A(b, m, k) * B(b, k, n) }"

# (M, K, N): one element, primes, smaller than a micro-tile, and larger than one K block and one
# N panel of the host blocking (several tasks of each stage)
SIZES = [(1, 1, 1), (7, 3, 5), (13, 1, 300), (61, 257, 67), (301, 129, 257), (130, 600, 1030)]


def _inputs(src: str, m: int, k: int, n: int, rng) -> list[np.ndarray]:
    def f(*shape):
        dtype = np.float64 if src is DMM else np.float32
        return rng.uniform(-1, 1, size=shape).astype(dtype)

    if src is MLP:
        return [f(m, k), f(k, n), f(n)]
    if src is MM2:
        return [f(m, k), f(k, n), f(n, 11)]
    if src is BMM:
        return [f(3, m, k), f(3, k, n)]
    return [f(m, k), f(k, n)]


@pytest.mark.parametrize(
    "src", [MM, DMM, MLP, MM2, GEMM_THEN_EW, BMM], ids=["mm", "dmm", "mlp", "2mm", "ew", "bmm"]
)
def test_threads_give_bitwise_equal_results_and_match_the_reference(src, monkeypatch):
    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)  # split even tiny GEMMs
    rng = np.random.default_rng(3)
    kernels = {t: tl.compile(src, options=tl.Options(threads=t)) for t in (1, 2, 3)}
    reference = tl.compile(src, options=tl.Options(optimize=False))
    for m, k, n in SIZES if src is not BMM else SIZES[:4]:
        args = _inputs(src, m, k, n, rng)
        want = reference(*args)
        got = {t: _outputs(kern(*args)) for t, kern in kernels.items()}
        for t in (2, 3):
            for x, y in zip(got[1], got[t]):
                np.testing.assert_array_equal(y, x, err_msg=f"{m}x{k}x{n}, {t} threads")
        for x, y in zip(got[1], _outputs(want)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4 * max(1, k), err_msg=f"{m}x{k}x{n}")


def _outputs(result) -> tuple[np.ndarray, ...]:
    return result if isinstance(result, tuple) else (result,)


def test_zeroing_is_folded_only_where_the_gemm_writes_every_cell_once():
    plan = tl.compile(MLP).inspect("plan", sizes={"M": 64, "K": 48, "N": 80})
    assert "phase 0: I0; folded into the GEMM of phase 1" in plan
    assert "the GEMM stores C (no zeroing pass)" in plan
    # K = 0: no GEMM call runs, so the zeroing phase stays
    empty = tl.compile(MM).inspect("plan", sizes={"M": 5, "K": 0, "N": 7})
    assert "folded" not in empty
    # a convolution sums kh and kw in loops around the GEMM: each call adds to the same C
    conv_src = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
    conv = tl.compile(conv_src, options=tl.Options(direct_conv=False))  # the GEMM path
    sizes = {"N": 1, "C": 8, "H": 10, "W": 10, "F": 16, "KH": 3, "KW": 3}
    text = conv.inspect("plan", sizes=sizes)
    if "GEMM" in text:
        assert "folded" not in text
    image = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype(np.float32)
    Wt = np.random.default_rng(2).standard_normal((16, 8, 3, 3)).astype(np.float32)
    want = tl.compile(conv_src, options=tl.Options(optimize=False))(image, Wt)
    np.testing.assert_allclose(conv(image, Wt), want, rtol=1e-4, atol=1e-4)


def test_empty_reduction_gives_zeros():
    k = tl.compile(MM, options=tl.Options(threads=2))
    out = k(np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32))
    np.testing.assert_array_equal(out, np.zeros((5, 7), np.float32))


# ---------------------------------------------------------------------------------------------
# The GEMM body called directly: teams of Python threads (ctypes releases the GIL)

_SIG = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 3
                               + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]))  # fmt: skip


class _Gemm:
    def __init__(self, dtype: str):
        self.dtype = dtype
        self.compiled = compile_gemm(dtype)
        self.fn = _SIG(self.compiled.cancellable)
        self.cancel = np.zeros(1, np.int32)
        self._keep = []

    def _aligned(self, nbytes: int) -> int:
        buf = np.zeros(nbytes + 64, np.uint8)
        self._keep.append(buf)
        return (buf.ctypes.data + 63) // 64 * 64

    def team(self, size: int) -> int:
        address = self._aligned(gemm_team_bytes())
        ctypes.c_int64.from_address(address + TEAM_SIZE).value = size
        return address

    def args(self, A, B, C, ow: int, team: int | None):
        it = A.itemsize
        return (
            A.shape[0], B.shape[1], A.shape[1],
            A.ctypes.data, A.strides[0] // it, A.strides[1] // it,
            B.ctypes.data, B.strides[0] // it, B.strides[1] // it,
            C.ctypes.data, C.strides[0] // it, C.strides[1] // it,
            self._aligned(workspace_bytes(self.dtype)), self.cancel.ctypes.data, ow, team,
        )  # fmt: skip

    def run(self, A, B, C, ow: int = 0, threads: int = 0, late: float = 0.0):
        """threads=0: alone; else a team of `threads`, the last one starting `late` seconds later."""
        if not threads:
            self.fn(*self.args(A, B, C, ow, None))
            return C
        team = self.team(threads)

        def member(i):
            if i == threads - 1 and late:
                time.sleep(late)
            self.fn(*self.args(A, B, C, ow, team))

        members = [threading.Thread(target=member, args=(i,)) for i in range(threads)]
        for t in members:
            t.start()
        for t in members:
            t.join(30)
            assert not t.is_alive(), "a team member did not finish"
        return C


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_team_gemm_is_bitwise_the_serial_gemm(dtype):
    g = _Gemm(dtype)
    rng = np.random.default_rng(0)
    for m, k, n in [(1, 1, 1), (7, 3, 5), (301, 257, 129), (64, 530, 1030), (5, 5, 0), (0, 4, 4)]:
        A, B = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        for order in "CF":  # a column-major C runs as Cᵀ = Bᵀ·Aᵀ
            C0 = np.asarray(rng.standard_normal((m, n)).astype(dtype), order=order)
            for ow in (0, 1):
                alone = g.run(A, B, C0.copy(order=order), ow)
                for threads in (1, 2, 3):
                    team = g.run(A, B, C0.copy(order=order), ow, threads)
                    np.testing.assert_array_equal(
                        team, alone, err_msg=f"{m}x{k}x{n} {order} ow={ow} {threads}"
                    )
            # storing the first K block is bitwise zeroing and then adding (also -0.0 → +0.0)
            stored = g.run(A, B, C0.copy(order=order), 1)
            added = g.run(A, B, np.zeros_like(C0, order=order), 0)
            assert np.array_equal(stored, added) and (np.signbit(stored) == np.signbit(added)).all()


def test_a_team_member_that_starts_late_or_never_delays_nothing():
    g = _Gemm("float32")
    rng = np.random.default_rng(1)
    A, B = (
        rng.standard_normal((300, 600)).astype(np.float32),
        rng.standard_normal((600, 700)).astype(np.float32),
    )
    want = g.run(A, B, np.zeros((300, 700), np.float32), 1)
    # a team of 2 of which only one thread ever calls: it does every task itself
    lone = g.team(2)
    C = np.zeros((300, 700), np.float32)
    g.fn(*g.args(A, B, C, 1, lone))
    np.testing.assert_array_equal(C, want)
    # the second member joins when the first is far along (or done)
    np.testing.assert_array_equal(
        g.run(A, B, np.zeros((300, 700), np.float32), 1, threads=2, late=0.02), want
    )


def test_a_cancelled_team_stops_without_waiting_for_each_other():
    g = _Gemm("float32")
    rng = np.random.default_rng(2)
    n = 1500
    A, B = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    C = np.zeros((n, n), np.float32)
    team = g.team(3)  # three members expected, two come: they must still stop
    members = [threading.Thread(target=g.fn, args=g.args(A, B, C, 1, team)) for _ in range(2)]
    for t in members:
        t.start()
    time.sleep(0.005)
    g.cancel[0] = 1
    for t in members:
        t.join(10)
        assert not t.is_alive(), "a cancelled team member kept running"
    done = ctypes.c_int64.from_address(team + TEAM_DONE).value
    taken = ctypes.c_int64.from_address(team + TEAM_TICKET).value
    assert done <= taken
