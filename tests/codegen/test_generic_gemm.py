"""Generic kernels (Options(specialize=False)) run contractions on the packed GEMM with run-time sizes.

One compiled kernel serves every size: each test compiles once and calls it at many awkward
sizes (1, 2, primes, odd, empty extents), comparing with NumPy (float64 references) and with the
specialised kernel. Every test first checks that the generic plan really calls the GEMM, so that
a silent fall-back to the loop path fails here instead of passing slowly.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import tensorlang as tl
from codegen.planning.plan import SMALL_GEMM_WORK as SMALL_WORK

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}\n"
MM64 = "def mm(double(M, K) A, double(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}\n"
# both operands transposed: A is K×M, B is N×K
MMT = "def mmt(float(K, M) A, float(N, K) B) -> (C) {\n  C(m, n) +=! A(k, m) * B(n, k)\n}\n"
BMM = "def bmm(float(Bt, M, K) A, float(Bt, K, N) B) -> (C) {\n  C(b, m, n) +=! A(b, m, k) * B(b, k, n)\n}\n"
MLP = (
    "def mlp(float(B, K) X, float(K, N) W, float(N) b) -> (O) {\n"
    "  O(i, j) +=! X(i, k) * W(k, j)\n  O(i, j) = fmax(O(i, j) + b(j), 0.0)\n}\n"
)
MM2 = (
    "def mm2(float(N, K) A, float(K, L) B, float(L, J) C, float(N, J) D, float alpha, float beta) -> (E) {\n"
    "  T(i, j) +=! A(i, k) * B(k, j)\n  E(i, j) +=! T(i, k) * C(k, j)\n"
    "  E(i, j) = alpha * E(i, j) + beta * D(i, j)\n}\n"
)
# accumulates into the caller's C (`+=` without `!`): no init, so nothing to fold
ACC = "def acc(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) += A(m, k) * B(k, n)\n}\n"

# (M, K, N): each extent tiny somewhere, primes, odd, around the register tile (16 × 14 or so)
SIZES = [
    (1, 1, 1), (1, 7, 13), (13, 1, 7), (7, 13, 1), (2, 3, 2), (3, 2, 17), (17, 31, 3), (31, 17, 64),
    (64, 64, 64), (100, 127, 31), (127, 100, 17), (13, 64, 100), (1, 127, 100), (100, 3, 127),
    (40, 41, 40), (41, 40, 40), (2, 1024, 32), (1, 4096, 17),
]  # fmt: skip
EMPTY = [(0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0)]


def test_sizes_cover_both_paths():
    """A generic call below SMALL_WORK multiply-adds runs plain loops, else the packed GEMM: the
    sizes the tests use take both, and the edge between them."""
    work = [m * k * n for m, k, n in SIZES]
    assert min(work) < SMALL_WORK <= max(work)
    assert sum(w >= SMALL_WORK for w in work) >= 4 and sum(w < SMALL_WORK for w in work) >= 4


def rng():
    return np.random.default_rng(12)


def generic(source: str, threads: int = 1, gemms: int = 1, **options) -> tl.Kernel:
    kernel = tl.compile(source, options=tl.Options(specialize=False, threads=threads, **options))
    assert_gemm(kernel, gemms)
    return kernel


def assert_gemm(kernel: tl.Kernel, count: int = 1) -> None:
    """The generic plan (no sizes) has `count` GEMM calls: the path did not fall back to loops."""
    plan = kernel.inspect("plan")
    assert "(symbolic)" in plan.splitlines()[0], plan
    assert plan.count(": GEMM m=") == count, plan


def close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    tol = (1e-5 if got.dtype == np.float32 else 1e-12) * max(1, k) * scale
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_one_kernel_every_size(threads):
    k = generic(MM, threads)
    r = rng()
    for M, K, N in SIZES + EMPTY:
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        close(k(A, B), A.astype(np.float64) @ B, K)
    assert k.compile_count == 1  # one generic object for every size


@pytest.mark.parametrize("threads", [1, 2])
def test_empty_k_zeroes_a_caller_buffer(threads):
    """K = 0: C = A·B is zero. The zeroing pass is folded into the GEMM, which stores C at its
    first K block; with no K block it must still zero C (a buffer full of NaN shows it)."""
    k = generic(MM, threads)
    assert "folded into the GEMM" in k.inspect("plan")
    for M, N in ((5, 7), (1, 1), (33, 65)):
        out = np.full((M, N), np.nan, np.float32)
        k(np.zeros((M, 0), np.float32), np.zeros((0, N), np.float32), out={"C": out})
        np.testing.assert_array_equal(out, np.zeros((M, N), np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_accumulating_contraction_adds_to_the_callers_buffer(threads):
    k = generic(ACC, threads)
    r = rng()
    for M, K, N in [(3, 5, 7), (17, 0, 13), (64, 31, 100), (1, 1, 1)]:
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        C0 = r.standard_normal((M, N), dtype=np.float32)
        out = C0.copy()
        k(A, B, out={"C": out})
        close(out, C0 + A.astype(np.float64) @ B, K + 1)


def test_small_extents_shared_by_a_team(monkeypatch):
    """Below SMALL_WORK a generic call runs plain loops; when the runtime still hands
    the phase to a team of threads, exactly one of them runs the loops (a `+=` applied twice
    would show), also for an accumulating contraction."""
    import codegen.runtime.parallel as parallel

    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 0)
    r = rng()
    for source in (MM, ACC):
        k = generic(source, 2)
        assert "threads share the gemm" in k.inspect("plan")
        for M, K, N in [(3, 5, 7), (15, 16, 17), (1, 1, 1), (4, 0, 4), (64, 64, 64)]:
            A = r.standard_normal((M, K), dtype=np.float32)
            B = r.standard_normal((K, N), dtype=np.float32)
            C0 = r.standard_normal((M, N), dtype=np.float32)
            out = C0.copy()
            k(A, B, out={"C": out})
            close(out, (C0 if source is ACC else 0) + A.astype(np.float64) @ B, K + 1)


def test_generic_matches_specialised():
    kg, ks = generic(MM), tl.compile(MM, options=tl.Options(threads=1))
    r = rng()
    for M, K, N in [(64, 64, 64), (100, 127, 31), (41, 40, 40), (13, 64, 100)]:
        assert M * K * N >= SMALL_WORK
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        # the same GEMM with the same blocking: the same sums in the same order
        np.testing.assert_array_equal(kg(A, B), ks(A, B))


def test_float64():
    k = generic(MM64, 2)
    r = rng()
    for M, K, N in SIZES[:8] + SIZES[8:10] + EMPTY[:2]:
        A, B = r.standard_normal((M, K)), r.standard_normal((K, N))
        close(k(A, B), A @ B, K)


@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_operands(threads):
    k = generic(MMT, threads)
    r = rng()
    for M, K, N in SIZES[::2] + EMPTY[1:2]:
        A = r.standard_normal((K, M), dtype=np.float32)
        B = r.standard_normal((N, K), dtype=np.float32)
        close(k(A, B), A.T.astype(np.float64) @ B.T, K)


def test_non_contiguous_inputs():
    k = generic(MM, 2)
    r = rng()
    for M, K, N in [(20, 31, 17), (40, 62, 40)]:  # plain loops, the GEMM
        A = r.standard_normal((2 * M, 2 * K), dtype=np.float32)[::2, 1::2]  # strided rows and columns
        B = np.asfortranarray(r.standard_normal((K, N), dtype=np.float32))
        close(k(A, B), A.astype(np.float64) @ B, K)
        close(k(A.T.copy().T, B.T.copy().T), A.astype(np.float64) @ B, K)


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_matmul(threads):
    k = generic(BMM, threads)
    r = rng()
    for Bt, (M, K, N) in [
        (1, (7, 13, 17)),
        (3, (1, 1, 1)),
        (5, (31, 2, 64)),
        (2, (100, 127, 3)),
        (0, (3, 4, 5)),
    ]:
        A = r.standard_normal((Bt, M, K), dtype=np.float32)
        B = r.standard_normal((Bt, K, N), dtype=np.float32)
        close(k(A, B), A.astype(np.float64) @ B, K)
    for Bt, (M, K, N) in [(3, (5, 0, 4)), (2, (0, 3, 4))]:
        out = np.full((Bt, M, N), np.nan, np.float32)
        k(np.ones((Bt, M, K), np.float32), np.ones((Bt, K, N), np.float32), out={"C": out})
        np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_layer(threads):
    k = generic(MLP, threads)
    r = rng()
    for B, K, N in [(1, 1, 1), (2, 3, 17), (13, 64, 7), (100, 31, 127), (64, 127, 100), (7, 0, 5)]:
        X = r.standard_normal((B, K), dtype=np.float32)
        W = r.standard_normal((K, N), dtype=np.float32)
        b = r.standard_normal(N, dtype=np.float32)
        close(k(X, W, b), np.maximum(X.astype(np.float64) @ W + b, 0), K)


@pytest.mark.parametrize("threads", [1, 2])
def test_two_matmuls(threads):
    k = generic(MM2, threads, gemms=2)
    r = rng()
    for N, K, L, J in [
        (1, 1, 1, 1),
        (7, 13, 17, 3),
        (31, 2, 64, 100),
        (64, 64, 64, 64),
        (5, 0, 3, 4),
        (4, 3, 0, 5),
    ]:
        A = r.standard_normal((N, K), dtype=np.float32)
        B = r.standard_normal((K, L), dtype=np.float32)
        C = r.standard_normal((L, J), dtype=np.float32)
        D = r.standard_normal((N, J), dtype=np.float32)
        alpha, beta = np.float32(1.5), np.float32(-0.5)
        want = 1.5 * (A.astype(np.float64) @ B @ C) - 0.5 * D
        close(k(A, B, C, D, alpha, beta), want, max(1, K) * max(1, L))


def test_convolution_on_the_gemm_path():
    """A convolution without direct convolution: one GEMM per window offset, K the channels."""
    src = (
        "def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
        "  O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n}\n"
    )
    k = generic(src, 2, direct_conv=False)
    assert "GEMM m=w n=f k=c" in k.inspect("plan")  # the channels, not a window offset, as K
    ref = tl.compile(src, options=tl.Options(optimize=False))
    r = rng()
    for shape, wshape in [
        ((1, 3, 7, 9), (5, 3, 3, 3)),
        ((2, 1, 5, 5), (1, 1, 1, 2)),
        ((1, 4, 3, 3), (2, 4, 3, 3)),
        ((1, 32, 4, 70), (32, 32, 3, 3)),  # 68 · 32 · 32 multiply-adds a call: the packed GEMM
    ]:
        inp = r.standard_normal(shape, dtype=np.float32)
        Wt = r.standard_normal(wshape, dtype=np.float32)
        close(k(inp, Wt), ref(inp, Wt), shape[1] * wshape[2] * wshape[3])


def test_constant_extents_pick_the_larger_candidate():
    """A range that is a constant of the source is known to the generic plan: a size symbol's
    extent counts as larger (M here, not the 2 rows of a constant block)."""
    src = "def blk(float(M, 2, K) A, float(K, N) B) -> (C) {\n  C(m, r, n) +=! A(m, r, k) * B(k, n)\n}\n"
    k = generic(src)
    assert "GEMM m=m n=n k=k" in k.inspect("plan")
    r = rng()
    A = r.standard_normal((9, 2, 5), dtype=np.float32)
    B = r.standard_normal((5, 4), dtype=np.float32)
    close(k(A, B), np.einsum("mrk,kn->mrn", A.astype(np.float64), B), 5)


def test_known_small_contraction_stays_on_loops():
    """Constant extents below MIN_CONTRACTION_WORK: the loop path, as in a specialised kernel."""
    src = "def small(float(2, 3) A, float(3, 4) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}\n"
    k = tl.compile(src, options=tl.Options(specialize=False))
    assert "GEMM" not in k.inspect("plan")
    A = np.arange(6, dtype=np.float32).reshape(2, 3)
    B = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(A, B), A @ B)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_large_sizes_many_blocks(threads):
    """Sizes past the cache blocks (several MC, NC and KC blocks, partial ones at each edge)."""
    k = generic(MM, threads)
    r = rng()
    for M, K, N in [(300, 517, 1031), (1031, 300, 257), (257, 1031, 300)]:
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        close(k(A, B), A.astype(np.float64) @ B, K)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_generic_export_calls_the_gemm(tmp_path):
    """An exported generic kernel carries its GEMM: only libc/libm left undefined, right at any size."""
    import ctypes

    from codegen.aot import export

    result = export(MM, path=tmp_path)
    listing = subprocess.run(["nm", "-u", str(result.object)], check=True, capture_output=True, text=True)
    undefined = {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}
    assert not any("gemm" in name for name in undefined), undefined
    if result.shared is None:
        pytest.skip("no linker for the shared library")
    fn = getattr(ctypes.CDLL(str(result.shared)), result.name)
    fn.restype = ctypes.c_int32
    r = rng()
    for M, K, N in [(7, 13, 17), (64, 64, 64), (3, 0, 5), (1, 100, 1)]:
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        C = np.full((M, N), np.nan, np.float32)
        pointers = [ctypes.c_void_p(x.ctypes.data) for x in (A, B, C)]
        assert fn(*pointers, *[ctypes.c_int64(s) for s in (M, K, N)]) == 0
        close(C, A.astype(np.float64) @ B, K)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_corpus_contractions_generic(threads):
    """Every case of the public TC corpus whose generic plan calls the GEMM matches its reference."""
    from test_corpus_e2e import CASES, run_cases_whose_plan_mentions

    if not CASES:
        pytest.skip("../shared/tc_corpus/public.json not found")
    ran = run_cases_whose_plan_mentions(tl.Options(specialize=False, threads=threads), "GEMM")
    assert ran >= 5  # the corpus has a dozen contractions


@pytest.mark.parametrize("threads", [1, 2])
def test_ranges_computed_from_sizes_at_run_time(threads):
    """Range bounds that are expressions of the sizes (K - 1, (M + 1) / 2), evaluated by the call."""
    shifted = generic(
        "def s(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k + 1, n)\n}\n", threads
    )
    strided = generic(
        "def s(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(2 * m, k) * B(k, n) where m in 0:(M + 1) / 2\n}\n",
        threads,
    )
    r = rng()
    for M, K, N in [(5, 1, 3), (6, 2, 3), (51, 70, 60), (128, 300, 64)]:
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        close(shifted(A, B), A[:, : K - 1].astype(np.float64) @ B[1:], K)
        close(strided(A, B), A[::2].astype(np.float64) @ B, K)


def test_blocking_variant_and_loops_text():
    """Options(gemm_blocking=...) reaches the generic GEMM calls; inspect("loops") shows them."""
    k = generic(MM, 2, gemm_blocking=(48, 256, 64))
    assert "gemm=float32@48x256x64" in k.inspect("plan")
    assert "gemm(m in 0:M, n in 0:N, k in 0:K)" in k.inspect("loops")
    r = rng()
    for M, K, N in [(100, 130, 300), (7, 200, 9), (49, 65, 257)]:  # several blocks, partial ones
        A = r.standard_normal((M, K), dtype=np.float32)
        B = r.standard_normal((K, N), dtype=np.float32)
        close(k(A, B), A.astype(np.float64) @ B, K)


@pytest.mark.parametrize("fusion", ["max", "none"])
@pytest.mark.parametrize("thread_split", [None, "serial"])
def test_option_combinations(fusion, thread_split):
    """Fusion strategies, tiles and the serial split around the generic GEMM calls (MLP, 2mm)."""
    options = dict(fusion=fusion, thread_split=thread_split, tile=8)
    mlp, mm2 = generic(MLP, 2, **options), generic(MM2, 2, gemms=2, **options)
    r = rng()
    for B, K, N in [(3, 5, 7), (64, 70, 33), (0, 3, 4), (5, 0, 3)]:
        X = r.standard_normal((B, K), dtype=np.float32)
        W = r.standard_normal((K, N), dtype=np.float32)
        b = r.standard_normal(N, dtype=np.float32)
        close(mlp(X, W, b), np.maximum(X.astype(np.float64) @ W + b, 0), K)
        C = r.standard_normal((N, 9), dtype=np.float32)
        D = r.standard_normal((B, 9), dtype=np.float32)
        want = 1.5 * (X.astype(np.float64) @ W @ C) + 0.5 * D
        close(mm2(X, W, C, D, np.float32(1.5), np.float32(0.5)), want, max(1, K) * max(1, N))
