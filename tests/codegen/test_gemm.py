"""Packed GEMM kernel (codegen.emit.gemm_kernel, compiled by codegen.lowering.gemm_jit): differential tests against NumPy on awkward sizes, strides, threads."""

from __future__ import annotations

import ctypes
import itertools
import threading

import llvmlite.ir as ir
import numpy as np
import pytest

from codegen import host
from codegen.emit.gemm_kernel import define_gemm
from codegen.lowering.gemm_jit import compile_gemm

DTYPES = ["float32", "float64"]
TOL = {"float32": 2e-4, "float64": 1e-11}


def _variants(dtype: str) -> dict[str, host.GemmBlocking]:
    native = host.gemm_blocking(dtype)
    size = np.dtype(dtype).itemsize
    vw = 32 // size  # a 256-bit (AVX2-like) shape runs on any x86-64 host with AVX2
    return {
        "host": native,
        # tiny cache blocks: every block boundary (jc, pc, ic) is crossed even by small matrices
        "tiny": host.GemmBlocking(
            vw=native.vw, mr=native.mr, nv=native.nv, kc=5, mc=2 * native.mr, nc=2 * native.nr
        ),
        "avx2": host.GemmBlocking(vw=vw, mr=6, nv=2, kc=40, mc=18, nc=4 * 2 * vw, unroll=3, prefetch_c=False),
    }


class Gemm:
    """A compiled tl_gemm_<dtype> with its own workspace, called on NumPy views."""

    def __init__(self, dtype: str, cfg: host.GemmBlocking):
        self.dtype = dtype
        self.compiled = compile_gemm(dtype, cfg)
        self.ws_bytes = host.gemm_workspace_layout(cfg, np.dtype(dtype).itemsize)[2]

    def workspace(self) -> np.ndarray:
        raw = np.empty(self.ws_bytes + 64, np.uint8)
        return raw[(-raw.ctypes.data) % 64 :]

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, ws: np.ndarray | None = None) -> None:
        (m, k), (k2, n) = a.shape, b.shape
        assert k == k2 and c.shape == (m, n)
        ptr = ctypes.POINTER(ctypes.c_float if self.dtype == "float32" else ctypes.c_double)
        item = a.itemsize

        def args(x):
            return [x.ctypes.data_as(ptr), x.strides[0] // item, x.strides[1] // item]

        ws = self.workspace() if ws is None else ws
        self.compiled.fn(m, n, k, *args(a), *args(b), *args(c), ws.ctypes.data)


_cache: dict[tuple[str, str], Gemm] = {}


def kernel(dtype: str, variant: str = "host") -> Gemm:
    key = (dtype, variant)
    if key not in _cache:
        _cache[key] = Gemm(dtype, _variants(dtype)[variant])
    return _cache[key]


rng = np.random.default_rng(1234)


def rand(dtype, *shape):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def check(g: Gemm, a, b, c):
    expected = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    g(a, b, c)
    scale = max(1.0, a.shape[1] ** 0.5)
    np.testing.assert_allclose(c, expected, rtol=TOL[g.dtype] * scale, atol=TOL[g.dtype] * scale)


SMALL = [1, 2, 3, 7, 17, 31]
LARGE = [64, 65, 129, 300]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["host", "tiny", "avx2"])
def test_awkward_sizes(dtype, variant):
    g = kernel(dtype, variant)
    shapes = set(itertools.product(SMALL[::2] + [65], repeat=3))
    shapes |= {(m, n, k) for m in LARGE for n in (1, 7, 65) for k in (3, 129)}
    shapes |= {(m, n, k) for n in LARGE for m in (1, 17) for k in (2, 300)}
    shapes |= {(300, 300, 300), (129, 64, 31), (64, 64, 64), (31, 129, 65), (2, 300, 129)}
    for m, n, k in sorted(shapes):
        check(g, rand(dtype, m, k), rand(dtype, k, n), rand(dtype, m, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_small_sizes(dtype):
    g = kernel(dtype, "tiny")
    for m, n, k in itertools.product(SMALL, repeat=3):
        check(g, rand(dtype, m, k), rand(dtype, k, n), rand(dtype, m, n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0), (0, 3, 0)])
def test_empty(dtype, shape):
    m, n, k = shape
    g = kernel(dtype)
    a, b, c = rand(dtype, m, k), rand(dtype, k, n), rand(dtype, m, n)
    before = c.copy()
    g(a, b, c)
    np.testing.assert_array_equal(c, before)  # K = 0 adds nothing


def _layouts(dtype, m, n, k):
    """(name, A, B) views: row-major, transposed, column-strided, row-strided, broadcast (stride 0)."""
    yield "plain", rand(dtype, m, k), rand(dtype, k, n)
    yield "transposed", rand(dtype, k, m).T, rand(dtype, n, k).T
    yield "a_t", rand(dtype, k, m).T, rand(dtype, k, n)
    yield "b_t", rand(dtype, m, k), rand(dtype, n, k).T
    yield "strided", rand(dtype, 2 * m, 3 * k)[::2, ::3], rand(dtype, 3 * k, 2 * n)[::3, ::2]
    yield "strided_t", rand(dtype, 3 * k, 2 * m)[::3, ::2].T, rand(dtype, 2 * n, 3 * k)[::2, ::3].T
    yield "broadcast", np.broadcast_to(rand(dtype, 1, k), (m, k)), np.broadcast_to(rand(dtype, k, 1), (k, n))


def _outputs(dtype, m, n):
    """(name, C view, backing array) with row-major, column-major and doubly strided layouts."""
    yield "c", *(lambda x: (x, x))(rand(dtype, m, n))
    back = rand(dtype, n, m)
    yield "c_t", back.T, back
    back = rand(dtype, 3 * m + 1, 2 * n + 3)
    yield "c_strided", back[1::3, 3::2], back
    back = rand(dtype, 2 * n, 5 * m)
    yield "c_strided_t", back[::2, ::5].T, back


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["host", "tiny"])
def test_strides(dtype, variant):
    g = kernel(dtype, variant)
    for m, n, k in [(7, 17, 31), (65, 129, 33), (300, 70, 129), (1, 65, 300), (40, 3, 2)]:
        for (la, a, b), (lc, c, back) in itertools.product(_layouts(dtype, m, n, k), _outputs(dtype, m, n)):
            mask = np.ones(back.shape, bool)
            mask_view = mask.T if lc == "c_t" else mask
            if lc == "c_strided":
                mask_view[1::3, 3::2] = False
            elif lc == "c_strided_t":
                mask_view[::2, ::5] = False
            else:
                mask_view[...] = False
            outside = back[mask].copy()
            expected = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
            g(a, b, c)
            tol = TOL[dtype] * max(1.0, k**0.5)
            np.testing.assert_allclose(c, expected, rtol=tol, atol=tol, err_msg=f"{la}/{lc} {m, n, k}")
            np.testing.assert_array_equal(back[mask], outside, err_msg=f"{la}/{lc} wrote outside C")


