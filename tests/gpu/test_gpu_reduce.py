"""target="cuda": rows spread over a block or a warp (gpu/rows.py, gpu/rowlower.py) — the plan text,
the CPU emulation of the step structure (every operation for every thread of a block in turn)
against NumPy at awkward row lengths and counts, exact integer and max reductions, run-time
errors inside a shared row, the fallbacks, and ptxas on the PTX for sm_80 and sm_90."""

from __future__ import annotations

import ctypes
import re
import subprocess
import warnings

import llvmlite.binding as llvm
import numpy as np
import pytest
from conftest import load_corpus

import tensorlang as tl
from codegen.gpu.lower import lower_for_emulation
from codegen.gpu.ptx import ptxas_path
from codegen.lowering.abi import kernel_layout
from polyhedral.sizes import compile_size_expr

SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N, D) X) -> (Y) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    Y(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""
ROWSUM = "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }"
ROWMAX = "def rowmax(float(N, D) X) -> (M) { M(n) max=! X(n, d) }"
TWO = "def two(float(N, D) X) -> (S, Q) {\n  S(n) +=! X(n, d)\n  Q(n) +=! X(n, d) * X(n, d)\n}"
LENGTHS = [1, 3, 31, 32, 33, 100, 1000, 4097]
ROWS = [1, 3, 9]


def retype(src: str, dtype: str) -> str:
    return src.replace("float(", f"{dtype}(")


def emulate(
    src: str, sizes: dict, inputs: dict, entry: str | None = None, fill: int = 7
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The outputs of the grid's CPU emulation, and the error record [code, check, dim, value].
    Outputs and temporaries start as `fill`: the kernel must initialise what it reads."""
    kernel = tl.compile(src, entry, target="cuda")
    plan, mapping = kernel.plan(sizes)
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ref = llvm.parse_assembly(str(lower_for_emulation(plan, mapping)))
    ref.verify()
    engine = llvm.create_mcjit_compiler(ref, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    arrays = {}
    for t in plan.program.tensors:
        shape = tuple(compile_size_expr(d)(sizes) for d in t.shape)
        given = inputs.get(t.name)
        dtype = np.dtype(t.dtype.numpy_name)
        arrays[t.name] = np.ascontiguousarray(given) if given is not None else np.full(shape, fill, dtype)
    error = np.zeros(4, np.int64)
    args = [arrays[n].ctypes.data for n in kernel_layout(plan.scop).tensors] + [error.ctypes.data]
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(args))
    for grid in mapping.phases:
        proto(engine.get_function_address(f"tl_emulate_phase{grid.index}"))(*args)
    del engine
    return {t.name: arrays[t.name] for t in plan.program.outputs}, error


def plan_line(src: str, sizes: dict, phase: int = -1) -> str:
    text = tl.compile(src, target="cuda").inspect("plan", sizes=sizes)
    return [line for line in text.splitlines() if line.startswith("// cuda phase")][phase]


def rand(shape, dtype, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


def tolerance(dtype) -> float:
    return 2e-5 if dtype == np.float32 else 1e-12


# ---------------------------------------------------------------------------- the plan


def test_plan_block_per_long_row() -> None:
    line = plan_line(SOFTMAX, {"N": 32768, "D": 4096})
    assert "one block of 512 threads per row, grid 32768 x 512 (rows of 4096 iterations" in line
    assert "S0 reduced by warp shuffles + shared memory across warps" in line
    assert line.count("] barrier [") == 3 and "[first thread: I0, I2]" in line
    assert "[c1 strided over the row's threads: S3]" in line


def test_plan_block_size_follows_row_length() -> None:
    assert "one block of 64 threads per row" in plan_line(ROWSUM, {"N": 5, "D": 129})
    assert "one block of 128 threads per row" in plan_line(ROWSUM, {"N": 5, "D": 1000})
    assert "one block of 512 threads per row" in plan_line(ROWSUM, {"N": 5, "D": 100000})


def test_plan_warp_per_short_row_and_thread_per_tiny_row() -> None:
    line = plan_line(LAYERNORM, {"N": 100, "D": 64})
    assert "one warp per row (8 rows per block), grid 13 x 256 (rows of 64 <= 128 iterations)" in line
    assert "warp barrier" in line and "across warps" not in line
    line = plan_line(ROWSUM, {"N": 100, "D": 3})
    assert "one thread per c0[100]" in line and "no block per row: rows of 3 < 16 iterations" in line


def test_plan_fallbacks_say_why() -> None:
    bmm = "def bmm(float(B,M,K) A, float(B,K,N) W) -> (C) { C(b,m,n) +=! A(b,m,k) * W(b,k,n) }"
    line = plan_line(bmm, {"B": 2, "M": 64, "K": 64, "N": 64})
    assert "no block per row: the loop c2 inside the row contains loops" in line
    # gathered rows: the reduction walks T across rows, the mapped loop n along them
    gather = "def g(float(V, N) T, int32(D) I) -> (O) { O(n) +=! T(I(d), n) }"
    line = plan_line(gather, {"V": 50, "N": 300, "D": 200})
    assert "one thread per c0[300]" in line and "no loop inside the row walks a stride-1 dimension" in line


def test_plan_row_local_temporaries_in_shared_memory() -> None:
    line = plan_line(SOFTMAX, {"N": 32768, "D": 4096})
    assert "; e lives in shared memory (4096 elements per row, never in global memory)" in line
    assert line.endswith(
        "; I's row read once from global memory (step 2) and kept in shared memory for the later steps"
    )
    assert "c lives in shared memory (64 elements per row" in plan_line(LAYERNORM, {"N": 100, "D": 64})
    # too long for a block's shared memory: e stays in global memory
    assert "lives in shared memory" not in plan_line(SOFTMAX, {"N": 3, "D": 20000})
    # a temporary another phase reads stays in global memory
    two_phase = (
        "def f(float(N, D) X) -> (Y, Z) {\n  t(n, d) = X(n, d) * 2\n  Y(n) +=! t(n, d)\n  Z(d) +=! t(n, d)\n}"
    )
    assert "t lives" not in tl.compile(two_phase, target="cuda").inspect("plan", sizes={"N": 40, "D": 300})


def test_rows_read_in_several_steps_are_read_from_global_memory_once() -> None:
    # layer norm reads X for the mean and again for the deviations: the second from shared memory
    assert "X's row read once from global memory (step 2)" in plan_line(LAYERNORM, {"N": 100, "D": 300})
    ptx = tl.compile(SOFTMAX, target="cuda").inspect("ptx", sizes={"N": 64, "D": 4096})
    assert ptx.count("ld.global.nc") == 8  # one row pass of 8 loads per thread (512 threads, 4096)
    # read in one step only (a row sum), read under a condition, or too long: no copy
    assert "read once" not in plan_line(
        "def f(float(N, D) X) -> (S) { S(n) +=! X(n, d) }", {"N": 40, "D": 300}
    )
    guarded = (
        "def f(float(N, D) X) -> (Y) {\n  m(n) max=! X(n, d)\n"
        "  Y(n, d) = X(n, d) > 0 ? X(n, d) - m(n) : 0.0\n}"
    )
    assert "read once" not in plan_line(guarded, {"N": 40, "D": 300})
    assert "read once" not in plan_line(SOFTMAX, {"N": 3, "D": 20000})


def test_row_local_temporary_is_not_allocated() -> None:
    kernel = tl.compile(SOFTMAX, target="cuda")
    plan, mapping = kernel.plan({"N": 3, "D": 4096})
    from codegen.gpu.kernel import CudaSpecialisation

    spec = CudaSpecialisation.of(plan, mapping, "", kernel.interface, {"N": 3, "D": 4096})
    assert spec.storage["e"] == (1, 1) and spec.storage["mx"] == (3,)


def test_plan_two_mapped_loops_rows() -> None:
    src = "def s3(float(A, B, C) X) -> (S) { S(a, b) +=! X(a, b, c) }"
    line = plan_line(src, {"A": 3, "B": 5, "C": 200})
    assert "rows c0[3] x c1[5] = 15, one block of 64 threads per row" in line


# ---------------------------------------------------------------------------- emulation


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length", LENGTHS)
def test_emulated_softmax_and_layernorm(length: int, dtype) -> None:
    name = "float" if dtype == np.float32 else "double"
    for rows in ROWS if length < 1000 else [3]:
        X = rand((rows, length), dtype, seed=length + rows)
        sizes = {"N": rows, "D": length}
        out, error = emulate(retype(SOFTMAX, name), sizes, {"I": X})
        assert not error.any(), error
        e = np.exp(X - X.max(1, keepdims=True))
        np.testing.assert_allclose(out["O"], e / e.sum(1, keepdims=True), rtol=tolerance(dtype), atol=1e-7)
        out, error = emulate(retype(LAYERNORM, name), sizes, {"X": X})
        assert not error.any(), error
        c = X - X.mean(1, keepdims=True)
        want = c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(out["Y"], want, rtol=50 * tolerance(dtype), atol=50 * tolerance(dtype))


@pytest.mark.parametrize("length", LENGTHS)
def test_emulated_row_sums_and_max(length: int) -> None:
    for rows in ROWS:
        sizes = {"N": rows, "D": length}
        X = rand((rows, length), np.float64, seed=3 * length + rows)
        out, error = emulate(retype(ROWSUM, "double"), sizes, {"X": X})
        assert not error.any()
        np.testing.assert_allclose(out["S"], X.sum(1), rtol=1e-12, atol=1e-12)
        out, _ = emulate(retype(ROWMAX, "double"), sizes, {"X": X})
        np.testing.assert_array_equal(out["M"], X.max(1))  # max is exact in any order
        Xi = np.random.default_rng(length).integers(-(2**20), 2**20, (rows, length)).astype(np.int32)
        out, _ = emulate(retype(ROWSUM, "int32"), sizes, {"X": Xi})
        np.testing.assert_array_equal(out["S"], Xi.sum(1, dtype=np.int32))
        out, _ = emulate(retype(ROWMAX, "int64"), sizes, {"X": Xi.astype(np.int64)})
        np.testing.assert_array_equal(out["M"], Xi.max(1))


@pytest.mark.parametrize("sizes", [{"N": 3, "D": 20000}, {"N": 40, "D": 300}])
def test_emulated_softmax_with_the_temporary_in_global_memory_or_another_phase(sizes) -> None:
    X = rand((sizes["N"], sizes["D"]), np.float32, seed=1)
    out, _ = emulate(SOFTMAX, sizes, {"I": X})
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(out["O"], e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-8)
    two_phase = (
        "def f(float(N, D) X) -> (Y, Z) {\n  t(n, d) = X(n, d) * 2\n  Y(n) +=! t(n, d)\n  Z(d) +=! t(n, d)\n}"
    )
    out, _ = emulate(two_phase, sizes, {"X": X})
    np.testing.assert_allclose(out["Y"], 2 * X.sum(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["Z"], 2 * X.sum(0), rtol=1e-4, atol=1e-3)


def test_emulated_two_reductions_in_one_loop_and_three_d_rows() -> None:
    for D in (40, 300):
        X = rand((4, D), np.float32, seed=D)
        out, _ = emulate(TWO, {"N": 4, "D": D}, {"X": X})
        np.testing.assert_allclose(out["S"], X.sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["Q"], (X * X).sum(1), rtol=1e-5)
    src = "def s3(float(A, B, C) X) -> (S) { S(a, b) max=! X(a, b, c) }"
    X = rand((3, 5, 200), np.float32, seed=9)
    out, _ = emulate(src, {"A": 3, "B": 5, "C": 200}, {"X": X})
    np.testing.assert_array_equal(out["S"], X.max(2))


def test_emulated_nan_propagates_through_max() -> None:
    X = rand((2, 100), np.float32)
    X[1, 57] = np.nan
    out, _ = emulate(ROWMAX, {"N": 2, "D": 100}, {"X": X})
    assert out["M"][0] == X[0].max() and np.isnan(out["M"][1])


def test_emulated_gather_out_of_range_in_a_shared_row() -> None:
    src = "def g(float(N, V) T, int32(D) I) -> (O) { O(n) +=! T(n, I(d)) }"
    T = rand((3, 50), np.float32)
    index = np.arange(200, dtype=np.int32) % 50
    out, error = emulate(src, {"N": 3, "V": 50, "D": 200}, {"T": T, "I": index})
    assert "one block of 64 threads per row" in plan_line(src, {"N": 3, "V": 50, "D": 200})
    assert not error.any()
    np.testing.assert_allclose(out["O"], T[:, index].sum(1), rtol=1e-5)
    index[77] = 50
    _, error = emulate(src, {"N": 3, "V": 50, "D": 200}, {"T": T, "I": index})
    assert error[0] != 0 and error[3] == 50  # [code, check, dim, value]: the bad index


# ------------------------------------------------------------- the corpus at larger sizes

CORPUS = load_corpus() or {"cases": []}
FLOAT_CASES = [
    c
    for c in CORPUS["cases"]
    if all(d.startswith("float") for d in c.get("input_dtypes", {}).values()) and c.get("sizes")
]


@pytest.mark.slow
@pytest.mark.parametrize("scale", [40, 150])
def test_corpus_rows_at_larger_sizes(scale: int) -> None:
    """Every float corpus kernel with all sizes set to `scale`, where a phase gets rows or
    tiles (gpu/tiles.py): the emulation against the CPU kernel."""
    mapped = 0
    for case in FLOAT_CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel = tl.compile(case["tc"], case.get("entry"), target="cuda")
            sizes = {s: scale for s in kernel.interface.sizes}
            try:
                text = kernel.inspect("plan", sizes=sizes)
            except tl.TensorLangError:
                continue
            if not re.search(r"one (warp|block of \d+ threads) per (row|\d+ x \d+ tile)", text):
                continue
            elements = [
                np.prod([compile_size_expr(d)(sizes) for d in t.shape], dtype=np.int64)
                for t in kernel.program.tensors
            ]
            if max(elements, default=0) > 5_000_000:
                continue  # a 4-D Kronecker factor at 150 per dimension: gigabytes on the CPU
            cpu = tl.compile(case["tc"], case.get("entry"))
            inputs = {}
            for t in kernel.interface.inputs:
                shape = tuple(sizes[v] if kind == "size" else v for kind, v in t.dims)
                inputs[t.name] = rand(shape, np.dtype(t.dtype.numpy_name), seed=len(inputs))
            want = cpu(*inputs.values(), **sizes)
        if not isinstance(want, tuple):
            want = (want,)
        # outputs start at zero, as the CPU kernel's do (a `+=` without `!` accumulates onto them)
        got, error = emulate(case["tc"], sizes, inputs, case.get("entry"), fill=0)
        assert not error.any(), (case["name"], error)
        for t, w in zip(kernel.interface.outputs, want):
            # float32 sums in another order: cancellation makes small results relatively inexact,
            # and long ones (a convolution's 150³ terms at scale 150) drift (an indexing error
            # would be off by the results' own size)
            atol = 1e-5 * max(1.0, scale / 40) * float(np.abs(w).max(initial=1.0))
            np.testing.assert_allclose(got[t.name], w, rtol=1e-4, atol=atol, err_msg=case["name"])
        mapped += 1
    assert mapped >= 5


# ---------------------------------------------------------------------------- ptxas

needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed (tensorlang[cuda-tools])")


@needs_ptxas
@pytest.mark.parametrize(
    "src,sizes",
    [
        (SOFTMAX, {"N": 32768, "D": 4096}),
        (LAYERNORM, {"N": 32768, "D": 4096}),
        (LAYERNORM, {"N": 100, "D": 100}),
        (retype(TWO, "double"), {"N": 7, "D": 3000}),
        (retype(ROWMAX, "int64"), {"N": 7, "D": 3000}),
        (retype(ROWSUM, "int8"), {"N": 7, "D": 50}),
        ("def g(float(N, V) T, int32(D) I) -> (O) { O(n) +=! T(n, I(d)) }", {"N": 3, "V": 50, "D": 200}),
    ],
)
def test_row_ptx_assembles(src: str, sizes: dict, tmp_path) -> None:
    kernel = tl.compile(src, target="cuda")
    assert "per row" in kernel.inspect("plan", sizes=sizes)
    for arch in ("sm_80", "sm_90"):
        ptx = kernel.inspect("ptx", sizes=sizes, arch=arch)
        assert "shfl.sync.bfly.b32" in ptx
        if "barrier" in kernel.inspect("plan", sizes=sizes):
            assert re.search(r"\bbar\.(sync|warp\.sync)\b", ptx)
        f = tmp_path / "kernel.ptx"
        f.write_text(ptx)
        done = subprocess.run(
            [ptxas_path(), f"-arch={arch}", str(f), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[:2000]


# ------------------------------------------------------- the whole call path, stand-in driver


@pytest.mark.parametrize("sizes", [{"N": 5, "D": 40}, {"N": 3, "D": 700}])
def test_row_phase_through_the_stand_in_driver(monkeypatch, sizes: dict) -> None:
    """The runtime launches a row phase with the mapping's grid (checked by the stand-in), no
    dynamic shared memory (the shared array is static), and the emulation gives softmax."""
    import os
    import sys

    from codegen.gpu import runtime

    sys.path.insert(0, os.path.dirname(__file__))
    from fake_driver import FakeDriver

    driver = FakeDriver()
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid()))
    monkeypatch.setattr(runtime, "driver", lambda: driver)
    kernel = tl.compile(SOFTMAX, target="cuda")
    driver.register(kernel, sizes)
    X = rand((sizes["N"], sizes["D"]), np.float32)
    Y = kernel(X)
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(Y, e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)
    (launch,) = [args for name, args in driver.calls if name == "cuLaunchKernel"]
    _, mapping = kernel.plan(sizes)
    assert launch[1][0] == mapping.phases[0].blocks and launch[2][0] == mapping.phases[0].block
    assert launch[3] == 0


def test_emulated_bool_and_int8_rows() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((3, 300)) < 0.002
    out, _ = emulate("def f(bool(N,D) X) -> (Y) { Y(n) max=! X(n,d) }", {"N": 3, "D": 300}, {"X": X})
    np.testing.assert_array_equal(out["Y"], X.any(1))
    Xi = rng.integers(-100, 100, (3, 300)).astype(np.int8)
    out, _ = emulate("def f(int8(N,D) X) -> (Y) { Y(n) +=! X(n,d) }", {"N": 3, "D": 300}, {"X": Xi})
    np.testing.assert_array_equal(out["Y"], Xi.sum(1, dtype=np.int8))  # wraps, in any order


# ------------------------------------------- a reduction over the outer loop: the inner loop mapped

COLSUM = "def colsum(float(N, D) X) -> (S) { S(d) +=! X(n, d) * X(n, d) }"
ATAX = "def atax(float(M,N) A, float(N) x) -> (y) {\n  t(i) +=! A(i,j) * x(j)\n  y(j) +=! A(i,j) * t(i)\n}"


def test_plan_outer_reduction_maps_the_inner_loop() -> None:
    line = plan_line(COLSUM, {"N": 200, "D": 37})
    assert "one thread per c2[37] = 37 threads" in line
    assert (
        "the loop c2 inside it is mapped instead, c1 runs in each thread (each thread its own elements of S)"
        in line
    )
    # tiled by the schedule (Y[c1 + c2]): threads could share elements, so a single thread
    src = "def w(float(N, D) X) -> (Y) { Y(d) +=! X(n, D - 1 - d) }"
    line = plan_line(src, {"N": 50, "D": 40})
    assert "single thread" in line and "threads of c1 would share elements of Y" in line


@pytest.mark.parametrize("N,D", [(1, 1), (200, 37), (33, 300)])
def test_emulated_outer_reductions(N: int, D: int) -> None:
    X = rand((N, D), np.float32, seed=N)
    out, _ = emulate(COLSUM, {"N": N, "D": D}, {"X": X})
    np.testing.assert_allclose(out["S"], (X * X).sum(0), rtol=1e-5, atol=1e-6)
    out, _ = emulate("def h(float(N, D) X) -> (S) { S(d) max=! X(n, d) }", {"N": N, "D": D}, {"X": X})
    np.testing.assert_array_equal(out["S"], X.max(0))
    A, x = rand((N, D), np.float32, seed=2), rand((D,), np.float32, seed=3)
    out, _ = emulate(ATAX, {"M": N, "N": D}, {"A": A, "x": x})
    np.testing.assert_allclose(out["y"], A.T @ (A @ x), rtol=1e-4, atol=1e-4)


@needs_ptxas
def test_outer_reduction_ptx_assembles(tmp_path) -> None:
    kernel = tl.compile(ATAX, target="cuda")
    for arch in ("sm_80", "sm_90"):
        f = tmp_path / "kernel.ptx"
        f.write_text(kernel.inspect("ptx", sizes={"M": 500, "N": 400}, arch=arch))
        done = subprocess.run([ptxas_path(), f"-arch={arch}", str(f), "-o", str(tmp_path / "k.cubin")])
        assert done.returncode == 0
