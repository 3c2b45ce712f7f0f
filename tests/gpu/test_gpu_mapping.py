"""target="cuda": the grid mapping's decisions (inspect("plan")) and a CPU emulation of the mapped
grid (the same phase bodies and thread → iteration arithmetic, run thread by thread on the host)
checked against NumPy."""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest

import tensorlang as tl
from codegen.gpu.lower import lower_for_emulation
from codegen.lowering.abi import kernel_layout
from polyhedral.sizes import compile_size_expr

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = (
    "def sm(float(N,D) X) -> (Y) {\n  mx(n) max=! X(n,d)\n  e(n,d) = exp(X(n,d) - mx(n))\n  s(n) +=! e(n,d)\n"
    "  Y(n,d) = e(n,d) / s(n)\n}"
)
SUM = "def total(float(N) a) -> (t) { t +=! a(i) }"
ADD2D = "def add(float(M,N) a, float(M,N) b) -> (c) { c(i,j) = a(i,j) + b(i,j) }"
ATAX = "def atax(float(M,N) A, float(N) x) -> (y) {\n  t(i) +=! A(i,j) * x(j)\n  y(j) +=! A(i,j) * t(i)\n}"
GATHER = "def emb(float(V,E) T, int32(B) I) -> (O) { O(b,e) = T(I(b), e) }"


def plan_lines(src: str, sizes: dict) -> list[str]:
    text = tl.compile(src, target="cuda").inspect("plan", sizes=sizes)
    assert "// target cuda" in text
    return [line for line in text.splitlines() if line.startswith("// cuda phase")]


def test_elementwise_2d_maps_both_loops_stride1_fastest() -> None:
    (line,) = plan_lines(ADD2D, {"M": 30, "N": 70})
    assert "one thread per c0[30] x c1[70] = 2100 threads" in line
    assert "c1 varies fastest (stride-1 dimension of c: coalesced)" in line
    assert "grid 9 x 256" in line


def test_matmul_init_2d_body_tiled_or_one_thread_per_row() -> None:
    init, body = plan_lines(MATMUL, {"M": 64, "K": 32, "N": 48})
    assert "(I0)" in init and "c0[64] x c1[48]" in init
    # a contraction: shared-memory tiles (gpu/tiles.py; tests/gpu/test_gpu_tiles.py)
    assert "(S0)" in body and "shared-memory tiles for C += A·B" in body
    # below 4096 multiply-adds no tiles: the schedule puts k between m and n, so only m is mapped
    _, body = plan_lines(MATMUL, {"M": 8, "K": 8, "N": 8})
    assert "one thread per c0[8] = 8 threads" in body and "inner loops sequential" in body


def test_fused_softmax_one_warp_per_row() -> None:
    # short rows: a warp per row (gpu/rows.py; tests/gpu/test_gpu_reduce.py has the rest)
    (line,) = plan_lines(SOFTMAX, {"N": 100, "D": 33})
    assert "one warp per row (8 rows per block), grid 13 x 256" in line


def test_reduction_over_the_outer_loop_is_single_thread() -> None:
    lines = plan_lines(SUM, {"N": 1000})
    assert any("single thread (grid 1 x 1)" in line and "carries a dependence" in line for line in lines)


# ---------------------------------------------------------------------------- CPU emulation


def emulate(src: str, sizes: dict, inputs: dict) -> dict[str, np.ndarray]:
    kernel = tl.compile(src, target="cuda")
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
        arrays[t.name] = (
            np.ascontiguousarray(given)
            if given is not None
            else np.zeros(shape, np.dtype(t.dtype.numpy_name))
        )
    layout = kernel_layout(plan.scop)
    error = np.zeros(4, np.int64)
    args = [arrays[n].ctypes.data for n in layout.tensors] + [error.ctypes.data]
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(args))
    for grid in mapping.phases:
        proto(engine.get_function_address(f"tl_emulate_phase{grid.index}"))(*args)
    assert not error.any(), error
    del engine
    return {t.name: arrays[t.name] for t in plan.program.outputs}


def rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("sizes", [{"M": 17, "K": 5, "N": 23}, {"M": 1, "K": 1, "N": 1}])
def test_emulated_matmul(sizes) -> None:
    A, B = rand(sizes["M"], sizes["K"]), rand(sizes["K"], sizes["N"], seed=1)
    np.testing.assert_allclose(emulate(MATMUL, sizes, {"A": A, "B": B})["C"], A @ B, rtol=1e-5, atol=1e-5)


def test_emulated_elementwise_2d_odd_sizes() -> None:
    a, b = rand(13, 37), rand(13, 37, seed=3)
    np.testing.assert_array_equal(emulate(ADD2D, {"M": 13, "N": 37}, {"a": a, "b": b})["c"], a + b)


def test_emulated_softmax() -> None:
    X = rand(9, 31)
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(
        emulate(SOFTMAX, {"N": 9, "D": 31}, {"X": X})["Y"], e / e.sum(1, keepdims=True), rtol=1e-5
    )


def test_emulated_atax_and_sum() -> None:
    A, x = rand(21, 19), rand(19, seed=5)
    np.testing.assert_allclose(
        emulate(ATAX, {"M": 21, "N": 19}, {"A": A, "x": x})["y"], A.T @ (A @ x), rtol=1e-4, atol=1e-5
    )
    a = rand(1000)
    np.testing.assert_allclose(emulate(SUM, {"N": 1000}, {"a": a})["t"], a.sum(), rtol=1e-4)