@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_on_row_blocks(dtype):
    g = kernel(dtype)
    m, n, k = 301, 257, 190
    a, b, c = rand(dtype, m, k), rand(dtype, k, n), rand(dtype, m, n)
    expected = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    blocks = [(0, 150), (150, m)]
    errors = []

    def work(lo, hi):
        try:
            ws = g.workspace()
            for _ in range(3):  # overlap the two calls in time
                g(a[lo:hi], b, c[lo:hi], ws)
                g(-a[lo:hi], b, c[lo:hi], ws)
            g(a[lo:hi], b, c[lo:hi], ws)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=blk) for blk in blocks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    tol = TOL[dtype] * 20
    np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_define_once_and_signature(dtype):
    module = ir.Module(name="m")
    fn = define_gemm(module, dtype)
    assert define_gemm(module, dtype) is fn
    assert fn.name == {"float32": "tl_gemm_f32", "float64": "tl_gemm_f64"}[dtype]
    assert len(fn.args) == 13 and isinstance(fn.function_type.return_type, ir.VoidType)
    other = define_gemm(module, "float64" if dtype == "float32" else "float32")
    assert other is not fn
    ws = host.workspace_bytes(dtype)
    assert ws > 0 and ws % 64 == 0


def test_host_config_is_sane():
    for dtype in DTYPES:
        cfg = host.gemm_blocking(dtype)
        assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0
        assert cfg.mr * cfg.nv + cfg.nv + 1 <= (32 if cfg.vw * np.dtype(dtype).itemsize == 64 else 16)
