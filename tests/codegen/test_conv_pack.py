"""The direct convolution's filter packing (codegen/emit/conv_pack.py): the transposing path
against the element loop and a NumPy relayout, on geometries with partial channel blocks, runs
that are not a whole number of vectors, groups and float64."""

from __future__ import annotations

import ctypes

import llvmlite.ir as ir
import numpy as np
import pytest

from codegen.emit import conv_pack
from codegen.emit.conv_kernel import ConvGeometry
from codegen.emit.gemm_pack import define_function
from codegen.lowering.jit import _lock, compile_module, optimise


def _geometry(itemsize, channels, taps, window, groups=()) -> ConvGeometry:
    """An NCHW-like filter w[groups, f, taps, u], row-major."""
    run = int(np.prod(taps, dtype=np.int64)) * window
    tap_strides, stride = [], window
    for count in reversed(taps):
        tap_strides.insert(0, stride)
        stride *= count
    group_strides, stride = [], channels * run
    for count in reversed(groups):
        group_strides.insert(0, stride)
        stride *= count
    return ConvGeometry(
        itemsize=itemsize, channels=channels, positions=8, window=window, taps=tuple(taps),
        in_x=1, in_u=1, in_taps=tuple(1 for _ in taps), out_f=1, out_x=1,
        wt_f=run, wt_u=1, wt_taps=tuple(tap_strides), groups=tuple(groups), wt_groups=tuple(group_strides),
    )  # fmt: skip


def _packed(g: ConvGeometry, w: np.ndarray, transposes: bool) -> np.ndarray:
    module = ir.Module(name="pack_test")
    tp = g.element.as_pointer()
    fn = define_function(module, "pack", ir.VoidType(), [tp, tp], ["w", "wp"], "external")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if transposes:
        conv_pack._pack_by_transposes(module, b, g, *fn.args)
    else:
        conv_pack._pack_by_elements(b, g, *fn.args)
    b.ret_void()
    with _lock:
        engine, _ = compile_module(optimise(module))
        address = engine.get_function_address("pack")
    out = np.full(int(np.prod(g.groups, dtype=np.int64)) * g.group_elements, np.nan, w.dtype)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(address)(w.ctypes.data, out.ctypes.data)
    return out


def _reference(g: ConvGeometry, w: np.ndarray) -> np.ndarray:
    """w[groups..., f, run] → [groups..., fb, run, lane], zero past the last channel."""
    run = g.tap_count * g.window
    w = w.reshape(*g.groups, g.channels, run)
    padded = np.zeros((*g.groups, g.f_blocks * g.lanes, run), w.dtype)
    padded[..., : g.channels, :] = w
    blocks = padded.reshape(*g.groups, g.f_blocks, g.lanes, run)
    return np.swapaxes(blocks, -1, -2).reshape(-1)


@pytest.mark.parametrize(
    "itemsize, channels, taps, window, groups",
    [
        (4, 64, (64, 3), 3, ()),  # the 64-channel 3x3 layer: whole blocks, run 576
        (4, 16, (1, 1), 1, ()),  # one column
        (4, 13, (7, 3), 3, ()),  # fewer channels than lanes; run 63 = 3 vectors + 15
        (4, 37, (5,), 5, ()),  # a partial third block; run 25
        (4, 17, (2, 2), 1, (3,)),  # groups; run 4, less than a vector
        (8, 19, (3, 3), 3, ()),  # float64: 8 lanes, run 27
        (8, 8, (4,), 2, (2, 2)),  # two group variables
    ],
)
def test_transposes_equal_the_element_loop_and_numpy(itemsize, channels, taps, window, groups):
    g = _geometry(itemsize, channels, taps, window, groups)
    assert conv_pack.contiguous_taps(g)
    dtype = np.float32 if itemsize == 4 else np.float64
    count = int(np.prod(groups, dtype=np.int64)) * channels * g.tap_count * window
    w = np.random.default_rng(channels).standard_normal(count).astype(dtype)
    want = _reference(g, w)
    np.testing.assert_array_equal(_packed(g, w, transposes=False), want)
    np.testing.assert_array_equal(_packed(g, w, transposes=True), want)


def test_layouts_whose_taps_are_not_one_run_keep_the_element_loop():
    nchw = _geometry(4, 16, (8, 3), 3)
    nhwc = ConvGeometry(  # Wt(kh, kw, c, f): f has unit stride, the taps do not
        itemsize=4, channels=16, positions=8, window=3, taps=(3, 8), in_x=1, in_u=1, in_taps=(1, 1),
        out_f=1, out_x=1, wt_f=1, wt_u=8 * 16, wt_taps=(3 * 8 * 16, 16),
    )  # fmt: skip
    assert conv_pack.contiguous_taps(nchw)
    assert not conv_pack.contiguous_taps(nhwc)
