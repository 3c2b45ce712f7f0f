"""The generic kernel's direct convolution (Options(specialize=False); polyhedral/convolution.py with
sizes None, codegen/emit/conv_generic.py): it is really taken, and differential tests against
NumPy, the specialised kernel and the untransformed reference (Options(optimize=False)) on
awkward sizes, layouts, strides, dilation, padding guards, groups, float64 and threads, with one
compiled kernel serving every size."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import tensorlang as tl

NCHW = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
NCHW64 = NCHW.replace("float(", "double(")
SWAPPED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! Wt(f,c,kh,kw) * I(n,c,h+kh,w+kw) }"
STRIDED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw) }"
DILATED = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+2*kh,w+3*kw) * Wt(f,c,kh,kw) }"
NHWC = "def conv(float(N,H,W,C) I, float(KH,KW,C,F) Wt) -> (O) { O(n,h,w,f) +=! I(n,h+kh,w+kw,c) * Wt(kh,kw,c,f) }"
CONV1D = "def conv(float(C,X) I, float(F,C,K) Wt) -> (O) { O(f,x) +=! I(c,x+k) * Wt(f,c,k) }"
CONV3D = (
    "def conv(float(N,C,D,H,W) I, float(F,C,KD,KH,KW) Wt) -> (O) "
    "{ O(n,f,d,h,w) +=! I(n,c,d+kd,h+kh,w+kw) * Wt(f,c,kd,kh,kw) }"
)
PADDED = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                     ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0 where h in 0:H, w in 0:W
}"""
PADDED_STRIDED = """def conv(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {
  O(n, f, h, w) +=! (2*h + kh - 1 >= 0 && 2*h + kh - 1 < H && 2*w + kw - 1 >= 0 && 2*w + kw - 1 < W)
                     ? I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(f, c, kh, kw) : 0.0
                     where h in 0:(H+1)/2, w in 0:(W+1)/2
}"""
PADDED_NHWC = """def conv(float(N, H, W, C) I, float(3, 3, C, F) Wt) -> (O) {
  O(n, h, w, f) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                     ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c, f) : 0.0 where h in 0:H, w in 0:W
}"""
GROUPED = "def conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt) -> (O) { O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * Wt(g,f,c,kh,kw) }"
OFFSET_ACCUMULATE = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) = 1.0 where n in 0:N, f in 0:F, h in 0:H, w in 0:W
  O(n,f,h,w) += I(n,c,h+kh-1,w+kw-3) * Wt(f,c,kh,kw) where h in 1:H-KH+1, w in 3:W-KW+2
}"""
WEIGHT_GRADIENT = (
    "def wg(float(N,C,H,W) I, float(N,F,OH,OW) dO) -> (dW) "
    "{ dW(f,c,kh,kw) +=! dO(n,f,h,w) * I(n,c,h+kh,w+kw) where kh in 0:H-OH+1, kw in 0:W-OW+1 }"
)

TOL = {np.float32: 2e-4, np.float64: 1e-11}


def generic(src: str, threads: int = 1) -> tl.Kernel:
    return tl.compile(src, options=tl.Options(specialize=False, threads=threads))


def conv_np(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW valid convolution (cross-correlation), stride 1, in float64."""
    win = sliding_window_view(x.astype(np.float64), w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,fcij->nfhw", win, w.astype(np.float64))


def _args(rng, shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _close(got, want, dtype=np.float32):
    tol = TOL[dtype]
    scale = max(1.0, float(np.max(np.abs(want)))) if np.size(want) else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _generic_plan(kernel) -> str:
    return kernel.inspect("plan")  # no sizes: the plan of the one generic kernel


def test_generic_plan_runs_the_direct_convolution():
    """The generic plan holds the direct convolution (not the loops it used to fall back to), and
    a call is served by it: its sizes are run-time values."""
    k = generic(NCHW)
    plan = k._plan(None)
    assert not plan.specialised and list(plan.convolutions) == ["S0"]
    assert plan.convolutions["S0"].generic
    text = _generic_plan(k)
    assert "direct convolution O += I * Wt" in text and "sized at run time" in text
    assert "kw unrolled for 3, 5, 7, else looped" in text
    x, w = _args(np.random.default_rng(0), [(1, 3, 8, 21), (17, 3, 3, 3)])
    _close(k(x, w), conv_np(x, w))
    assert "tl_convg_S0_u3" in k.inspect("llvm", {"N": 1, "C": 3, "H": 8, "W": 21, "F": 17, "KH": 3, "KW": 3})


# N, C, H, W (input), F, KH, KW: channels 1, 3, 15, 17, 33; odd and prime H and W; fewer output
# positions than a register block; windows of 3 (unrolled) and of 2 and 4 (looped)
SHAPES = [
    (1, 1, 5, 7, 16, 3, 3),  # one input channel, output 3×5: a block of 4 + 1 positions
    (1, 3, 7, 9, 8, 3, 3),  # half a vector of output channels
    (2, 15, 6, 19, 17, 3, 3),  # output width 17 = 16+1, 17 channels: a partial f-block
    (1, 17, 5, 17, 15, 3, 3),  # output width 15 = 8+4+2+1
    (1, 33, 6, 23, 33, 5, 5),  # 5×5, 33 channels: three f-blocks, the last of one channel
    (1, 3, 11, 13, 1, 3, 3),  # one output channel (the specialised plan leaves this to loops)
    (1, 4, 9, 30, 20, 7, 7),  # 7×7, unrolled
    (1, 5, 8, 29, 18, 2, 4),  # widths 4 and 2: the looped window tap
    (3, 2, 8, 21, 9, 3, 1),  # 3×1 filter
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_nchw_matches_numpy_and_specialised(shape):
    n, c, h, w, f, kh, kw = shape
    args = _args(np.random.default_rng(sum(shape)), [(n, c, h, w), (f, c, kh, kw)])
    got = generic(NCHW)(*args)
    _close(got, conv_np(*args))
    _close(got, tl.compile(NCHW, options=tl.Options(threads=1))(*args))


@pytest.mark.parametrize("threads", [1, 2])
def test_one_generic_kernel_serves_many_sizes(threads):
    """One compilation; every size (smaller than a block, a block ± 1, several blocks, each
    window width) runs on it and matches NumPy."""
    k = generic(NCHW, threads)
    rng = np.random.default_rng(7)
    shapes = [
        (1, 3, 5, 5, 8, 3, 3),
        (2, 7, 9, 18, 16, 3, 3),
        (1, 5, 6, 20, 31, 5, 5),
        (1, 2, 10, 47, 9, 3, 3),
        (1, 6, 4, 11, 17, 1, 1),
        (1, 4, 9, 16, 12, 2, 6),
        (1, 3, 7, 9, 8, 7, 9),
        (2, 1, 13, 37, 3, 3, 3),
    ]
    for n, c, h, w, f, kh, kw in shapes:
        x, wt = _args(rng, [(n, c, h, w), (f, c, kh, kw)])
        _close(k(x, wt), conv_np(x, wt))
    assert k.compile_count == 1


@pytest.mark.parametrize(
    "src, shapes",
    [
        (SWAPPED, [(1, 4, 9, 20), (9, 4, 3, 3)]),
        (STRIDED, [(2, 5, 23, 37), (17, 5, 3, 3)]),
        (STRIDED, [(1, 3, 9, 12), (8, 3, 2, 2)]),
        (DILATED, [(1, 3, 20, 30), (20, 3, 3, 3)]),
        (NHWC, [(2, 12, 21, 5), (3, 3, 5, 24)]),
        (NHWC, [(1, 6, 9, 3), (2, 3, 3, 9)]),
        (CONV1D, [(6, 40), (33, 6, 5)]),
        (CONV3D, [(1, 3, 5, 6, 19), (10, 3, 2, 3, 3)]),
        (OFFSET_ACCUMULATE, [(2, 3, 9, 40), (17, 3, 3, 3)]),
    ],
    ids=["swapped", "strided", "strided-2x2", "dilated", "nhwc", "nhwc-small", "conv1d", "conv3d", "offset"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_layouts_strides_dilation_match_the_reference(src, shapes, threads):
    args = _args(np.random.default_rng(3), shapes)
    k = generic(src, threads)
    assert "direct convolution" in _generic_plan(k)
    _close(k(*args), tl.compile(src, options=tl.Options(optimize=False))(*args))


@pytest.mark.parametrize(
    "src, shapes",
    [
        (PADDED, [(1, 3, 7, 9), (8, 3, 3, 3)]),  # narrower than a block: both edges in one
        (PADDED, [(2, 5, 6, 40), (17, 5, 3, 3)]),  # interior blocks between the edges
        (PADDED, [(1, 4, 5, 33), (20, 4, 3, 3)]),  # 16k+1: a last block of one position
        (PADDED, [(1, 4, 6, 30), (9, 4, 1, 3)]),  # 1×3 window, padding along h with one tap
        (PADDED, [(1, 3, 7, 21), (16, 3, 4, 4)]),  # width 4: the looped tap, guarded per tap
        (PADDED, [(1, 2, 6, 35), (16, 2, 5, 5)]),  # two columns of padding past the right edge
        (PADDED_STRIDED, [(1, 4, 9, 37), (12, 4, 3, 3)]),
        (PADDED_NHWC, [(2, 5, 19, 6), (3, 3, 6, 10)]),
    ],
    ids=["small", "interior", "16k+1", "1x3", "4x4-looped", "5x5", "strided", "nhwc"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_padding_guards_match_the_reference(src, shapes, threads):
    args = _args(np.random.default_rng(17), shapes)
    k = generic(src, threads)
    assert "padding guards" in _generic_plan(k)
    _close(k(*args), tl.compile(src, options=tl.Options(optimize=False))(*args))


def test_padded_matches_numpy_pad_and_specialised():
    x, w = _args(np.random.default_rng(4), [(2, 6, 11, 23), (19, 6, 3, 3)])
    want = conv_np(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), w)
    got = generic(PADDED, 2)(x, w)
    _close(got, want)
    _close(got, tl.compile(PADDED, options=tl.Options(threads=2))(x, w))


@pytest.mark.parametrize(
    "shapes",
    [[(2, 3, 5, 7, 20), (3, 9, 5, 3, 3)], [(1, 2, 4, 6, 40), (2, 17, 4, 3, 3)]],
    ids=["nchw", "two-blocks"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_groups_match_the_reference(shapes, threads):
    args = _args(np.random.default_rng(21), shapes)
    k = generic(GROUPED, threads)
    assert "groups g" in _generic_plan(k)
    _close(k(*args), tl.compile(GROUPED, options=tl.Options(optimize=False))(*args))


@pytest.mark.parametrize("threads", [1, 2])
def test_float64(threads):
    k = generic(NCHW64, threads)
    assert "8-lane vectors" in _generic_plan(k)
    rng = np.random.default_rng(5)
    for shape in [(1, 3, 7, 12, 9, 3, 3), (2, 5, 6, 13, 17, 5, 5), (1, 2, 5, 8, 4, 2, 3)]:
        n, c, h, w, f, kh, kw = shape
        args = _args(rng, [(n, c, h, w), (f, c, kh, kw)], np.float64)
        _close(k(*args), conv_np(*args), np.float64)


def test_filter_changed_between_calls_is_seen():
    rng = np.random.default_rng(5)
    x, w = _args(rng, [(1, 6, 9, 20), (18, 6, 3, 3)])
    k = generic(NCHW, 2)
    _close(k(x, w), conv_np(x, w))
    w *= -2.0
    w[3] = 1.0
    _close(k(x, w), conv_np(x, w))


def test_empty_extents():
    """No input channels: the taps are empty, O is zero; an output narrower than the window
    (none of its positions exist) is empty. Nothing is read or packed out of bounds."""
    k = generic(NCHW)
    x, w = np.zeros((1, 0, 6, 9), np.float32), np.zeros((16, 0, 3, 3), np.float32)
    _close(k(x, w), np.zeros((1, 16, 4, 7), np.float32))
    x, w = _args(np.random.default_rng(1), [(1, 3, 6, 9), (16, 3, 3, 3)])
    _close(k(x, w), conv_np(x, w))  # still right after the empty call


def test_weight_gradient_matches_the_reference():
    """Convolution-shaped too (dO plays the filter); without sizes its window's width is unknown,
    so the generic kernel may run it directly (the looped window tap): results still exact."""
    args = _args(np.random.default_rng(13), [(1, 16, 12, 19), (1, 16, 10, 17)])
    _close(
        generic(WEIGHT_GRADIENT)(*args),
        tl.compile(WEIGHT_GRADIENT, options=tl.Options(optimize=False))(*args),
    )


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_large_matches_specialised(threads):
    """The benchmark's shape and a padded one, against the specialised kernel."""
    rng = np.random.default_rng(2)
    for src, shapes in (
        (NCHW, [(1, 64, 58, 58), (64, 64, 3, 3)]),
        (PADDED, [(2, 32, 29, 31), (40, 32, 3, 3)]),
    ):
        args = _args(rng, shapes)
        want = tl.compile(src, options=tl.Options(threads=threads))(*args)
        _close(generic(src, threads)(*args), want)


def test_zeroing_is_folded_into_the_generic_kernel():
    """`+=!` on its own: the generic kernel stores its sums (no zeroing pass), for every size:
    with no input channels the calls still run and store zeros; old values never leak."""
    k = generic(NCHW, 2)
    assert "no zeroing pass" in _generic_plan(k)
    rng = np.random.default_rng(12)
    for shapes in (
        [(2, 4, 7, 22), (12, 4, 3, 3)],
        [(1, 0, 5, 9), (9, 0, 2, 3)],
        [(1, 3, 6, 17), (20, 3, 3, 3)],
    ):
        x, w = _args(rng, shapes)
        for _ in range(2):  # reused output buffers
            _close(k(x, w), conv_np(x, w))


def test_non_contiguous_arguments():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 6, 12, 44)).astype(np.float32)[:, :, ::2, ::2]
    w = np.asfortranarray(rng.standard_normal((16, 6, 3, 3)).astype(np.float32))
    _close(generic(NCHW)(x, w), conv_np(x, w))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_generic_export_runs_the_direct_convolution(tmp_path):
    """An exported generic kernel allocates and frees its packed filter itself (libc's malloc and
    free): right at any size, through the C entry."""
    import ctypes

    from codegen.aot import export

    result = export(NCHW, path=tmp_path)
    listing = subprocess.run(["nm", "-u", str(result.object)], check=True, capture_output=True, text=True)
    undefined = {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}
    assert {"malloc", "free"} <= undefined and not any("conv" in name for name in undefined), undefined
    if result.shared is None:
        pytest.skip("no linker for the shared library")
    fn = getattr(ctypes.CDLL(str(result.shared)), result.name)
    fn.restype = ctypes.c_int32
    rng = np.random.default_rng(6)
    for n, c, h, w, f, kh, kw in [(1, 3, 7, 9, 8, 3, 3), (2, 5, 6, 23, 17, 5, 5), (1, 2, 5, 8, 20, 2, 4)]:
        x, wt = _args(rng, [(n, c, h, w), (f, c, kh, kw)])
        out = np.full((n, f, h - kh + 1, w - kw + 1), np.nan, np.float32)
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in (x, wt, out)]
        assert fn(*pointers, *[ctypes.c_int64(s) for s in (n, c, h, w, f, kh, kw)]) == 0
        _close(out, conv_np(x, wt))


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_corpus_convolutions_generic(threads):
    """Every case of the public TC corpus whose generic plan runs a direct convolution matches
    its reference."""
    from test_corpus_e2e import CASES, run_cases_whose_plan_mentions

    if not CASES:
        pytest.skip("../shared/tc_corpus/public.json not found")
    ran = run_cases_whose_plan_mentions(tl.Options(specialize=False, threads=threads), "direct convolution")
    assert ran >= 1


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_padded_random_sizes_match_numpy(dtype):
    """One generic padded kernel over random sizes (windows 1-7, channels 1-40, images narrower
    than the window's reach): NumPy on the zero-padded input as the reference."""
    src = PADDED if dtype == np.float32 else PADDED.replace("float(", "double(")
    k = generic(src, 2)
    rng = np.random.default_rng(31)
    for _ in range(12):
        n, c, h, w = (int(v) for v in rng.integers(1, (3, 12, 20, 41)))
        f, kh, kw = (int(v) for v in rng.integers(1, (41, 8, 8)))
        x, wt = _args(rng, [(n, c, h, w), (f, c, kh, kw)], dtype)
        padded = np.pad(x, ((0, 0), (0, 0), (1, max(1, kh - 2)), (1, max(1, kw - 2))))
        want = conv_np(padded, wt)[:, :, :h, :w]
        _close(k(x, wt), want, dtype)


@pytest.mark.parametrize("layout", ["nhwc", "strided"])
def test_random_sizes_match_numpy(layout):
    """One generic kernel per layout over random sizes (windows 1-7, channels 1-40)."""
    k = generic(NHWC if layout == "nhwc" else STRIDED, 2)
    rng = np.random.default_rng(37)
    for _ in range(12):
        n, c, f = (int(v) for v in rng.integers(1, (3, 12, 41)))
        kh, kw = (int(v) for v in rng.integers(1, 8, size=2))
        h, w = kh + int(rng.integers(0, 20)), kw + int(rng.integers(0, 40))
        x, wt = _args(rng, [(n, c, h, w), (f, c, kh, kw)])
        want = conv_np(x, wt)
        if layout == "nhwc":
            got = k(x.transpose(0, 2, 3, 1).copy(), wt.transpose(2, 3, 1, 0).copy()).transpose(0, 3, 1, 2)
        else:
            got, want = k(x, wt), want[:, :, ::2, ::2]
        _close(got, want)


@pytest.mark.parametrize(
    "src",
    [
        "def conv(float(1,8,12,20) I, float(16,8,3,3) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }",
        "def conv(float(N,8,H,W) I, float(16,8,3,3) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }",
    ],
    ids=["all-constant", "constant-filter"],
)
def test_constant_shapes(src):
    """Extents that are constants of the source: still the generic kernel's code (its sizes are
    arguments whatever they are), planned with the tests those constants allow."""
    x, w = _args(np.random.default_rng(8), [(1, 8, 12, 20), (16, 8, 3, 3)])
    k = generic(src)
    assert "sized at run time" in _generic_plan(k)
    _close(k(x, w), conv_np(x, w))
