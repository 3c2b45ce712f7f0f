"""target="cuda": contractions in shared-memory tiles (gpu/tiles.py, gpu/tilelower.py) — the plan
text, the CPU emulation of the tile steps (the chunk loop around load, barrier, compute,
barrier) against NumPy at awkward sizes, both tile shapes, transposed operands, float64, the
fallbacks, and ptxas for sm_80 and sm_90."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from test_gpu_reduce import emulate, plan_line, rand

import tensorlang as tl
from codegen.gpu import tiles
from codegen.gpu.ptx import ptxas_path

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MM_T = "def mmt(float(K,M) A, float(N,K) B) -> (C) { C(n,m) +=! A(k,m) * B(n,k) }"
MM_ACC = "def acc(float(M,K) A, float(K,N) B, float(M,N) C0) -> (C) {\n  C(m,n) = C0(m,n)\n  C(m,n) += A(m,k) * B(k,n)\n}"


def test_plan_sgemm_4096_large_tiles() -> None:
    line = plan_line(MM, {"M": 4096, "K": 4096, "N": 4096})
    assert "shared-memory tiles for C += A·B (m=m, n=n, k=k)" in line
    assert "one block of 256 threads per 128 x 128 tile, grid 1024 x 256 (32 x 32 tiles)" in line
    assert "k in 512 chunks of 8" in line and "each thread a 8 x 8 register tile" in line


def test_plan_small_matrix_small_tiles_and_fallbacks() -> None:
    line = plan_line(MM, {"M": 100, "K": 50, "N": 70})
    assert "64 x 64 tile, grid 4 x 256 (2 x 2 tiles); k in 4 chunks of 16" in line
    # too little work for tiles, and a batch variable: the old mapping
    assert "one thread per" in plan_line(MM, {"M": 8, "K": 8, "N": 8})
    bmm = "def bmm(float(B,M,K) A, float(B,K,N) W) -> (C) { C(b,m,n) +=! A(b,m,k) * W(b,k,n) }"
    assert "tiles" not in plan_line(bmm, {"B": 2, "M": 64, "K": 64, "N": 64})


def reference(A, B):
    return (A.astype(np.float64) @ B.astype(np.float64)).astype(A.dtype)


@pytest.mark.parametrize(
    "M,K,N",
    [(17, 19, 23), (1, 4096, 1), (64, 16, 64), (65, 1, 70), (70, 33, 130), (3, 700, 5), (129, 17, 2)],
)
def test_emulated_tiles_awkward_sizes(M: int, K: int, N: int) -> None:
    sizes = {"M": M, "K": K, "N": N}
    assert "shared-memory tiles" in plan_line(MM, sizes)
    A, B = rand((M, K), np.float32), rand((K, N), np.float32, seed=1)
    out, error = emulate(MM, sizes, {"A": A, "B": B})
    assert not error.any()
    np.testing.assert_allclose(out["C"], reference(A, B), rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_emulated_large_tiles(monkeypatch) -> None:
    monkeypatch.setattr(tiles, "LARGE_TILE_MIN_TILES", 1)
    sizes = {"M": 130, "K": 21, "N": 129}
    kernel = tl.compile(MM, target="cuda")
    assert "128 x 128 tile" in kernel.inspect("plan", sizes=sizes)
    A, B = rand((130, 21), np.float32), rand((21, 129), np.float32, seed=2)
    out, _ = emulate(MM, sizes, {"A": A, "B": B})
    np.testing.assert_allclose(out["C"], reference(A, B), rtol=1e-4, atol=1e-4)


def test_emulated_transposed_operands_float64_and_accumulation() -> None:
    sizes = {"M": 37, "K": 41, "N": 43}
    A, B = rand((41, 37), np.float64), rand((43, 41), np.float64, seed=3)
    src = MM_T.replace("float(", "double(")
    assert "shared-memory tiles for C += A·B" in plan_line(src, sizes)
    out, _ = emulate(src, sizes, {"A": A, "B": B})
    np.testing.assert_allclose(out["C"], B @ A, rtol=1e-12, atol=1e-12)
    A, B, C0 = (
        rand((37, 41), np.float32),
        rand((41, 43), np.float32, seed=4),
        rand((37, 43), np.float32, seed=5),
    )
    out, _ = emulate(MM_ACC, sizes, {"A": A, "B": B, "C0": C0})
    np.testing.assert_allclose(out["C"], C0 + reference(A, B), rtol=1e-4, atol=1e-4)


needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed (tensorlang[cuda-tools])")


@needs_ptxas
@pytest.mark.parametrize(
    "src,sizes",
    [
        (MM, {"M": 4096, "K": 4096, "N": 4096}),
        (MM, {"M": 70, "K": 33, "N": 130}),
        (MM_T.replace("float(", "double("), {"M": 300, "K": 200, "N": 100}),
    ],
)
def test_tile_ptx_assembles(src: str, sizes: dict, tmp_path) -> None:
    kernel = tl.compile(src, target="cuda")
    for arch in ("sm_80", "sm_90"):
        ptx = kernel.inspect("ptx", sizes=sizes, arch=arch)
        assert "bar.sync" in ptx and "ld.shared.v" in ptx  # staged tiles, vector loads from them
        f = tmp_path / "kernel.ptx"
        f.write_text(ptx)
        done = subprocess.run(
            [ptxas_path(), f"-arch={arch}", "-v", str(f), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[:2000]
        assert "0 bytes spill stores" in done.stderr


CONV = """def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}"""


def conv_reference(image, Wt):
    KH, KW = Wt.shape[2:]
    H, W = image.shape[2] - KH + 1, image.shape[3] - KW + 1
    out = np.zeros((image.shape[0], Wt.shape[0], H, W))
    for kh in range(KH):
        for kw in range(KW):
            out += np.einsum("nchw,fc->nfhw", image[:, :, kh : kh + H, kw : kw + W], Wt[:, :, kh, kw])
    return out


def test_plan_conv2d_implicit_gemm() -> None:
    sizes = {"N": 32, "C": 64, "H": 58, "W": 58, "F": 64, "KH": 3, "KW": 3}
    line = plan_line(CONV, sizes)
    assert "shared-memory tiles for O += I·Wt (m=n·h·w, n=f, k=c·kh·kw)" in line
    assert "128 x 64 tile, grid 784 x 256" in line and "(loads of I along m, of Wt along k)" in line


@pytest.mark.parametrize("narrow", [False, True])
def test_emulated_conv2d_tiles(monkeypatch, narrow: bool) -> None:
    if narrow:
        monkeypatch.setattr(tiles, "LARGE_TILE_MIN_TILES", 1)
    sizes = {"N": 2, "C": 5, "H": 11, "W": 13, "F": 7, "KH": 3, "KW": 2}
    kernel = tl.compile(CONV, target="cuda")
    assert ("128 x 64 tile" if narrow else "64 x 64 tile") in kernel.inspect("plan", sizes=sizes)
    image, Wt = rand((2, 5, 11, 13), np.float32), rand((7, 5, 3, 2), np.float32, seed=1)
    out, error = emulate(CONV, sizes, {"I": image, "Wt": Wt})
    assert not error.any()
    np.testing.assert_allclose(out["O"], conv_reference(image, Wt), rtol=1e-4, atol=1e-4)


@needs_ptxas
def test_conv2d_tile_ptx_assembles(tmp_path) -> None:
    sizes = {"N": 32, "C": 64, "H": 58, "W": 58, "F": 64, "KH": 3, "KW": 3}
    kernel = tl.compile(CONV, target="cuda")
    for arch in ("sm_80", "sm_90"):
        f = tmp_path / "kernel.ptx"
        f.write_text(kernel.inspect("ptx", sizes=sizes, arch=arch))
        done = subprocess.run(
            [ptxas_path(), f"-arch={arch}", "-v", str(f), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and "0 bytes spill stores" in done.stderr, done.stderr[:2000]