def test_emulated_gather() -> None:
    T, index = rand(50, 8), np.array([3, 0, 49, 7, 7], np.int32)
    np.testing.assert_array_equal(
        emulate(GATHER, {"V": 50, "E": 8, "B": 5}, {"T": T, "I": index})["O"], T[index]
    )


# ---------------------------------------------------------------------------- registers (gpu/private.py)

CHAIN = (
    "def chain(float(N) a, float(N) b, float(N) c) -> (o) {\n  t1(i) = a(i) * b(i) + c(i)\n"
    "  t2(i) = tanh(t1(i))\n  t3(i) = t2(i) * 0.5 + a(i)\n  o(i) = t3(i) * t3(i) - b(i)\n}"
)
ROW_SUM_3D = "def f(float(M,N,K) A) -> (y) {\n  t(i) +=! A(i,j,k)\n  y(i) = t(i) * 2\n}"
TILE_2D = "def f(float(M,N) a) -> (o) {\n  t(i,j) = a(i,j) * 2\n  o(i,j) = t(i,j) + 1\n}"
ROW_READ = "def f(float(M,N) a) -> (o) {\n  t(i,j) = a(i,j) * 2\n  o(i,j) = t(i,j) + t(i,0)\n}"
SHARED_LATER = "def f(float(N) a) -> (o) {\n  t(i) = a(i) * 2\n  s +=! t(i)\n  o(i) = t(i) / s\n}"


@pytest.mark.parametrize("n", [1, 7, 1009])
def test_chain_temporaries_live_in_registers(n) -> None:
    if n > 1:  # one element: no loop, single-thread phases
        (line,) = plan_lines(CHAIN, {"N": n})
        assert "t1, t2, t3 kept in registers" in line
        ptx = tl.compile(CHAIN, target="cuda").inspect("ptx", sizes={"N": n})
        assert ptx.count("st.global") == 1  # o alone is stored
    a = rand(n)
    b, c = np.random.default_rng(1).uniform(-1, 1, (2, n)).astype(np.float32)
    t3 = np.tanh(a * b + c) * np.float32(0.5) + a
    np.testing.assert_allclose(
        emulate(CHAIN, {"N": n}, {"a": a, "b": b, "c": c})["o"], t3 * t3 - b, rtol=1e-5, atol=1e-6
    )


def test_a_row_accumulator_lives_in_a_register() -> None:
    sizes = {"M": 5, "N": 7, "K": 3}
    (line,) = plan_lines(ROW_SUM_3D, sizes)
    assert "t kept in registers" in line and "inner loops sequential" in line
    A = rand(5, 7, 3)
    np.testing.assert_allclose(emulate(ROW_SUM_3D, sizes, {"A": A})["y"], 2 * A.sum((1, 2)), rtol=1e-5)


@pytest.mark.parametrize("sizes", [{"M": 5, "N": 7}, {"M": 13, "N": 37}, {"M": 1, "N": 1}])
def test_a_2d_temporary_lives_in_registers(sizes) -> None:
    if sizes["N"] > 1:
        (line,) = plan_lines(TILE_2D, sizes)
        assert "t kept in registers" in line
    a = rand(sizes["M"], sizes["N"])
    np.testing.assert_array_equal(emulate(TILE_2D, sizes, {"a": a})["o"], a * 2 + 1)


@pytest.mark.parametrize(
    ("src", "sizes", "reference"),
    [
        (ROW_READ, {"M": 5, "N": 7}, lambda a: 2 * a + 2 * a[:, :1]),  # read at another element
        (SHARED_LATER, {"N": 11}, lambda a: 2 * a / (2 * a).sum()),  # read by other phases
    ],
)
def test_temporaries_other_threads_or_phases_read_stay_in_memory(src, sizes, reference) -> None:
    assert not any("registers" in line for line in plan_lines(src, sizes))
    a = rand(*sizes.values())
    np.testing.assert_allclose(emulate(src, sizes, {"a": a})["o"], reference(a), rtol=1e-5)


SCALE_4D = "def f(float(N,C,H,W) a) -> (o) { o(n,c,h,w) = a(n,c,h,w) * 2 + 1 }"
CONV = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (3, 1, 11, 13), (1, 2, 1, 3)])
def test_a_4d_nest_maps_every_parallel_loop(shape) -> None:
    sizes = dict(zip("NCHW", shape))
    lines = plan_lines(SCALE_4D, sizes)
    if min(shape) > 1:
        (line,) = lines
        assert f"c0[{shape[0]}] x c1[{shape[1]}] x c2[{shape[2]}] x c3[{shape[3]}]" in line
        assert "c3 varies fastest" in line
    a = rand(*shape)
    np.testing.assert_array_equal(emulate(SCALE_4D, sizes, {"a": a})["o"], a * 2 + 1)


def test_a_convolutions_initialisation_is_one_thread_per_element() -> None:
    # it was one thread per (n, f) storing 56² zeros one after another: half of conv2d's time
    sizes = {"N": 2, "C": 3, "H": 9, "W": 11, "F": 5, "KH": 3, "KW": 3}
    init = plan_lines(CONV, sizes)[0]
    assert "(I0)" in init and "c0[2] x c1[5] x c2[7] x c3[9] = 630 threads" in init
    img, Wt = rand(2, 3, 9, 11), rand(5, 3, 3, 3, seed=1)
    ref = np.einsum(
        "nchwij,fcij->nfhw", np.lib.stride_tricks.sliding_window_view(img, (3, 3), axis=(2, 3)), Wt
    )
    np.testing.assert_allclose(emulate(CONV, sizes, {"I": img, "Wt": Wt})["O"], ref, rtol=1e-4, atol=1e-5)
